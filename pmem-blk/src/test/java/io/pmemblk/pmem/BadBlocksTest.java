package io.pmemblk.pmem;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Bad blocks: the sysfs formats and where each lives (a fake sysfs tree in the layout the kernel makes), the
 * range bookkeeping, and the requests that touch them, on a real file: FIEMAP of a file on this machine's disk,
 * punching and reallocating its blocks when a write clears them.
 */
class BadBlocksTest {
    static final long MIB = 1 << 20;
    @TempDir
    Path dir;

    @Test
    void parsesSectorCountLinesIntoByteRanges() throws IOException {
        assertThat(BadBlocks.parse("", "bb")).isEmpty();
        assertThat(BadBlocks.parse("8 1\n\n100 16\n", "bb")).containsExactly(4096, 4608, 51200, 59392);
        assertThat(BadBlocks.parse("  0   2  \n", "bb")).containsExactly(0, 1024);
    }

    @Test
    void aMalformedLineIsRefusedNamingTheFileTheLineAndTheFormat() {
        assertThatThrownBy(() -> BadBlocks.parse("8 1\n8\n", "/sys/block/pmem0/badblocks")).isInstanceOf(IOException.class)
                .hasMessageContaining("/sys/block/pmem0/badblocks line 2: '8' is not 'sector count'");
        assertThatThrownBy(() -> BadBlocks.parse("x 1\n", "bb")).hasMessageContaining("line 1: 'x 1'");
        assertThatThrownBy(() -> BadBlocks.parse("8 0\n", "bb")).hasMessageContaining("count > 0");
        assertThatThrownBy(() -> BadBlocks.parse("-8 1\n", "bb")).hasMessageContaining("sector must be >= 0");
        assertThatThrownBy(() -> BadBlocks.parse(Long.MAX_VALUE / 512 + " 1\n", "bb")).hasMessageContaining("2^63");
    }

    @Test
    void rangesAreSortedMergedAndLookedUpHalfOpen() {
        BadBlocks b = new BadBlocks(new long[]{8192, 9000, 0, 512, 512, 1024, 20000, 20001}, "t", null, 1);
        assertThat(b.ranges()).containsExactly(0, 1024, 8192, 9000, 20000, 20001);
        assertThat(b.bytes()).isEqualTo(1024 + 808 + 1);
        assertThat(b.overlaps(1024, 7168)).as("between two ranges, touching both ends").isFalse();
        assertThat(b.overlaps(1023, 1)).isTrue();
        assertThat(b.overlaps(8191, 2)).isTrue();
        assertThat(b.overlaps(9000, 10000)).isFalse();
        assertThat(b.overlaps(19999, 2)).isTrue();
        assertThat(b.overlaps(20001, 1 << 30)).isFalse();
        assertThat(b.overlaps(0, 0)).as("empty").isFalse();
        assertThat(BadBlocks.NONE.overlaps(0, Long.MAX_VALUE)).isFalse();
        assertThat(BadBlocks.subtract(b.ranges(), 256, 8500)).containsExactly(0, 256, 8500, 9000, 20000, 20001);
        assertThat(BadBlocks.rebase(new long[]{0, 4096, 8192, 16384}, 6000, 4096)).containsExactly(2192, 4096);
        List<BadBlocks.Extent> ext = List.of(new BadBlocks.Extent(0, 1_000_000, 8192), new BadBlocks.Extent(8192, 50_000, 4096));
        assertThat(BadBlocks.toFile(new long[]{1_004_096, 1_004_608, 49_000, 50_512}, ext))
                .containsExactly(4096, 4608, 8192, 8704);
    }

    /** A fake sysfs with device DAX dax0.0 whose data starts 2 MiB into region0 (after its info block). */
    private Path fakeDevDaxSysfs(String regionBadblocks) throws IOException {
        Path sys = dir.resolve("sys");
        Path region = Files.createDirectories(sys.resolve("devices/platform/e820_pmem/ndbus0/region0"));
        Files.writeString(region.resolve("resource"), "0x100000000\n");
        Files.writeString(region.resolve("badblocks"), regionBadblocks);
        Path nd = Files.createDirectories(region.resolve("dax0.0"));
        Files.writeString(nd.resolve("resource"), "0x100200000\n");
        Files.createDirectories(nd.resolve("dax0.0"));
        Path bus = Files.createDirectories(sys.resolve("bus/dax/devices"));
        Files.createSymbolicLink(bus.resolve("dax0.0"), Path.of("../../../devices/platform/e820_pmem/ndbus0/region0/dax0.0/dax0.0"));
        return sys;
    }

    @Test
    void deviceDaxTakesTheRegionsListMinusWhereTheNamespaceDataStarts() throws IOException {
        // region sectors: 2048 (1 MiB: the info block, not mapped), 4096 (2 MiB: the mapping's first sector),
        // 8192 x 16 (4 MiB: 2 MiB into the mapping), and one past the 64 MiB mapping
        Path sys = fakeDevDaxSysfs("2048 8\n4096 1\n8192 16\n" + (4096 + 64 * 2048) + " 8\n");
        BadBlocks b = BadBlocks.of(Path.of("/dev/dax0.0"), true, sys, 64 * MIB);
        assertThat(b.ranges()).containsExactly(0, 512, 2 * MIB, 2 * MIB + 8192);
        assertThat(b.clearable()).isFalse();
        assertThat(b.source()).endsWith("region0/badblocks");
        assertThat(BadBlocks.of(Path.of("/dev/dax0.0"), true, fakeDevDaxSysfs2(), 64 * MIB)).isSameAs(BadBlocks.NONE);
        assertThat(BadBlocks.of(Path.of("/dev/dax9.9"), true, sys, 64 * MIB)).as("unknown device").isSameAs(BadBlocks.NONE);
    }

    private Path fakeDevDaxSysfs2() throws IOException {
        Path saved = dir;
        dir = Files.createDirectories(saved.resolve("empty"));
        try {
            return fakeDevDaxSysfs("");
        } finally {
            dir = saved;
        }
    }

    @Test
    void aFileOnFsdaxMapsTheDevicesSectorsThroughItsExtentsAndAPartitionsStart() throws IOException {
        Path file = dataFile(1 * MIB);
        List<BadBlocks.Extent> extents = BadBlocks.extents(file);
        assertThat(extents).as("FIEMAP of a written file on " + Files.getFileStore(file)).isNotEmpty();
        BadBlocks.Extent first = extents.get(0);
        long physSector = (first.physical() + 8192) / 512;
        // whole disk: sectors relative to the device
        Path sys = fakeBlockSysfs(file, false, physSector + " 2\n", 0);
        BadBlocks b = BadBlocks.of(file, false, sys, 1 * MIB);
        assertThat(b.ranges()).containsExactly(first.logical() + 8192, first.logical() + 9216);
        assertThat(b.clearable()).isTrue();
        // a partition starting 1 MiB into the disk: the disk's list, shifted by the partition's start
        Path sys2 = fakeBlockSysfs(file, true, (physSector + 2048) + " 2\n", 2048);
        assertThat(BadBlocks.of(file, false, sys2, 1 * MIB).ranges()).containsExactly(first.logical() + 8192, first.logical() + 9216);
        // no list for that device (tmpfs, overlay): none
        assertThat(BadBlocks.of(file, false, dir.resolve("no-sys"), 1 * MIB)).isSameAs(BadBlocks.NONE);
    }

    private Path dataFile(long size) throws IOException {
        Path file = dir.resolve("data.img");
        byte[] data = new byte[(int) size];
        for (int i = 0; i < data.length; i++) data[i] = (byte) (i / 4096 + 1);
        Files.write(file, data);
        try (FileChannel fc = FileChannel.open(file, StandardOpenOption.WRITE)) {
            fc.force(true);
        }
        return file;
    }

    private int fakeSysfsCount;

    /** sys/dev/block/MAJ:MIN of the file's device, pointing at a fake disk (or partition of one) with a badblocks list. */
    private Path fakeBlockSysfs(Path file, boolean partition, String badblocks, long startSector) throws IOException {
        long dev = ((Number) Files.getAttribute(file, "unix:dev")).longValue();
        long major = ((dev >>> 8) & 0xfff) | ((dev >>> 32) & ~0xfffL);
        long minor = (dev & 0xff) | ((dev >>> 12) & ~0xffL);
        Path sys = dir.resolve("sys-block-" + fakeSysfsCount++);
        Path disk = Files.createDirectories(sys.resolve("devices/platform/e820_pmem/ndbus0/region0/namespace0.0/block/pmem0"));
        Files.writeString(disk.resolve("badblocks"), badblocks);
        Path target = disk;
        if (partition) {
            target = Files.createDirectories(disk.resolve("pmem0p1"));
            Files.writeString(target.resolve("partition"), "1\n");
            Files.writeString(target.resolve("start"), startSector + "\n");
        }
        Path devBlock = Files.createDirectories(sys.resolve("dev/block"));
        Files.createSymbolicLink(devBlock.resolve(major + ":" + minor), devBlock.relativize(target));
        return sys;
    }

    // --- the requests that touch them ---

    private PmemBlockDriver driver;
    private HardwareQueue q;
    private final CopyStats stats = new CopyStats();

    private int run(Op op, long off, int len, byte fill, boolean sink, byte[] out) throws InterruptedException {
        return InlineRequests.run(q, op, off, len, fill, sink, out);
    }

    @Test
    void deviceDaxBadRangesAnswerEioToReadsAndWritesAndTheRestIsServed() throws Exception {
        try (PmemRegion region = PmemRegion.open(dir.resolve("d.img"), 8 * MIB, false, PmemRegion.Mapper.AUTO)) {
            assertThat(region.badBlocks()).as("a file on a disk without bad blocks").isSameAs(BadBlocks.NONE);
            region.badBlocks(new BadBlocks(new long[]{MIB, MIB + 512}, "region0/badblocks", null, 1));
            driver = new PmemBlockDriver(region, stats);
            BlockLayer layer = new BlockLayer(driver, 1, 8, 4 << 20, 1 << 20);
            q = layer.queue(0);
            assertThat(run(Op.READ, MIB, 512, (byte) 0, false, null)).isEqualTo(Status.EIO);
            assertThat(run(Op.READ, MIB - 4096, 8192, (byte) 0, true, null)).as("sink READ").isEqualTo(Status.EIO);
            assertThat(run(Op.WRITE, MIB - 4096, 8192, (byte) 1, false, null)).as("device DAX cannot clear").isEqualTo(Status.EIO);
            assertThat(run(Op.WRITE_ZEROES, MIB, 4096, (byte) 0, false, null)).isEqualTo(Status.EIO);
            assertThat(driver.receivesInPlace(MIB, 4096)).isFalse();
            assertThat(region.badBlocks().ranges()).as("still bad").containsExactly(MIB, MIB + 512);
            assertThat(stats.mappingFaults()).isEqualTo(4);
            // next to it, all served
            assertThat(run(Op.WRITE, MIB + 512, 4096, (byte) 9, false, null)).isZero();
            byte[] got = new byte[4096];
            assertThat(run(Op.READ, MIB + 512, 4096, (byte) 0, false, got)).isZero();
            for (byte x : got) assertThat(x).isEqualTo((byte) 9);
            assertThat(run(Op.READ, 0, (int) MIB, (byte) 0, false, null)).isZero();
            assertThat(driver.receivesInPlace(MIB + 512, 4096)).isTrue();
            layer.close();
        }
    }

    @Test
    void onAFileAWriteCoveringWholeFilesystemBlocksPunchesAndReallocatesThemAndClearsThem() throws Exception {
        Path file = dataFile(2 * MIB);
        long blk = Files.getFileStore(file).getBlockSize();
        long first = BadBlocks.extents(file).get(0).physical();
        // bad: 1 KiB inside the file's block at 64 KiB, and a sector in the block at 128 KiB
        Path sys = fakeBlockSysfs(file, false, ((first + 65536 + 1024) / 512) + " 2\n" + ((first + 131072) / 512) + " 1\n", 0);
        try (PmemRegion region = PmemRegion.open(file, 2 * MIB, false, PmemRegion.Mapper.JAVA)) {
            BadBlocks found = BadBlocks.of(file, false, sys, region.size());
            assertThat(found.ranges()).containsExactly(65536 + 1024, 65536 + 2048, 131072, 131072 + 512);
            region.badBlocks(found);
            driver = new PmemBlockDriver(region, stats);
            BlockLayer layer = new BlockLayer(driver, 1, 8, 4 << 20, 1 << 20);
            q = layer.queue(0);
            assertThat(run(Op.READ, 65536, (int) blk, (byte) 0, false, null)).isEqualTo(Status.EIO);
            // a write of the bad sectors alone would need the block punched, and the block's other bytes with it
            assertThat(run(Op.WRITE, 65536 + 1024, 1024, (byte) 7, false, null)).isEqualTo(Status.EIO);
            assertThat(region.badBlocks().ranges()).hasSize(4);
            // a write covering the whole block clears it: punched, reallocated, then written
            assertThat(run(Op.WRITE, 65536, (int) blk, (byte) 7, false, null)).isZero();
            assertThat(region.badBlocks().ranges()).containsExactly(131072, 131072 + 512);
            byte[] got = new byte[(int) (3 * blk)];
            assertThat(run(Op.READ, 65536 - blk, got.length, (byte) 0, false, got)).isZero();
            for (int i = 0; i < got.length; i++) {
                byte expected = i >= blk && i < 2 * blk ? (byte) 7 : (byte) ((65536 - blk + i) / 4096 + 1);
                assertThat(got[i]).as("byte %d", 65536 - blk + i).isEqualTo(expected);
            }
            assertThat(run(Op.READ, 131072, 4096, (byte) 0, true, null)).as("the other range stays bad").isEqualTo(Status.EIO);
            assertThat(run(Op.WRITE_ZEROES, 131072 - blk, (int) (2 * blk), (byte) 0, false, null)).as("zeroing clears too").isZero();
            assertThat(region.badBlocks().isEmpty()).isTrue();
            assertThat(run(Op.READ, 131072, 4096, (byte) 0, false, null)).isZero();
            assertThat(run(Op.FLUSH, 0, 0, (byte) 0, false, null)).isZero();
            layer.close();
        }
        assertThat(Files.size(file)).as("punching kept the size").isEqualTo(2 * MIB);
        byte[] disk = Files.readAllBytes(file);
        assertThat(disk[65536]).isEqualTo((byte) 7);
        assertThat(disk[131072]).isZero();
        assertThat(disk[200000]).isEqualTo((byte) (200000 / 4096 + 1));
    }

    @Test
    void aFailedClearKeepsTheRangeBadAndTheWriteFails() {
        BadBlocks b = new BadBlocks(new long[]{4096, 4608}, "t", (off, len) -> {
            throw new IOException("fallocate: EOPNOTSUPP (injected)");
        }, 4096);
        assertThatThrownBy(() -> b.beforeWrite(0, 16384)).isInstanceOf(MappingFault.class).hasMessageContaining("bad block");
        assertThat(b.ranges()).containsExactly(4096, 4608);
        List<Long> calls = new ArrayList<>();
        BadBlocks ok = new BadBlocks(new long[]{4096, 4608, 10000, 10001}, "t", (off, len) -> {
            calls.add(off);
            calls.add(len);
        }, 4096);
        ok.beforeWrite(0, 16384);
        assertThat(calls).as("each bad range's blocks, once").containsExactly(4096L, 4096L, 8192L, 4096L);
        assertThat(ok.isEmpty()).isTrue();
        ok.beforeWrite(0, 16384);
        assertThat(calls).as("nothing bad left: no more punching").hasSize(4);
    }
}
