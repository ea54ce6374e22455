package io.pmemblk.posix;

import org.junit.jupiter.api.Test;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** Edge-triggered waits on eventfds against the kernel's epoll. */
class EdgeWaitTest {
    @Test
    void eachSignalEndsOneWaitAndACounterLeftUnreadDoesNotEndTheNext() throws Exception {
        try (EventFd e = EventFd.create(true); EdgeWait w = EdgeWait.create(1)) {
            w.add(e);
            assertThat(w.await(0)).isFalse();
            e.signal();
            e.signal();
            assertThat(w.await(0)).isTrue(); // two signals, one wake-up
            // The counter is still 2: level-triggered (poll) would report it again; edge-triggered waits for a signal.
            assertThat(w.await(0)).isFalse();
            assertThat(e.await(0)).isTrue();
            e.signal();
            assertThat(w.await(0)).isTrue();
            assertThat(e.drain()).isEqualTo(3); // never read by the waits
        }
    }

    @Test
    void aSignalPendingWhenAddedEndsTheFirstWait() throws Exception {
        try (EventFd e = EventFd.create(true); EdgeWait w = EdgeWait.create(1)) {
            e.signal();
            w.add(e);
            assertThat(w.await(0)).isTrue();
            assertThat(w.await(0)).isFalse();
        }
    }

    @Test
    void anyOfSeveralWakesAWaitingThread() throws Exception {
        try (EventFd kick = EventFd.create(true); EventFd stop = EventFd.create(true); EdgeWait w = EdgeWait.create(2)) {
            w.add(kick);
            w.add(stop);
            CompletableFuture<Boolean> woke = CompletableFuture.supplyAsync(() -> {
                try {
                    return w.await(-1);
                } catch (NativeException x) {
                    throw new IllegalStateException(x);
                }
            });
            stop.signal();
            assertThat(woke.get(10, TimeUnit.SECONDS)).isTrue();
        }
    }

    @Test
    void wrongUseIsRefusedWithWhatIsAllowed() throws Exception {
        assertThatThrownBy(() -> EdgeWait.create(0)).hasMessageContaining("allowed: 1..64");
        try (EventFd e = EventFd.create(true); EdgeWait w = EdgeWait.create(2)) {
            w.add(e);
            assertThatThrownBy(() -> w.add(e)).isInstanceOf(NativeException.class)
                    .satisfies(x -> assertThat(((NativeException) x).errno()).isEqualTo(Errno.EEXIST));
            EventFd closed = EventFd.create(true);
            closed.close();
            assertThatThrownBy(() -> w.add(closed)).isInstanceOf(NativeException.class)
                    .satisfies(x -> assertThat(((NativeException) x).errno()).isEqualTo(Errno.EBADF));
        }
        try (EventFd e = EventFd.create(true); EdgeWait w = EdgeWait.create(1)) {
            w.add(e);
            assertThatThrownBy(() -> w.add(e)).isInstanceOf(IllegalStateException.class).hasMessageContaining("allowed: 1");
        }
    }
}
