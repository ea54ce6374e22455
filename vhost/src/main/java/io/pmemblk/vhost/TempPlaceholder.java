package io.pmemblk.vhost;

/** TEMPORARY (virtq): the exported package needs a class until proto's server lands; reverted before handover. */
final class TempPlaceholder {
    private TempPlaceholder() {}
}
