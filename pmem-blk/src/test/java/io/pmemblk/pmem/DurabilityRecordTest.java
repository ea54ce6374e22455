package io.pmemblk.pmem;

import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.Waits;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Durability asserted from the record of persistence steps, not from reading data back (which the page cache
 * would answer whether or not anything was persisted). Every test runs on both mappers; the surefire execution
 * {@code forced-pmem} runs them again with PMEM_IS_PMEM_FORCE=1, where the libpmem mapper takes the real-pmem
 * branches (non-temporal copies, write-backs, drains).
 */
class DurabilityRecordTest {
    static final long SIZE = 64L << 20;
    static final boolean FORCED = "1".equals(System.getenv("PMEM_IS_PMEM_FORCE"));

    @TempDir
    Path dir;
    RecordingPersistence rec;
    PmemBlockDriver driver;
    BlockLayer layer;
    long base;
    final AtomicLong ids = new AtomicLong();
    final BlockingQueue<Integer> statuses = new ArrayBlockingQueue<>(100_000);

    void open(PmemRegion.Mapper mapper, int queues, DmaEngine engine, Routing routing) throws IOException {
        EachMapper.Assume.available(mapper);
        PmemRegion region = RegionFile.open(dir.resolve("d.img"), SIZE, false, mapper, true,
                p -> rec = new RecordingPersistence(p));
        base = region.memory().address();
        driver = new PmemBlockDriver(region, new CopyStats(), engine, routing);
        layer = new BlockLayer(driver, queues, 16, 8 << 20, 1 << 20);
        boolean pmem = mapper == PmemRegion.Mapper.LIBPMEM && FORCED;
        assertThat(region.isPmem()).as("the pmem branches run exactly when forced on the libpmem mapper").isEqualTo(pmem);
    }

    @AfterEach
    void close() throws Exception {
        Closing.closeAll(driver, layer);
    }

    /** Acquires, fills (random bytes for WRITE) and dispatches one request; its ack is recorded and it is released. */
    void submit(HardwareQueue q, Op op, long off, long len, boolean fua, int seed) throws InterruptedException {
        Request r = q.acquire(op == Op.WRITE ? (int) len : 0);
        r.op = op;
        r.offset = off;
        r.length = len;
        r.fua = fua;
        r.cookie = ids.incrementAndGet();
        r.completion = this::acknowledge;
        if (op == Op.WRITE) {
            SeededBytes.fill(r, seed);
        }
        rec.submitted(r, base);
        q.dispatch(new Request[]{r}, 1);
    }

    private void acknowledge(Request r) {
        rec.acknowledged(r, base);
        int status = r.status();
        r.release();
        statuses.add(status);
    }

    List<Integer> await(int n) throws InterruptedException {
        return Waits.take("completion", statuses, n, Duration.ofSeconds(30));
    }

    DurabilityCheck.Checked verify() {
        return new DurabilityCheck(rec.events(), rec.flushesCaches()).verify();
    }

    /** Submits request i of queue qi's thread, drawing what it needs from that thread's Random (seeded qi). */
    interface PerRequest {
        void submit(int qi, int i, Random rnd) throws Exception;
    }

    /**
     * Submits perThread requests on each queue in [first, last], one platform thread per queue, and awaits them all
     * answered OK; rethrows the first failure of a thread.
     */
    void submitFromThreads(int first, int last, int perThread, PerRequest body) throws InterruptedException {
        AtomicReference<Throwable> failure = new AtomicReference<>();
        List<Thread> threads = new ArrayList<>();
        for (int qi = first; qi <= last; qi++) {
            int q = qi;
            threads.add(Thread.ofPlatform().start(() -> {
                try {
                    Random rnd = new Random(q);
                    for (int i = 0; i < perThread; i++) {
                        body.submit(q, i, rnd);
                    }
                } catch (Throwable t) {
                    failure.compareAndSet(null, t);
                }
            }));
        }
        for (Thread t : threads) {
            t.join(120_000);
            assertThat(t.isAlive()).as("worker finished within 120 s").isFalse();
        }
        if (failure.get() != null) {
            throw new AssertionError("worker failed", failure.get());
        }
        assertThat(await((last - first + 1) * perThread)).containsOnly(Status.OK);
    }

    /** A FLUSH on queue 0, answered OK: what it covers is then in the record for {@link #verify}. */
    void flush() throws InterruptedException {
        submit(layer.queue(0), Op.FLUSH, 0, 0, false, 0);
        assertThat(await(1)).containsOnly(Status.OK);
    }

    @EachMapper
    void fuaWritesZeroesAndTrimsFromSeveralQueuesArePersistedBeforeTheirAck(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, 3, null, Routing.CPU_ONLY);
        int perThread = 60;
        submitFromThreads(0, 2, perThread, (qi, i, rnd) -> {
            long area = qi * (SIZE / 3);
            long off = area + rnd.nextInt((int) (SIZE / 3 - (3 << 20)));
            int pick = rnd.nextInt(10);
            Op op = pick < 6 ? Op.WRITE : pick < 8 ? Op.WRITE_ZEROES : pick < 9 ? Op.TRIM : Op.FLUSH;
            long len = op == Op.WRITE ? 1 + rnd.nextInt(300_000) : op == Op.FLUSH ? 0 : 1 + rnd.nextInt(3 << 20);
            submit(layer.queue(qi), op, op == Op.FLUSH ? 0 : off, len, rnd.nextBoolean(), qi * 1000 + i);
        });
        DurabilityCheck.Checked c = verify();
        assertThat(c.fuaWrites()).as("FUA writes checked").isGreaterThan(30);
        assertThat(c.flushes()).as("FLUSHes checked").isPositive();
    }

    /** CAN_MULTI_CONN: a FLUSH on one queue covers writes acknowledged on the others, by other threads. */
    @EachMapper
    void aFlushOnOneQueueCoversWritesAcknowledgedOnOtherQueuesAndThreads(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, 4, null, Routing.CPU_ONLY);
        int perThread = 40;
        submitFromThreads(1, 3, perThread, (qi, i, rnd) -> {
            long off = (long) qi * (16 << 20) + (long) i * 300_000;
            Op op = i % 5 == 4 ? Op.WRITE_ZEROES : Op.WRITE;
            submit(layer.queue(qi), op, off, 1 + rnd.nextInt(290_000), false, qi * 1000 + i);
        });
        flush();
        DurabilityCheck.Checked c = verify();
        assertThat(c.flushes()).isEqualTo(1);
        assertThat(c.writesCoveredByFlushes()).as("every write acknowledged before the FLUSH").isEqualTo(3 * perThread);
    }

    /** The kernel stores a payload straight into the mapping (ordinary stores, on the receiving thread). */
    @EachMapper
    void writesReceivedInPlaceArePersistedBeforeTheirFuaAckAndTheFlush(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, 3, null, Routing.CPU_ONLY);
        int perThread = 40;
        submitFromThreads(1, 2, perThread, (qi, i, rnd) -> {
            HardwareQueue q = layer.queue(qi);
            long off = (long) qi * (16 << 20) + (long) i * 70_000 + rnd.nextInt(100);
            int len = 1 + rnd.nextInt(65_536);
            assertThat(driver.receivesInPlace(off, len)).isTrue();
            Request r = q.acquire(0);
            r.op = Op.WRITE;
            r.offset = off;
            r.length = len;
            r.fua = i % 2 == 0;
            r.cookie = ids.incrementAndGet();
            r.completion = this::acknowledge;
            driver.receiveInPlace(r);
            for (int b = 0; b < r.dataBufferCount(); b++) { // what recv(2) into the views does
                ByteBuffer v = r.dataBuffers()[b];
                while (v.hasRemaining()) v.put((byte) rnd.nextInt());
            }
            rec.submitted(r, base);
            q.dispatch(new Request[]{r}, 1);
        });
        flush();
        DurabilityCheck.Checked c = verify();
        assertThat(c.fuaWrites()).isEqualTo(perThread);
        assertThat(c.writesCoveredByFlushes()).isEqualTo(2 * perThread);
        assertThat(rec.events()).as("the in-place path really ran").anyMatch(e -> e.what() != null && e.what().contains("in-place"));
    }

    /** The soft DMA engine writes with its own threads; completions (and their persistence) run on its completion thread. */
    @EachMapper
    void dmaWrittenRangesArePersistedBeforeTheirFuaAckAndTheFlush(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, 3, DmaEngine.soft(new IovaSpace(), 2, 64, 16), new Routing(8192, Integer.MAX_VALUE, true));
        int perThread = 30;
        submitFromThreads(1, 2, perThread, (qi, i, rnd) -> {
            long off = (long) qi * (16 << 20) + (long) i * 400_000;
            submit(layer.queue(qi), Op.WRITE, off, 8192 + rnd.nextInt(300_000), i % 2 == 0, qi * 1000 + i);
        });
        flush();
        DurabilityCheck.Checked c = verify();
        assertThat(c.fuaWrites()).isEqualTo(perThread);
        assertThat(c.writesCoveredByFlushes()).isEqualTo(2 * perThread);
        assertThat(rec.events()).as("the DMA route really ran")
                .anyMatch(e -> e.kind() == RecordingPersistence.Kind.ACK && e.what().contains("by DMA"));
    }

    /**
     * Caller memory (a vhost-user guest's RAM): FUA writes from its pieces, by the CPU below the threshold and by
     * the engine straight from the registered memory above it, persisted before their ack; the FLUSH covers all.
     */
    @EachMapper
    void callerMemoryWritesArePersistedBeforeTheirFuaAckAndTheFlushOnBothRoutes(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, 1, DmaEngine.soft(new IovaSpace(), 1, 64, 16), new Routing(65536, Integer.MAX_VALUE));
        try (Arena arena = Arena.ofShared()) {
            MemorySegment guest = arena.allocate(4 << 20, 4096);
            byte[] noise = new byte[(int) guest.byteSize()];
            new Random(11).nextBytes(noise);
            MemorySegment.copy(noise, 0, guest, ValueLayout.JAVA_BYTE, 0, noise.length);
            long iova = driver.registerMemory(guest);
            FrontendQueue f = new FrontendQueue(layer.queue(0));
            Random rnd = new Random(12);
            int n = 20;
            for (int i = 0; i < n; i++) {
                int len = i % 2 == 0 ? 4096 + rnd.nextInt(20_000) : 65536 + rnd.nextInt(150_000); // CPU, DMA
                Request r = f.acquireIov(Op.WRITE, (long) i * 300_000, len);
                long at = (long) i * 200_000;
                int first = len / 3;
                r.addIov(guest.asSlice(at, first), iova + at);
                r.addIov(guest.asSlice(at + first + 100, len - first), iova + at + first + 100);
                r.fua = i % 4 < 2;
                r.cookie = ids.incrementAndGet();
                r.completion = this::acknowledge;
                rec.submitted(r, base);
                f.add(r);
                f.dispatch();
            }
            assertThat(await(n)).containsOnly(Status.OK);
            flush();
            driver.unregisterMemory(guest);
        }
        DurabilityCheck.Checked c = verify();
        assertThat(c.fuaWrites()).isEqualTo(10);
        assertThat(c.writesCoveredByFlushes()).isEqualTo(20);
        assertThat(rec.events()).as("both routes ran")
                .anyMatch(e -> e.kind() == RecordingPersistence.Kind.ACK && e.what().contains("FUA") && e.what().contains("by DMA"))
                .anyMatch(e -> e.kind() == RecordingPersistence.Kind.ACK && e.what().contains("FUA") && e.what().contains("by CPU"));
    }

    /**
     * Linux reports a failed write-back once and marks the pages clean: a retried msync answers OK for data that
     * never reached the storage. So the port fails ONE msync here, as the kernel does, and every later FLUSH, FUA
     * write and plain write must still answer EIO (without another msync that could "succeed"), reads keep working.
     */
    @EachMapper
    void aFailedMsyncIsFinalEveryLaterFlushFuaAndWriteAnswersEio(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, 1, null, Routing.CPU_ONLY);
        assumeAnMsyncCanFail();
        HardwareQueue q = layer.queue(0);
        submit(q, Op.WRITE, 4096, 10_000, false, 1);
        assertThat(await(1)).containsExactly(Status.OK);
        rec.failSyncs.set(1);
        for (int i = 0; i < 3; i++) {
            submit(q, Op.FLUSH, 0, 0, false, 0);
        }
        assertThat(await(3)).as("three FLUSHes after one failed write-back").containsExactly(Status.EIO, Status.EIO, Status.EIO);
        long syncsAfterFailure = rec.events().stream().filter(e -> e.kind() == RecordingPersistence.Kind.SYNC_FAILED
                || e.kind() == RecordingPersistence.Kind.SYNC).filter(e -> e.seq() > firstFailed().seq()).count();
        assertThat(syncsAfterFailure).as("no msync after the failure: a retry would answer OK having written nothing").isZero();

        byte[] before = readBack(q, 1 << 20, 5000);
        submit(q, Op.WRITE, 1 << 20, 5000, true, 2);
        submit(q, Op.WRITE, 1 << 20, 5000, false, 3);
        submit(q, Op.WRITE_ZEROES, 8192, 4096, false, 0);
        submit(q, Op.TRIM, 8192, 4096, true, 0);
        assertThat(await(4)).as("FUA write, plain write, WRITE_ZEROES, TRIM").containsOnly(Status.EIO);
        assertThat(readBack(q, 1 << 20, 5000)).as("a refused write does not reach the mapping").isEqualTo(before);
        assertThat(driver.region().writeBack().writeBackFailure()).contains("injected msync failure").contains("restart the server");
        assertThat(driver.region().writeBack().refusedRequests()).as("3 FLUSHes and 4 writes refused").isEqualTo(7);
        assertThat(verify().writesCoveredByFlushes()).as("an EIO promises nothing").isZero();
        assertClosingSaysNothingWasPersisted();
    }

    @EachMapper
    void aFailedFuaMsyncFailsEveryLaterFlushToo(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, 1, null, Routing.CPU_ONLY);
        assumeAnMsyncCanFail();
        HardwareQueue q = layer.queue(0);
        rec.failSyncs.set(1);
        submit(q, Op.WRITE, 1 << 20, 5000, true, 2);
        assertThat(await(1)).containsExactly(Status.EIO);
        submit(q, Op.FLUSH, 0, 0, false, 0);
        submit(q, Op.FLUSH, 0, 0, false, 0);
        assertThat(await(2)).containsExactly(Status.EIO, Status.EIO);
        assertThat(driver.region().writeBack().writeBackFailure()).contains("bytes " + (1 << 20) + " to ");
        assertClosingSaysNothingWasPersisted();
    }

    /** The same on the DMA route: its FUA msync runs on the engine's completion thread. */
    @EachMapper
    void aFailedMsyncOfADmaWriteIsFinalToo(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, 1, DmaEngine.soft(new IovaSpace(), 1, 64, 16), new Routing(8192, Integer.MAX_VALUE, true));
        assumeAnMsyncCanFail();
        HardwareQueue q = layer.queue(0);
        rec.failSyncs.set(1);
        submit(q, Op.WRITE, 0, 65536, true, 1);
        assertThat(await(1)).as("FUA DMA write whose msync fails").containsExactly(Status.EIO);
        assertThat(firstFailed().thread()).as("the msync ran on the DMA completion thread, not the submitter")
                .isNotEqualTo(Thread.currentThread().threadId());
        byte[] before = readBack(q, 1 << 20, 65536);
        submit(q, Op.WRITE, 1 << 20, 65536, false, 2);
        submit(q, Op.FLUSH, 0, 0, false, 0);
        assertThat(await(2)).containsExactly(Status.EIO, Status.EIO);
        assertThat(readBack(q, 1 << 20, 65536)).as("the refused DMA-sized write did not land").isEqualTo(before);
        assertClosingSaysNothingWasPersisted();
    }

    /** The tests of a failed msync: on pmem the persistence is a drain, which has no failure to inject. */
    private void assumeAnMsyncCanFail() {
        assumeTrue(!rec.flushesCaches(), "pmem: nothing to msync (pmem_drain cannot fail)");
    }

    /** After a failed write-back, closing the driver says so; it is closed here, not again after the test. */
    private void assertClosingSaysNothingWasPersisted() {
        PmemBlockDriver d = driver;
        driver = null;
        assertThatThrownBy(d::close).as("closing says nothing was persisted").isInstanceOf(WriteBackFailedException.class);
    }

    private RecordingPersistence.Event firstFailed() {
        return rec.events().stream().filter(e -> e.kind() == RecordingPersistence.Kind.SYNC_FAILED).findFirst().orElseThrow();
    }

    /** READ through the driver; the read path keeps working whatever the write-back state. */
    private byte[] readBack(HardwareQueue q, long off, int len) throws InterruptedException {
        AtomicReference<byte[]> got = new AtomicReference<>();
        Request r = q.acquire(len);
        r.op = Op.READ;
        r.offset = off;
        r.length = len;
        r.completion = done -> {
            got.set(InlineRequests.gather(done, len)); // before the status: a DMA read completes on the engine's thread
            int status = done.status();
            done.release();
            statuses.add(status);
        };
        q.dispatch(new Request[]{r}, 1);
        assertThat(await(1)).as("READ after a failed write-back").containsExactly(Status.OK);
        return got.get();
    }

    /**
     * A server killed after plain writes leaves them dirty in the page cache; a client that reconnects to the
     * next server (or ublk recovery reissuing a FLUSH) is owed them after its FLUSH. The new region syncs the
     * whole mapping before it is handed out, whatever its own dirty flag says.
     */
    @EachMapper
    void openingSyncsTheWholeMappingSoWhatAnEarlierProcessLeftIsDurable(PmemRegion.Mapper mapper) throws Exception {
        Path f = dir.resolve("d.img");
        try (java.nio.channels.FileChannel fc = java.nio.channels.FileChannel.open(f, java.nio.file.StandardOpenOption.CREATE_NEW,
                java.nio.file.StandardOpenOption.WRITE)) {
            fc.write(ByteBuffer.wrap(new byte[8192]), SIZE - 8192); // the earlier process's write, in the page cache
        }
        open(mapper, 1, null, Routing.CPU_ONLY);
        // On both paths: forced pmem stands for fsdax, where msync writes back DAX pages left dirty.
        assertThat(rec.events()).as("one msync of the whole mapping before open returned")
                .anyMatch(e -> e.kind() == RecordingPersistence.Kind.SYNC && e.address() == base && e.length() == SIZE);
        flush();
    }

    @EachMapper
    void aFailedStartUpSyncStartsTheRegionFailed(PmemRegion.Mapper mapper) throws Exception {
        EachMapper.Assume.available(mapper);
        PmemRegion region = RegionFile.open(dir.resolve("d.img"), SIZE, false, mapper, true, p -> {
            rec = new RecordingPersistence(p);
            rec.failSyncs.set(1);
            return rec;
        });
        base = region.memory().address();
        driver = new PmemBlockDriver(region, new CopyStats(), null, Routing.CPU_ONLY);
        layer = new BlockLayer(driver, 1, 16, 8 << 20, 1 << 20);
        assertThat(region.writeBack().writeBackFailure()).startsWith("write-back at start-up");
        assertThat(region.writeBack().refusedRequests()).as("no request refused yet").isZero();
        HardwareQueue q = layer.queue(0);
        submit(q, Op.FLUSH, 0, 0, false, 0);
        submit(q, Op.WRITE, 0, 4096, false, 1);
        assertThat(await(2)).containsExactly(Status.EIO, Status.EIO);
        assertThat(region.writeBack().refusedRequests()).isEqualTo(2);
        readBack(q, 0, 4096);
        assertClosingSaysNothingWasPersisted();
    }

    @EachMapper
    void creatingTheBackingFileSyncsItAndItsDirectoryAndReopeningDoesNot(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, 1, null, Routing.CPU_ONLY);
        assertThat(rec.events()).anyMatch(e -> e.kind() == RecordingPersistence.Kind.SYNC_CREATED
                && e.what().equals(dir.resolve("d.img").toString()));
        driver.close();
        layer.close();
        driver = null;
        layer = null;
        open(mapper, 1, null, Routing.CPU_ONLY);
        assertThat(rec.events()).noneMatch(e -> e.kind() == RecordingPersistence.Kind.SYNC_CREATED);
    }

    @EachMapper
    void directoriesCreatedForTheFileAreSyncedToo(PmemRegion.Mapper mapper) throws Exception {
        EachMapper.Assume.available(mapper);
        Path f = dir.resolve("a/b/d.img");
        try (PmemRegion r = RegionFile.open(f, 1 << 20, false, mapper, true, p -> rec = new RecordingPersistence(p))) {
            assertThat(rec.events()).filteredOn(e -> e.kind() == RecordingPersistence.Kind.SYNC_CREATED)
                    .extracting(RecordingPersistence.Event::what).containsExactly(f.toString(), dir.resolve("a/b").toString(), dir.resolve("a").toString());
        }
    }

    @Test
    void isPmemIsAcceptedOnlyWhereTheDrainArgumentIsEstablished() {
        assertThat(RegionFile.drainCoversOwnStores("amd64")).isTrue();
        assertThat(RegionFile.drainCoversOwnStores("aarch64")).isFalse();
        assertThat(RegionFile.drainCoversOwnStores("ppc64le")).isFalse();
    }

    /** The judge itself can say no: a drain on another thread, or none, or a sync before the store. */
    @Test
    void theCheckRejectsADrainOnAnotherThreadAndASyncBeforeTheStore() {
        List<RecordingPersistence.Event> crossThread = fuaWriteOf100(
                ev(2, 1, RecordingPersistence.Kind.COPY, 0, 100, 0, null),
                ev(3, 2, RecordingPersistence.Kind.DRAIN, 0, 0, 0, null));
        assertThatThrownBy(() -> new DurabilityCheck(crossThread, true).verify()).hasMessageContaining("byte 0 of 100");
        List<RecordingPersistence.Event> sameThread = new ArrayList<>(crossThread);
        sameThread.set(2, ev(3, 1, RecordingPersistence.Kind.DRAIN, 0, 0, 0, null));
        assertThat(new DurabilityCheck(sameThread, true).verify().fuaWrites()).isEqualTo(1);
        List<RecordingPersistence.Event> syncFirst = fuaWriteOf100(
                ev(2, 1, RecordingPersistence.Kind.SYNC, 0, 4096, 0, null),
                ev(3, 1, RecordingPersistence.Kind.COPY, 0, 100, 0, null));
        assertThatThrownBy(() -> new DurabilityCheck(syncFirst, false).verify()).hasMessageContaining("msync after its store");
        List<RecordingPersistence.Event> partly = fuaWriteOf100(
                ev(2, 1, RecordingPersistence.Kind.COPY, 0, 100, 0, null),
                ev(3, 1, RecordingPersistence.Kind.SYNC, 0, 60, 0, null));
        assertThatThrownBy(() -> new DurabilityCheck(partly, false).verify()).hasMessageContaining("byte 60 of 100");
    }

    /**
     * The record of one FUA write of bytes 0..99 (request 7) submitted and acknowledged on thread 1, with the two
     * steps (seq 2 and 3) under judgement between its SUBMIT (seq 1) and its ACK (seq 4).
     */
    private static List<RecordingPersistence.Event> fuaWriteOf100(RecordingPersistence.Event second,
                                                                  RecordingPersistence.Event third) {
        return List.of(
                ev(1, 1, RecordingPersistence.Kind.SUBMIT, 0, 100, 7, "WRITE FUA off 0 len 100"),
                second,
                third,
                ev(4, 1, RecordingPersistence.Kind.ACK, 0, 100, 7, "WRITE FUA off 0 len 100 status 0"));
    }

    private static RecordingPersistence.Event ev(long seq, long thread, RecordingPersistence.Kind k, long addr, long len, long id, String what) {
        return new RecordingPersistence.Event(seq, thread, k, addr, len, id, what);
    }
}
