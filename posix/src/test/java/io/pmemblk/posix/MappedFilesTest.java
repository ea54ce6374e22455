package io.pmemblk.posix;

import static org.assertj.core.api.Assertions.assertThat;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The registry of file-backed mappings: a slice of a mapping finds the file and its offset, the descriptor it
 * gives is a new open file description (the mapper's file lock is not shared), and closing the mapping's arena
 * forgets it. Anonymous memory has no file.
 */
class MappedFilesTest {
    @TempDir
    Path dir;

    @Test
    void aSliceOfAMappingFindsItsFileAndOffsetUntilTheArenaCloses() throws Exception {
        int before = MappedFiles.size();
        Arena arena = Arena.ofShared();
        int memfd = SharedMemory.memfd("mapped-files-test", 16 * 4096);
        MemorySegment mapping;
        try {
            mapping = SharedMemory.map(memfd, 2 * 4096, 3 * 4096, arena); // file pages 2..4
        } finally {
            Libc.close(memfd);
        }
        assertThat(MappedFiles.size()).isEqualTo(before + 1);
        mapping.set(ValueLayout.JAVA_LONG, 4096 + 8, 0x1122334455667788L);

        MappedFiles.Backing b = MappedFiles.backing(mapping.address() + 4096 + 8, 100);
        assertThat(b).isNotNull();
        try (Arena a = Arena.ofConfined()) {
            assertThat(b.offset()).as("file offset of the slice").isEqualTo(3 * 4096 + 8);
            MemorySegment word = a.allocate(8);
            assertThat(FileIo.pread(b.fd(), word, b.offset())).isEqualTo(8);
            assertThat(word.get(ValueLayout.JAVA_LONG, 0)).as("the same file, through the descriptor given")
                    .isEqualTo(0x1122334455667788L);
        } finally {
            Libc.close(b.fd());
        }
        assertThat(MappedFiles.backing(mapping.address() + 2 * 4096, 4097)).as("past the mapping's last page").isNull();

        arena.close();
        assertThat(MappedFiles.size()).isEqualTo(before);
        assertThat(MappedFiles.backing(mapping.address(), 8)).as("forgotten with its arena").isNull();
    }

    @Test
    void anonymousMemoryHasNoFile() throws Exception {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment anon = a.allocate(8192, 4096);
            assertThat(MappedFiles.backing(anon.address(), 8192)).isNull();
        }
    }

    /** The pmem file's OFD lock stays the mapper's: the descriptor given out is a description of its own. */
    @Test
    void theDescriptorGivenOutDoesNotShareTheMappersLock() throws Exception {
        int fd = ZeroedFile.openReadWrite(dir.resolve("locked.img"), 8192);
        try (Arena arena = Arena.ofShared()) {
            assertThat(FileCalls.lockExclusive(fd)).isTrue();
            MemorySegment m = Mman.map(fd, 8192, Mman.PROT_READ | Mman.PROT_WRITE, Mman.MAP_SHARED, 0, arena);
            MappedFiles.register(m, fd, 0, arena);
            MappedFiles.Backing b = MappedFiles.backing(m.address(), 8192);
            try {
                assertThat(FileCalls.lockExclusive(b.fd())).as("another description: the mapper's lock conflicts").isFalse();
            } finally {
                Libc.close(b.fd());
            }
        } finally {
            Libc.close(fd);
        }
    }
}
