package io.pmemblk.vhost.blk;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.ForwardingBlockDriver;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A queue thread whose only pending work is DMA copies sleeps until their interrupt wakes it (SPDK's poller in
 * interrupt mode): it does not poll the ring, nor reap in a loop, while a copy is in flight, however wide its
 * polling window has grown. The real stack: the pmem driver's DMA route, the I/OAT driver and the software I/OAT
 * device, whose interrupt is an eventfd as on the vfio-user route (so the queue thread reaps the completions
 * itself), stalled by the test while each copy is to stay in flight. What is counted is work, not time: the
 * driver's reapCompletions calls while a copy is stalled (each turn of a poll loop makes one).
 */
class CopiesInFlightTest {
    private static final int WRITE = 64 << 10;
    /** How long each stalled copy stays in flight; the polling window may grow to 500 ms, well past it. */
    private static final long STALL_NANOS = TimeUnit.MILLISECONDS.toNanos(20);
    private static final int STALLED = 12;
    /**
     * reapCompletions calls a sleeping queue thread may make per stalled copy: its loop's turn after the dispatch,
     * and one more for a wake-up with nothing new (an edge already reaped); a poll loop makes thousands.
     */
    private static final int REAPS_PER_STALL = 3;

    @TempDir
    Path dir;

    @Test
    void aQueueWhoseRequestsAreAllOnTheEngineSleepsUntilTheirInterrupt() throws Exception {
        // A window that may grow past a stalled copy (500 ms), one polling place, no hold.
        RingPolling polling = new RingPolling(TimeUnit.MILLISECONDS.toNanos(500), 0, 1);
        try (DmaQueueRig rig = new DmaQueueRig(dir, polling, CountingReaps::new)) {
            CountingReaps driver = (CountingReaps) rig.driver;
            // Writes answered as fast as the device goes: a guest at this pace opens the polling window.
            for (int i = 0; i < 40; i++) {
                writeAndAwait(rig, driver, i, false);
            }
            long reapsWhileStalled = 0;
            for (int i = 0; i < STALLED; i++) {
                reapsWhileStalled += writeAndAwait(rig, driver, 40 + i, true);
            }
            assertThat(reapsWhileStalled).as("reapCompletions calls on the queue thread while " + STALLED
                    + " copies were each in flight for " + TimeUnit.NANOSECONDS.toMillis(STALL_NANOS) + " ms")
                    .isLessThanOrEqualTo((long) REAPS_PER_STALL * STALLED);
            assertThat(driver.onQueueThread.get()).as("reapCompletions calls on the queue thread: it reaps itself")
                    .isPositive();
            int last = 40 + STALLED - 1;
            assertThat(rig.region.memory().asSlice((long) last * WRITE, WRITE).toArray(ValueLayout.JAVA_BYTE))
                    .as("the last stalled write's data in the region").isEqualTo(filled(last));
        }
    }

    /**
     * Writes {@code WRITE} bytes of value n + 1 at block n and waits (bounded) for the answer. When {@code stalled}
     * the copy is stalled: held in flight for {@link #STALL_NANOS} from when the queue has taken the request (and
     * so left any poll of the ring it was in), then released; the reapCompletions calls made meanwhile are returned.
     */
    private long writeAndAwait(DmaQueueRig rig, CountingReaps driver, int n, boolean stalled) throws InterruptedException {
        VhostBlkQueue queue = rig.queue;
        BlkGuest guest = rig.guest;
        if (stalled) {
            rig.stall.on = true;
        }
        Sent w = guest.write((long) n * WRITE / 512, filled(n), 4, false);
        rig.kick.signal();
        long reaps = 0;
        if (stalled) {
            Waits.await("write " + n + " taken by the queue", () -> queue.inFlight() == 1);
            long from = driver.calls.get();
            long until = System.nanoTime() + STALL_NANOS;
            for (long left; (left = until - System.nanoTime()) > 0; ) {
                LockSupport.parkNanos(left); // the copy's time in flight, not a synchronisation
            }
            reaps = driver.calls.get() - from;
            rig.stall.release();
        }
        Waits.await("the answer to write " + n, () -> {
            guest.answered();
            return guest.inFlight() == 0;
        });
        assertThat(guest.status(w)).as("write " + n).isZero();
        return reaps;
    }

    private static byte[] filled(int n) {
        byte[] b = new byte[WRITE];
        Arrays.fill(b, (byte) (n + 1));
        return b;
    }

    /** The pmem driver, its reapCompletions calls counted: the work a queue thread does per turn of its loop. */
    private static final class CountingReaps extends ForwardingBlockDriver {
        final AtomicLong calls = new AtomicLong();
        final AtomicLong onQueueThread = new AtomicLong();

        CountingReaps(BlockDriver d) {
            super(d);
        }

        @Override
        public int reapCompletions(int hwq) {
            calls.incrementAndGet();
            if (Thread.currentThread().getName().startsWith("vhost-blk-q")) {
                onQueueThread.incrementAndGet();
            }
            return device.reapCompletions(hwq);
        }
    }
}
