package io.pmemblk.vhost.blk;

/**
 * STUB of contract C5 (owner: virtq), only so that proto's session compiles before virtq's branch is merged:
 * at the merge, virtq's file replaces this one. What the guest is told about the disk.
 */
public record BlkDevice(long capacitySectors, int blkSize, boolean readOnly, boolean canDiscard, boolean canZero,
                        String serial) {
    public static BlkDevice of(long bytes, boolean readOnly, boolean canDiscard, boolean canZero, String serial) {
        return new BlkDevice(bytes / 512, 512, readOnly, canDiscard, canZero, serial);
    }
}
