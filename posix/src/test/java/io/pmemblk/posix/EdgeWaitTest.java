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

    @Test
    void aWaitInNanosecondsEndsAtItsTimeoutOrAtOnceOnASignal() throws Exception {
        try (EventFd e = EventFd.create(true); EdgeWait w = EdgeWait.create(1)) {
            w.add(e);
            long from = System.nanoTime();
            assertThat(w.awaitNanos(300_000)).as("nothing signalled").isFalse();
            assertThat(System.nanoTime() - from).as("slept at least its 300 us").isGreaterThanOrEqualTo(300_000);
            e.signal();
            assertThat(w.awaitNanos(60_000_000_000L)).as("a signal ends a minute's wait").isTrue();
            assertThat(w.awaitNanos(1)).as("that edge was taken").isFalse();
            assertThatThrownBy(() -> w.awaitNanos(0)).hasMessageContaining("allowed: > 0");
        }
    }

    @Test
    void aThreadsTimerSlackIsItsOwn() throws Exception {
        long before = Libc.timerSlack();
        long other = CompletableFuture.supplyAsync(() -> {
            try {
                Libc.setTimerSlack(1_000);
                return Libc.timerSlack();
            } catch (NativeException x) {
                throw new IllegalStateException(x);
            }
        }, r -> Thread.ofPlatform().start(r)).get(10, TimeUnit.SECONDS); // a thread of its own, not a pool's
        assertThat(other).isEqualTo(1_000);
        assertThat(Libc.timerSlack()).as("this thread's").isEqualTo(before);
        assertThatThrownBy(() -> Libc.setTimerSlack(0)).hasMessageContaining("allowed: >= 1");
    }
}
