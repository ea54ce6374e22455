package io.pmemblk.vhost.blk;

/**
 * STUB of contract C5 (owner: virtq), only so that proto's session compiles before virtq's branch is merged:
 * at the merge, virtq's file replaces this one.
 */
public final class VirtioBlkConfig {
    private VirtioBlkConfig() {}

    public static final int BYTES = 60;

    /** The virtio features the device offers (ring and virtio-blk bits; the session adds bit 30). */
    public static long features(BlkDevice d) {
        long f = (1L << 32) | (1L << 28) | (1L << 29) | (1L << 1) | (1L << 2) | (1L << 6) | (1L << 9) | (1L << 10)
                | (1L << 11) | (1L << 12);
        if (d.readOnly()) {
            return f | 1L << 5;
        }
        return f | (d.canDiscard() ? 1L << 13 : 0) | (d.canZero() ? 1L << 14 : 0);
    }

    /** The 60-byte virtio_blk_config (capacity, blk_size, wce 1, num_queues only, in this stub). */
    public static byte[] bytes(BlkDevice d, int numQueues, int queueSize, int maxRequestBytes) {
        java.nio.ByteBuffer b = java.nio.ByteBuffer.allocate(BYTES).order(java.nio.ByteOrder.LITTLE_ENDIAN);
        b.putLong(0, d.capacitySectors());
        b.putInt(20, d.blkSize());
        b.put(32, (byte) 1);
        b.putShort(34, (short) numQueues);
        return b.array();
    }
}
