package io.pmemblk.posix;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** eventfd and shared memory against the kernel. */
class EventFdTest {
    @Test
    void signalsAddUpAndADrainResetsThem() throws Exception {
        try (EventFd e = EventFd.create(true)) {
            assertThat(e.drain()).isZero();
            assertThat(e.await(0)).isFalse();
            e.signal();
            e.signal();
            e.signal();
            assertThat(e.await(0)).isTrue();
            assertThat(e.drain()).isEqualTo(3);
            assertThat(e.await(0)).isFalse();
        }
    }

    @Test
    void awaitWakesWhenAnotherThreadSignals() throws Exception {
        try (EventFd e = EventFd.create(false)) {
            CompletableFuture<Boolean> woke = CompletableFuture.supplyAsync(() -> {
                try {
                    return e.await(10_000);
                } catch (NativeException x) {
                    throw new IllegalStateException(x);
                }
            });
            e.signal();
            assertThat(woke.get(10, TimeUnit.SECONDS)).isTrue();
            assertThat(e.drain()).isEqualTo(1); // blocking, but a signal is pending
        }
    }

    @Test
    void anAdoptedDescriptorIsClosedWithIt() throws Exception {
        int fd = FileIo.eventfd(0, FileIo.EFD_NONBLOCK);
        EventFd e = EventFd.adopt(fd);
        e.signal();
        e.close();
        e.close(); // idempotent
        assertThatThrownBy(() -> Libc.close(fd)).isInstanceOf(NativeException.class)
                .satisfies(x -> assertThat(((NativeException) x).errno()).isEqualTo(Errno.EBADF));
        assertThatThrownBy(() -> EventFd.adopt(-1)).isInstanceOf(IllegalArgumentException.class);
    }

    /**
     * A front end's call eventfd with its counter at 2^64-2 (the most a write may leave): a blocking write of 1
     * would wait for a reader for good. An adopted notifier is made non-blocking and its signal returns at once.
     */
    @Test
    void aNotifierWithAFullCounterIsSignalledWithoutBlocking() throws Exception {
        int theirs = FileIo.eventfd(0, 0); // blocking, as a hostile front end may make it
        try (Arena a = Arena.ofConfined(); EventFd e = EventFd.adoptNotifier(Libc.dupCloexec(theirs), "vring 0 call fd")) {
            MemorySegment max = a.allocate(ValueLayout.JAVA_LONG);
            max.set(ValueLayout.JAVA_LONG, 0, 0xfffffffffffffffeL);
            assertThat(FileIo.write(theirs, max)).isEqualTo(8);
            CompletableFuture<Void> signalled = CompletableFuture.runAsync(e::signal);
            signalled.get(10, TimeUnit.SECONDS); // a blocking write would still wait here
            assertThat(e.drain()).as("the counter, still full: the signal was pending already").isEqualTo(0xfffffffffffffffeL);
        } finally {
            Libc.close(theirs);
        }
    }

    /** Anything but an eventfd is refused as a notifier, naming what it is. */
    @Test
    void aNotifierThatIsNotAnEventfdIsRefusedNamingWhatItIs() throws Exception {
        int memfd = SharedMemory.memfd("not-an-eventfd", 4096);
        int socket = Sockets.unixStreamSocket();
        try {
            assertThatThrownBy(() -> EventFd.adoptNotifier(memfd, "vring 0 kick fd"))
                    .isInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("vring 0 kick fd is /memfd:not-an-eventfd")
                    .hasMessageContaining("not an eventfd; allowed: an eventfd(2)");
            assertThatThrownBy(() -> EventFd.adoptNotifier(socket, "vring 1 call fd"))
                    .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("vring 1 call fd is socket:[");
        } finally {
            Libc.close(memfd);
            Libc.close(socket);
        }
    }

    /** What one mapping of a memfd stores, a second mapping of it (another process's, in vhost-user) sees. */
    @Test
    void twoMappingsOfAMemfdShareTheirBytesAndASealFixesItsSize() throws Exception {
        long page = Libc.pageSize();
        int fd = SharedMemory.memfd("pmemblk-test", 4 * page);
        try (Arena a = Arena.ofConfined()) {
            Arena b = Arena.ofConfined();
            MemorySegment whole = SharedMemory.map(fd, 0, 4 * page, a);
            MemorySegment tail = SharedMemory.map(fd, 2 * page, 2 * page, b);
            assertThat(whole.get(ValueLayout.JAVA_LONG, 2 * page)).isZero();
            whole.set(ValueLayout.JAVA_LONG, 2 * page + 8, 0x1234_5678_9abcL);
            assertThat(tail.get(ValueLayout.JAVA_LONG, 8)).isEqualTo(0x1234_5678_9abcL);
            assertThat(SharedMemory.seals(fd)).as("a new memfd carries no seals").isZero();
            SharedMemory.seal(fd);
            assertThat(SharedMemory.seals(fd)).isEqualTo(
                    SharedMemory.F_SEAL_GROW | SharedMemory.F_SEAL_SHRINK | SharedMemory.F_SEAL_SEAL);
            assertThatThrownBy(() -> FileCalls.ftruncate(fd, page)).isInstanceOf(NativeException.class)
                    .satisfies(x -> assertThat(((NativeException) x).errno()).isEqualTo(Errno.EPERM));
            b.close();
            assertThatThrownBy(() -> tail.get(ValueLayout.JAVA_LONG, 0)).isInstanceOf(IllegalStateException.class);
        } finally {
            Libc.close(fd);
        }
    }
}
