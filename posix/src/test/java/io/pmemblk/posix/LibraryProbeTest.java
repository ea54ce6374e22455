package io.pmemblk.posix;

import org.junit.jupiter.api.Test;

import java.util.Optional;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class LibraryProbeTest {
    /**
     * The first caller's probe holds on until a second caller has either blocked behind it or started a probe of
     * its own: only the first may probe, and the second gets the first one's answer.
     */
    @Test
    void aSecondCallerWaitsForTheFirstProbeAndGetsItsAnswer() throws Exception {
        AtomicInteger probes = new AtomicInteger();
        AtomicReference<Thread> second = new AtomicReference<>();
        CountDownLatch probing = new CountDownLatch(1);
        LibraryProbe<String> lib = new LibraryProbe<>(() -> {
            if (probes.incrementAndGet() == 1) {
                probing.countDown();
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
                while (probes.get() == 1 && !blocked(second.get())) {
                    if (System.nanoTime() > deadline) {
                        throw new AssertionError("the second caller neither blocked nor probed within 10 s");
                    }
                    Thread.onSpinWait();
                }
            }
            return Optional.empty();
        });
        Thread first = Thread.ofPlatform().start(lib::get);
        assertThat(probing.await(10, TimeUnit.SECONDS)).as("the first probe started").isTrue();
        AtomicReference<Optional<String>> secondAnswer = new AtomicReference<>();
        second.set(Thread.ofPlatform().unstarted(() -> secondAnswer.set(lib.get())));
        second.get().start();
        first.join(10_000);
        second.get().join(10_000);
        assertThat(probes.get()).as("probes made for two callers").isEqualTo(1);
        assertThat(secondAnswer.get()).as("the second caller's answer").isEmpty();
        assertThat(lib.get()).isEmpty();
        assertThat(probes.get()).as("probes made after a third call").isEqualTo(1);
    }

    private static boolean blocked(Thread t) {
        return t != null && t.getState() == Thread.State.BLOCKED;
    }

    @Test
    void aProbeThatThrowsIsMadeAgainByTheNextCaller() {
        AtomicInteger probes = new AtomicInteger();
        LibraryProbe<String> lib = new LibraryProbe<>(() -> {
            if (probes.incrementAndGet() == 1) {
                throw new IllegalStateException("first probe fails");
            }
            return Optional.of("loaded");
        });
        assertThatThrownBy(lib::get).hasMessage("first probe fails");
        assertThat(lib.get()).contains("loaded");
        assertThat(lib.get()).contains("loaded");
        assertThat(probes.get()).isEqualTo(2);
    }
}
