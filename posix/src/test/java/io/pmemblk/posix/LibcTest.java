package io.pmemblk.posix;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class LibcTest {
    @Test
    void openOfMissingFileCarriesErrnoAndPath(@TempDir Path dir) {
        Path missing = dir.resolve("nope");
        assertThatThrownBy(() -> FileCalls.open(missing.toString(), FileCalls.O_RDONLY, 0))
                .isInstanceOf(NativeException.class)
                .hasMessageContaining(missing.toString())
                .hasMessageContaining("No such file or directory")
                .satisfies(e -> assertThat(((NativeException) e).errno()).isEqualTo(Errno.ENOENT));
    }

    /**
     * msync accepts an unaligned range (widened to its page) and the store is in the file. Not a durability test:
     * reading the file goes through the page cache that holds the mapping, so it passes without the msync too.
     */
    @Test
    void msyncOfAnUnalignedRangeIsAcceptedAndTheStoreIsInTheFile(@TempDir Path dir) throws Exception {
        Path f = dir.resolve("m");
        int fd = ZeroedFile.openReadWrite(f, 8192);
        try {
            MemorySegment m = Mman.mmap(8192, Mman.PROT_READ | Mman.PROT_WRITE, Mman.MAP_SHARED, fd, 0);
            m.set(java.lang.foreign.ValueLayout.JAVA_BYTE, 5000, (byte) 42);
            Mman.msync(m, 5000, 1); // unaligned start: widened to the page
            assertThat(Files.readAllBytes(f)[5000]).isEqualTo((byte) 42);
            Mman.munmap(m);
        } finally {
            Libc.close(fd);
        }
    }

    @Test
    void badIoctlIsReportedNotSwallowed() {
        assertThatThrownBy(() -> Libc.ioctl(-1, 0x5401, MemorySegment.NULL))
                .isInstanceOf(NativeException.class).hasMessageContaining("Bad file descriptor");
    }

    @Test
    void pageSizeIsAPowerOfTwo() {
        assertThat(Long.bitCount(Libc.pageSize())).isEqualTo(1);
    }

    @Test
    void ioFlusherIsSetOrRefusedWithAnErrno() throws Exception {
        int rc = Libc.setIoFlusher(); // root here: set; elsewhere EPERM. Either way no exception, and the kernel says which
        assertThat(rc).isIn(0, -Errno.EPERM);
        if (rc == 0) {
            // /proc/thread-self/stat field 9: PF_MEMALLOC_NOIO (0x80000) | PF_LOCAL_THROTTLE (0x100000)
            String stat = java.nio.file.Files.readString(java.nio.file.Path.of("/proc/thread-self/stat"));
            long flags = Long.parseLong(stat.substring(stat.lastIndexOf(')') + 2).split(" ")[6]);
            assertThat(flags & 0x180000L).isEqualTo(0x180000L);
        }
    }
}
