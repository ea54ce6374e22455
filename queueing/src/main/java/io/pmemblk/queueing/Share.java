package io.pmemblk.queueing;

/**
 * One submitter's hold on a {@link HardwareQueue} (a {@link FrontendQueue}'s): the tags and buffer chunks its
 * requests hold, which the queue bounds by a fair share (or by its reserved tags). Every field is guarded by
 * the queue's monitor: the submitter's thread changes them when it acquires, any completing thread when it
 * releases.
 */
final class Share {
    /** Takes the queue's reserved tags instead of shared ones. */
    final boolean reserved;
    int tags;
    int chunks;
    /** Counted among the queue's users: holding a tag, or waiting for one. */
    boolean active;
    boolean waiting;

    Share(boolean reserved) {
        this.reserved = reserved;
    }
}
