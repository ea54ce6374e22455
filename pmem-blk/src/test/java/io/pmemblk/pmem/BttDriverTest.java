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
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
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
    private void serve(int sectorSize, int queues, int lanes) throws IOException {
        Path file = dir.resolve("d.img");
        boolean fresh = !Files.exists(file);
        PmemRegion region = PmemRegion.open(file, SIZE, false, PmemRegion.Mapper.AUTO);
        if (fresh) {
            BttRegion.format(region, sectorSize);
        }
        driver = PmemBlockDriver.onBtt(region, new CopyStats(), BttRegion.open(region, lanes, 0));
        layer = new BlockLayer(driver, queues, 16, 4 << 20, 1 << 20);
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
        int pos = 0;
        for (ByteBuffer b : r.buffers()) {
            if (b == null) break;
            int k = b.remaining();
            b.put(data, pos, k);
            pos += k;
        }
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
        serve(4096, 2, 3); // fewer lanes than threads: they must take turns, never share one
        int writers = 6, readers = 2, lbas = 3;
        AtomicBoolean stop = new AtomicBoolean();
        AtomicLong reads = new AtomicLong(), writes = new AtomicLong();
        ConcurrentLinkedQueue<String> problems = new ConcurrentLinkedQueue<>();
        List<Thread> threads = new ArrayList<>();
        for (int w = 0; w < writers; w++) {
            int id = w;
            threads.add(Thread.ofPlatform().start(() -> {
                HardwareQueue q = layer.queue(id % 2);
                byte[] sector = new byte[4096];
                try {
                    for (int i = 0; !stop.get(); i++) {
                        java.util.Arrays.fill(sector, (byte) (1 + id * 40 + i % 40));
                        int st = write(q, (long) (i % lbas) * 4096, sector, false);
                        if (st != 0) {
                            problems.add("writer " + id + ": status " + st);
                        }
                        writes.incrementAndGet();
                    }
                } catch (Throwable t) {
                    problems.add("writer " + id + ": " + t);
                }
            }));
        }
        for (int rd = 0; rd < readers; rd++) {
            int id = rd;
            threads.add(Thread.ofPlatform().start(() -> {
                HardwareQueue q = layer.queue(id % 2);
                try {
                    for (int i = 0; !stop.get(); i++) {
                        byte[] s = read(q, (long) (i % lbas) * 4096, 4096);
                        for (byte x : s) {
                            if (x != s[0]) {
                                problems.add("a read of LBA " + i % lbas + " mixes " + s[0] + " and " + x);
                                break;
                            }
                        }
                        reads.incrementAndGet();
                    }
                } catch (Throwable t) {
                    problems.add("reader " + id + ": " + t);
                }
            }));
        }
        // Until enough of both have overlapped (msync per step makes page-cache writes slow), 10 s at most.
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (System.nanoTime() < deadline && problems.isEmpty() && (reads.get() < 100 || writes.get() < 300)) {
            Thread.onSpinWait();
        }
        stop.set(true);
        for (Thread t : threads) {
            t.join(10_000);
            assertThat(t.isAlive()).as("%s ended within 10 s", t).isFalse();
        }
        assertThat(problems).isEmpty();
        assertThat(writes.get()).isGreaterThan(100);
        assertThat(reads.get()).isGreaterThan(20);
        assertThat(driver.btt().check()).isEmpty();
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
            assertThat(BttRegion.holdsBtt(r)).isFalse();
            assertThatThrownBy(() -> BttRegion.open(r, 1, 0)).isInstanceOf(IOException.class)
                    .hasMessageContaining("holds no BTT").hasMessageContaining(BttRegion.FORMAT_COMMAND);
            assertThat(r.memory().get(LE32, 512)).as("untouched").isEqualTo(0xEF53);
            assertThat(r.memory().get(LE32, BttLayout.BTT_OFFSET)).isZero();
        }
        serve(512, 1, 1);
        assertThat(BttRegion.holdsBtt(driver.region())).isTrue();
        assertThatThrownBy(() -> BttRegion.open(driver.region(), 1, 4096))
                .hasMessageContaining("is a BTT of 512-byte sectors, but pmem.sector-size is 4096");
    }
}
