package io.pmemblk.vhost.blk;

/**
 * STUB of contract C5 (owner: virtq), only so that proto's session compiles before virtq's branch is merged:
 * at the merge, virtq's file replaces this one.
 */
public final class VirtioBlkConfig {
    private VirtioBlkConfig() {}

    /** sizeof(struct virtio_blk_config) in QEMU 7.2's header. */
    public static final int SIZE = 60;

    /** The virtio-blk feature bits the device offers (SIZE_MAX .. WRITE_ZEROES, RO). */
    public static long features(BlkDevice device) {
        long f = (1L << 1) | (1L << 2) | (1L << 6) | (1L << 9) | (1L << 10) | (1L << 11) | (1L << 12);
        if (device.canDiscard()) {
            f |= 1L << 13;
        }
        if (device.canZero()) {
            f |= 1L << 14;
        }
        if (device.readOnly()) {
            f |= 1L << 5;
        }
        return f;
    }

    /** The 60-byte virtio_blk_config. */
    public static byte[] build(BlkDevice device, int numQueues, boolean writeback) {
        java.nio.ByteBuffer b = java.nio.ByteBuffer.allocate(SIZE).order(java.nio.ByteOrder.LITTLE_ENDIAN);
        b.putLong(0, device.capacitySectors());
        b.putInt(20, device.blkSize());
        b.put(32, (byte) (writeback ? 1 : 0));
        b.putShort(34, (short) numQueues);
        return b.array();
    }
}
