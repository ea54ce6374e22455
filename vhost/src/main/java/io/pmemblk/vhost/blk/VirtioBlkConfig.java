package io.pmemblk.vhost.blk;

import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.vhost.spec.Le;
import io.pmemblk.vhost.virtq.VirtioFeatures;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * The device's features and its {@code struct virtio_blk_config} for GET_CONFIG, written once from the header QEMU
 * 7.2 copies (qemu/qemu {@code include/standard-headers/linux/virtio_blk.h}; packed, little-endian, 60 bytes):
 * <pre>
 * u64 capacity @0; u32 size_max @8; u32 seg_max @12; geometry {u16 cylinders @16, u8 heads @18, u8 sectors @19};
 * u32 blk_size @20; u8 physical_block_exp @24; u8 alignment_offset @25; u16 min_io_size @26; u32 opt_io_size @28;
 * u8 wce @32; u8 unused @33; u16 num_queues @34; u32 max_discard_sectors @36; u32 max_discard_seg @40;
 * u32 discard_sector_alignment @44; u32 max_write_zeroes_sectors @48; u32 max_write_zeroes_seg @52;
 * u8 write_zeroes_may_unmap @56; u8 unused1[3] @57
 * </pre>
 * QEMU asks for 36, 48 or 57 bytes of it (by its own discard / write-zeroes properties); the session answers
 * from {@link #bytes}.
 */
public final class VirtioBlkConfig {
    private VirtioBlkConfig() {}

    public static final int BYTES = 60;
    static final long CAPACITY = 0, SIZE_MAX = 8, SEG_MAX = 12, BLK_SIZE = 20, PHYSICAL_BLOCK_EXP = 24,
            MIN_IO_SIZE = 26, OPT_IO_SIZE = 28, WCE = 32, NUM_QUEUES = 34, MAX_DISCARD_SECTORS = 36,
            MAX_DISCARD_SEG = 40, DISCARD_SECTOR_ALIGNMENT = 44, MAX_WRITE_ZEROES_SECTORS = 48,
            MAX_WRITE_ZEROES_SEG = 52, WRITE_ZEROES_MAY_UNMAP = 56;
    /**
     * One DISCARD / WRITE_ZEROES covers at most 16 MiB, in one segment, as qemu-storage-daemon's
     * ({@code VIRTIO_BLK_MAX_DISCARD_SECTORS}): the pmem driver zeroes it with the CPU inside the batch, and a
     * larger range would hold the queue's other requests behind it for longer.
     */
    public static final int MAX_RANGE_SECTORS = 32768, MAX_RANGE_SEGMENTS = 1;
    private static final int PAGE = 4096;


    /**
     * The virtio features GET_FEATURES offers (the session adds vhost-user's bit 30). QEMU clears every bit of its
     * {@code user_feature_bits} the back-end lacks, so this is also what the guest may see. Not offered: GEOMETRY
     * (no CHS to give), NOTIFY_ON_EMPTY, RING_PACKED (split rings only), ACCESS_PLATFORM (no vIOMMU translation).
     */
    public static long features(BlkDevice d) {
        long f = bit(VirtioFeatures.VERSION_1) | bit(VirtioFeatures.RING_INDIRECT_DESC) | bit(VirtioFeatures.RING_EVENT_IDX)
                | bit(VirtioBlk.F_SIZE_MAX) | bit(VirtioBlk.F_SEG_MAX) | bit(VirtioBlk.F_BLK_SIZE)
                | bit(VirtioBlk.F_TOPOLOGY) | bit(VirtioBlk.F_FLUSH) | bit(VirtioBlk.F_CONFIG_WCE) | bit(VirtioBlk.F_MQ);
        if (d.readOnly()) {
            f |= bit(VirtioBlk.F_RO);
        } else {
            f |= (d.canDiscard() ? bit(VirtioBlk.F_DISCARD) : 0) | (d.canZero() ? bit(VirtioBlk.F_WRITE_ZEROES) : 0);
        }
        return f;
    }

    /**
     * seg_max: data segments per request. A chain's header and status take two descriptors of the queue
     * ({@code queueSize - 2}, as QEMU's own virtio-blk advertises), and each segment may split once where it
     * crosses from one guest memory region into the next (a segment is at most size_max, and RAM regions that
     * touch are far larger), so at most {@link HardwareQueue#MAX_IOVS} / 2 segments keep every chain's pieces within
     * what a request holds. Never more than maxRequestBytes / 4096, so size_max stays at least a page.
     */
    public static int segMax(int queueSize, int maxRequestBytes) {
        return Math.max(1, Math.min(Math.min(queueSize - 2, HardwareQueue.MAX_IOVS / 2), maxRequestBytes / PAGE));
    }

    /** size_max: bytes per segment, in pages, so seg_max of them never exceed maxRequestBytes (one request). */
    public static int sizeMax(int queueSize, int maxRequestBytes) {
        return Math.max(PAGE, maxRequestBytes / segMax(queueSize, maxRequestBytes) / PAGE * PAGE);
    }

    /**
     * The 60-byte configuration: capacity, size_max and seg_max as above, blk_size with one block per physical
     * block and minimal / optimal I/O of one block, wce = 1 (a writeback cache: the guest then sends FLUSH, which
     * the pmem driver makes durable; with wce 0 it would send none and a power loss could lose completed writes
     * still in the CPU caches), num_queues, and the discard / write-zeroes limits.
     * @param queueSize the virtqueue size QEMU is configured with (its {@code queue-size}; the guest may use less)
     */
    public static byte[] bytes(BlkDevice d, int numQueues, int queueSize, int maxRequestBytes) {
        if (numQueues < 1 || numQueues > 0xffff) {
            throw new IllegalArgumentException("num_queues " + numQueues + ": allowed 1..65535");
        }
        if (queueSize < 3) {
            throw new IllegalArgumentException("queue size " + queueSize + ": a request needs at least 3 descriptors");
        }
        byte[] b = new byte[BYTES];
        MemorySegment c = MemorySegment.ofArray(b);
        c.set(Le.U64_UNALIGNED, CAPACITY, d.capacitySectors());
        c.set(Le.U32_UNALIGNED, SIZE_MAX, sizeMax(queueSize, maxRequestBytes));
        c.set(Le.U32_UNALIGNED, SEG_MAX, segMax(queueSize, maxRequestBytes));
        c.set(Le.U32_UNALIGNED, BLK_SIZE, d.blkSize());
        c.set(ValueLayout.JAVA_BYTE, PHYSICAL_BLOCK_EXP, (byte) 0);
        c.set(Le.U16_UNALIGNED, MIN_IO_SIZE, (short) 1);
        c.set(Le.U32_UNALIGNED, OPT_IO_SIZE, 1);
        c.set(ValueLayout.JAVA_BYTE, WCE, (byte) 1);
        c.set(Le.U16_UNALIGNED, NUM_QUEUES, (short) numQueues);
        int alignment = d.blkSize() / VirtioBlk.SECTOR;
        if (d.canDiscard()) {
            c.set(Le.U32_UNALIGNED, MAX_DISCARD_SECTORS, MAX_RANGE_SECTORS);
            c.set(Le.U32_UNALIGNED, MAX_DISCARD_SEG, MAX_RANGE_SEGMENTS);
            c.set(Le.U32_UNALIGNED, DISCARD_SECTOR_ALIGNMENT, alignment);
        }
        if (d.canZero()) {
            c.set(Le.U32_UNALIGNED, MAX_WRITE_ZEROES_SECTORS, MAX_RANGE_SECTORS);
            c.set(Le.U32_UNALIGNED, MAX_WRITE_ZEROES_SEG, MAX_RANGE_SEGMENTS);
            // The pmem driver zeroes either way; the guest may send UNMAP, which changes nothing here.
            c.set(ValueLayout.JAVA_BYTE, WRITE_ZEROES_MAY_UNMAP, (byte) 1);
        }
        return b;
    }

    private static long bit(int b) {
        return 1L << b;
    }
}
