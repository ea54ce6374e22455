package io.pmemblk.dma.ioat;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.testing.ForwardingMmio;
import io.pmemblk.dma.Recorder;
import io.pmemblk.dma.Rig;
import io.pmemblk.dma.soft.SoftIoatDevice;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

class IoatChannelTest {

    @Test
    void ringWrapsAroundManyTimes() {
        try (Rig r = new Rig(1, 16, 20, 1 << 20)) {
            int copies = 10_000;
            for (int i = 0; i < copies; i++) {
                long off = (i * 64L) % (1 << 20);
                r.placeWaiting(r.ch, off, off, 64, i);
                if (i % 7 == 6) {
                    r.ch.submit();
                }
            }
            r.ch.submit();
            r.rec.awaitCount(copies);
            for (int i = 0; i < copies; i++) {
                assertThat(r.rec.status(i)).as("status of copy %d", i).isZero();
            }
            assertThat(r.mismatch(0, 0, Math.min(copies * 64L, 1 << 20))).isEqualTo(-1);
            assertThat(r.device.descriptorsCompleted(0)).isEqualTo(copies + 1); // + the start-up null descriptor
            assertThat(r.ch.freeSlots()).isEqualTo(15);
        }
    }

    /** Counts DMACOUNT writes: each submit of a batch must be exactly one doorbell. */
    private static final class DoorbellCounter extends ForwardingMmio {
        final AtomicInteger doorbells = new AtomicInteger();

        DoorbellCounter(Mmio inner) {
            super(inner);
        }

        @Override
        public void write16(long o, int v) {
            if (o % IoatSpec.CHANNEL_MMIO_SIZE == IoatSpec.DMACOUNT) {
                doorbells.incrementAndGet();
            }
            inner.write16(o, v);
        }
    }

    @Test
    void everyBatchSizeRingsTheDoorbellOnce() {
        IovaSpace space = new IovaSpace();
        try (Arena arena = Arena.ofShared();
             SoftIoatDevice dev = new SoftIoatDevice(space, 1, 20)) {
            MemorySegment src = arena.allocate(1 << 16);
            MemorySegment dst = arena.allocate(1 << 16);
            for (int i = 0; i < 1 << 16; i++) {
                src.set(ValueLayout.JAVA_BYTE, i, (byte) (i ^ (i >> 8)));
            }
            long s = space.map(src);
            long d = space.map(dst);
            DoorbellCounter bar = new DoorbellCounter(dev);
            Recorder rec = new Recorder();
            try (DmaEngine engine = DmaEngine.ioat(bar, space, dev::interrupt, 1, 16, null)) {
                engine.onCompletion(rec);
                DmaChannel ch = engine.channel(0);
                int expected = 0;
                int ctx = 0;
                for (int batch = 1; batch <= 15; batch++) {
                    int before = bar.doorbells.get();
                    for (int k = 0; k < batch; k++) {
                        long off = (ctx * 256L) % (1 << 16);
                        assertThat(ch.place(s + off, d + off, 256, ctx++)).as("room for batch of %d", batch).isTrue();
                    }
                    assertThat(ch.freeSlots()).isEqualTo(15 - batch);
                    ch.submit();
                    ch.submit(); // nothing new placed: no doorbell
                    assertThat(bar.doorbells.get() - before).as("doorbells for a batch of %d", batch).isEqualTo(1);
                    expected += batch;
                    rec.awaitCount(expected);
                }
                assertThat(ch.place(s, d, 16, "one")).isTrue();
                for (int k = 0; k < 14; k++) {
                    assertThat(ch.place(s, d, 16, "more" + k)).isTrue();
                }
                assertThat(ch.place(s, d, 16, "too many")).as("ring of 16 holds 15").isFalse();
                ch.submit();
                rec.awaitCount(expected + 15);
                assertThat(rec.statuses).doesNotContainKey("too many");
            }
            assertThat(MemorySegment.mismatch(src, 0, 120 * 256, dst, 0, 120 * 256)).isEqualTo(-1);
        }
    }

    @Test
    void copiesLongerThanXfercapAreSplit() {
        try (Rig r = new Rig(1, 64, 12, 256 * 1024)) {
            long before = r.device.descriptorsCompleted(0);
            assertThat(r.ch.slotsFor(100 * 1024)).isEqualTo(25);
            assertThat(r.ch.slotsFor(4096)).isEqualTo(1);
            assertThat(r.ch.slotsFor(4097)).isEqualTo(2);
            assertThat(r.ch.place(r.srcIova + 3, r.dstIova + 1000, 100 * 1024, "big")).isTrue();
            assertThat(r.ch.freeSlots()).isEqualTo(63 - 25);
            r.ch.submit();
            r.rec.awaitCount(1);
            assertThat(r.rec.status("big")).isZero();
            assertThat(r.mismatch(3, 1000, 100 * 1024)).isEqualTo(-1);
            assertThat(r.dst.get(ValueLayout.JAVA_BYTE, 999)).as("byte before the copy untouched").isZero();
            assertThat(r.dst.get(ValueLayout.JAVA_BYTE, 1000 + 100 * 1024)).as("byte after the copy untouched").isZero();
            assertThat(r.device.descriptorsCompleted(0) - before).isEqualTo(25);
            assertThatThrownBy(() -> r.ch.place(r.srcIova, r.dstIova, 64 * 4096, "too big"))
                    .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("descriptors");
        }
    }

    @Test
    void concurrentSubmitters() throws Exception {
        int threads = 4;
        int perThread = 3000;
        int len = 512;
        try (Rig r = new Rig(1, 64, 20, (long) threads * perThread * len)) {
            CountDownLatch done = new CountDownLatch(threads);
            AtomicReference<Throwable> failure = new AtomicReference<>();
            for (int t = 0; t < threads; t++) {
                int id = t;
                Thread.ofPlatform().start(() -> {
                    try {
                        for (int i = 0; i < perThread; i++) {
                            long off = ((long) id * perThread + i) * len;
                            r.placeWaiting(r.ch, off, off, len, id * perThread + i);
                            if ((i & 3) == 3) {
                                r.ch.submit();
                            }
                        }
                        r.ch.submit();
                    } catch (Throwable e) {
                        failure.compareAndSet(null, e);
                    } finally {
                        done.countDown();
                    }
                });
            }
            assertThat(done.await(30, TimeUnit.SECONDS)).as("submitter threads finished").isTrue();
            assertThat(failure.get()).isNull();
            r.rec.awaitCount(threads * perThread);
            assertThat(r.rec.statuses.values()).allMatch(s -> s == 0);
            assertThat(r.mismatch(0, 0, (long) threads * perThread * len)).isEqualTo(-1);
        }
    }

    /** Stall, place four one-descriptor copies, fail the nth processed descriptor, release. */
    private static void failThenRecover(int chanerrBit) {
        try (Rig r = new Rig(1, 16, 20, 1 << 16)) {
            r.faults.stall(true);
            for (int i = 0; i < 4; i++) {
                assertThat(r.ch.place(r.srcIova + i * 1024L, r.dstIova + i * 1024L, 1024, "c" + i)).isTrue();
            }
            r.ch.submit();
            r.faults.failDescriptor(2, chanerrBit);
            r.faults.stall(false);
            r.rec.awaitCount(4);
            assertThat(r.rec.status("c0")).isZero();
            assertThat(r.rec.status("c1")).isEqualTo(chanerrBit);
            assertThat(r.rec.status("c2")).isEqualTo(chanerrBit);
            assertThat(r.rec.status("c3")).isEqualTo(chanerrBit);
            assertThat(r.mismatch(0, 0, 1024)).isEqualTo(-1);
            assertThat(r.dst.get(ValueLayout.JAVA_BYTE, 2048)).as("copy after the failure did not run").isZero();
            // Recovered: later copies succeed, on the same ring, several times around it.
            for (int i = 0; i < 40; i++) {
                r.placeWaiting(r.ch, 8192 + i * 512L, 8192 + i * 512L, 512, "after" + i);
                r.ch.submit();
            }
            r.rec.awaitCount(44);
            for (int i = 0; i < 40; i++) {
                assertThat(r.rec.status("after" + i)).as("status of after%d", i).isZero();
            }
            assertThat(r.mismatch(8192, 8192, 40 * 512)).isEqualTo(-1);
            assertThat(r.rec.duplicates()).isZero();
        }
    }

    /** n copies of len bytes, copy i at offset i * stride of both buffers. */
    private static DmaChannel.Copies copies(Rig r, int n, long len, long stride) {
        return new DmaChannel.Copies() {
            @Override public int count() { return n; }
            @Override public long srcIova(int i) { return r.srcIova + i * stride; }
            @Override public long dstIova(int i) { return r.dstIova + i * stride; }
            @Override public long length(int i) { return len; }
        };
    }

    @Test
    void placeAllPlacesEveryCopyOrNone() {
        try (Rig r = new Rig(1, 16, 12, 1 << 16)) { // 4 KiB descriptors, 15 usable slots
            r.faults.stall(true);
            // 3 copies of 2 descriptors each: 6 slots
            assertThat(r.ch.placeAll(copies(r, 3, 8192, 8192), "unit")).isTrue();
            assertThat(r.ch.freeSlots()).isEqualTo(9);
            // 5 copies of 2: 10 slots, 9 free: nothing placed
            assertThat(r.ch.placeAll(copies(r, 5, 8192, 8192), "too big")).isFalse();
            assertThat(r.ch.freeSlots()).as("a refused unit leaves the ring as it was").isEqualTo(9);
            r.ch.submit();
            r.faults.stall(false);
            r.rec.awaitCondition(() -> r.ch.freeSlots() == 15, () -> "the unit's copies to complete");
            assertThat(r.rec.status("unit")).isZero();
            assertThat(r.rec.status("too big")).as("never placed, never reported").isNull();
            assertThat(r.mismatch(0, 0, 3 * 8192)).isEqualTo(-1);
            assertThatThrownBy(() -> r.ch.placeAll(copies(r, 2, 0, 0), "empty copy"))
                    .isInstanceOf(IllegalArgumentException.class);
            assertThat(r.ch.freeSlots()).isEqualTo(15);
            r.ch.close();
            assertThatThrownBy(() -> r.ch.placeAll(copies(r, 1, 64, 0), "closed"))
                    .isInstanceOf(IllegalStateException.class).hasMessageContaining("closed");
        }
    }

    /**
     * A channel the device breaks for good (it never arms again): what was placed is reported failed once, then
     * place() throws, close() returns. The driver's fallback for a throwing channel is tested against this.
     */
    @Test
    void aBrokenChannelReportsWhatWasPlacedThenRefusesNewCopies() {
        try (Rig r = new Rig(1, 16, 20, 1 << 16)) {
            r.faults.stall(true);
            for (int i = 0; i < 4; i++) {
                assertThat(r.ch.place(r.srcIova + i * 1024L, r.dstIova + i * 1024L, 1024, "c" + i)).isTrue();
            }
            r.ch.submit();
            r.faults.breakAfter(0, 2, IoatSpec.CHANERR_DEST_ADDR);
            r.faults.stall(false);
            r.rec.awaitCount(4); // after the driver's re-arm has timed out (2 s)
            assertThat(r.faults.isBroken(0)).isTrue();
            assertThat(r.rec.status("c0")).isZero();
            for (int i = 1; i < 4; i++) {
                assertThat(r.rec.status("c" + i)).as("status of c%d", i).isEqualTo(IoatSpec.CHANERR_DEST_ADDR);
            }
            assertThatThrownBy(() -> r.ch.place(r.srcIova, r.dstIova, 64, "late"))
                    .isInstanceOf(IllegalStateException.class).hasMessageContaining("could not recover from a halt");
            assertThat(r.rec.status("late")).as("a refused copy is never reported").isNull();
        }
    }

    @Test
    void sourceAddressErrorRecovers() {
        failThenRecover(IoatSpec.CHANERR_SRC_ADDR);
    }

    @Test
    void destinationAddressErrorRecovers() {
        failThenRecover(IoatSpec.CHANERR_DEST_ADDR);
    }

    @Test
    void lengthErrorRecovers() {
        failThenRecover(IoatSpec.CHANERR_LENGTH);
    }

    @Test
    void unmappedIovasHaltWithTheRightCauseAndRecover() {
        try (Rig r = new Rig(1, 16, 20, 1 << 16)) {
            long unmapped = r.dstIova + (1 << 16) + 64; // in the guard gap
            r.faults.stall(true);
            assertThat(r.ch.place(r.srcIova, r.dstIova, 100, "ok")).isTrue();
            assertThat(r.ch.place(r.srcIova, unmapped, 100, "bad dst")).isTrue();
            assertThat(r.ch.place(r.srcIova, r.dstIova + 200, 100, "after")).isTrue();
            r.ch.submit();
            r.faults.stall(false);
            r.rec.awaitCount(3);
            assertThat(r.rec.status("ok")).isZero();
            assertThat(r.rec.status("bad dst")).isEqualTo(IoatSpec.CHANERR_DEST_ADDR);
            assertThat(r.rec.status("after")).isEqualTo(IoatSpec.CHANERR_DEST_ADDR);

            assertThat(r.copyAlone(0x10, r.dstIova, 100, "bad src")).isEqualTo(IoatSpec.CHANERR_SRC_ADDR);

            // A copy running off the end of its buffer is a source fault too.
            assertThat(r.copyAlone(r.srcIova + (1 << 16) - 10, r.dstIova, 100, "overrun")).isEqualTo(IoatSpec.CHANERR_SRC_ADDR);

            assertThat(r.copyAlone(r.srcIova + 500, r.dstIova + 500, 300, "fine")).isZero();
            assertThat(r.mismatch(500, 500, 300)).isEqualTo(-1);
        }
    }

    @Test
    void haltWhileWorkIsQueuedFailsItAndRecovers() {
        try (Rig r = new Rig(1, 16, 20, 1 << 16)) {
            r.faults.stall(true);
            assertThat(r.ch.place(r.srcIova, r.dstIova, 100, "a")).isTrue();
            assertThat(r.ch.place(r.srcIova, r.dstIova + 100, 100, "b")).isTrue();
            r.ch.submit();
            r.faults.halt(IoatSpec.CHANERR_CHIPSET_UNCORRECTABLE_DATA_INTEGRITY);
            r.rec.awaitCount(2);
            assertThat(r.rec.status("a")).isEqualTo(IoatSpec.CHANERR_CHIPSET_UNCORRECTABLE_DATA_INTEGRITY);
            assertThat(r.rec.status("b")).isEqualTo(IoatSpec.CHANERR_CHIPSET_UNCORRECTABLE_DATA_INTEGRITY);
            r.faults.stall(false);
            assertThat(r.copyAlone(r.srcIova + 7, r.dstIova + 7, 1000, "c")).isZero();
            assertThat(r.mismatch(7, 7, 1000)).isEqualTo(-1);
        }
    }

    @Test
    void haltWhileIdleLosesNothingAndRecovers() {
        try (Rig r = new Rig(1, 8, 20, 1 << 16)) {
            for (int i = 0; i < 5; i++) {
                assertThat(r.ch.place(r.srcIova, r.dstIova, 64, i)).isTrue();
            }
            r.ch.submit();
            r.rec.awaitCount(5);
            r.faults.halt(IoatSpec.CHANERR_SOFT);
            // Copies placed before the driver notices the halt would be failed with it (the contract); wait for re-arm.
            long chansts = IoatSpec.channelBase(0) + IoatSpec.CHANSTS;
            r.rec.awaitCondition(() -> (r.device.read64(chansts) & IoatSpec.CHANSTS_STATUS_MASK) == IoatSpec.CHANSTS_ARMED,
                    () -> "the driver to re-arm the halted channel, CHANSTS 0x" + Long.toHexString(r.device.read64(chansts)));
            for (int i = 5; i < 30; i++) {
                r.placeWaiting(r.ch, i * 64L, i * 64L, 64, i);
                r.ch.submit();
            }
            r.rec.awaitCount(30);
            assertThat(r.rec.statuses.values()).allMatch(s -> s == 0);
            assertThat(r.mismatch(5 * 64, 5 * 64, 25 * 64)).isEqualTo(-1);
        }
    }

    @Test
    void splitCopyFailingHalfwayIsReportedOnceAsFailed() {
        try (Rig r = new Rig(1, 32, 12, 1 << 16)) {
            r.faults.failDescriptor(3, IoatSpec.CHANERR_DEST_ADDR);
            assertThat(r.ch.place(r.srcIova, r.dstIova, 5 * 4096, "split")).isTrue();
            assertThat(r.ch.place(r.srcIova, r.dstIova + 40_000, 4096, "next")).isTrue();
            r.ch.submit();
            r.rec.awaitCount(2);
            assertThat(r.rec.status("split")).isEqualTo(IoatSpec.CHANERR_DEST_ADDR);
            assertThat(r.rec.status("next")).isEqualTo(IoatSpec.CHANERR_DEST_ADDR);
            assertThat(r.mismatch(0, 0, 2 * 4096)).as("first two chunks were copied").isEqualTo(-1);
            assertThat(r.dst.get(ValueLayout.JAVA_BYTE, 2 * 4096)).as("third chunk failed").isZero();
            assertThat(r.copyAlone(r.srcIova, r.dstIova, 5 * 4096, "again")).isZero();
            assertThat(r.mismatch(0, 0, 5 * 4096)).isEqualTo(-1);
        }
    }

    @Test
    void stallHoldsWorkUntilReleased() {
        try (Rig r = new Rig(1, 16, 20, 1 << 16)) {
            long before = r.device.descriptorsCompleted(0);
            r.faults.stall(true);
            for (int i = 0; i < 10; i++) {
                assertThat(r.ch.place(r.srcIova + i * 100L, r.dstIova + i * 100L, 100, i)).isTrue();
            }
            r.ch.submit();
            assertThat(r.device.descriptorsCompleted(0)).as("a stalled engine processes nothing").isEqualTo(before);
            assertThat(r.rec.count()).isZero();
            assertThat(r.ch.freeSlots()).isEqualTo(5);
            r.faults.stall(false);
            r.rec.awaitCount(10);
            assertThat(r.rec.statuses.values()).allMatch(s -> s == 0);
            assertThat(r.mismatch(0, 0, 1000)).isEqualTo(-1);
        }
    }

    @Test
    void listenerMayPlaceAndSubmitFromTheCompletionThread() {
        try (Rig r = new Rig(1, 8, 20, 1 << 16)) {
            AtomicInteger chained = new AtomicInteger();
            Recorder rec = r.rec;
            r.engine.onCompletion((ctx, status) -> {
                rec.completed(ctx, status);
                int n = chained.incrementAndGet();
                if (n < 200) {
                    long off = (n * 64L) % (1 << 16);
                    if (!r.ch.place(r.srcIova + off, r.dstIova + off, 64, n)) {
                        throw new AssertionError("ring full inside listener");
                    }
                    r.ch.submit();
                }
            });
            assertThat(r.ch.place(r.srcIova, r.dstIova, 64, 0)).isTrue();
            r.ch.submit();
            r.rec.awaitCount(200);
            assertThat(r.mismatch(0, 0, 200 * 64)).isEqualTo(-1);
        }
    }

    @Test
    void pollReapsWithoutWaitingForTheInterruptAndCloseDrains() {
        Recorder rec = new Recorder();
        List<Integer> polled = new ArrayList<>();
        try (Rig r = new Rig(2, 16, 20, 1 << 16)) {
            r.engine.onCompletion(rec);
            DmaChannel ch1 = r.engine.channel(1);
            assertThat(ch1.index()).isEqualTo(1);
            for (int i = 0; i < 10; i++) {
                assertThat(ch1.place(r.srcIova + i * 64L, r.dstIova + i * 64L, 64, i)).isTrue();
            }
            ch1.submit();
            rec.awaitCondition(() -> {
                polled.add(ch1.poll());
                return rec.count() == 10;
            }, () -> "10 completions on channel 1");
            assertThat(polled.stream().mapToInt(Integer::intValue).sum()).isBetween(0, 10);
            for (int i = 10; i < 20; i++) {
                assertThat(ch1.place(r.srcIova + i * 64L, r.dstIova + i * 64L, 64, i)).isTrue();
            }
            ch1.close(); // submits and drains
            assertThat(rec.count()).isEqualTo(20);
            assertThat(rec.statuses.values()).allMatch(s -> s == 0);
            assertThat(r.mismatch(0, 0, 20 * 64)).isEqualTo(-1);
            assertThatThrownBy(() -> ch1.place(r.srcIova, r.dstIova, 64, "late")).isInstanceOf(IllegalStateException.class);
            ch1.close(); // idempotent
        }
    }

    @Test
    void multipleChannelsCopyIndependently() {
        try (Rig r = new Rig(4, 16, 20, 1 << 16)) {
            for (int c = 0; c < 4; c++) {
                DmaChannel ch = r.engine.channel(c);
                for (int i = 0; i < 50; i++) {
                    long off = (c * 50L + i) * 64;
                    r.placeWaiting(ch, off, off, 64, c * 1000 + i);
                    ch.submit();
                }
            }
            r.rec.awaitCount(200);
            assertThat(r.mismatch(0, 0, 200 * 64)).isEqualTo(-1);
            assertThat(r.device.engineCpuTimeNanos()).isPositive();
            for (int c = 0; c < 4; c++) {
                assertThat(r.device.descriptorsCompleted(c)).isEqualTo(51);
            }
        }
    }

    @Test
    void closedStatusForCopiesTheDeviceNeverRuns() {
        IovaSpace space = new IovaSpace();
        Recorder rec = new Recorder();
        try (Arena arena = Arena.ofShared()) {
            MemorySegment buf = arena.allocate(4096);
            long iova = space.map(buf);
            SoftIoatDevice dev = new SoftIoatDevice(space, 1, 20);
            IoatChannel ch = new IoatChannel(dev, 0, space, dev.interrupt(0), 8);
            ch.listener(rec);
            ch.closeTimeout(Duration.ofMillis(200));
            int regionsWithRing = space.regions();
            // A device that stops answering (engine thread gone) never completes anything.
            dev.close();
            assertThat(ch.place(iova, iova + 2048, 100, "orphan")).isTrue();
            ch.submit();
            long start = System.nanoTime();
            ch.close();
            assertThat(rec.status("orphan")).isEqualTo(DmaCompletionListener.STATUS_CLOSED);
            assertThat(space.regions()).as("ring and completion word unmapped").isEqualTo(regionsWithRing - 2);
            assertThat(System.nanoTime() - start).as("close is bounded").isLessThan(TimeUnit.SECONDS.toNanos(20));
        }
    }

    /** Registers of a device that went away, as VfioUserMmio answers them: reads all ones, writes dropped. */
    private static final class VanishingMmio extends ForwardingMmio {
        volatile boolean gone;

        VanishingMmio(Mmio inner) {
            super(inner);
        }

        @Override public int read8(long o) { return gone ? 0xff : inner.read8(o); }
        @Override public int read16(long o) { return gone ? 0xffff : inner.read16(o); }
        @Override public int read32(long o) { return gone ? -1 : inner.read32(o); }
        @Override public long read64(long o) { return gone ? -1L : inner.read64(o); }
        @Override public void write8(long o, int v) { if (!gone) inner.write8(o, v); }
        @Override public void write16(long o, int v) { if (!gone) inner.write16(o, v); }
        @Override public void write32(long o, int v) { if (!gone) inner.write32(o, v); }
        @Override public void write64(long o, long v) { if (!gone) inner.write64(o, v); }
    }

    /**
     * A device that halts a channel as it goes away (a vfio-user device unmapping the ring on its way out) and then
     * answers no register: the reaper that finds the halt reads CHANERR as all ones. That is the device gone, not
     * a cause: the copies after the halt are reported once, as lost, without waiting out a reset of registers that
     * answer nothing; the engine's own deviceLost afterwards finds nothing left to report.
     */
    @Test
    void aHaltWhoseCauseReadsAllOnesReportsTheRestOnceAsDeviceLost() {
        IovaSpace space = new IovaSpace();
        io.pmemblk.dma.testing.InjectedFaults faults = new io.pmemblk.dma.testing.InjectedFaults();
        Recorder rec = new Recorder();
        try (Arena arena = Arena.ofShared();
             SoftIoatDevice dev = new SoftIoatDevice(space, 1, 20, faults)) {
            faults.attach(dev);
            MemorySegment buf = arena.allocate(1 << 16, 4096);
            long iova = space.map(buf);
            VanishingMmio bar = new VanishingMmio(dev);
            IoatChannel ch = new IoatChannel(bar, 0, space, dev.interrupt(0), 16);
            ch.listener(rec);
            faults.stall(0, true);
            for (int i = 0; i < 8; i++) {
                assertThat(ch.place(iova + i * 1024L, iova + 32768 + i * 1024L, 1024, i)).isTrue();
            }
            ch.submit();
            bar.gone = true;
            faults.failDescriptor(0, 3, IoatSpec.CHANERR_NEXT_ADDR); // two copies done, then the halt
            faults.stall(0, false);
            rec.awaitCount(8); // bounded; fails on a second report of any ctx
            for (int i = 0; i < 8; i++) {
                assertThat(rec.status(i)).as("status of copy %d", i)
                        .isEqualTo(i < 2 ? 0 : DmaCompletionListener.STATUS_DEVICE_LOST);
            }
            assertThat(ch.deviceGone()).isTrue();
            assertThatThrownBy(() -> ch.place(iova, iova + 32768, 64, "late")).isInstanceOf(IllegalStateException.class);
            assertThat(ch.deviceLost(DmaCompletionListener.STATUS_DEVICE_LOST, "the engine saw it too")).isZero();
            ch.closeTimeout(Duration.ZERO);
            ch.close();
            assertThat(rec.count()).isEqualTo(8);
            assertThat(rec.duplicates()).isZero();
        }
    }
}
