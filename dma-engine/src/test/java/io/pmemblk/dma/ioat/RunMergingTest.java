package io.pmemblk.dma.ioat;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Rig;
import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.vfio.EventfdInterrupt;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.management.ManagementFactory;
import java.util.Arrays;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

/**
 * A unit's copies that continue one another are placed as one run of descriptors (RingPlacement), counted on the
 * software device's descriptors; copies that do not (a gap in the source or the destination, the transfer size
 * reached, another mapping) stay apart. Every copy is still reported once, and the bytes land where asked, no more.
 */
class RunMergingTest {
    /** Counts reports: calls, copies per call, failed copies; a run's copies arrive in one call. */
    private static final class Tally implements DmaCompletionListener {
        final AtomicInteger calls = new AtomicInteger();
        final AtomicLong copies = new AtomicLong();
        final AtomicLong failed = new AtomicLong();
        final AtomicInteger lastStatus = new AtomicInteger();

        @Override
        public void completed(Object ctx, int status) {
            completed(ctx, status, 1);
        }

        @Override
        public void completed(Object ctx, int status, int n) {
            calls.incrementAndGet();
            if (status != 0) {
                failed.addAndGet(n);
                lastStatus.set(status);
            }
            copies.addAndGet(n);
        }

        /** Waits (10 s at most) until {@code n} copies were reported; fails saying how many came. */
        void await(long n) {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (copies.get() < n) {
                if (System.nanoTime() - deadline > 0) {
                    throw new AssertionError("timed out after 10 s waiting for " + n + " copies reported, got " + copies.get());
                }
                Thread.onSpinWait();
            }
        }
    }

    /** Copy i: length lengths[i] from srcOff[i] to dstOff[i] of the rig's buffers. */
    private record Pieces(Rig r, long[] srcOff, long[] dstOff, long[] lengths) implements DmaChannel.Copies {
        @Override public int count() { return lengths.length; }
        @Override public long srcIova(int i) { return r.srcIova + srcOff[i]; }
        @Override public long dstIova(int i) { return r.dstIova + dstOff[i]; }
        @Override public long length(int i) { return lengths[i]; }

        /** n pieces of len bytes, piece i at i * srcStride in the source and i * dstStride in the destination. */
        static Pieces strided(Rig r, int n, long len, long srcStride, long dstStride) {
            long[] s = new long[n], d = new long[n], l = new long[n];
            for (int i = 0; i < n; i++) {
                s[i] = i * srcStride;
                d[i] = i * dstStride;
                l[i] = len;
            }
            return new Pieces(r, s, d, l);
        }

        /** Each piece's bytes arrived, and every other byte of the destination is still 0. */
        void checkBytes() {
            byte[] rest = r.dst.toArray(ValueLayout.JAVA_BYTE);
            for (int i = 0; i < count(); i++) {
                assertThat(r.mismatch(srcOff[i], dstOff[i], lengths[i])).as("bytes of piece %d", i).isEqualTo(-1);
                Arrays.fill(rest, (int) dstOff[i], (int) (dstOff[i] + lengths[i]), (byte) 0);
            }
            assertThat(Arrays.mismatch(rest, new byte[rest.length])).as("first destination byte no piece asked for that is not 0")
                    .isEqualTo(-1);
        }
    }

    /** Places {@code p} as one unit on a stalled channel; returns the slots it took, then runs and checks it. */
    private static int placeAndRun(Rig r, Tally tally, Pieces p) {
        r.faults.stall(true);
        int free = r.ch.freeSlots();
        assertThat(r.ch.placeAll(p, "unit")).as("room for the unit").isTrue();
        int slots = free - r.ch.freeSlots();
        long before = r.device.descriptorsCompleted(0);
        r.ch.submit();
        r.faults.stall(false);
        tally.await(p.count());
        assertThat(r.device.descriptorsCompleted(0) - before).as("descriptors the device ran").isEqualTo(slots);
        assertThat(tally.copies.get()).as("every copy reported once").isEqualTo(p.count());
        assertThat(tally.failed.get()).as("copies reported failed").isZero();
        return slots;
    }

    private static Rig rig(int xfercapLog2, long bytes, Tally tally) {
        Rig r = new Rig(1, 1024, xfercapLog2, bytes); // room for every piece alone, merged or not
        r.engine.onCompletion(tally);
        return r;
    }

    @Test
    void contiguousPiecesBecomeOneDescriptorPerTransferSize() {
        Tally tally = new Tally();
        try (Rig r = rig(20, 4 << 20, tally)) {
            // a 2 MiB request of 512 pages contiguous in both spaces: two descriptors of 1 MiB, not 512
            Pieces p = Pieces.strided(r, 512, 4096, 4096, 4096);
            assertThat(placeAndRun(r, tally, p)).isEqualTo(2);
            assertThat(tally.calls.get()).as("reports: one call per run").isEqualTo(2);
            p.checkBytes();
        }
    }

    @Test
    void aGapInTheSourceOrTheDestinationEndsTheRun() {
        Tally tally = new Tally();
        try (Rig r = rig(20, 1 << 20, tally)) {
            // pieces 0-3 contiguous; a one-byte gap in the source before 4; 4-5 contiguous; a gap in the
            // destination before 6; 6-7 contiguous: three runs
            long[] src = {0, 512, 1024, 1536, 2049, 2561, 3073, 3585};
            long[] dst = {0, 512, 1024, 1536, 2048, 2560, 3584, 4096};
            long[] len = {512, 512, 512, 512, 512, 512, 512, 512};
            Pieces p = new Pieces(r, src, dst, len);
            assertThat(placeAndRun(r, tally, p)).isEqualTo(3);
            p.checkBytes();
        }
        Tally apart = new Tally();
        try (Rig r = rig(20, 1 << 20, apart)) {
            // the destination runs backwards: contiguous sources, but no piece continues the one before it
            long[] src = {0, 4096, 8192};
            long[] dst = {8192, 4096, 0};
            Pieces p = new Pieces(r, src, dst, new long[] {4096, 4096, 4096});
            assertThat(placeAndRun(r, apart, p)).isEqualTo(3);
            p.checkBytes();
        }
    }

    @Test
    void aRunStopsAtTheTransferSize() {
        Tally tally = new Tally();
        try (Rig r = rig(12, 1 << 20, tally)) { // 4 KiB descriptors
            // ten contiguous 1 KiB pieces: runs of 4, 4 and 2 KiB
            Pieces ones = Pieces.strided(r, 10, 1024, 1024, 1024);
            assertThat(placeAndRun(r, tally, ones)).isEqualTo(3);
            ones.checkBytes();
        }
        Tally threes = new Tally();
        try (Rig r = rig(12, 1 << 20, threes)) {
            // 3 KiB pieces: two would pass 4 KiB, so none merge (no piece is split to fill a descriptor)
            Pieces p = Pieces.strided(r, 4, 3072, 3072, 3072);
            assertThat(placeAndRun(r, threes, p)).isEqualTo(4);
            p.checkBytes();
        }
        Tally big = new Tally();
        try (Rig r = rig(12, 1 << 20, big)) {
            // a piece above the transfer size is split alone; the 1 KiB pieces after it make a run of their own
            long[] src = {0, 10240, 11264};
            Pieces p = new Pieces(r, src, src.clone(), new long[] {10240, 1024, 1024});
            assertThat(placeAndRun(r, big, p)).isEqualTo(3 + 1);
            p.checkBytes();
        }
    }

    @Test
    void piecesInTwoMappingsStayApartEvenWhenTheirMemoryTouches() {
        Tally tally = new Tally();
        try (Rig r = rig(20, 64 << 10, tally)) {
            // one allocation mapped as two regions: the second half's first byte follows the first half's last
            // in memory, but the space leaves a guard page between them, so the pieces do not continue
            MemorySegment both = r.arena.allocate(16 << 10, 4096);
            long lowIova = r.space.map(both.asSlice(0, 8 << 10));
            long highIova = r.space.map(both.asSlice(8 << 10, 8 << 10));
            assertThat(highIova).as("the second mapping's IOVA").isGreaterThan(lowIova + (8 << 10));
            DmaChannel.Copies p = new DmaChannel.Copies() {
                @Override public int count() { return 2; }
                @Override public long srcIova(int i) { return r.srcIova + i * 4096L; }
                @Override public long dstIova(int i) { return i == 0 ? lowIova + (4 << 10) : highIova; }
                @Override public long length(int i) { return 4096; }
            };
            r.faults.stall(true);
            int free = r.ch.freeSlots();
            assertThat(r.ch.placeAll(p, "across")).isTrue();
            assertThat(free - r.ch.freeSlots()).as("slots of two pieces in two mappings").isEqualTo(2);
            r.ch.submit();
            r.faults.stall(false);
            tally.await(2);
            assertThat(tally.failed.get()).isZero();
            assertThat(MemorySegment.mismatch(r.src, 0, 8192, both, 4096, 12288)).as("both pieces' bytes").isEqualTo(-1);
        }
    }

    @Test
    void aRunWithAPieceRunningOffItsMappingFailsWholeAndWritesNothingOutside() {
        Tally tally = new Tally();
        long bytes = 64 << 10;
        try (Rig r = rig(20, bytes, tally)) {
            // three contiguous pieces whose last runs 512 bytes past the end of the destination mapping
            long first = bytes - 3 * 4096 + 512;
            Pieces p = Pieces.strided(r, 3, 4096, 4096, 4096);
            long[] dst = {first, first + 4096, first + 8192};
            Pieces off = new Pieces(r, p.srcOff(), dst, p.lengths());
            r.faults.stall(true);
            assertThat(r.ch.placeAll(off, "overrun")).isTrue();
            r.ch.submit();
            r.faults.stall(false);
            tally.await(3);
            assertThat(tally.failed.get()).as("copies of the run reported failed").isEqualTo(3);
            assertThat(tally.lastStatus.get()).isEqualTo(IoatSpec.CHANERR_DEST_ADDR);
            byte[] landed = r.dst.toArray(ValueLayout.JAVA_BYTE);
            assertThat(Arrays.mismatch(landed, new byte[landed.length])).as("first destination byte written").isEqualTo(-1);
            // the channel recovered: the same pieces inside the mapping run as one descriptor
            Tally after = new Tally();
            r.engine.onCompletion(after);
            Pieces inside = Pieces.strided(r, 3, 4096, 4096, 4096);
            assertThat(placeAndRun(r, after, inside)).isEqualTo(1);
            inside.checkBytes();
        }
    }

    @Test
    void placingAndReapingARunAllocatesNothing() throws Exception {
        Tally tally = new Tally();
        IovaSpace space = new IovaSpace();
        // the interrupt an eventfd, as on the vfio-user route: with a poller the completion thread stands by, and
        // this thread places, rings and reaps, as a vhost queue thread does
        try (Arena arena = Arena.ofShared(); EventfdInterrupt vector = new EventfdInterrupt();
             SoftIoatDevice device = new SoftIoatDevice(space, 1, 20, SoftFaults.NONE, n -> vector);
             DmaEngine engine = DmaEngine.ioat(device, space, device::interrupt, 1, 64, null)) {
            engine.onCompletion(tally);
            DmaChannel ch = engine.channel(0);
            long srcIova = space.map(arena.allocate(32 << 10, 4096));
            long dstIova = space.map(arena.allocate(32 << 10, 4096));
            DmaChannel.Copies unit = new DmaChannel.Copies() { // 512 contiguous pieces of 64 bytes: one descriptor
                @Override public int count() { return 512; }
                @Override public long srcIova(int i) { return srcIova + i * 64L; }
                @Override public long dstIova(int i) { return dstIova + i * 64L; }
                @Override public long length(int i) { return 64; }
            };
            ch.pollers(true);
            long reported = 0;
            for (int i = 0; i < 2000; i++) { // warm-up: the JIT compiles the path
                reported = unit(ch, unit, tally, reported);
            }
            var threads = (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
            long me = Thread.currentThread().threadId();
            long before = threads.getThreadAllocatedBytes(me);
            int units = 1000;
            long calls = tally.calls.get();
            for (int i = 0; i < units; i++) {
                reported = unit(ch, unit, tally, reported);
            }
            long allocated = threads.getThreadAllocatedBytes(me) - before;
            ch.pollers(false);
            assertThat(tally.calls.get() - calls).as("reports of %d units of one run each", units).isEqualTo(units);
            assertThat(allocated).as("bytes allocated placing, ringing and reaping %d units of 512 contiguous pieces", units)
                    .isLessThan(units);
        }
    }

    /** Places the unit, rings, and reaps on this thread until its copies are reported (bounded); the new total. */
    private static long unit(DmaChannel ch, DmaChannel.Copies unit, Tally tally, long reported) {
        if (!ch.placeAll(unit, unit)) {
            throw new AssertionError("no room for the unit in an empty ring");
        }
        ch.submit();
        long want = reported + unit.count();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (tally.copies.get() < want) {
            ch.poll();
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("timed out after 10 s reaping a unit: " + tally.copies.get() + " of " + want + " copies");
            }
        }
        return want;
    }
}
