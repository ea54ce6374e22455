package io.pmemblk.pmem;

import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

class PmemRegionTest {
    @TempDir
    Path dir;

    @ParameterizedTest
    @EnumSource(value = PmemRegion.Mapper.class, names = {"JAVA", "LIBPMEM"})
    void createsFileOfConfiguredSizeAndTheDataIsInTheFileAndAfterReopen(PmemRegion.Mapper mapper) throws IOException {
        assumeMapper(mapper);
        Path f = dir.resolve("sub/pmem.img");
        try (PmemRegion r = PmemRegion.open(f, 1 << 20, false, mapper); Arena a = Arena.ofConfined()) {
            assertThat(r.size()).isEqualTo(1 << 20);
            assertThat(r.mappedBy()).isEqualTo(mapper == PmemRegion.Mapper.JAVA ? "java" : "libpmem");
            MemorySegment src = a.allocate(8192);
            for (int i = 0; i < 8192; i++) {
                src.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 7));
            }
            r.write(src, 0, 4096 * 3 + 100, 8192);
            r.persistWritten(4096 * 3 + 100, 8192);
        }
        assertThat(Files.size(f)).isEqualTo(1 << 20);
        // The file's pages, read back. This goes through the same page cache as the mapping, so it shows the bytes
        // landed where they should, not that they are durable: DurabilityRecordTest asserts that, from the record.
        byte[] bytes = Files.readAllBytes(f);
        for (int i = 0; i < 8192; i++) {
            assertThat(bytes[4096 * 3 + 100 + i]).isEqualTo((byte) (i * 7));
        }
        try (PmemRegion r = PmemRegion.open(f, 1 << 20, false, mapper)) {
            assertThat(r.memory().get(ValueLayout.JAVA_BYTE, 4096 * 3 + 100 + 5)).isEqualTo((byte) 35);
        }
    }

    @Test
    void existingFileOfAnotherSizeIsRefusedWithAClearMessage() throws IOException {
        Path f = dir.resolve("p.img");
        Files.write(f, new byte[4096]);
        assertThatThrownBy(() -> PmemRegion.open(f, 8192, false, PmemRegion.Mapper.AUTO))
                .isInstanceOf(IOException.class)
                .hasMessageContaining("holds 4096 bytes but pmem.size is 8192")
                .hasMessageContaining("pmem.resize=true");
        assertThat(Files.size(f)).as("refusal must not touch the file").isEqualTo(4096);
    }

    @ParameterizedTest
    @EnumSource(value = PmemRegion.Mapper.class, names = {"JAVA", "LIBPMEM"})
    void resizeKeepsTheDataBelowTheOldEnd(PmemRegion.Mapper mapper) throws IOException {
        assumeMapper(mapper);
        Path f = dir.resolve("p.img");
        byte[] data = new byte[4096];
        data[4095] = 9;
        Files.write(f, data);
        try (PmemRegion r = PmemRegion.open(f, 65536, true, mapper)) {
            assertThat(r.size()).isEqualTo(65536);
            assertThat(r.memory().get(ValueLayout.JAVA_BYTE, 4095)).isEqualTo((byte) 9);
            assertThat(r.memory().get(ValueLayout.JAVA_BYTE, 65535)).isZero();
        }
    }

    @Test
    void libpmemReportsIsPmemFalseOnAnOrdinaryFile() throws IOException {
        assumeTrue(Libpmem.load().isPresent(), "libpmem not installed");
        try (PmemRegion r = PmemRegion.open(dir.resolve("x"), 1 << 16, false, PmemRegion.Mapper.LIBPMEM)) {
            // a test run may force it with PMEM_IS_PMEM_FORCE=1; otherwise a tmp file is not pmem
            assertThat(r.isPmem()).isEqualTo("1".equals(System.getenv("PMEM_IS_PMEM_FORCE")));
        }
    }

    @Test
    void closeIsIdempotentAndAccessAfterCloseFailsCleanly() throws IOException {
        PmemRegion r = PmemRegion.open(dir.resolve("c"), 1 << 16, false, PmemRegion.Mapper.AUTO);
        MemorySegment view = r.memory();
        r.close();
        r.close();
        assertThatThrownBy(() -> view.get(ValueLayout.JAVA_BYTE, 0)).isInstanceOf(IllegalStateException.class);
    }

    @Test
    void aSecondExclusiveOpenOfTheSameFileIsRefusedUntilTheFirstCloses() throws IOException {
        Path f = dir.resolve("locked.img");
        try (PmemRegion first = PmemRegion.open(f, 1 << 20, false, PmemRegion.Mapper.AUTO)) {
            assertThatThrownBy(() -> PmemRegion.open(f, 2 << 20, true, PmemRegion.Mapper.AUTO))
                    .hasMessageContaining("already open");
            assertThat(Files.size(f)).as("the refused resize did not touch the file").isEqualTo(1 << 20);
            // inspection (pmemblk info) does not need the lock
            try (PmemRegion look = PmemRegion.open(f, 1 << 20, false, PmemRegion.Mapper.AUTO, false)) {
                assertThat(look.size()).isEqualTo(1 << 20);
            }
        }
        try (PmemRegion again = PmemRegion.open(f, 1 << 20, false, PmemRegion.Mapper.AUTO)) {
            assertThat(again.size()).isEqualTo(1 << 20);
        }
    }

    @Test
    void nonRegularFileIsRefused() {
        assertThatThrownBy(() -> PmemRegion.open(dir, 4096, false, PmemRegion.Mapper.AUTO))
                .hasMessageContaining("is a directory; allowed: a regular file, or a device-DAX node");
    }

    private static void assumeMapper(PmemRegion.Mapper mapper) {
        if (mapper == PmemRegion.Mapper.LIBPMEM) {
            assumeTrue(Libpmem.load().isPresent(), "libpmem not installed: " + Libpmem.unavailableReason());
        }
    }
}
