package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.ForwardingBlockDriver;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.testing.Waits;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import io.pmemblk.pmem.CrashModel;
import io.pmemblk.pmem.PmemRegion;

import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.UnaryOperator;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Writers on every queue race checkpoints, half their writes received straight into the device: each block is
 * written once, so each must be in exactly one bitmap of the chain (the frozen ones as they were when their checkpoint returned, and the active one at the end), and a
 * frozen bitmap never changes after its checkpoint returned.
 */
class CheckpointRaceTest {
    private static final int QUEUES = 4, BLOCK = 4096, BATCH = 8;
    private static final long SIZE = 64 << 20;
    private static final int BLOCKS = (int) (SIZE / BLOCK);

    @TempDir
    Path dir;

    private static BitSet bits(BitmapFile f) {
        BitSet s = new BitSet();
        for (long b = 0; b < f.blocks(); b++) {
            if (f.dirty(b)) s.set((int) b);
        }
        return s;
    }

    @Test
    void everyWriteIsInExactlyOneBitmapAndAFrozenBitmapNeverChanges() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, BLOCK, List.of("b"), QUEUES)) {
            AtomicReference<Throwable> failed = new AtomicReference<>();
            List<Thread> writers = new ArrayList<>();
            for (int q = 0; q < QUEUES; q++) {
                int queue = q;
                writers.add(Thread.ofPlatform().name("writer-" + q).start(() -> {
                    List<Integer> mine = new ArrayList<>();
                    for (int b = queue; b < BLOCKS; b += QUEUES) mine.add(b);
                    Collections.shuffle(mine, new Random(queue));
                    Op[] ops = new Op[BATCH];
                    java.util.Arrays.fill(ops, Op.WRITE);
                    long[] offsets = new long[BATCH];
                    FrontendQueue frontend = new FrontendQueue(d.layer.queue(queue));
                    try {
                        for (int i = 0; i < mine.size(); i += BATCH) {
                            for (int k = 0; k < BATCH; k++) offsets[k] = (long) mine.get(i + k) * BLOCK;
                            if ((i / BATCH) % 2 == 0) {
                                d.batch(queue, ops, offsets, BLOCK, (byte) 7);
                            } else {
                                inPlace(frontend, offsets); // marked when received, not at dispatch
                            }
                        }
                    } catch (Throwable t) {
                        failed.compareAndSet(null, t);
                    }
                }));
            }
            List<String> frozen = new ArrayList<>();
            List<BitSet> atFreeze = new ArrayList<>();
            while (writers.stream().anyMatch(Thread::isAlive)) {
                String f = d.bitmaps.checkpoint("b");
                frozen.add(f);
                atFreeze.add(bits(d.bitmaps.find(f)));
            }
            for (Thread t : writers) Waits.join("writer", t);
            assertThat(failed.get()).as("a writer failed").isNull();
            assertThat(frozen).as("checkpoints taken while the writers ran").hasSizeGreaterThan(2);

            BitSet seen = new BitSet();
            for (int i = 0; i < frozen.size(); i++) {
                BitSet now = bits(d.bitmaps.find(frozen.get(i)));
                assertThat(now).as(frozen.get(i) + " changed after its checkpoint returned").isEqualTo(atFreeze.get(i));
                BitSet both = (BitSet) seen.clone();
                both.and(now);
                assertThat(both).as("blocks in " + frozen.get(i) + " and an earlier bitmap").isEqualTo(new BitSet());
                seen.or(now);
            }
            BitSet last = bits(d.bitmaps.find("b"));
            BitSet both = (BitSet) seen.clone();
            both.and(last);
            assertThat(both).as("blocks in the active bitmap and a frozen one").isEqualTo(new BitSet());
            seen.or(last);
            BitSet missing = new BitSet();
            missing.set(0, BLOCKS);
            missing.andNot(seen);
            assertThat(missing).as("blocks written but in no bitmap").isEqualTo(new BitSet());
        }
    }

    /** Writes of BLOCK bytes at {@code offsets}, received straight into the device, as one batch; completed inline. */
    private static void inPlace(FrontendQueue frontend, long[] offsets) throws InterruptedException {
        Request[] rs = new Request[offsets.length];
        AtomicInteger ok = new AtomicInteger();
        for (int k = 0; k < offsets.length; k++) {
            Request r = frontend.acquireWrite(offsets[k], BLOCK);
            if (!r.dataInPlace) throw new AssertionError(r + " was not received in place");
            receive(r);
            r.completion = req -> {
                if (req.status() == 0) ok.incrementAndGet();
            };
            frontend.add(r);
            rs[k] = r;
        }
        frontend.dispatch();
        if (ok.get() != offsets.length) {
            throw new AssertionError(ok.get() + " of " + offsets.length + " in-place writes completed inline with OK");
        }
        for (Request r : rs) r.release();
    }

    /** The payload, as a frontend's read from its socket puts it: straight into the device range. */
    private static void receive(Request r) {
        ByteBuffer[] bufs = r.dataBuffers();
        for (int i = 0; i < r.dataBufferCount(); i++) {
            while (bufs[i].hasRemaining()) bufs[i].put((byte) 7);
        }
    }

    private static boolean waitingIn(Thread t, Class<?> c, String method) {
        return java.util.Arrays.stream(t.getStackTrace())
                .anyMatch(f -> f.getClassName().equals(c.getName()) && f.getMethodName().equals(method));
    }

    /** Runs {@code checkpoint} of "b" on a thread of its own; its result or failure lands in the references. */
    private static Thread checkpoint(TrackedDevice d, AtomicReference<String> frozen, AtomicReference<Throwable> failed) {
        return Thread.ofPlatform().name("checkpoint").start(() -> {
            try {
                frozen.set(d.bitmaps.checkpoint("b"));
            } catch (Throwable t) {
                failed.set(t);
            }
        });
    }

    /**
     * A write whose payload is being received straight into the device when a checkpoint starts was marked in
     * the bitmap the checkpoint freezes: it must be in that one alone (not marked again in the successor at its
     * dispatch), and the checkpoint must wait for it, since its data lands after the freeze.
     */
    @Test
    void aWriteReceivedInPlaceAcrossACheckpointIsInTheFrozenBitmapAlone() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, BLOCK, List.of("b"), 1)) {
            FrontendQueue frontend = new FrontendQueue(d.layer.queue(0));
            Request r = frontend.acquireWrite(5L * BLOCK, BLOCK);
            assertThat(r.dataInPlace).as("the CPU route receives in place").isTrue();
            AtomicReference<String> frozen = new AtomicReference<>();
            AtomicReference<Throwable> failed = new AtomicReference<>();
            Thread checkpoint = checkpoint(d, frozen, failed);
            Waits.await("the checkpoint to wait for the write or return", () -> frozen.get() != null
                    || failed.get() != null || waitingIn(checkpoint, WriteMarker.class, "awaitWrites"));
            assertThat(frozen.get()).as("checkpoint returned while a write received in place was in flight").isNull();
            receive(r);
            AtomicInteger status = new AtomicInteger(-1);
            r.completion = req -> status.set(req.status());
            frontend.add(r);
            frontend.dispatch();
            Waits.join("checkpoint", checkpoint);
            assertThat(failed.get()).isNull();
            assertThat(status.get()).isZero();
            r.release();
            assertThat(d.bitmaps.find(frozen.get()).dirty(5)).as("in the bitmap it marked, now frozen").isTrue();
            assertThat(d.bitmaps.find("b").dirty(5)).as("a write received in place across a checkpoint is in its"
                    + " successor too").isFalse();
        }
    }

    /** A write received in place whose payload never came (the client vanished) holds no checkpoint back. */
    @Test
    void aWriteReceivedInPlaceButNeverDispatchedDoesNotHoldACheckpoint() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, BLOCK, List.of("b"), 1, UnaryOperator.identity(),
                TimeUnit.SECONDS.toNanos(2))) {
            FrontendQueue frontend = new FrontendQueue(d.layer.queue(0));
            frontend.acquireWrite(5L * BLOCK, BLOCK);
            assertThat(frontend.releaseUndispatched()).isEqualTo(1); // the reader's teardown
            assertThat(d.bitmaps.checkpoint("b")).isEqualTo("b@1");
            assertThat(d.bitmaps.find("b@1").dirty(5)).as("marked when received: part of it may have landed").isTrue();
            assertThat(d.bitmaps.find("b").dirty(5)).isFalse();
        }
    }

    /**
     * A write the device has not completed when a checkpoint starts: the checkpoint returns only after it, and
     * the write is in the frozen bitmap alone.
     */
    @Test
    void aCheckpointWaitsForTheDevicesCompletionOfTheWritesItFroze() throws Exception {
        try (TrackedDevice d = TrackedDevice.holding(dir, SIZE, BLOCK, r -> r.offset == 7L * BLOCK,
                DirtyBitmaps.SETTLE)) {
            HeldCompletions device = d.held();
            AtomicInteger status = new AtomicInteger(-1);
            d.start(0, Op.WRITE, 7L * BLOCK, BLOCK, (byte) 1, r -> status.set(r.status()));
            assertThat(device.held()).isEqualTo(1);
            AtomicReference<String> frozen = new AtomicReference<>();
            AtomicReference<Throwable> failed = new AtomicReference<>();
            Thread checkpoint = checkpoint(d, frozen, failed);
            Waits.await("the checkpoint to wait for the write or return", () -> frozen.get() != null
                    || failed.get() != null || waitingIn(checkpoint, WriteMarker.class, "awaitWrites"));
            assertThat(frozen.get()).as("checkpoint returned while the device had not completed a write it froze")
                    .isNull();
            device.release();
            Waits.join("checkpoint", checkpoint);
            assertThat(failed.get()).isNull();
            assertThat(status.get()).isZero();
            assertThat(d.bitmaps.find(frozen.get()).dirty(7)).isTrue();
            assertThat(d.bitmaps.find("b").dirty(7)).isFalse();
        }
    }

    /**
     * A device that never completes a write: the checkpoint gives up within its bound, naming the write, and
     * leaves the bitmap as it was: active, nothing frozen, and holding the writes that marked the successor
     * meanwhile (merged back). Once the write completes, a checkpoint goes through.
     */
    @Test
    void aCheckpointGivesUpOnAWriteTheDeviceNeverCompletesAndUndoesItself() throws Exception {
        try (TrackedDevice d = TrackedDevice.holding(dir, SIZE, BLOCK, r -> r.offset == 7L * BLOCK,
                TimeUnit.SECONDS.toNanos(3))) {
            HeldCompletions device = d.held();
            d.start(0, Op.WRITE, 7L * BLOCK, BLOCK, (byte) 1, r -> {});
            d.write(3L * BLOCK, BLOCK);
            AtomicReference<String> frozen = new AtomicReference<>();
            AtomicReference<Throwable> failed = new AtomicReference<>();
            Thread checkpoint = checkpoint(d, frozen, failed);
            Waits.await("the checkpoint to wait for the write or return", () -> frozen.get() != null
                    || failed.get() != null || waitingIn(checkpoint, WriteMarker.class, "awaitWrites"));
            d.write(9L * BLOCK, BLOCK); // marks the successor
            Waits.join("checkpoint", checkpoint);
            assertThat(frozen.get()).as("a checkpoint with a write stuck on the device").isNull();
            assertThat(failed.get()).isInstanceOf(java.io.IOException.class).hasMessageStartingWith(
                    "checkpoint 'b' gave up: 1 write marked before it still in flight (queue 0 tag ")
                    .hasMessageContaining(": WRITE of 4096 bytes at 28672 (on the device))");
            assertThat(d.bitmaps.names()).as("nothing frozen").containsExactly("b");
            BitSet b = bits(d.bitmaps.find("b"));
            assertThat(b.stream().boxed().toList()).as("the bitmap as it was, with the successor's writes merged back")
                    .containsExactly(3, 7, 9);
            assertThat(dir.resolve("d.img.bitmaps/b.next")).as("the successor removed").doesNotExist();
            device.release();
            assertThat(d.bitmaps.checkpoint("b")).isEqualTo("b@1");
            assertThat(bits(d.bitmaps.find("b@1")).stream().boxed().toList()).containsExactly(3, 7, 9);
        }
    }

    /**
     * A writer stopped between persisting its bit in the bitmap and reaching the device (where a preempted thread
     * could be) while a checkpoint runs: the checkpoint must not return before that write completes, or a backup
     * reading the frozen bitmap at once could copy the block before the write lands, and the successor would not
     * have it either.
     */
    @Test
    void aCheckpointReturnsOnlyOnceTheWritesItFrozeHaveCompleted() throws Exception {
        java.util.Map<Path, CrashModel> models = new java.util.concurrent.ConcurrentHashMap<>();
        BitmapDirectory files = BitmapDirectory.open(dir.resolve("d.img.bitmaps"), "bitmap.dir", (p, size) -> {
            CrashModel.Modelled m = CrashModel.open(p, size, PmemRegion.Mapper.JAVA);
            models.put(p, m.model());
            return m.region();
        });
        PmemRegion region = PmemRegion.open(dir.resolve("d.img"), SIZE, false, PmemRegion.Mapper.JAVA);
        // Under the tracking layer: the write's data held on its way to the device, after its bit is persisted and
        // its marking ended, so that a checkpoint that does not wait for it returns before the data lands.
        CountDownLatch dataHeld = new CountDownLatch(1), dataRelease = new CountDownLatch(1);
        UnaryOperator<BlockDriver> holdData = pmem -> new ForwardingBlockDriver(pmem) {
            @Override
            public void queueRequests(int hwq, Request[] batch, int count) {
                for (int i = 0; i < count; i++) {
                    if (batch[i].op == Op.WRITE && batch[i].offset == 5L * BLOCK) {
                        dataHeld.countDown();
                        try {
                            dataRelease.await(Waits.BOUND.toSeconds(), TimeUnit.SECONDS);
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                    }
                }
                super.queueRequests(hwq, batch, count);
            }
        };
        try (TrackedDevice d = new TrackedDevice(region, files, BLOCK, List.of("b"), 1, holdData, DirtyBitmaps.SETTLE)) {
            AtomicBoolean armed = new AtomicBoolean(true);
            CountDownLatch held = new CountDownLatch(1), release = new CountDownLatch(1);
            models.get(dir.resolve("d.img.bitmaps/b.pbm")).afterEachStep(() -> {
                if (armed.compareAndSet(true, false)) {
                    held.countDown();
                    try {
                        release.await(Waits.BOUND.toSeconds(), TimeUnit.SECONDS);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                }
            });
            AtomicInteger order = new AtomicInteger();
            AtomicInteger writeDone = new AtomicInteger(), checkpointDone = new AtomicInteger();
            AtomicReference<Throwable> failed = new AtomicReference<>();
            Thread writer = Thread.ofPlatform().name("writer").start(() -> {
                try {
                    d.write(5L * BLOCK, BLOCK);
                    writeDone.set(order.incrementAndGet());
                } catch (Throwable t) {
                    failed.set(t);
                }
            });
            assertThat(held.await(Waits.BOUND.toSeconds(), TimeUnit.SECONDS)).as("writer persisted its bit").isTrue();
            AtomicReference<String> frozen = new AtomicReference<>();
            AtomicBoolean landedAtReturn = new AtomicBoolean();
            Thread checkpoint = Thread.ofPlatform().name("checkpoint").start(() -> {
                try {
                    frozen.set(d.bitmaps.checkpoint("b"));
                    checkpointDone.set(order.incrementAndGet());
                    // what a backup reading the frozen bitmap at once would copy: the write's data must be there
                    landedAtReturn.set(region.memory().asSlice(5L * BLOCK, BLOCK).elements(java.lang.foreign.ValueLayout.JAVA_BYTE)
                            .allMatch(b -> b.get(java.lang.foreign.ValueLayout.JAVA_BYTE, 0) == (byte) 0x5a));
                } catch (Throwable t) {
                    failed.set(t);
                }
            });
            // until the checkpoint waits for the grace period, or (wrongly) returns without waiting
            Waits.await("the checkpoint to wait for the write or return", () -> checkpointDone.get() != 0
                    || java.util.Arrays.stream(checkpoint.getStackTrace())
                            .anyMatch(f -> f.getClassName().equals(Grace.class.getName()) && f.getMethodName().equals("await")));
            assertThat(checkpointDone.get()).as("checkpoint returned while the write it froze was in flight").isZero();
            release.countDown();
            // the bit is persisted and the marking over; the write's data is still on its way to the device
            assertThat(dataHeld.await(Waits.BOUND.toSeconds(), TimeUnit.SECONDS)).as("the write's data on its way").isTrue();
            Waits.await("the checkpoint to wait for the write's data or return", () -> checkpointDone.get() != 0
                    || java.util.Arrays.stream(checkpoint.getStackTrace())
                            .anyMatch(f -> f.getClassName().equals(WriteMarker.class.getName())
                                    && f.getMethodName().equals("awaitWrites")));
            assertThat(checkpointDone.get()).as("checkpoint returned while the data of a write it froze was on its way")
                    .isZero();
            dataRelease.countDown();
            Waits.join("writer", writer);
            Waits.join("checkpoint", checkpoint);
            assertThat(failed.get()).isNull();
            // The record ends when the write reaches the device, before the frontend hears of it: the checkpoint may
            // return before d.write does, never before the data is in the device
            assertThat(writeDone.get()).as("the write completed").isPositive();
            assertThat(landedAtReturn.get()).as("the write's data in the device when the checkpoint returned").isTrue();
            assertThat(d.bitmaps.find(frozen.get()).dirty(5)).isTrue();
            assertThat(d.bitmaps.find("b").dirty(5)).isFalse();
        }
    }
}
