package io.pmemblk.nbd;

/**
 * Why a connection ends, and whether replies may still be written: shared by its reader, its sender, the
 * server's stall watchdog and a forced close, each of which may be the one that decides.
 */
final class CloseState {
    /** Replies cannot (or must not) be written any more: release completed requests without replying. */
    volatile boolean broken;
    /** For the log line when the connection closes. */
    volatile String reason = "closed";

    /** Marks the connection broken; the first reason given wins over later consequences of the same failure. */
    void fail(String why) {
        if (!broken) {
            reason = why;
        }
        broken = true;
    }
}
