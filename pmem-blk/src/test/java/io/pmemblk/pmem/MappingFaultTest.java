package io.pmemblk.pmem;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.testing.Closing;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The backing file truncated under a live mapping (SIGBUS on every access past the new end, as a poisoned pmem
 * line raises it): each request touching the lost part answers EIO, everything else keeps working, the JVM
 * lives. Runs with both mappers, on a disk file system (reads by the JDK's fault-checked copy) and on tmpfs (reads
 * by memcpy behind the tail probe); in the forced-pmem execution (pom) also through libpmem's non-temporal path.
 */
class MappingFaultTest {
    static final int SIZE = 8 << 20;
    static final int HALF = SIZE / 2;
    @TempDir
    Path dir;
    PmemBlockDriver driver;
    BlockLayer layer;
    HardwareQueue q;
    CopyStats stats = new CopyStats();

    Path shm;

    @AfterEach
    void tearDown() throws Exception {
        Closing.closeAll(layer, driver);
        if (shm != null) {
            Files.deleteIfExists(shm.resolve("d.img"));
            Files.deleteIfExists(shm);
        }
    }

    /** Each mapper on the build's file system and on /dev/shm (tmpfs), where reads take the other copy. */
    static Stream<Arguments> placements() {
        return Stream.of(PmemRegion.Mapper.JAVA, PmemRegion.Mapper.AUTO)
                .flatMap(m -> Stream.of(Arguments.of(m, false), Arguments.of(m, true)));
    }

    private void serveThenTruncate(PmemRegion.Mapper mapper, boolean inMemory) throws Exception {
        Path where = dir;
        if (inMemory) {
            where = shm = Files.createTempDirectory(Path.of("/dev/shm"), "mapping-fault-test");
        }
        Path file = where.resolve("d.img");
        driver = new PmemBlockDriver(PmemRegion.open(file, SIZE, false, mapper), stats);
        assertThat(driver.region().readsWithMemcpy()).as("reads by memcpy on %s", where).isEqualTo(inMemory);
        layer = new BlockLayer(driver, 1, 8, 4 << 20, 2 << 20);
        q = layer.queue(0);
        assertThat(run(Op.WRITE, 0, 2 << 20, (byte) 0x5a, false, null)).isZero();
        assertThat(run(Op.WRITE, HALF, 1 << 20, (byte) 0x6b, false, null)).isZero();
        // Hot enough for C2: compiled, a fault's error is thrown at a later safepoint poll unless the access
        // path makes it throw on the spot (interpreted, it shows up at once and proves nothing).
        for (int i = 0; i < 40_000; i++) {
            int len = (i & 1) == 0 ? 512 : 8192;
            run(Op.READ, (i * 8192L) % HALF, len, (byte) 0, (i & 2) != 0, null);
            run(Op.WRITE, HALF + (i * 8192L) % HALF, len, (byte) 0x6b, false, null);
            if ((i & 15) == 0) {
                run(Op.WRITE_ZEROES, HALF + (1 << 20) + (i * 8192L) % (1 << 20), len, (byte) 0, false, null);
            }
        }
        try (FileChannel fc = FileChannel.open(file, StandardOpenOption.WRITE)) {
            fc.truncate(HALF); // behind the server's back: its mapping still spans SIZE
        }
    }

    private int run(Op op, long off, int len, byte fill, boolean sink, byte[] out) throws InterruptedException {
        return InlineRequests.run(q, op, off, len, fill, sink, out);
    }

    @ParameterizedTest
    @MethodSource("placements")
    void requestsIntoTheTruncatedPartAnswerEioAndTheRestIsServed(PmemRegion.Mapper mapper, boolean inMemory) throws Exception {
        serveThenTruncate(mapper, inMemory);
        long[] lens = {512, 4096, 65536, 2 << 20}; // inline copies, libc-sized copies, many 64 KiB chunks
        int expectedFaults = 0;
        for (long len : lens) {
            int n = (int) len;
            assertThat(run(Op.READ, HALF + 4096, n, (byte) 0, false, null)).as("READ %d past the end", len).isEqualTo(Status.EIO);
            assertThat(run(Op.READ, HALF + 4096, n, (byte) 0, true, null)).as("sink READ %d past the end", len).isEqualTo(Status.EIO);
            assertThat(run(Op.WRITE, HALF + 8192, n, (byte) 1, false, null)).as("WRITE %d past the end", len).isEqualTo(Status.EIO);
            assertThat(run(Op.WRITE_ZEROES, HALF + 8192, n, (byte) 0, false, null)).as("WRITE_ZEROES %d", len).isEqualTo(Status.EIO);
            expectedFaults += 4;
        }
        // straddling the new end: the whole request fails, none of it is answered as if read
        assertThat(run(Op.READ, HALF - 4096, 8192, (byte) 0, false, null)).isEqualTo(Status.EIO);
        expectedFaults++;
        assertThat(stats.mappingFaults()).isEqualTo(expectedFaults);

        // the intact half is served, by both read paths, and takes writes
        byte[] got = new byte[1 << 20];
        assertThat(run(Op.READ, 4096, got.length, (byte) 0, false, got)).isZero();
        for (int i = 0; i < got.length; i++) assertThat(got[i]).as("byte %d", i).isEqualTo((byte) 0x5a);
        byte[] viaViews = new byte[65536];
        assertThat(run(Op.READ, 65536, viaViews.length, (byte) 0, true, viaViews)).isZero();
        for (int i = 0; i < viaViews.length; i++) assertThat(viaViews[i]).isEqualTo((byte) 0x5a);
        assertThat(run(Op.WRITE, 0, 4096, (byte) 0x77, false, null)).isZero();
        assertThat(run(Op.FLUSH, 0, 0, (byte) 0, false, null)).isZero();
        byte[] back = new byte[4096];
        assertThat(run(Op.READ, 0, 4096, (byte) 0, false, back)).isZero();
        for (byte b : back) assertThat(b).isEqualTo((byte) 0x77);
        assertThat(stats.mappingFaults()).as("no fault counted for the intact part").isEqualTo(expectedFaults);
    }

    /**
     * A guest's request: many 4 KiB pieces of caller memory (and one of 128 KiB, which a read of a file in memory
     * copies with memcpy), copied as one run without a round trip per piece: a fault in any piece still fails the
     * request, inside it, and the JVM lives; pieces in the intact half are copied byte for byte.
     */
    @ParameterizedTest
    @MethodSource("placements")
    void aRequestOfManyPiecesFaultsAsAWholeAndTheIntactHalfIsServedByPieces(PmemRegion.Mapper mapper, boolean inMemory)
            throws Exception {
        serveThenTruncate(mapper, inMemory);
        FrontendQueue fq = new FrontendQueue(q);
        try (Arena a = Arena.ofShared()) {
            int pieces = 48, big = 128 << 10, len = (pieces - 1) * 4096 + big;
            MemorySegment mem = a.allocate(2L * len, 4096);
            for (long i = 0; i < len; i++) {
                mem.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 31 + 7));
            }
            // Hot for C2 first, on the intact half (compiled, a fault not made to throw inside the run shows up
            // at a later safepoint poll, maybe after the request was answered).
            for (int i = 0; i < 20_000; i++) {
                assertThat(runPieces(fq, (i & 1) == 0 ? Op.WRITE : Op.READ, 8192, mem, len, pieces, big)).isZero();
            }
            // past the end, straddling it, and only the last piece past it: the whole request fails
            for (long off : new long[]{HALF + 8192, HALF - 64 * 4096, HALF - (len - 4096)}) {
                for (Op op : new Op[]{Op.WRITE, Op.READ}) {
                    assertThat(runPieces(fq, op, off, mem, len, pieces, big)).as("%s of %d pieces at %d", op, pieces, off)
                            .isEqualTo(Status.EIO);
                }
            }
            assertThat(stats.mappingFaults()).isEqualTo(6);
            // the intact half: written from the pieces, read back into others
            assertThat(runPieces(fq, Op.WRITE, 8192, mem, len, pieces, big)).isZero();
            assertThat(runPieces(fq, Op.READ, 8192, mem.asSlice(len), len, pieces, big)).isZero();
            assertThat(mem.asSlice(len, len).mismatch(mem.asSlice(0, len))).as("read back byte for byte").isEqualTo(-1);
            assertThat(stats.mappingFaults()).isEqualTo(6);
        }
    }

    /** One request of {@code pieces} pieces of {@code mem} (4 KiB each, the middle one {@code big}), run inline. */
    private static int runPieces(FrontendQueue fq, Op op, long off, MemorySegment mem, int len, int pieces, int big)
            throws InterruptedException {
        Request r = fq.acquireIov(op, off, len);
        long at = 0;
        for (int i = 0; i < pieces; i++) {
            int n = i == pieces / 2 ? big : 4096;
            r.addIov(mem.asSlice(at, n), Request.NO_IOVA);
            at += n;
        }
        AtomicInteger done = new AtomicInteger(-1);
        r.completion = req -> done.set(req.status());
        fq.add(r);
        fq.dispatch();
        assertThat(done.get()).as("CPU route completes inline").isGreaterThanOrEqualTo(0);
        r.release();
        return done.get();
    }

    @ParameterizedTest
    @MethodSource("placements")
    void theKernelIsNotHandedAPageItCannotLoad(PmemRegion.Mapper mapper, boolean inMemory) throws Exception {
        serveThenTruncate(mapper, inMemory);
        // a WRITE past the end is not received into the mapping (read(2) would answer EFAULT mid-payload)
        assertThat(driver.receivesInPlace(HALF + 4096, 4096)).isFalse();
        assertThat(driver.receivesInPlace(HALF - 4096, 8192)).isFalse();
        assertThat(driver.receivesInPlace(4096, 65536)).isTrue();
    }

    @ParameterizedTest
    @MethodSource("placements")
    void theRegionsAccessorsThrowAMappingFaultNamingTheOffset(PmemRegion.Mapper mapper, boolean inMemory) throws Exception {
        serveThenTruncate(mapper, inMemory);
        PmemRegion region = driver.region();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(1 << 20);
            assertThatThrownBy(() -> region.read(HALF + 100, buf, 0, 1 << 20)).isInstanceOf(MappingFault.class)
                    .hasMessageContaining("read of 1048576 bytes at offset " + (HALF + 100))
                    .satisfies(e -> assertThat(((MappingFault) e).offset()).isEqualTo(HALF + 100));
            assertThatThrownBy(() -> region.write(buf, 0, HALF, 4096)).isInstanceOf(MappingFault.class)
                    .hasMessageContaining("write of 4096 bytes at offset " + HALF);
            assertThatThrownBy(() -> region.zero(SIZE - 4096, 4096)).isInstanceOf(MappingFault.class);
            assertThatThrownBy(() -> region.probe(SIZE - 1, 1)).isInstanceOf(MappingFault.class);
            region.read(0, buf, 0, 4096);
            assertThat(buf.get(java.lang.foreign.ValueLayout.JAVA_BYTE, 0)).isEqualTo((byte) 0x5a);
        }
    }
}
