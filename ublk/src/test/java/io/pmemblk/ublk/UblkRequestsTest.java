package io.pmemblk.ublk;

import io.pmemblk.queueing.testing.Closing;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.Libpmem;
import io.pmemblk.pmem.PersistenceRecorder;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.Routing;
import io.pmemblk.posix.FileIo;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.queueing.Route;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

import static io.pmemblk.posix.Errno.*;
import static io.pmemblk.ublk.UblkAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * The ublk data path without the kernel's ublk driver: {@link UblkRequests} against a sparse file standing in for
 * {@code /dev/ublkcN}. The user-copy positions are plain file offsets there (from 2 GiB up), so its pread/pwrite
 * are the same system calls copying the same way: a WRITE's payload is copied by the kernel straight into the
 * pmem mapping, a READ's straight out of it. The driver is the real pmem driver over a region whose persistence
 * steps are recorded, so "a FUA write or a FLUSH is acknowledged only when durable" is checked on the path the
 * kernel's copies take. (The ring and the URING_CMDs are exercised in the guest: scripts/vm-test ublk*.)
 */
class UblkRequestsTest {
    static final long SIZE = 32L << 20;
    static final int MAX_IO = 1 << 20;
    static final int MAX_DISCARD = 4 << 20;
    static final boolean FORCED = "1".equals(System.getenv("PMEM_IS_PMEM_FORCE"));

    @TempDir
    Path dir;
    PersistenceRecorder rec;
    PmemBlockDriver driver;
    BlockLayer layer;
    FrontendQueue frontend;
    UblkRequests requests;
    int fd = -1;
    FdGuard ublkc;
    final Map<Integer, Integer> results = new ConcurrentHashMap<>();
    final AtomicInteger doneCalls = new AtomicInteger();
    /** What each tag was given, for the acknowledgement record: op, fua, offset, length, id. */
    final Map<Integer, long[]> given = new ConcurrentHashMap<>();
    long ids;

    void open(PmemRegion.Mapper mapper, DmaEngine engine, Routing routing, int openFlags) throws Exception {
        open(mapper, engine, routing, openFlags, 64);
    }

    void open(PmemRegion.Mapper mapper, DmaEngine engine, Routing routing, int openFlags, int depth) throws Exception {
        if (mapper == PmemRegion.Mapper.LIBPMEM) {
            assumeTrue(Libpmem.load().isPresent(), "libpmem not installed");
        }
        rec = PersistenceRecorder.open(dir.resolve("d.img"), SIZE, mapper);
        assertThat(rec.region().isPmem()).isEqualTo(mapper == PmemRegion.Mapper.LIBPMEM && FORCED);
        driver = new PmemBlockDriver(rec.region(), new CopyStats(), engine, routing);
        layer = new BlockLayer(driver, 1, depth, 32 << 20, MAX_IO);
        frontend = new FrontendQueue(layer.queue(0));
        fd = FileCalls.open(dir.resolve("ublkc").toString(), FileCalls.O_CREAT | openFlags, 0600);
        ublkc = new FdGuard(fd);
        requests = new UblkRequests(0, ublkc, frontend, MAX_IO, MAX_DISCARD, (tag, res) -> {
            long[] g = given.get(tag);
            Op op = Op.values()[(int) g[0]];
            // The acknowledgement: from here the COMMIT carrying res may reach the kernel.
            rec.acknowledged(g[4], op, g[1] == 1, g[2], g[3], res < 0 ? -res : 0);
            doneCalls.incrementAndGet();
            assertThat(results.put(tag, res)).as("tag " + tag + " reported once").isNull();
        }, "test-q0");
    }

    @AfterEach
    void close() throws Exception {
        Closing.closeAll(driver, layer);
        if (fd >= 0) {
            Libc.close(fd);
        }
    }

    /** The kernel's side of a WRITE: the request's pages, readable at its user-copy position. */
    byte[] kernelHasWrite(int tag, int len, long seed) {
        byte[] data = new byte[len];
        new Random(seed).nextBytes(data);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment s = a.allocate(len);
            MemorySegment.copy(MemorySegment.ofArray(data), 0, s, 0, len);
            assertThat(FileIo.pwrite(fd, s, userCopyPosition(0, tag, 0))).isEqualTo(len);
        }
        return data;
    }

    byte[] kernelGotRead(int tag, int len) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment s = a.allocate(len);
            assertThat(FileIo.pread(fd, s, userCopyPosition(0, tag, 0))).isEqualTo(len);
            return s.toArray(JAVA_BYTE);
        }
    }

    void serve(int tag, int ublkOp, boolean fua, long offset, long length) {
        serveSectors(tag, ublkOp, fua, offset >> 9, (int) (length >> 9));
    }

    /** A descriptor as the kernel writes it: start_sector and nr_sectors (both unsigned), whatever they hold. */
    void serveSectors(int tag, int ublkOp, boolean fua, long startSector, int nrSectors) {
        long offset = startSector << 9;
        long length = Integer.toUnsignedLong(nrSectors) << 9;
        Op op = switch (ublkOp) {
            case UBLK_IO_OP_READ -> Op.READ;
            case UBLK_IO_OP_WRITE -> Op.WRITE;
            case UBLK_IO_OP_FLUSH -> Op.FLUSH;
            case UBLK_IO_OP_DISCARD -> Op.TRIM;
            default -> Op.WRITE_ZEROES;
        };
        long id = ++ids;
        results.remove(tag);
        given.put(tag, new long[]{op.ordinal(), fua ? 1 : 0, offset, length, id});
        // Recorded before the serve, so before the kernel's stores into the mapping: every persistence step that
        // covers them comes after this point, as the check requires.
        if (rec != null) {
            rec.submitted(id, op, fua, offset, length);
        }
        requests.serve(tag, ublkOp | (fua ? UBLK_IO_F_FUA : 0), startSector, nrSectors);
    }

    /**
     * A WRITE of {@code len} bytes of pattern {@code seed} at {@code offset}, served on {@code tag}, dispatched
     * and answered with its byte count; the bytes written.
     */
    byte[] written(int tag, boolean fua, long offset, int len, int seed) throws Exception {
        byte[] data = kernelHasWrite(tag, len, seed);
        serve(tag, UBLK_IO_OP_WRITE, fua, offset, len);
        frontend.dispatch();
        assertThat(await(tag)).isEqualTo(len);
        return data;
    }

    int await(int tag) throws InterruptedException {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (!results.containsKey(tag)) {
            assertThat(System.nanoTime() - deadline).as("tag " + tag + " completed within 10 s").isNegative();
            Thread.sleep(1);
        }
        return results.get(tag);
    }

    byte[] device(long offset, int len) {
        return rec.region().memory().asSlice(offset, len).toArray(JAVA_BYTE);
    }

    @ParameterizedTest(name = "{0}")
    @EnumSource(value = PmemRegion.Mapper.class, names = {"JAVA", "LIBPMEM"})
    void kernelCopiedWritesAreDurableBeforeTheirFuaAckAndTheFlush(PmemRegion.Mapper mapper) throws Exception {
        open(mapper, null, Routing.CPU_ONLY, FileCalls.O_RDWR);
        Random rnd = new Random(7);
        int writes = 24;
        byte[][] data = new byte[writes][];
        long[] offsets = new long[writes];
        for (int i = 0; i < writes; i++) {
            int tag = i % 8;
            int len = 4096 * (1 + rnd.nextInt(64));
            offsets[i] = (long) i * (1 << 20) + 4096L * rnd.nextInt(8);
            data[i] = kernelHasWrite(tag, len, i);
            serve(tag, UBLK_IO_OP_WRITE, i % 2 == 0, offsets[i], len);
            frontend.dispatch();
            assertThat(await(tag)).as("WRITE result: its byte count").isEqualTo(len);
        }
        serve(3, UBLK_IO_OP_FLUSH, false, 0, 0);
        frontend.dispatch();
        assertThat(await(3)).as("FLUSH result: 0").isZero();
        for (int i = 0; i < writes; i++) {
            assertThat(device(offsets[i], data[i].length)).as("write " + i + " is in the mapping").isEqualTo(data[i]);
        }
        PersistenceRecorder.Verdict v = rec.verify();
        assertThat(v.fuaWrites()).isEqualTo(writes / 2);
        assertThat(v.flushes()).isEqualTo(1);
        assertThat(v.writesCoveredByFlushes()).isEqualTo(writes);
        assertThat(rec.count("COPY")).as("one copy, the kernel's: the driver copied nothing itself").isZero();
        assertThat(rec.count(rec.region().isPmem() ? "WRITE_BACK" : "SYNC")).isPositive();
    }

    @Test
    void readsArePwrittenFromTheMappingAndRangeOpsCommitZero() throws Exception {
        open(PmemRegion.Mapper.JAVA, null, Routing.CPU_ONLY, FileCalls.O_RDWR);
        byte[] data = written(1, false, 8192, 65536, 42);
        serve(2, UBLK_IO_OP_READ, false, 8192, 65536);
        frontend.dispatch();
        assertThat(await(2)).isEqualTo(65536);
        assertThat(kernelGotRead(2, 65536)).isEqualTo(data);
        serve(4, UBLK_IO_OP_DISCARD, false, 8192, 4096);
        serve(5, UBLK_IO_OP_WRITE_ZEROES, true, 12288, 4096);
        frontend.dispatch();
        assertThat(await(4)).isZero();
        assertThat(await(5)).isZero();
        assertThat(device(8192, 8192)).containsOnly((byte) 0);
        assertThat(device(16384, 4096)).isEqualTo(java.util.Arrays.copyOfRange(data, 8192, 12288));
        assertThat(doneCalls.get()).as("one report per request").isEqualTo(4);
    }

    @Test
    void dmaRouteCopiesThroughTheRegisteredBuffersAndReportsFromTheChannelThread() throws Exception {
        open(PmemRegion.Mapper.JAVA, DmaEngine.soft(new IovaSpace(), 1, 64, 16), new Routing(65536, Integer.MAX_VALUE, true), FileCalls.O_RDWR);
        byte[] data = written(6, true, 1 << 20, 512 << 10, 9);
        assertThat(device(1 << 20, 512 << 10)).isEqualTo(data);
        serve(7, UBLK_IO_OP_READ, false, 1 << 20, 512 << 10);
        frontend.dispatch();
        assertThat(await(7)).isEqualTo(512 << 10);
        assertThat(kernelGotRead(7, 512 << 10)).isEqualTo(data);
        assertThat(driver.engine()).isNotNull();
        rec.verify();
        assertThat(layer.queue(0).inflight()).as("every request released").isZero();
    }

    @Test
    void requestsTheDeviceCannotServeAreAnsweredOnceWithAnErrno() throws Exception {
        open(PmemRegion.Mapper.JAVA, null, Routing.CPU_ONLY, FileCalls.O_RDWR);
        serve(0, 10, false, 0, 4096); // a zone operation: not a zoned device
        assertThat(await(0)).isEqualTo(-EOPNOTSUPP);
        serve(1, UBLK_IO_OP_READ, false, 0, MAX_IO + 4096L);
        assertThat(await(1)).isEqualTo(-EINVAL);
        kernelHasWrite(2, 8192, 1);
        serve(2, UBLK_IO_OP_WRITE, false, SIZE - 4096, 8192); // past the end: refused before anything is copied
        frontend.dispatch();
        assertThat(await(2)).isEqualTo(-EINVAL);
        serve(3, UBLK_IO_OP_WRITE, false, 0, 4096); // the kernel has no data for tag 3: a short copy
        assertThat(await(3)).isEqualTo(-EIO);
        assertThat(doneCalls.get()).isEqualTo(4);
        assertThat(layer.queue(0).inflight()).isZero();
    }

    @Test
    void sectorsOutsideTheDeviceOrItsLimitsAreRefusedBeforeTheShiftAndTouchNothing() throws Exception {
        open(PmemRegion.Mapper.JAVA, null, Routing.CPU_ONLY, FileCalls.O_RDWR);
        byte[] a = written(1, false, 0, 8192, 11);
        List<String> logged = new java.util.concurrent.CopyOnWriteArrayList<>();
        java.util.logging.Logger jul = java.util.logging.Logger.getLogger(UblkRequests.class.getName());
        java.util.logging.Handler capture = new java.util.logging.Handler() {
            @Override public void publish(java.util.logging.LogRecord r) { logged.add(r.getMessage()); }
            @Override public void flush() { }
            @Override public void close() { }
        };
        jul.addHandler(capture);
        try {
            long wraps = 1L << 55; // times 512 is 2^64: shifted, start_sector 2^55 + n is byte n * 512 of the device
            long sectors = SIZE >> 9;
            kernelHasWrite(2, 8192, 12);
            serveSectors(2, UBLK_IO_OP_WRITE, false, wraps + 32, 16); // would land at byte 16384
            serveSectors(3, UBLK_IO_OP_DISCARD, false, wraps, 16); // would zero a's bytes at 0
            serveSectors(4, UBLK_IO_OP_WRITE_ZEROES, true, -16L, 16); // start_sector 2^64 - 16: negative as a long
            kernelHasWrite(5, 8192, 13);
            serveSectors(5, UBLK_IO_OP_WRITE, false, sectors - 8, 16); // straddles the end
            serveSectors(6, UBLK_IO_OP_READ, false, sectors, 8); // starts at the end
            serveSectors(7, UBLK_IO_OP_DISCARD, false, 8, -1); // nr_sectors 2^32 - 1
            serveSectors(8, UBLK_IO_OP_DISCARD, false, 8, 0); // empty
            serveSectors(9, UBLK_IO_OP_WRITE_ZEROES, false, 0, (MAX_DISCARD >> 9) + 8); // above max_discard_sectors
            serveSectors(10, UBLK_IO_OP_READ, false, 0, 0); // empty
            frontend.dispatch();
            for (int tag = 2; tag <= 10; tag++) {
                assertThat(await(tag)).as("tag " + tag + " refused").isEqualTo(-EINVAL);
            }
            assertThat(device(0, 8192)).as("a is still at byte 0").isEqualTo(a);
            assertThat(device(16384, 8192)).as("nothing written at byte 16384").containsOnly((byte) 0);
            assertThat(device(SIZE - 4096, 4096)).as("nothing written at the end").containsOnly((byte) 0);
            assertThat(logged).as("one line for the queue, the first refusal's").hasSize(1);
            assertThat(logged.get(0)).contains("test-q0: tag 2: the kernel sent WRITE of 16 sectors at sector "
                    + Long.toUnsignedString(wraps + 32) + "; allowed: 1.." + (MAX_IO >> 9) + " sectors, ending at or"
                    + " before sector " + sectors + " (the device's end). Answered EINVAL");
            assertThat(layer.queue(0).inflight()).as("nothing acquired").isZero();

            serve(11, UBLK_IO_OP_READ, false, 0, 8192); // and the queue serves on
            frontend.dispatch();
            assertThat(await(11)).isEqualTo(8192);
            assertThat(kernelGotRead(11, 8192)).isEqualTo(a);
            serve(12, UBLK_IO_OP_DISCARD, false, SIZE - MAX_DISCARD, MAX_DISCARD); // the longest, up to the end
            frontend.dispatch();
            assertThat(await(12)).isZero();
            assertThat(doneCalls.get()).as("one report per request").isEqualTo(12);
        } finally {
            jul.removeHandler(capture);
        }
    }

    @Test
    void aFailedCopyFromTheKernelAnswersTheErrnoAndLeavesNoTagBehind() throws Exception {
        open(PmemRegion.Mapper.JAVA, null, Routing.CPU_ONLY, FileCalls.O_WRONLY);
        serve(3, UBLK_IO_OP_WRITE, true, 0, 4096); // pread on a write-only fd: EBADF
        assertThat(await(3)).isEqualTo(-EBADF);
        assertThat(doneCalls.get()).isEqualTo(1);
        assertThat(layer.queue(0).inflight()).isZero();
        assertThat(frontend.batched()).isZero();
    }

    @Test
    void aReadWhoseHandBackThrowsIsCommittedWithEio() throws Exception {
        open(PmemRegion.Mapper.JAVA, null, Routing.CPU_ONLY, FileCalls.O_RDWR);
        kernelHasWrite(1, 8192, 3);
        serve(1, UBLK_IO_OP_WRITE, false, 0, 8192);
        serve(2, UBLK_IO_OP_READ, false, 0, 8192);
        frontend.dispatch();
        assertThat(await(2)).isEqualTo(8192);
        // The mapping goes (a server stopping past its drain deadline) while the kernel still sends a READ: the
        // driver hands back views of the unmapped range (cached per request), and the pwrite out of them throws.
        rec.region().close();
        serve(2, UBLK_IO_OP_READ, false, 0, 8192);
        frontend.dispatch();
        assertThat(await(2)).as("the READ is committed, with EIO: a tag never committed hangs until STOP_DEV")
                .isEqualTo(-EIO);
        assertThat(layer.queue(0).inflight()).as("and its request released").isZero();
        assertThat(doneCalls.get()).isEqualTo(3);
    }

    @Test
    void anErrorFromTheDriverFailsItsRequestNotTheQueue() throws Exception {
        // The real driver with a DMA channel that throws OutOfMemoryError on placing: the driver answers the
        // batch (on the CPU) and rethrows the Error to its caller, the ublk queue thread, which must go on.
        DmaEngine soft = DmaEngine.soft(new IovaSpace(), 1, 64, 16);
        AtomicInteger oomsLeft = new AtomicInteger(2);
        DmaEngine engine = DmaEngine.of(soft.iovaSpace(), List.of(new OomChannel(soft.channel(0), oomsLeft)), soft);
        open(PmemRegion.Mapper.JAVA, engine, new Routing(65536, Integer.MAX_VALUE, true), FileCalls.O_RDWR, 2);
        byte[] a = kernelHasWrite(0, 256 << 10, 1);
        serve(0, UBLK_IO_OP_WRITE, false, 0, 256 << 10);
        requests.dispatch(); // the queue thread's dispatch before it waits on its ring
        assertThat(await(0)).as("answered by the driver despite the Error").isEqualTo(256 << 10);
        byte[] b = kernelHasWrite(1, 256 << 10, 2);
        kernelHasWrite(2, 256 << 10, 3);
        serve(1, UBLK_IO_OP_WRITE, false, 1 << 20, 256 << 10);
        serve(2, UBLK_IO_OP_WRITE, false, 2 << 20, 256 << 10); // the batch is full: serve dispatches it itself
        assertThat(oomsLeft.get()).as("both Errors were thrown").isZero();
        assertThat(await(1)).isEqualTo(256 << 10);
        assertThat(await(2)).isEqualTo(256 << 10);
        serve(3, UBLK_IO_OP_READ, false, 1 << 20, 256 << 10);
        requests.dispatch();
        assertThat(await(3)).as("the queue goes on: the next request is served").isEqualTo(256 << 10);
        assertThat(kernelGotRead(3, 256 << 10)).isEqualTo(b);
        assertThat(device(0, 256 << 10)).isEqualTo(a);
        assertThat(doneCalls.get()).as("each tag reported once").isEqualTo(4);
        assertThat(layer.queue(0).inflight()).isZero();
    }

    @Test
    void aCompletionAfterTheDeviceRetiredItsFdWritesNothingToTheFileThatGotTheNumber() throws Exception {
        MemoryBlockDriver memory = new MemoryBlockDriver(SIZE);
        layer = new BlockLayer(memory, 1, 8, 8 << 20, MAX_IO);
        frontend = new FrontendQueue(layer.queue(0));
        fd = FileCalls.open(dir.resolve("ublkc").toString(), FileCalls.O_CREAT | FileCalls.O_RDWR, 0600);
        ublkc = new FdGuard(fd);
        requests = new UblkRequests(0, ublkc, frontend, MAX_IO, MAX_DISCARD, (tag, res) -> {
            doneCalls.incrementAndGet();
            results.put(tag, res);
        }, "test-q0");
        try {
            memory.hold(); // a READ still with the driver (a DMA copy) when its queue is abandoned
            serve(5, UBLK_IO_OP_READ, false, 0, 65536);
            requests.dispatch();
            assertThat(memory.awaitHeld(1, 10_000)).isTrue();
            // The device closes /dev/ublkcN as UblkDevice does, and the number goes to the next file opened.
            assertThat(ublkc.retire(1_000)).as("no writer inside").isTrue();
            Libc.close(fd);
            Path victim = dir.resolve("victim");
            int reused = FileCalls.open(victim.toString(), FileCalls.O_CREAT | FileCalls.O_RDWR, 0600);
            fd = reused;
            assertThat(reused).as("the next open gets the closed number").isEqualTo(ublkc.fd());
            memory.releaseHeld();
            assertThat(await(5)).as("the late READ has nowhere to go").isEqualTo(-ENODEV);
            assertThat(Files.size(victim)).as("nothing written into the file that got the number").isZero();
        } finally {
            memory.close();
        }
    }

    /** A channel whose placeAll() throws OutOfMemoryError while {@code left} lasts, as an allocation deep in a driver can. */
    private static final class OomChannel implements DmaChannel {
        final DmaChannel inner;
        final AtomicInteger left;

        OomChannel(DmaChannel inner, AtomicInteger left) {
            this.inner = inner;
            this.left = left;
        }

        @Override public int index() { return inner.index(); }
        @Override public void listener(DmaCompletionListener l) { inner.listener(l); }
        @Override public int freeSlots() { return inner.freeSlots(); }
        @Override public int slotsFor(long length) { return inner.slotsFor(length); }
        @Override public void submit() { inner.submit(); }
        @Override public int poll() { return inner.poll(); }
        @Override public void close() { inner.close(); }
        @Override public boolean place(long src, long dst, long length, Object ctx) { return inner.place(src, dst, length, ctx); }

        @Override
        public boolean placeAll(Copies copies, Object ctx) {
            if (left.get() > 0 && left.getAndDecrement() > 0) {
                throw new OutOfMemoryError("injected: no memory for the DMA descriptors");
            }
            return inner.placeAll(copies, ctx);
        }
    }
}
