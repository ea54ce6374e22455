package io.pmemblk.posix;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The raw calls' error mapping; the ring itself is tested in io.pmemblk.uring. */
class IoUringSyscallsTest {
    @Test
    void setupWithZeroEntriesCarriesEinval() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment params = a.allocate(120, 8);
            assertThatThrownBy(() -> IoUringSyscalls.setup(0, params))
                    .isInstanceOf(NativeException.class)
                    .hasMessageContaining("io_uring_setup(entries 0")
                    .hasMessageContaining("Invalid argument")
                    .satisfies(e -> assertThat(((NativeException) e).errno()).isEqualTo(22));
        }
    }

    @Test
    void enterOnAnFdThatIsNoRingIsAnExceptionNotARetry() throws Exception {
        int fd = FileCalls.open("/dev/null", FileCalls.O_RDONLY, 0);
        try {
            assertThatThrownBy(() -> IoUringSyscalls.enter(fd, 1, 0, 0))
                    .isInstanceOf(NativeException.class)
                    .hasMessageContaining("io_uring_enter(fd " + fd)
                    .satisfies(e -> assertThat(((NativeException) e).errno()).isEqualTo(Errno.EOPNOTSUPP));
        } finally {
            Libc.close(fd);
        }
    }

    @Test
    void aRingMappingIsUnmappedWithItsArena() throws Exception {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment params = a.allocate(120, 8);
            int fd = IoUringSyscalls.setup(4, params);
            try {
                int sqEntries = params.get(java.lang.foreign.ValueLayout.JAVA_INT, 0);
                assertThat(sqEntries).isEqualTo(4);
                Arena owner = Arena.ofConfined();
                MemorySegment sqes = IoUringSyscalls.mapRing(fd, 64L * sqEntries, 0x10000000L, owner);
                sqes.set(java.lang.foreign.ValueLayout.JAVA_LONG, 0, 42L); // mapped read-write
                owner.close();
                assertThatThrownBy(() -> sqes.get(java.lang.foreign.ValueLayout.JAVA_LONG, 0))
                        .isInstanceOf(IllegalStateException.class);
            } finally {
                Libc.close(fd);
            }
        }
    }
}
