package io.pmemblk.pmem;

import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.function.UnaryOperator;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

class PmemRegionTest {
    @TempDir
    Path dir;

    @EachMapper
    void createsFileOfConfiguredSizeAndTheDataIsInTheFileAndAfterReopen(PmemRegion.Mapper mapper) throws IOException {
        EachMapper.Assume.available(mapper);
        Path f = dir.resolve("sub/pmem.img");
        try (PmemRegion r = PmemRegion.open(f, 1 << 20, false, mapper); Arena a = Arena.ofConfined()) {
            assertThat(r.size()).isEqualTo(1 << 20);
            assertThat(r.mappedBy()).isEqualTo(mapper == PmemRegion.Mapper.JAVA ? "java" : "libpmem");
            MemorySegment src = a.allocate(8192);
            for (int i = 0; i < 8192; i++) {
                src.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 7));
            }
            r.write(src, 0, 4096 * 3 + 100, 8192);
            r.writeBack().persistWritten(4096 * 3 + 100, 8192);
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

    @EachMapper
    void resizeKeepsTheDataBelowTheOldEnd(PmemRegion.Mapper mapper) throws IOException {
        EachMapper.Assume.available(mapper);
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

    /**
     * The lock outlives the mapper: on an existing file, the mapper's own channel (java) or libpmem's own descriptor
     * was closed after mapping, and with it went the classic POSIX lock lock() had taken: any other process could then
     * lock and open the same file. Checked from another process, as a second server would.
     */
    @EachMapper
    void anotherProcessCannotLockAFileTheRegionReopened(PmemRegion.Mapper mapper) throws Exception {
        EachMapper.Assume.available(mapper);
        Path f = dir.resolve("p.img");
        PmemRegion.open(f, 1 << 20, false, mapper).close(); // created, so the next open finds it existing
        try (PmemRegion r = PmemRegion.open(f, 1 << 20, false, mapper)) {
            assertThat(otherProcessLocks(f)).as("another process's lock attempt while the region is open").isEqualTo("refused");
            PmemRegion.open(f, 1 << 20, false, mapper, false).close(); // inspection opens and closes a descriptor too
            assertThat(otherProcessLocks(f)).as("after an inspection opened and closed the file").isEqualTo("refused");
        }
        assertThat(otherProcessLocks(f)).as("after close").isEqualTo("locked");
    }

    /** Python's fcntl.lockf (a classic POSIX lock, as the JDK's FileChannel.tryLock takes) from another process. */
    static String otherProcessLocks(Path f) throws Exception {
        Process p = new ProcessBuilder("/usr/bin/python3", "-c", """
                import fcntl, sys
                f = open(sys.argv[1], 'r+')
                try:
                    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    print('locked')
                except OSError:
                    print('refused')
                """, f.toString()).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes()).trim();
        assertThat(p.waitFor(30, java.util.concurrent.TimeUnit.SECONDS)).as("python3 ended").isTrue();
        return out;
    }

    /**
     * The lock and the sync hold the mapped file, not its name: lock and fsync once reopened the new file by name after
     * mapping it. Between the mapping and the sync (the persistence port's syncCreated, wrapped here) the file's name
     * is given to another file: the lock must still be on the file that was mapped, and the region must serve that
     * file.
     */
    @EachMapper
    void theFileIsLockedAndSyncedAsMappedEvenIfItsNameIsReplacedMeanwhile(PmemRegion.Mapper mapper) throws Exception {
        EachMapper.Assume.available(mapper);
        Path f = dir.resolve("p.img");
        Path moved = dir.resolve("moved.img");
        UnaryOperator<Persistence> replaceTheNameOnSync = port -> new ForwardingPersistence(port) {
            @Override
            public void syncCreated(io.pmemblk.posix.TrustedFile file) throws IOException {
                Files.move(f, moved);
                Files.write(f, new byte[1 << 20]); // another file under the name, as another process could make it
                real.syncCreated(file);
            }
        };
        try (PmemRegion r = RegionFile.open(f, 1 << 20, false, PmemRegion.Mapper.valueOf(mapper.name()), true,
                replaceTheNameOnSync)) {
            r.memory().set(ValueLayout.JAVA_BYTE, 7, (byte) 42);
            r.writeBack().persistAll();
            assertThat(Files.readAllBytes(moved)[7]).as("the region maps the file it created").isEqualTo((byte) 42);
            assertThat(otherProcessLocks(moved)).as("the mapped file is locked").isEqualTo("refused");
            assertThat(otherProcessLocks(f)).as("the file that took its name is not").isEqualTo("locked");
        }
    }

    /**
     * Directories are checked as they are created: the path was once checked before the region created what was missing
     * (Files.createDirectories accepted any directory found there), so a directory another user made after the check
     * was used. Now the region checks as it creates: a directory of another user on the way, there before the file is
     * created, is refused and nothing is created in it.
     */
    @Test
    void aDirectoryAnotherUserMadeWhereTheRegionCreatesItsFileIsRefused() throws Exception {
        assumeTrue(io.pmemblk.posix.Libc.geteuid() == 0, "chowns a directory to another user: run as root (CI does)");
        Path f = dir.resolve("state/pmemblk/p.img");
        // (here the old code's TrustedPath.checkFile(f) passed: state/ did not exist yet)
        Path theirs = Files.createDirectories(dir.resolve("state/pmemblk"));
        Files.setPosixFilePermissions(theirs, java.nio.file.attribute.PosixFilePermissions.fromString("rwxrwxrwx"));
        Files.setAttribute(theirs, "unix:uid", 4242);
        assertThatThrownBy(() -> PmemRegion.open(f, 1 << 20, false, PmemRegion.Mapper.AUTO))
                .isInstanceOf(io.pmemblk.posix.UnsafePathException.class)
                .hasMessageContaining("directory " + theirs.toRealPath() + " is owned by uid 4242");
        assertThat(f).doesNotExist();
    }
}
