package io.pmemblk.pmem;

/**
 * An access to the mapping failed: the page is gone (the backing file was truncated under the server), the
 * platform reports the range as bad (a known bad block, or a poisoned line that raised a machine check), or the
 * filesystem refused the page. The request that touched it answers EIO; the mapping and every other range stay
 * usable. Thrown synchronously by {@link PmemRegion}'s accessors, never later.
 */
public final class MappingFault extends RuntimeException {
    private final long offset;
    private final long length;

    MappingFault(String what, long offset, long length, Throwable cause) {
        super(what + " of " + length + " bytes at offset " + offset + " (0x" + Long.toHexString(offset) + ") of the mapping"
                + " failed" + (cause == null ? "" : ": " + cause.getMessage()), cause, false, false);
        this.offset = offset;
        this.length = length;
    }

    /** Where the failed access started, in bytes from the start of the device. */
    public long offset() {
        return offset;
    }

    public long length() {
        return length;
    }
}
