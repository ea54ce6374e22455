package io.pmemblk.ublk;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/** The descriptor writers share with its closer: none gets the number once retired, and retire waits for those inside. */
@Timeout(60)
class FdGuardTest {
    @Test
    void retireWaitsForTheWriterInsideAndThenHandsOutNothing() throws Exception {
        FdGuard guard = new FdGuard(42);
        assertThat(guard.enter()).isEqualTo(42);
        guard.exit();
        CountDownLatch inside = new CountDownLatch(1);
        CountDownLatch leave = new CountDownLatch(1);
        Thread writer = Thread.ofPlatform().start(() -> {
            int fd = guard.enter();
            try {
                assertThat(fd).isEqualTo(42);
                inside.countDown();
                leave.await(30, TimeUnit.SECONDS); // "inside its write"
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } finally {
                guard.exit();
            }
        });
        assertThat(inside.await(30, TimeUnit.SECONDS)).isTrue();
        assertThat(guard.retire(50)).as("a writer is still inside: the number must not be closed yet").isFalse();
        assertThat(guard.enter()).as("retired: no new writer gets the number").isEqualTo(-1);
        guard.exit();
        leave.countDown();
        writer.join(30_000);
        assertThat(guard.retire(30_000)).as("the writer left: the closer may close it").isTrue();
        assertThat(guard.enter()).isEqualTo(-1);
        guard.exit();
        assertThat(guard.retire(0)).as("idempotent").isTrue();
    }
}
