package io.pmemblk.vhost.blk;

import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.virtq.VirtioFeatures;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The DMA completions a queue thread reaps at one wake-up interrupt the guest once, after the last is published
 * ({@link BlkAnswers}, deferCalls): signalled at the first, the call woke the front end while the rest were still
 * unpublished, and a guest that had re-armed on the first took a second interrupt for the rest. Without EVENT_IDX
 * every push asks for an interrupt, so the call eventfd's counter tells how many were sent. The real stack: the pmem
 * driver's DMA route, the I/OAT driver and the software I/OAT device (only the batch's last descriptor asks for a
 * completion write and an interrupt, so the three writes complete together, in one reap).
 */
@Timeout(60)
class CallAfterReapTest {
    private static final int WRITE = 64 << 10;

    @TempDir
    Path dir;

    @Test
    void threeCompletionsReapedTogetherInterruptTheGuestOnce() throws Exception {
        long features = GuestDriver.LINUX_FEATURES & ~VirtioFeatures.bit(VirtioFeatures.RING_EVENT_IDX);
        try (DmaQueueRig rig = new DmaQueueRig(dir, new RingPolling(0, 1), d -> d, features)) {
            BlkGuest guest = rig.guest;
            rig.stall.on = true;
            // Asleep, kicks armed: the three made available now are all there when the kick wakes it.
            Waits.await("the queue thread asleep before the writes", DmaQueueRig::queueThreadSleeps);
            Sent[] sent = new Sent[3];
            for (int i = 0; i < sent.length; i++) {
                sent[i] = guest.write((long) i * WRITE / 512, new byte[WRITE], 4, false);
            }
            rig.kick.signal(); // one kick: the three go to the engine in one batch
            Waits.await("the three writes held on the engine", () -> rig.queue.inFlight() == 3);
            rig.call.drain();
            rig.stall.release();
            Waits.await("all three answered", () -> {
                guest.answered();
                return guest.inFlight() == 0;
            });
            AtomicLong calls = new AtomicLong();
            Waits.await("the guest interrupted", () -> calls.addAndGet(rig.call.drain()) > 0);
            // The call is sent after the reap; asleep again, the queue thread has sent every one it made due.
            Waits.await("the queue thread asleep after the reap", DmaQueueRig::queueThreadSleeps);
            calls.addAndGet(rig.call.drain());
            for (Sent s : sent) {
                assertThat(guest.status(s)).isZero();
            }
            assertThat(calls.get()).as("call eventfd writes for three completions reaped at one wake-up").isEqualTo(1);
        }
    }
}
