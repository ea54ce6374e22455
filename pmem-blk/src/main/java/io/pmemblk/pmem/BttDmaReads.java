package io.pmemblk.pmem;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.Arrays;

/**
 * READs on the BTT layout whose data copies are a DMA channel's: each sector's block is held in the BTT's
 * device-read table until the request's copies are reported, so no writer reuses a block the engine still reads;
 * a copy the device failed is made again by the CPU from the blocks still held.
 */
final class BttDmaReads {
    private final Btt btt;
    private final int sector;
    private final int shift;
    private final PmemRegion region;
    private final CopyStats stats;
    private final DmaRoute dma;
    private final Completions completions;

    BttDmaReads(Btt btt, PmemRegion region, CopyStats stats, DmaRoute dma, Completions completions) {
        this.btt = btt;
        this.sector = btt.blockSize();
        this.shift = Integer.numberOfTrailingZeros(sector);
        this.region = region;
        this.stats = stats;
        this.dma = dma;
        this.completions = completions;
    }

    /** {@link #place}: every sector the READ touches reads as zeros, and its memory is zeroed already. */
    static final int ZEROS = 3;

    /**
     * Places a READ on the BTT as {@link DmaRoute#place} places one on raw, its copies those of
     * {@link #prepare} (each sector's block, held in the BTT's device-read table until the request's copies have
     * all been reported: {@link #finish} ends them). CPU: it takes the CPU route, nothing held; RING_FULL: nothing
     * placed, nothing held.
     */
    int place(DmaChannel channel, int hwq, Request r) {
        PerRequest st = PerRequest.of(r);
        int n = prepare(r, st.btt(), dma.poolIova(hwq));
        if (n < 0) {
            return DmaRoute.CPU;
        }
        if (n == 0) {
            return ZEROS;
        }
        st.beginCopies(n);
        try {
            if (!channel.placeAll(st.btt().reads(), r)) {
                end(st.btt());
                return DmaRoute.RING_FULL;
            }
            st.placed = n;
        } catch (Throwable t) {
            dma.notPlaced(channel, r, st, t); // finish ends its device reads and completes it by the CPU
        }
        return DmaRoute.PLACED;
    }

    /**
     * Completes a READ on the BTT whose copies have all been reported: by DMA if they all succeeded, else by the CPU
     * from the same blocks, still held ({@link #readHeldByCpu}: not the CPU route's execution, which claims a lane,
     * which this thread, the channel's completion thread, must never wait for). Then the blocks are let go.
     */
    Throwable finish(Request r, PerRequest st, Throwable error) {
        int status = st.failedStatus;
        BttPerRequest bst = st.btt();
        if (status == 0) {
            end(bst); // before the completion: the tag's state may serve its next request right after
            stats.count(Route.DMA, false, r.length);
            r.route = Route.DMA;
            return Completions.complete(r, Status.OK, error);
        }
        if (!dma.cpuMayRedo(r, status)) {
            end(bst);
            return Completions.complete(r, Status.EIO, error);
        }
        Throwable failed = null;
        try {
            readHeldByCpu(bst);
        } catch (Throwable t) {
            failed = t;
        } finally {
            end(bst);
        }
        if (failed != null) {
            return completions.completeFailed(r, failed, error);
        }
        stats.count(Route.CPU, false, r.length);
        r.route = Route.CPU;
        return Completions.complete(r, Status.OK, error);
    }

    /**
     * Copies a DMA READ on the BTT may take at most (one per sector, two where a piece boundary splits a sector):
     * beyond, it takes the CPU route. A ring of the default 512 descriptors holds a 1 MiB READ of 4 KiB sectors.
     */
    static final int MAX_READ_COPIES = 1024;

    /**
     * Prepares a READ for the DMA route ({@link ReadCopies}): every sector it touches is resolved through the map
     * and published in the device-read table ({@link Btt#beginDeviceRead}: no writer reuses its block until the
     * copy is reported), a sector that reads as zeros is zeroed in the request's memory here, and each other
     * sector's part becomes a copy (block -> the request's piece). Nothing of it is placed yet.
     *
     * @return the copies (0: every sector was zeros, the request's data is complete); -1, nothing held, when it
     *         must take the CPU route, which answers it as it would (a block marked bad, a known bad range, pieces not
     *         covering its length, more copies than {@link #MAX_READ_COPIES})
     */
    private int prepare(Request r, BttPerRequest st, long poolIova) {
        boolean caller = r.segments() == 0;
        long end = r.offset + r.length;
        long first = r.offset >>> shift, last = (end - 1) >>> shift;
        if ((caller && r.iovBytes() != r.length) || last - first + 1 > MAX_READ_COPIES) {
            return -1;
        }
        ReadCopies c = st.reads();
        c.count = 0;
        c.held = 0;
        MemorySegment poolMemory = caller ? null : r.queue().pool().memory();
        BadBlocks bad = region.badBlocks();
        int piece = 0;
        long in = 0;
        try {
            for (long lba = first; lba <= last; lba++) {
                long sectorStart = lba << shift;
                long from = Math.max(r.offset, sectorStart), to = Math.min(end, sectorStart + sector);
                long data = btt.beginDeviceRead(lba);
                if (data != Btt.ZEROS) {
                    c.hold(data);
                    if (!bad.isEmpty() && bad.overlaps(data, sector)) {
                        c.release(btt);
                        return -1; // the CPU's guarded read answers EIO
                    }
                }
                long inBlock = from - sectorStart;
                for (long left = to - from; left > 0; ) {
                    long pieceLength = caller ? r.iovLength(piece) : r.segmentLength(piece);
                    if (in == pieceLength) {
                        piece++;
                        in = 0;
                        continue;
                    }
                    long k = Math.min(left, pieceLength - in);
                    long at = (caller ? r.iovStart(piece) : r.segmentPoolOffset(piece)) + in;
                    if (data == Btt.ZEROS) {
                        (caller ? r.iovMapping(piece) : poolMemory).asSlice(at, k).fill((byte) 0);
                    } else {
                        if (c.count == MAX_READ_COPIES) {
                            c.release(btt);
                            return -1;
                        }
                        long dst = (caller ? r.iovIova(piece) : poolIova + r.segmentPoolOffset(piece)) + in;
                        c.add(dma.regionIova() + data + inBlock, dst, k, data + inBlock,
                                caller ? r.iovMapping(piece) : poolMemory, at);
                    }
                    in += k;
                    inBlock += k;
                    left -= k;
                }
            }
        } catch (IOException | RuntimeException e) {
            c.release(btt); // the CPU route reads the map again and answers it (EIO for a block marked bad)
            return -1;
        }
        return c.count;
    }

    /** Ends the device reads of a READ whose copies have all been reported (or were never placed). */
    private void end(BttPerRequest st) {
        st.reads().release(btt);
    }

    /**
     * After a DMA READ's copy failed (or was never placed): makes every copy of it by the CPU, from the blocks it
     * still holds in the device-read table (no writer has reused them), through the region's guarded read. Needs
     * no lane: this runs on the channel's completion thread, which must never wait for a lane (the lanes it would
     * wait for are held by groups whose completion is that thread's to run). The caller ends the holds after.
     *
     * @throws MappingFault when a block cannot be read (a known bad range, a fault on the mapping)
     */
    private void readHeldByCpu(BttPerRequest st) {
        ReadCopies c = st.reads();
        for (int i = 0; i < c.count; i++) {
            region.read(c.srcOffset[i], c.dstMemory[i], c.dstOffset[i], c.len[i]);
        }
    }

    /**
     * A DMA READ's copies on the BTT, and the blocks it holds in the device-read table: made on a tag's first such
     * READ, grown to its need (at most {@link #MAX_READ_COPIES}), reused after.
     */
    static final class ReadCopies implements DmaChannel.Copies {
        private long[] src = new long[16], dst = new long[16], len = new long[16];
        /** The same copies for the CPU, should the device fail: pool offset, and the request memory's place. */
        private long[] srcOffset = new long[16], dstOffset = new long[16];
        private MemorySegment[] dstMemory = new MemorySegment[16];
        private long[] heldBlocks = new long[16];
        private int count, held;

        void add(long s, long d, long l, long poolOffset, MemorySegment memory, long memoryOffset) {
            if (count == src.length) {
                int n = Math.min(MAX_READ_COPIES, 2 * count);
                src = Arrays.copyOf(src, n);
                dst = Arrays.copyOf(dst, n);
                len = Arrays.copyOf(len, n);
                srcOffset = Arrays.copyOf(srcOffset, n);
                dstOffset = Arrays.copyOf(dstOffset, n);
                dstMemory = Arrays.copyOf(dstMemory, n);
            }
            src[count] = s;
            dst[count] = d;
            len[count] = l;
            srcOffset[count] = poolOffset;
            dstMemory[count] = memory;
            dstOffset[count] = memoryOffset;
            count++;
        }

        void hold(long dataOffset) {
            if (held == heldBlocks.length) {
                heldBlocks = Arrays.copyOf(heldBlocks, 2 * held);
            }
            heldBlocks[held++] = dataOffset;
        }

        /** Ends every device read held: after the copies are reported, or when none will be placed. */
        void release(Btt btt) {
            for (int i = 0; i < held; i++) {
                btt.endDeviceRead(heldBlocks[i]);
            }
            Arrays.fill(dstMemory, 0, count, null); // the request's memory is not kept past it
            held = 0;
            count = 0;
        }

        @Override
        public int count() {
            return count;
        }

        @Override
        public long srcIova(int i) {
            return src[i];
        }

        @Override
        public long dstIova(int i) {
            return dst[i];
        }

        @Override
        public long length(int i) {
            return len[i];
        }
    }
}
