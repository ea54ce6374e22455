package io.pmemblk.pmem;

import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.pmem.btt.BttLayout;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Random;
import java.util.UUID;

import static io.pmemblk.queueing.testing.Digests.sha256;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Which layout a device is served with: the operator's pmem.layout and pmemblk's
 * {@link LayoutRecord}, never the device's bytes alone. A raw image holding what a client wrote (a pool
 * signature, a whole valid pool header) stays raw and is never laid out over; a recorded BTT is never served raw;
 * an unrecorded device is taken for a BTT (on the operator's word) only when it is wholly one. Real files, real
 * mappings; every refusal is checked to have written nothing (sha256 of the whole file).
 */
class LayoutDecisionTest {
    /** A pool header and one 16 MiB arena, plus a little. */
    static final long SIZE = BttLayout.BTT_OFFSET + (16 << 20) + (1 << 20);

    @TempDir
    Path dir;

    private static PmemRegion open(Path p) throws IOException {
        return PmemRegion.open(p, SIZE, false, PmemRegion.Mapper.AUTO);
    }

    /** The first 8 KiB of a pool pmemblk formats: a whole, valid pool header with its checksum, and bsize. */
    private byte[] validPoolHeader() throws IOException {
        Path scratch = dir.resolve("scratch.img");
        try (PmemRegion r = open(scratch)) {
            Btt.format(r.memory(), r.persistence(), 4096, 1);
            return r.memory().asSlice(0, BttLayout.BTT_OFFSET).toArray(java.lang.foreign.ValueLayout.JAVA_BYTE);
        } finally {
            Files.delete(scratch);
        }
    }

    /**
     * A raw image a client filled: random data everywhere except a whole valid pool header at 0 and zeros where
     * arena 0's info block and its backup would be (what the old serve took for `pmempool create blk` without -w,
     * and laid a BTT out over, overwriting the image's last MiB).
     */
    private Path rawImageWithPoolHeader() throws IOException {
        Path raw = dir.resolve("raw.img");
        byte[] header = validPoolHeader();
        try (PmemRegion r = open(raw)) {
            byte[] data = new byte[(int) SIZE];
            new Random(42).nextBytes(data);
            MemorySegment m = r.memory();
            MemorySegment.copy(MemorySegment.ofArray(data), 0, m, 0, SIZE);
            MemorySegment.copy(MemorySegment.ofArray(header), 0, m, 0, header.length);
            m.asSlice(BttLayout.BTT_OFFSET, BttLayout.INFO_SIZE).fill((byte) 0);
            m.asSlice(SIZE - BttLayout.INFO_SIZE, BttLayout.INFO_SIZE).fill((byte) 0); // the backup: the last 4 KiB
            r.writeBack().persistAll();
        }
        return raw;
    }

    @Test
    void aRawImageHoldingAWholeValidPoolHeaderIsNeverLaidOutOver() throws Exception {
        Path raw = rawImageWithPoolHeader();
        String before = sha256(raw);
        try (PmemRegion r = open(raw)) {
            assertThat(Btt.poolUuid(r.memory())).as("the header is valid: only a record can tell").isNotNull();
            assertThatThrownBy(() -> BttRegion.open(r, 1, 0)).isInstanceOf(IOException.class)
                    .hasMessageContaining("is not recorded as a BTT (no " + raw + LayoutRecord.SUFFIX + ")")
                    .hasMessageContaining("no BTT is laid out")
                    .hasMessageContaining("nothing was written")
                    .hasMessageContaining("serve it with pmem.layout=raw")
                    .hasMessageNotContaining("pmem.layout=btt");
            BttRegion.checkRaw(r, LayoutRecord.of(r, null)); // and served raw it is: no record, no refusal
        }
        assertThat(sha256(raw)).as("not one byte changed").isEqualTo(before);
        assertThat(raw.resolveSibling(raw.getFileName() + LayoutRecord.SUFFIX)).doesNotExist();
    }

    @Test
    void aRecordedBttIsNeverServedRawAndTheRefusalNamesTheRecord() throws Exception {
        Path img = dir.resolve("btt.img");
        UUID pool;
        try (PmemRegion r = open(img)) {
            BttRegion.format(r, 512);
            pool = Btt.poolUuid(r.memory());
        }
        Path record = dir.resolve("btt.img" + LayoutRecord.SUFFIX);
        assertThat(Files.readString(record)).contains("layout=btt", "state=btt", "sector-size=512", "size=" + SIZE,
                "pool-uuid=" + pool);
        try (PmemRegion r = open(img)) {
            assertThatThrownBy(() -> BttRegion.checkRaw(r, LayoutRecord.of(r, null)))
                    .hasMessageContaining("is recorded as a BTT of 512-byte sectors (pool " + pool + ") in " + record)
                    .hasMessageContaining("serve it with --set pmem.layout=btt")
                    .hasMessageContaining("remove " + record);
            // whatever its bytes: the pool header wiped (as a raw client could not, but an erase would) changes nothing
            r.memory().asSlice(0, 4096).fill((byte) 0);
            assertThatThrownBy(() -> BttRegion.checkRaw(r, LayoutRecord.of(r, null)))
                    .hasMessageContaining("is recorded as a BTT");
        }
    }

    @Test
    void anUnrecordedCompleteBttIsServedAsTheOperatorSaysAndRecordedWithoutAByteChanged() throws Exception {
        Path img = dir.resolve("old.img");
        try (PmemRegion r = open(img)) {
            Btt.format(r.memory(), r.persistence(), 4096, 1); // as an older pmemblk or `pmempool create -w blk` did
        }
        Path record = dir.resolve("old.img" + LayoutRecord.SUFFIX);
        assertThat(record).doesNotExist();
        String before = sha256(img);
        try (PmemRegion r = open(img)) {
            BttRegion.checkRaw(r, LayoutRecord.of(r, null)); // unrecorded: raw is the operator's to choose
            Btt btt = BttRegion.open(r, 1, 0);
            assertThat(btt.blockSize()).isEqualTo(4096);
            assertThat(LayoutRecord.of(r, null).read()).contains(new LayoutRecord.Entry(LayoutRecord.State.BTT, 4096,
                    SIZE, Btt.poolUuid(r.memory())));
        }
        assertThat(sha256(img)).as("opening a complete BTT wrote nothing").isEqualTo(before);
        try (PmemRegion r = open(img)) {
            assertThatThrownBy(() -> BttRegion.checkRaw(r, LayoutRecord.of(r, null))).hasMessageContaining(record.toString());
        }
    }

    @Test
    void anUnrecordedPoolWhosePrimaryInfoBlockIsDamagedIsNotRepairedOnTheOperatorsWord() throws Exception {
        Path img = dir.resolve("damaged.img");
        try (PmemRegion r = open(img)) {
            Btt.format(r.memory(), r.persistence(), 4096, 1);
            r.memory().set(java.lang.foreign.ValueLayout.JAVA_BYTE, BttLayout.BTT_OFFSET + 200, (byte) 1);
            r.writeBack().persistAll();
        }
        String before = sha256(img);
        try (PmemRegion r = open(img)) {
            assertThatThrownBy(() -> BttRegion.open(r, 1, 0)).hasMessageContaining("its backup is valid: opening"
                    + " would restore it, a write");
        }
        assertThat(sha256(img)).isEqualTo(before);
        // recorded, it is ours: restored from the backup as pmempool check -r would
        try (PmemRegion r = open(img)) {
            LayoutRecord.of(r, null).write(new LayoutRecord.Entry(LayoutRecord.State.BTT, 4096, SIZE,
                    Btt.poolUuid(r.memory())));
            assertThat(BttRegion.open(r, 1, 0).notes()).anyMatch(n -> n.contains("restored from its backup"));
        }
    }

    @Test
    void aRecordedBttWhoseImageWasReplacedIsRefusedAndNotLaidOutOver() throws Exception {
        Path img = dir.resolve("btt.img");
        try (PmemRegion r = open(img)) {
            BttRegion.format(r, 4096);
        }
        Path record = dir.resolve("btt.img" + LayoutRecord.SUFFIX);
        String recorded = Files.readString(record);
        try (PmemRegion r = open(img)) {
            Btt.format(r.memory(), r.persistence(), 4096, 1); // another pool in its place (a restored other image)
        }
        String before = sha256(img);
        try (PmemRegion r = open(img)) {
            assertThatThrownBy(() -> BttRegion.open(r, 1, 0))
                    .hasMessageContaining("is recorded as the BTT of pool")
                    .hasMessageContaining("but it now holds pool " + Btt.poolUuid(r.memory()));
        }
        assertThat(sha256(img)).isEqualTo(before);
        assertThat(Files.readString(record)).isEqualTo(recorded);
    }

    @Test
    void aFormatThatDidNotFinishIsFormattedAgain() throws Exception {
        Path img = dir.resolve("half.img");
        open(img).close(); // an existing file (one created by this open has no layout to keep)
        try (PmemRegion r = open(img)) {
            LayoutRecord rec = LayoutRecord.of(r, null);
            rec.write(new LayoutRecord.Entry(LayoutRecord.State.FORMATTING, 512, SIZE, null));
            r.memory().asSlice(BttLayout.BTT_OFFSET, 1 << 20).fill((byte) 7); // where the format stopped
            assertThatThrownBy(() -> BttRegion.checkRaw(r, rec)).hasMessageContaining("whose format did not finish");
            Btt btt = BttRegion.open(r, rec, 1, 0, 1);
            assertThat(btt.blockSize()).isEqualTo(512);
            assertThat(rec.read().orElseThrow().state()).isEqualTo(LayoutRecord.State.BTT);
        }
    }

    /**
     * A format refused for the device's size (16 MiB + 8 KiB + 512: not a multiple of 4 KiB past the header)
     * leaves no FORMATTING record: the file is still served raw, and not a byte of it changed.
     */
    @Test
    void aFormatRefusedForItsSizeLeavesNoRecordAndTheFileStaysRaw() throws Exception {
        Path img = dir.resolve("odd.img");
        long odd = BttLayout.BTT_OFFSET + (16 << 20) + 512;
        try (RandomAccessFile f = new RandomAccessFile(img.toFile(), "rw")) {
            f.setLength(odd);
        }
        String before = sha256(img);
        try (PmemRegion r = PmemRegion.open(img, odd, false, PmemRegion.Mapper.AUTO)) {
            assertThat(r.created()).isFalse();
            Throwable refused = org.assertj.core.api.Assertions.catchThrowable(() -> BttRegion.format(r, 4096));
            assertThat(dir.resolve("odd.img" + LayoutRecord.SUFFIX)).as("the layout record").doesNotExist();
            assertThat(refused).isInstanceOf(IOException.class)
                    .hasMessageContaining("a pmemblk pool of " + odd + " bytes cannot hold a BTT")
                    .hasMessageContaining("nothing was written");
            BttRegion.checkRaw(r, LayoutRecord.of(r, null));
        }
        assertThat(sha256(img)).isEqualTo(before);
    }

    @Test
    void aFileCreatedNowDropsTheRecordOfTheFileDeletedBefore() throws Exception {
        Path img = dir.resolve("new.img");
        try (PmemRegion r = open(img)) {
            BttRegion.format(r, 4096);
        }
        Files.delete(img);
        Path record = dir.resolve("new.img" + LayoutRecord.SUFFIX);
        assertThat(record).exists();
        try (PmemRegion r = open(img)) {
            assertThat(r.created()).isTrue();
            BttRegion.checkRaw(r, LayoutRecord.of(r, null));
        }
        assertThat(record).doesNotExist();
    }

    @Test
    void aRecordThatIsNotOneIsAnErrorNamingIt() throws Exception {
        Path img = dir.resolve("x.img");
        Files.writeString(dir.resolve("x.img" + LayoutRecord.SUFFIX), "hello\n");
        try (PmemRegion r = open(img)) {
            Files.writeString(dir.resolve("x.img" + LayoutRecord.SUFFIX), "hello\n");
            // created just now: the stray file is removed as a stale record
            BttRegion.checkRaw(r, LayoutRecord.of(r, null));
        }
        Files.writeString(dir.resolve("x.img" + LayoutRecord.SUFFIX), "layout=raw\n");
        try (PmemRegion r = open(img)) {
            assertThatThrownBy(() -> BttRegion.checkRaw(r, LayoutRecord.of(r, null)))
                    .hasMessageContaining("the layout record " + dir.resolve("x.img" + LayoutRecord.SUFFIX)
                            + " cannot be read (layout is raw, not btt)");
        }
    }

    // ------------------------------------------------------------------------------------------------- DataScan

    @Test
    void dataOnlyPastTheFirstMibIsFound() throws Exception {
        Path img = dir.resolve("late.img");
        try (PmemRegion r = open(img)) {
            assertThat(DataScan.firstNonZero(r)).as("a new file: reserved, never written").isEqualTo(-1);
            r.memory().set(java.lang.foreign.ValueLayout.JAVA_BYTE, (3L << 20) + 5, (byte) 1);
            r.writeBack().persistAll();
            assertThat(DataScan.firstNonZero(r)).isEqualTo((3L << 20) + 5);
            r.memory().set(java.lang.foreign.ValueLayout.JAVA_BYTE, SIZE - 1, (byte) 1);
            r.memory().set(java.lang.foreign.ValueLayout.JAVA_BYTE, (3L << 20) + 5, (byte) 0);
            assertThat(DataScan.firstNonZero(r)).as("the very last byte").isEqualTo(SIZE - 1);
        }
    }

    @Test
    void aOneTebibyteSparseFileIsScannedInAMomentByItsHoles() throws Exception {
        long size = 1L << 40;
        Path img = dir.resolve("sparse.img");
        try (RandomAccessFile f = new RandomAccessFile(img.toFile(), "rw")) {
            f.setLength(size);
            f.seek(size - 4096 + 17);
            f.write(9); // one block of data, at the end
        }
        try (PmemRegion r = PmemRegion.open(img, size, false, PmemRegion.Mapper.JAVA)) {
            long t0 = System.nanoTime();
            assertThat(DataScan.firstNonZero(r)).isEqualTo(size - 4096 + 17);
            long ms = (System.nanoTime() - t0) / 1_000_000;
            // read byte by byte it would take minutes (1 TiB at a few GB/s): the holes are skipped unread
            assertThat(ms).as("ms to scan 1 TiB sparse").isLessThan(5_000);
        }
    }
}
