package io.pmemblk.posix;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;

import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static org.assertj.core.api.Assertions.assertThat;

class FileIoTest {
    @TempDir
    Path dir;

    @Test
    void preadAndPwriteMoveBytesAtAPositionAndReportErrnoNegated() throws Exception {
        Path f = dir.resolve("f");
        int fd = ZeroedFile.openReadWrite(f, 8192);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment src = a.allocate(100);
            for (int i = 0; i < 100; i++) {
                src.set(java.lang.foreign.ValueLayout.JAVA_BYTE, i, (byte) (i + 1));
            }
            assertThat(FileIo.pwrite(fd, src, 4000)).isEqualTo(100);
            MemorySegment dst = a.allocate(100);
            assertThat(FileIo.pread(fd, dst, 4000)).isEqualTo(100);
            assertThat(dst.mismatch(src)).isEqualTo(-1);
            // a short read at the end of the file, as a request clamped at its end gives
            assertThat(FileIo.pread(fd, dst, 8192 - 10)).isEqualTo(10);
            assertThat(FileIo.pread(-1, dst, 0)).isEqualTo(-Errno.EBADF);
        } finally {
            Libc.close(fd);
        }
        assertThat(Files.readAllBytes(f)[4000 + 99]).isEqualTo((byte) 100);
    }

    @Test
    void eventfdCountsWrites() throws Exception {
        int fd = FileIo.eventfd(0, FileIo.EFD_NONBLOCK);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment one = a.allocate(JAVA_LONG);
            one.set(JAVA_LONG, 0, 1L);
            assertThat(FileIo.write(fd, one)).isEqualTo(8);
            assertThat(FileIo.write(fd, one)).isEqualTo(8);
            MemorySegment v = a.allocate(JAVA_LONG);
            assertThat(FileIo.read(fd, v)).isEqualTo(8);
            assertThat(v.get(JAVA_LONG, 0)).isEqualTo(2); // the two signals, read (and reset) at once
            assertThat(FileIo.read(fd, v)).isEqualTo(-Errno.EAGAIN);
            assertThat(FileIo.pread(fd, v, 0)).isEqualTo(-Errno.ESPIPE); // an eventfd has no position
        } finally {
            Libc.close(fd);
        }
    }
}
