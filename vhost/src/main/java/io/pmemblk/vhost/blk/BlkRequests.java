package io.pmemblk.vhost.blk;

import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.log.RateLimitedLog;
import io.pmemblk.vhost.virtq.BrokenRingException;
import io.pmemblk.vhost.virtq.Chain;
import io.pmemblk.vhost.virtq.Virtqueue;

import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;

/**
 * A popped chain into a virtio-blk request: parsed, checked, and turned into a block-layer request on the guest's
 * own memory ({@link FrontendQueue#acquireIov}: the driver copies between guest RAM and pmem, the only copy), or
 * answered at once with the status it earns (SPDK's {@code process_blk_request}). Queue thread only.
 *
 * <h2>Requests (virtio 1.2 section 5.2.6)</h2>
 * A 16-byte header in the first device-readable bytes (split anywhere), data, and the status in the chain's last
 * device-writable byte. IN / OUT: a non-zero multiple of blk_size at a blk_size-aligned sector, inside the
 * device, at most the block layer's maxRequestBytes (seg_max x size_max stays within it), and no more than {@link HardwareQueue#MAX_IOVS} pieces, else IOERR;
 * IN with readable data past the header, or OUT with writable bytes besides the status, IOERR; OUT on a read-only
 * device IOERR. FLUSH -> the block layer's FLUSH (durable). GET_ID -> the serial, NUL-padded, in at most 20
 * bytes. DISCARD / WRITE_ZEROES -> TRIM / WRITE_ZEROES of exactly one 16-byte segment (max_discard_seg 1, more:
 * UNSUPP, as qemu-storage-daemon), flags other than UNMAP on WRITE_ZEROES UNSUPP, a range outside the device or
 * above the advertised maximum IOERR. Anything else UNSUPP. A chain without a device-writable byte cannot be
 * answered at all: the queue breaks.
 */
final class BlkRequests {
    /** Logged as the queue's: one logger for everything a ring's thread refuses or breaks on. */
    private static final System.Logger LOG = System.getLogger(VhostBlkQueue.class.getName());
    /** A guest can refuse itself as fast as it fills the ring: its refusals are rate-limited. */
    private static final RateLimitedLog REFUSALS = RateLimitedLog.to(LOG, System.Logger.Level.DEBUG);
    /** Pieces a chain may have besides its data: header and status, each possibly split once. */
    static final int CHAIN_SLACK = 4;

    private final int index;
    private final Virtqueue vq;
    private final FrontendQueue frontend;
    private final BlkDevice device;
    private final BlkAnswers answers;
    private final long maxDataBytes;
    private final MemorySegment serialBytes;
    /** What the driver calls when one of these requests is done (any thread). */
    private final Request.Completion completion;
    private volatile boolean writeThrough;

    /**
     * @param vq      the ring the chains come from (a chain never submitted is given back to it)
     * @param answers where statuses go, at once or when the driver completes
     */
    BlkRequests(int index, Virtqueue vq, FrontendQueue frontend, BlkDevice device, BlkAnswers answers) {
        this.index = index;
        this.vq = vq;
        this.frontend = frontend;
        this.device = device;
        this.answers = answers;
        this.completion = answers::completed;
        this.maxDataBytes = frontend.queue().maxRequestBytes();
        byte[] serial = device.serial().getBytes(StandardCharsets.US_ASCII);
        this.serialBytes = MemorySegment.ofArray(new byte[VirtioBlk.ID_BYTES]); // NUL-padded
        MemorySegment.copy(MemorySegment.ofArray(serial), 0, serialBytes, 0, serial.length);
    }

    /**
     * SET_CONFIG's wce: with the write cache off (write-through) the guest sends no FLUSH, so every write is made
     * durable before it completes (FUA).
     */
    void writeCache(boolean enabled) {
        writeThrough = !enabled;
    }

    /**
     * Serves the chain just popped: a request handed to the block layer (dispatched with the batch), or an answer
     * at once (GET_ID, a refusal).
     * @throws BrokenRingException when the chain has no device-writable byte: it cannot be answered at all
     * @throws InterruptedException when stopping interrupted a wait for a tag: the chain is given back unpopped
     */
    void submit(Chain c) throws BrokenRingException, InterruptedException {
        int head = c.head();
        MemorySegment statusMap = c.lastWritableMapping();
        if (statusMap == null) {
            vq.unpop(head);
            throw new BrokenRingException("virtqueue " + index + ": the chain of head " + head
                    + " has no device-writable byte for its status");
        }
        answers.statusAt(head, statusMap, c.lastWritableOffset());
        if (c.readableBytes() < VirtioBlk.OUTHDR_BYTES) {
            refuse(head, VirtioBlk.S_IOERR, "a header of " + c.readableBytes() + " device-readable bytes: 16 needed");
            return;
        }
        if (c.overflowed()) {
            refuse(head, VirtioBlk.S_IOERR, "a chain of more than " + (HardwareQueue.MAX_IOVS + CHAIN_SLACK)
                    + " pieces of guest memory");
            return;
        }
        int type = (int) c.readLE(VirtioBlk.OUTHDR_TYPE, 4);
        long sector = c.readLE(VirtioBlk.OUTHDR_SECTOR, 8);
        long readData = c.readableBytes() - VirtioBlk.OUTHDR_BYTES;
        long writeData = c.writableBytes() - 1;
        switch (type) {
            case VirtioBlk.T_IN -> {
                if (readData != 0) {
                    refuse(head, VirtioBlk.S_IOERR, "IN with " + readData + " device-readable bytes after its header");
                } else if (dataOk(head, "IN", sector, writeData)) {
                    data(c, head, Op.READ, sector, writeData);
                }
            }
            case VirtioBlk.T_OUT -> {
                if (writeData != 0) {
                    refuse(head, VirtioBlk.S_IOERR, "OUT with " + writeData + " device-writable bytes besides its status");
                } else if (device.readOnly()) {
                    refuse(head, VirtioBlk.S_IOERR, "OUT on a read-only device");
                } else if (dataOk(head, "OUT", sector, readData)) {
                    data(c, head, Op.WRITE, sector, readData);
                }
            }
            case VirtioBlk.T_FLUSH -> range(head, Op.FLUSH, 0, 0);
            case VirtioBlk.T_GET_ID -> {
                if (writeData == 0) {
                    refuse(head, VirtioBlk.S_IOERR, "GET_ID without a device-writable buffer for the serial");
                    return;
                }
                long written = c.writeFrom(serialBytes, Math.min(writeData, VirtioBlk.ID_BYTES));
                answers.answer(head, VirtioBlk.S_OK, (int) written + 1);
            }
            case VirtioBlk.T_DISCARD, VirtioBlk.T_WRITE_ZEROES -> discardOrZero(c, head, type, readData);
            default -> refuse(head, VirtioBlk.S_UNSUPP, "request type " + Integer.toUnsignedString(type)
                    + ": served IN 0, OUT 1, FLUSH 4, GET_ID 8, DISCARD 11, WRITE_ZEROES 13");
        }
    }

    /** Whether an IN / OUT of {@code bytes} at {@code sector} may be served; refused (IOERR) if not. */
    private boolean dataOk(int head, String what, long sector, long bytes) {
        int blk = device.blkSize();
        String wrong = null;
        if (bytes <= 0 || bytes % blk != 0) {
            wrong = bytes + " data bytes: allowed a non-zero multiple of the block size " + blk;
        } else if (bytes > maxDataBytes) {
            wrong = bytes + " data bytes: at most " + maxDataBytes + " (the block layer's maxRequestBytes, which seg_max"
                    + " x size_max stays within)";
        } else if (!inDevice(sector, bytes / VirtioBlk.SECTOR)) {
            wrong = "sector " + Long.toUnsignedString(sector) + " + " + bytes / VirtioBlk.SECTOR
                    + " sectors: outside the device of " + device.capacitySectors() + " sectors";
        } else if (sector % (blk / VirtioBlk.SECTOR) != 0) {
            wrong = "sector " + sector + ": not aligned to the block size " + blk;
        }
        if (wrong != null) {
            refuse(head, VirtioBlk.S_IOERR, what + " of " + wrong);
            return false;
        }
        return true;
    }

    /** Unsigned: sectors [sector, sector + count) lie in the device (no overflow: sector is compared first). */
    private boolean inDevice(long sector, long count) {
        long cap = device.capacitySectors();
        return Long.compareUnsigned(sector, cap) <= 0 && count <= cap - sector;
    }

    /**
     * IN / OUT: the data are the chain's readable bytes after the header (OUT) or its writable bytes before the
     * status byte (IN), {@code bytes} of them, in pieces as the chain has them.
     */
    private void data(Chain c, int head, Op op, long sector, long bytes) throws InterruptedException {
        boolean write = op == Op.WRITE;
        int first = write ? 0 : c.readable();
        int end = write ? c.readable() : c.count();
        long skip = write ? VirtioBlk.OUTHDR_BYTES : 0;
        int pieces = dataPieces(c, first, end, skip, bytes); // counted before a request is taken for it
        if (pieces > HardwareQueue.MAX_IOVS) {
            refuse(head, VirtioBlk.S_IOERR, op + " in " + pieces + " pieces of guest memory: at most "
                    + HardwareQueue.MAX_IOVS + " (seg_max segments, each split at most once between regions)");
            return;
        }
        Request r;
        try {
            r = frontend.acquireIov(op, sector * VirtioBlk.SECTOR, bytes);
        } catch (InterruptedException e) {
            vq.unpop(head); // never submitted: popped again by the next pop, or not counted by GET_VRING_BASE
            throw e;
        }
        long left = bytes;
        for (int i = first; i < end && left > 0; i++) {
            long off = c.offset(i), len = c.length(i);
            if (skip >= len) {
                skip -= len;
                continue;
            }
            long take = Math.min(len - skip, left);
            long iova = c.iova(i);
            r.addIov(c.mapping(i), off + skip, take, iova == Request.NO_IOVA ? iova : iova + skip);
            skip = 0;
            left -= take;
        }
        answers.okLength(head, write ? 1 : (int) bytes + 1);
        submitRequest(r, head);
    }

    /** How many pieces {@code bytes} data bytes take from pieces [first, end) after skipping {@code skip} bytes. */
    private static int dataPieces(Chain c, int first, int end, long skip, long bytes) {
        int n = 0;
        for (int i = first; i < end && bytes > 0; i++) {
            long len = c.length(i);
            if (skip >= len) {
                skip -= len;
                continue;
            }
            bytes -= Math.min(len - skip, bytes);
            skip = 0;
            n++;
        }
        return n;
    }

    private void discardOrZero(Chain c, int head, int type, long readData) throws InterruptedException {
        boolean zero = type == VirtioBlk.T_WRITE_ZEROES;
        String name = zero ? "WRITE_ZEROES" : "DISCARD";
        if (!(zero ? device.canZero() : device.canDiscard())) {
            refuse(head, VirtioBlk.S_UNSUPP, name + ": not offered by this device");
            return;
        }
        if (device.readOnly()) {
            refuse(head, VirtioBlk.S_IOERR, name + " on a read-only device");
            return;
        }
        if (readData != VirtioBlk.SEGMENT_BYTES) {
            refuse(head, readData > 0 && readData % VirtioBlk.SEGMENT_BYTES == 0 ? VirtioBlk.S_UNSUPP : VirtioBlk.S_IOERR,
                    name + " with " + readData + " bytes of segments: exactly one 16-byte segment (max_discard_seg 1)");
            return;
        }
        long at = VirtioBlk.OUTHDR_BYTES;
        long sector = c.readLE(at + VirtioBlk.SEGMENT_SECTOR, 8);
        long count = c.readLE(at + VirtioBlk.SEGMENT_NUM_SECTORS, 4);
        int flags = (int) c.readLE(at + VirtioBlk.SEGMENT_FLAGS, 4);
        int allowed = zero ? VirtioBlk.WRITE_ZEROES_FLAG_UNMAP : 0;
        int align = device.blkSize() / VirtioBlk.SECTOR;
        if ((flags & ~allowed) != 0) {
            refuse(head, VirtioBlk.S_UNSUPP, name + " with flags 0x" + Integer.toHexString(flags) + ": allowed 0x"
                    + Integer.toHexString(allowed));
        } else if (count == 0 || count > VirtioBlkConfig.MAX_RANGE_SECTORS) {
            refuse(head, VirtioBlk.S_IOERR, name + " of " + count + " sectors: allowed 1.."
                    + VirtioBlkConfig.MAX_RANGE_SECTORS);
        } else if (!inDevice(sector, count)) {
            refuse(head, VirtioBlk.S_IOERR, name + " of sector " + Long.toUnsignedString(sector) + " + " + count
                    + ": outside the device of " + device.capacitySectors() + " sectors");
        } else if (sector % align != 0 || count % align != 0) {
            refuse(head, VirtioBlk.S_IOERR, name + " of sector " + sector + " + " + count + ": not aligned to the"
                    + " block size " + device.blkSize());
        } else {
            range(head, zero ? Op.WRITE_ZEROES : Op.TRIM, sector * VirtioBlk.SECTOR, count * VirtioBlk.SECTOR);
        }
    }

    /** A request without data (FLUSH, TRIM, WRITE_ZEROES) through the block layer. */
    private void range(int head, Op op, long offset, long length) throws InterruptedException {
        Request r;
        try {
            r = frontend.acquire(0);
        } catch (InterruptedException e) {
            vq.unpop(head);
            throw e;
        }
        r.op = op;
        r.offset = offset;
        r.length = length;
        answers.okLength(head, 1);
        submitRequest(r, head);
    }

    private void submitRequest(Request r, int head) {
        r.cookie = head;
        r.fua = writeThrough && r.op != Op.READ && r.op != Op.FLUSH;
        r.completion = completion;
        frontend.add(r);
    }

    private void refuse(int head, byte status, String why) {
        refuseLog(head, why);
        answers.answer(head, status, 1);
    }

    private void refuseLog(int head, String why) {
        if (REFUSALS.enabled()) {
            REFUSALS.refused("vhost-blk-q{0} head {1} refused: {2}", index, head, why);
        }
    }
}
