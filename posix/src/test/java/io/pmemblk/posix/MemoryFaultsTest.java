package io.pmemblk.posix;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The fault-surviving copy against a memfd truncated under its mapping: a catchable error, on the spot. */
class MemoryFaultsTest {
    @Test
    void aCopyOutOfOrIntoATruncatedMappingThrowsHotSpotsFaultAndTheLoadProbeSaysWhichSide() throws Exception {
        int fd = SharedMemory.memfd("memory-faults", 1 << 20);
        try (Arena a = Arena.ofShared()) {
            MemorySegment file = SharedMemory.map(fd, 0, 1 << 20, a);
            MemorySegment mine = a.allocate(256 << 10, 4096);
            MemoryFaults.copy(mine, 0, file, 0, mine.byteSize()); // while it is whole: fine
            assertThat(MemoryFaults.loads(file)).isTrue();
            FileCalls.ftruncate(fd, 64 << 10); // the other side cuts it after its first 64 KiB
            assertThatThrownBy(() -> MemoryFaults.copy(file, 0, mine, 0, mine.byteSize()))
                    .isInstanceOf(InternalError.class).satisfies(e -> assertThat(MemoryFaults.isFault((InternalError) e)).isTrue());
            assertThatThrownBy(() -> MemoryFaults.copy(mine, 0, file, 0, mine.byteSize()))
                    .isInstanceOf(InternalError.class);
            assertThat(MemoryFaults.loads(file.asSlice(0, 64 << 10))).as("the part still in the file").isTrue();
            assertThat(MemoryFaults.loads(file)).as("the cut part").isFalse();
            assertThat(MemoryFaults.loads(mine)).isTrue();
            assertThat(MemoryFaults.isFault(new InternalError("something else"))).isFalse();
        } finally {
            Libc.close(fd);
        }
    }
}
