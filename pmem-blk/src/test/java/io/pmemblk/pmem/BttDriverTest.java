package io.pmemblk.pmem;

import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.pmem.btt.BttLayout;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The block driver on the BTT layout (pmem.layout=btt): requests through the block layer, as every frontend sends them. */
class BttDriverTest {
    /** A pool header and one 16 MiB arena, plus a little: the smallest BTT PMDK lays out. */
    static final long SIZE = BttLayout.BTT_OFFSET + (16 << 20) + (1 << 20);
    private static final java.lang.foreign.ValueLayout.OfInt LE32 =
            java.lang.foreign.ValueLayout.JAVA_INT.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN);
    @TempDir
    Path dir;
    PmemBlockDriver driver;
    BlockLayer layer;

    /** Formats (first time) or opens the BTT of d.img and serves it on {@code queues} hardware queues. */
    private void serve(int sectorSize, int queues, int callers) throws IOException {
        serve(sectorSize, queues, callers, Btt.GROUP_BLOCKS);
    }

    /** As {@link #serve(int, int, int)}, with {@code callers x lanesPerCaller} lanes. */
    private void serve(int sectorSize, int queues, int callers, int lanesPerCaller) throws IOException {
        Path file = dir.resolve("d.img");
        boolean fresh = !Files.exists(file);
        PmemRegion region = PmemRegion.open(file, SIZE, false, PmemRegion.Mapper.AUTO);
        if (fresh) {
            BttRegion.format(region, sectorSize);
        }
        driver = PmemBlockDriver.onBtt(region, new CopyStats(), BttRegion.open(region, callers, 0, lanesPerCaller));
        layer = new BlockLayer(driver, queues, 16, 4 << 20, 1 << 20);
    }

    /**
     * Dispatches one batch of WRITEs, {@code data[i]} at {@code offs[i]}, in one call (as a frontend with several
     * requests in hand does: the driver may group their sectors); the status of each.
     */
    private static int[] writeBatch(HardwareQueue q, long[] offs, byte[][] data) throws InterruptedException {
        Request[] batch = new Request[offs.length];
        int[] status = new int[offs.length];
        java.util.Arrays.fill(status, -1);
        for (int i = 0; i < offs.length; i++) {
            Request r = q.acquire(data[i].length);
            r.op = Op.WRITE;
            r.offset = offs[i];
            r.length = data[i].length;
            InlineRequests.fill(r, data[i]);
            int me = i;
            r.completion = req -> status[me] = req.status();
            batch[i] = r;
        }
        q.dispatch(batch, batch.length);
        for (Request r : batch) {
            r.release();
        }
        for (int i = 0; i < status.length; i++) {
            assertThat(status[i]).as("request %d completed inline", i).isGreaterThanOrEqualTo(0);
        }
        return status;
    }

    private void stop() throws IOException {
        if (layer != null) {
            layer.close();
            driver.close();
            layer = null;
        }
    }

    private static byte[] bytes(int seed, int n) {
        byte[] b = new byte[n];
        new java.util.Random(seed).nextBytes(b);
        return b;
    }

    @AfterEach
    void tearDown() throws IOException {
        stop();
    }

    private int run(Op op, long off, int len, byte fill, byte[] out) throws InterruptedException {
        return InlineRequests.run(layer.queue(0), op, off, len, fill, false, out);
    }

    /** Writes {@code data} at {@code off} (a WRITE of its length, FUA when asked). */
    private static int write(HardwareQueue q, long off, byte[] data, boolean fua) throws InterruptedException {
        Request r = q.acquire(data.length);
        r.op = Op.WRITE;
        r.offset = off;
        r.length = data.length;
        r.fua = fua;
        InlineRequests.fill(r, data);
        AtomicInteger done = new AtomicInteger(-1);
        r.completion = req -> done.set(req.status());
        q.dispatch(new Request[]{r}, 1);
        r.release();
        return done.get();
    }

    private static byte[] read(HardwareQueue q, long off, int len) throws InterruptedException {
        byte[] out = new byte[len];
        assertThat(InlineRequests.run(q, Op.READ, off, len, (byte) 0, false, out)).as("READ %d+%d", off, len).isZero();
        return out;
    }

    @ParameterizedTest
    @ValueSource(ints = {512, 4096})
    void theDeviceIsTheBttsSectorsAndReadsBackWhatWasWrittenAcrossChunks(int sector) throws Exception {
        serve(sector, 1, 2);
        Btt btt = driver.btt();
        assertThat(btt.blockSize()).isEqualTo(sector);
        assertThat(driver.size()).as("capacity = external LBAs").isEqualTo(btt.blocks() * sector).isLessThan(SIZE);
        byte[] data = bytes(7, 3 * 128 * 1024 + 4 * sector); // beyond three 128 KiB chunks
        assertThat(write(layer.queue(0), 8L * sector, data, false)).isZero();
        assertThat(read(layer.queue(0), 8L * sector, data.length)).isEqualTo(data);
        // a read may start and end inside sectors
        assertThat(read(layer.queue(0), 8L * sector + 100, 3 * sector)).isEqualTo(java.util.Arrays.copyOfRange(data, 100,
                100 + 3 * sector));
        // never written: zeros (the map's initial entries)
        assertThat(read(layer.queue(0), driver.size() - sector, sector)).containsOnly(0);
        assertThat(btt.check()).isEmpty();
    }

    /**
     * One batch of WRITEs, several sectors each and overlapping one another (one sector written by three requests
     * of the batch, another by two): their sectors are written in groups, and a sector written twice in a batch
     * ends as the later request wrote it, exactly as if the requests had come one by one. Two blocks of one LBA
     * in one group would both free its old block (and lose one of theirs): check() names that.
     */
    @ParameterizedTest
    @ValueSource(ints = {512, 4096})
    void aBatchOfOverlappingWritesEndsAsItsRequestsInOrderAndStaysConsistent(int sector) throws Exception {
        serve(sector, 1, 1);
        long[] offs = {0, 2L * sector, 10L * sector, 2L * sector, 3L * sector, 40L * sector, 0};
        int[] lens = {4, 1, 2, 1, 2, 24, 1}; // in sectors: 35, more than a group holds
        byte[][] data = new byte[offs.length][];
        byte[] expect = new byte[64 * sector];
        for (int i = 0; i < offs.length; i++) {
            data[i] = bytes(100 + i, lens[i] * sector);
            System.arraycopy(data[i], 0, expect, (int) offs[i], data[i].length);
        }
        for (int round = 0; round < 3; round++) { // again over blocks already written: old entries not initial
            assertThat(writeBatch(layer.queue(0), offs, data)).containsOnly(Status.OK);
            assertThat(read(layer.queue(0), 0, expect.length)).isEqualTo(expect);
            assertThat(driver.btt().check()).isEmpty();
        }
        // one request of many sectors alone: grouped too
        byte[] big = bytes(99, 40 * sector);
        assertThat(writeBatch(layer.queue(0), new long[]{100L * sector}, new byte[][]{big})).containsOnly(Status.OK);
        assertThat(read(layer.queue(0), 100L * sector, big.length)).isEqualTo(big);
        assertThat(driver.btt().check()).isEmpty();
        stop();
        serve(sector, 1, 1);
        assertThat(driver.btt().notes()).as("nothing left to recover").isEmpty();
        assertThat(read(layer.queue(0), 0, expect.length)).isEqualTo(expect);
        assertThat(read(layer.queue(0), 100L * sector, big.length)).isEqualTo(big);
    }

    /**
     * A batch mixing requests the BTT refuses or that are not WRITEs with WRITEs: each answered as alone (a
     * partial sector EINVAL, beyond the end ENOSPC, a READ between two WRITEs of one sector reads the first).
     */
    @Test
    void aBatchAnswersEachOfItsRequestsAsAlone() throws Exception {
        serve(4096, 1, 1);
        HardwareQueue q = layer.queue(0);
        byte[] a = bytes(1, 8192), b = bytes(2, 4096);
        Request w1 = q.acquire(a.length), bad = q.acquire(512), rd = q.acquire(4096), w2 = q.acquire(b.length),
                far = q.acquire(4096);
        Request[] batch = {w1, bad, rd, w2, far};
        int[] status = new int[batch.length];
        java.util.Arrays.fill(status, -1);
        Object[][] setup = {{Op.WRITE, 0L, a}, {Op.WRITE, 512L, new byte[512]}, {Op.READ, 4096L, null},
                {Op.WRITE, 4096L, b}, {Op.WRITE, driver.size(), new byte[4096]}};
        for (int i = 0; i < batch.length; i++) {
            Request r = batch[i];
            r.op = (Op) setup[i][0];
            r.offset = (Long) setup[i][1];
            byte[] d = (byte[]) setup[i][2];
            r.length = d == null ? 4096 : d.length;
            if (d != null) {
                InlineRequests.fill(r, d);
            }
            int me = i;
            r.completion = req -> status[me] = req.status();
        }
        q.dispatch(batch, batch.length);
        byte[] readBack = new byte[4096];
        rd.buffers()[0].duplicate().get(readBack, 0, 4096);
        for (Request r : batch) {
            r.release();
        }
        assertThat(status).containsExactly(Status.OK, Status.EINVAL, Status.OK, Status.OK, Status.ENOSPC);
        assertThat(readBack).as("the READ ran after the first WRITE, before the second").isEqualTo(
                java.util.Arrays.copyOfRange(a, 4096, 8192));
        byte[] expect = a.clone();
        System.arraycopy(b, 0, expect, 4096, 4096);
        assertThat(read(q, 0, 8192)).isEqualTo(expect);
        assertThat(driver.btt().check()).isEmpty();
    }

    /**
     * A batch of READs runs on one lane with its map entries loaded ahead (BttCpuRequests.reads): each READ is still
     * answered as alone, a partial sector, several sectors and a never-written one among them, and one out of
     * bounds ends the run without disturbing the others.
     */
    @Test
    void aRunOfReadsInOneBatchAnswersEachAsAlone() throws Exception {
        serve(4096, 1, 1);
        HardwareQueue q = layer.queue(0);
        byte[] data = bytes(7, 4 * 4096);
        assertThat(write(q, 0, data, false)).isZero();
        long[][] reads = {{0, 4096}, {4096 + 10, 100}, {8192, 8192}, {driver.size(), 4096}, {64 * 4096, 4096},
                {4096, 4096}};
        Request[] batch = new Request[reads.length];
        int[] status = new int[reads.length];
        java.util.Arrays.fill(status, -1);
        for (int i = 0; i < reads.length; i++) {
            Request r = batch[i] = q.acquire((int) reads[i][1]);
            r.op = Op.READ;
            r.offset = reads[i][0];
            r.length = (int) reads[i][1];
            int me = i;
            r.completion = req -> status[me] = req.status();
        }
        q.dispatch(batch, batch.length);
        assertThat(status).containsExactly(Status.OK, Status.OK, Status.OK, Status.EINVAL, Status.OK, Status.OK);
        for (int i = 0; i < reads.length; i++) {
            if (i == 3) {
                continue;
            }
            byte[] got = InlineRequests.gather(batch[i], (int) reads[i][1]);
            byte[] expect = reads[i][0] >= data.length ? new byte[got.length]
                    : java.util.Arrays.copyOfRange(data, (int) reads[i][0], (int) (reads[i][0] + reads[i][1]));
            assertThat(got).as("READ %d (%d+%d)", i, reads[i][0], reads[i][1]).isEqualTo(expect);
        }
        for (Request r : batch) {
            r.release();
        }
    }

    /**
     * A group whose blocks' free blocks are bad in turn (every other lane's), on device DAX (nothing can clear
     * them): each such lane moves to a spare flog lane, and every request is written; so are the next batches,
     * through the same lanes, and after a restart, where the bad blocks are found again (they are still their
     * flog lanes' free blocks on the media). The BTT stays consistent throughout.
     */
    @Test
    void aBadFreeBlockThatCannotBeClearedMovesItsLaneToASpareAndTheWriteSucceeds() throws Exception {
        serve(4096, 1, 1, 8);
        BttLayout.Arena g = BttLayout.arenas(SIZE - BttLayout.BTT_OFFSET, 4096).getFirst();
        long data = BttLayout.BTT_OFFSET + g.dataOff();
        long[] bad = new long[8];
        for (int i = 0; i < 4; i++) { // lanes 1, 3, 5, 7: their free blocks are the format's external_nlba + lane
            long block = g.externalNlba() + 2L * i + 1;
            bad[2 * i] = data + block * g.internalLbaSize();
            bad[2 * i + 1] = bad[2 * i] + 4096;
        }
        driver.region().badBlocks(new BadBlocks(bad, "test", null, 1));
        for (int round = 0; round < 3; round++) {
            if (round == 2) {
                stop();
                serve(4096, 1, 1, 8);
                driver.region().badBlocks(new BadBlocks(bad, "test", null, 1));
            }
            long[] offs = new long[6];
            byte[][] d = new byte[6][];
            for (int i = 0; i < 6; i++) {
                offs[i] = i * 4096L;
                d[i] = bytes(50 + 10 * round + i, 4096);
            }
            int[] status = writeBatch(layer.queue(0), offs, d);
            assertThat(status).as("round %d", round).containsOnly(Status.OK);
            for (int i = 0; i < 6; i++) {
                assertThat(read(layer.queue(0), offs[i], 4096)).as("round %d sector %d", round, i).isEqualTo(d[i]);
            }
            assertThat(driver.btt().check()).as("round %d", round).isEmpty();
        }
        for (int i = 0; i < bad.length; i += 2) {
            assertThat(driver.region().memory().asSlice(bad[i], 4096).toArray(java.lang.foreign.ValueLayout.JAVA_BYTE))
                    .as("bad block at %d: never stored into", bad[i]).containsOnly(0);
        }
    }

    /** Callers that would take every flog lane leave spares for lanes whose free block turns out bad. */
    @Test
    void aServerKeepsSpareFlogLanesWhenItsCallersWouldTakeThemAll() throws Exception {
        serve(4096, 1, BttLayout.NFREE / Btt.GROUP_BLOCKS);
        assertThat(driver.btt().lanes()).isEqualTo(BttLayout.NFREE - BttRegion.SPARE_FLOG_LANES);
    }

    @Test
    void partialSectorWritesAndZeroesAreRefusedWithEinvalAndChangeNothing() throws Exception {
        serve(4096, 1, 2);
        byte[] data = bytes(1, 8192);
        assertThat(write(layer.queue(0), 0, data, false)).isZero();
        assertThat(run(Op.WRITE, 512, 512, (byte) 9, null)).isEqualTo(Status.EINVAL);
        assertThat(run(Op.WRITE, 4096, 4000, (byte) 9, null)).isEqualTo(Status.EINVAL);
        assertThat(run(Op.WRITE_ZEROES, 100, 4096, (byte) 0, null)).isEqualTo(Status.EINVAL);
        assertThat(run(Op.TRIM, 0, 1000, (byte) 0, null)).isEqualTo(Status.EINVAL);
        assertThat(read(layer.queue(0), 0, 8192)).isEqualTo(data);
        // and out of the BTT's capacity, as on raw: the device ends at its last sector, not at the file's end
        assertThat(run(Op.WRITE, driver.size(), 4096, (byte) 9, null)).isEqualTo(Status.ENOSPC);
    }

    @Test
    void trimAndWriteZeroesReadBackAsZerosThroughTheMapsZeroFlag() throws Exception {
        serve(4096, 1, 2);
        byte[] data = bytes(3, 16 * 4096);
        assertThat(write(layer.queue(0), 0, data, false)).isZero();
        assertThat(run(Op.WRITE_ZEROES, 4096, 2 * 4096, (byte) 0, null)).isZero();
        assertThat(run(Op.TRIM, 10 * 4096, 4096, (byte) 0, null)).isZero();
        byte[] out = read(layer.queue(0), 0, data.length);
        for (int i = 0; i < out.length; i++) {
            int s = i / 4096;
            boolean zeroed = s == 1 || s == 2 || s == 10;
            if (out[i] != (zeroed ? 0 : data[i])) {
                throw new AssertionError("byte " + i + " (sector " + s + "): " + out[i] + ", expected "
                        + (zeroed ? 0 : data[i]));
            }
        }
        // the blocks stay mapped (flag set, no data written): every block referenced once
        assertThat(driver.btt().check()).isEmpty();
        long mapOff = BttLayout.BTT_OFFSET + BttLayout.arenas(SIZE - BttLayout.BTT_OFFSET, 4096).getFirst().mapOff();
        int entry1 = driver.region().memory().get(LE32, mapOff + 4);
        assertThat(entry1 & 0xC000_0000).as("LBA 1's map entry: Z set, E clear").isEqualTo(BttLayout.MAP_ZERO);
    }

    @Test
    void whatWasWrittenAndFlushedIsThereAfterARestartOnTheSameFile() throws Exception {
        serve(4096, 2, 4);
        byte[] a = bytes(11, 64 * 1024), b = bytes(12, 4096);
        assertThat(write(layer.queue(0), 0, a, false)).isZero();
        assertThat(write(layer.queue(1), 5 * 4096, b, true)).as("FUA").isZero();
        assertThat(run(Op.TRIM, 15 * 4096, 4096, (byte) 0, null)).isZero();
        assertThat(run(Op.FLUSH, 0, 0, (byte) 0, null)).isZero();
        stop();
        serve(4096, 1, 1);
        byte[] expect = a.clone();
        System.arraycopy(b, 0, expect, 5 * 4096, 4096);
        java.util.Arrays.fill(expect, 15 * 4096, 16 * 4096, (byte) 0);
        assertThat(read(layer.queue(0), 0, a.length)).isEqualTo(expect);
        assertThat(driver.btt().notes()).as("a clean close leaves nothing to recover").isEmpty();
        assertThat(driver.btt().check()).isEmpty();
    }

    /**
     * Writers on two hardware queues, several per queue (so two threads dispatch on one queue at once and must not
     * share a lane, and there are more threads than lanes), all on the same few LBAs, each WRITE one whole sector of one byte value; readers check every
     * sector they read is a single value: wholly some writer's, never a mix.
     */
    @Test
    void concurrentWritersOnOneLbaFromManyQueuesLeaveEveryReadWhollyOldOrNew() throws Exception {
        serve(4096, 2, 3, 1); // fewer lanes than threads: they must take turns, never share one
        int lbas = 3;
        // Until enough of both have overlapped (msync per step makes page-cache writes slow), 10 s at most.
        long writes = writersBesideTornSectorReaders(6, lbas, 300, id -> {
            byte[] sector = new byte[4096];
            return i -> {
                java.util.Arrays.fill(sector, (byte) (1 + id * 40 + i % 40));
                return new int[]{write(layer.queue(id % 2), (long) (i % lbas) * 4096, sector, false)};
            };
        });
        assertThat(writes).isGreaterThan(100);
    }

    /**
     * Writers dispatching batches of overlapping multi-sector WRITEs from two queues on 4 lanes (so groups are
     * smaller than asked, and lanes are claimed from one another's way), readers checking every sector is wholly
     * one writer's: grouped writes take their map locks in one order (no deadlock: the test ends), never share
     * a lane, and leave every block referenced once.
     */
    @Test
    void concurrentBatchesOnFewLanesNeverTearASectorNorDeadlock() throws Exception {
        serve(4096, 2, 2, 2);
        int lbas = 6;
        long batches = writersBesideTornSectorReaders(4, lbas, 200, id -> {
            java.util.Random rnd = new java.util.Random(id);
            return i -> {
                int n = 2 + rnd.nextInt(4);
                long[] offs = new long[n];
                byte[][] data = new byte[n][];
                for (int k = 0; k < n; k++) {
                    int first = rnd.nextInt(lbas), len = 1 + rnd.nextInt(Math.min(3, lbas - first));
                    offs[k] = first * 4096L;
                    data[k] = new byte[len * 4096];
                    for (int sct = 0; sct < len; sct++) { // one value per sector: a reader can tell a mix
                        java.util.Arrays.fill(data[k], sct * 4096, (sct + 1) * 4096, (byte) rnd.nextInt(256));
                    }
                }
                return writeBatch(layer.queue(id % 2), offs, data);
            };
        });
        assertThat(batches).isGreaterThan(50);
    }

    @Test
    void aReadOfADataBlockInABadRangeAnswersEioAndTheRestIsServed() throws Exception {
        serve(4096, 1, 2);
        assertThat(write(layer.queue(0), 3 * 4096, bytes(5, 4096), false)).isZero();
        BttLayout.Arena g = BttLayout.arenas(SIZE - BttLayout.BTT_OFFSET, 4096).getFirst();
        long data = BttLayout.BTT_OFFSET + g.dataOff(), map = BttLayout.BTT_OFFSET + g.mapOff();
        // the whole data area is bad, the map and flog are not
        driver.region().badBlocks(new BadBlocks(new long[]{data, map}, "test", null, 1));
        assertThat(run(Op.READ, 3 * 4096, 4096, (byte) 0, null)).isEqualTo(Status.EIO);
        assertThat(run(Op.READ, 3 * 4096 + 10, 100, (byte) 0, null)).as("a partial read too").isEqualTo(Status.EIO);
        assertThat(read(layer.queue(0), 4 * 4096, 4096)).as("never written: from the map alone").containsOnly(0);
        // a write's free block is bad too (and cannot be cleared, as on device DAX): EIO, the BTT unchanged
        assertThat(run(Op.WRITE, 4 * 4096, 4096, (byte) 1, null)).isEqualTo(Status.EIO);
        assertThat(driver.region().badBlocks().isEmpty()).isFalse();
        assertThat(driver.btt().check()).isEmpty();
        assertThat(run(Op.TRIM, 3 * 4096, 4096, (byte) 0, null)).as("the map is not bad").isZero();
        assertThat(read(layer.queue(0), 3 * 4096, 4096)).containsOnly(0);
    }

    @Test
    void aRawImageIsNeverReinterpretedAndTheSectorSizeMustBeThePools() throws Exception {
        Path raw = dir.resolve("raw.img");
        try (PmemRegion r = PmemRegion.open(raw, SIZE, false, PmemRegion.Mapper.AUTO)) {
            r.memory().set(LE32, 512, 0xEF53); // some raw data
            assertThatThrownBy(() -> BttRegion.open(r, 1, 0)).isInstanceOf(IOException.class)
                    .hasMessageContaining("is not recorded as a BTT").hasMessageContaining(BttRegion.FORMAT_COMMAND);
            assertThat(r.memory().get(LE32, 512)).as("untouched").isEqualTo(0xEF53);
            assertThat(r.memory().get(LE32, BttLayout.BTT_OFFSET)).isZero();
        }
        serve(512, 1, 1);
        assertThat(LayoutRecord.of(driver.region(), null).read()).get().extracting(LayoutRecord.Entry::sectorSize)
                .isEqualTo(512);
        assertThatThrownBy(() -> BttRegion.open(driver.region(), 1, 4096))
                .hasMessageContaining("is a BTT of 512-byte sectors, but pmem.sector-size is 4096");
    }

    /** Writer {@code id}'s i-th step: the statuses it got (each non-zero one is a problem). */
    interface WriterStep {
        int[] step(int i) throws Exception;
    }

    /**
     * {@code writers} threads, each running the step {@code writerOf} makes for it until stopped, beside 2 readers
     * that check every sector of the first {@code lbas} is wholly one writer's; until {@code enough} steps and
     * 100 reads have overlapped, 10 s at most. Then: no problem, more than 20 reads, a consistent BTT.
     *
     * @return the steps the writers made
     */
    private long writersBesideTornSectorReaders(int writers, int lbas, long enough,
                                                java.util.function.IntFunction<WriterStep> writerOf) throws Exception {
        Workers workers = new Workers();
        AtomicLong reads = new AtomicLong(), steps = new AtomicLong();
        for (int w = 0; w < writers; w++) {
            int id = w;
            WriterStep writer = writerOf.apply(id);
            workers.start("writer " + id, () -> {
                for (int i = 0; !workers.stopped(); i++) {
                    for (int st : writer.step(i)) {
                        if (st != 0) {
                            workers.problem("writer " + id + ": status " + st);
                        }
                    }
                    steps.incrementAndGet();
                }
            });
        }
        startTornSectorReaders(2, lbas, workers, reads);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (System.nanoTime() < deadline && workers.noProblem() && (reads.get() < 100 || steps.get() < enough)) {
            Thread.onSpinWait();
        }
        workers.stopAndJoin(10);
        assertThat(reads.get()).isGreaterThan(20);
        assertThat(driver.btt().check()).isEmpty();
        return steps.get();
    }

    /**
     * Readers of 4 KiB sectors on both queues until the workers stop, each sector checked to hold one value only (the
     * writers fill each sector with one value): a mix is a torn sector, a problem of {@code workers}.
     */
    private void startTornSectorReaders(int readers, int lbas, Workers workers, AtomicLong reads) {
        for (int rd = 0; rd < readers; rd++) {
            int id = rd;
            workers.start("reader " + id, () -> {
                HardwareQueue q = layer.queue(id % 2);
                for (int i = 0; !workers.stopped(); i++) {
                    byte[] s = read(q, (long) (i % lbas) * 4096, 4096);
                    for (byte x : s) {
                        if (x != s[0]) {
                            workers.problem("a read of LBA " + i % lbas + " mixes " + s[0] + " and " + x);
                            break;
                        }
                    }
                    reads.incrementAndGet();
                }
            });
        }
    }
}
