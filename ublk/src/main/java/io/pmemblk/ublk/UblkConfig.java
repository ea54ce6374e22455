package io.pmemblk.ublk;

/**
 * How to create the ublk device.
 *
 * @param id         device id ({@code /dev/ublkb<id>}), or -1 to let the kernel pick one
 * @param queues     ublk queues (one thread each); queue i is served on the block layer's hardware queue i
 * @param depth      tags per queue (at most the hardware queue's depth, so a tag of ours is always free for it)
 * @param blockSize  logical block size, 512 or 4096
 * @param maxIoBytes largest READ/WRITE the kernel sends (bigger ones are split)
 * @param recovery   UBLK_F_USER_RECOVERY(_REISSUE): a killed server leaves the device quiesced, and the next
 *                   server with the same id takes it over; requests the dead one held are issued again
 */
public record UblkConfig(int id, int queues, int depth, int blockSize, int maxIoBytes, boolean recovery) {
    public UblkConfig {
        if (id < -1) {
            throw new IllegalArgumentException("ublk id " + id + ": -1 (the kernel picks) or a device id >= 0");
        }
        if (queues < 1 || queues > 4096) {
            throw new IllegalArgumentException("ublk queues " + queues + ": 1..4096");
        }
        if (depth < 1 || depth > UblkAbi.UBLK_MAX_QUEUE_DEPTH) {
            throw new IllegalArgumentException("ublk depth " + depth + ": 1.." + UblkAbi.UBLK_MAX_QUEUE_DEPTH);
        }
        if (blockSize != 512 && blockSize != 4096) {
            throw new IllegalArgumentException("ublk block size " + blockSize + ": 512 or 4096");
        }
    }
}
