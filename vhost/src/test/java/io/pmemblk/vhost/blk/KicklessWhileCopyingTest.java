package io.pmemblk.vhost.blk;

import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.spec.SplitRingLayout;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.Arrays;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * With two or more requests on a DMA engine whose completions the queue thread reaps, the queue sleeps with the
 * guest's kicks off ({@link VhostBlkQueue#KICKLESS_IN_FLIGHT}): a request the guest makes available meanwhile needs no
 * kick (virtio's kick_prepare with EVENT_IDX says so), and the next completion's wake-up takes it. The real stack:
 * the pmem driver's DMA route, the I/OAT driver and the software I/OAT device interrupting through an eventfd, as
 * on the vfio-user route, held by the test while the requests are to stay in flight.
 */
@Timeout(60)
class KicklessWhileCopyingTest {
    private static final int WRITE = 64 << 10;

    @TempDir
    Path dir;

    @Test
    void aRequestMadeAvailableWhileTwoAreOnTheEngineNeedsNoKickAndIsTakenAtTheNextCompletion() throws Exception {
        try (DmaQueueRig rig = new DmaQueueRig(dir, new RingPolling(0, 1), d -> d)) {
            Sent[] sent = twoOnTheEngineThenAThirdWithoutAKick(rig);
            rig.stall.release(); // no kick for the third: the first completion's wake-up takes it
            assertAllAnswered(rig, sent);
        }
    }

    /**
     * The same, the completions made on another thread: with the device's interrupt muted, only the channel's
     * completion thread (standing by while the queue thread reaps, {@code CompletionThread}) reaps them, and
     * {@link BlkAnswers} must wake the kickless queue thread for each, or the third request, made available without
     * a kick, would never be taken.
     */
    @Test
    void aCompletionMadeOnAnotherThreadWakesTheKicklessQueueToTakeTheNextRequest() throws Exception {
        try (DmaQueueRig rig = new DmaQueueRig(dir, new RingPolling(0, 1), d -> d)) {
            // One request answered first: the ring's first publish always interrupts (as libvhost-user's).
            rig.guest.write(3L * WRITE / 512, filled(4), 4, false);
            rig.kick.signal();
            assertAllAnswered(rig);
            rig.raised.muted = true;
            Sent[] sent = twoOnTheEngineThenAThirdWithoutAKick(rig);
            // The guest wants no interrupt for these completions (EVENT_IDX, used_event far ahead): no call is due,
            // so only the wake for a kickless queue can bring the queue thread back.
            rig.ring.usedEvent(0x7fff);
            rig.stall.release(); // no interrupt, no kick: the completion thread's reap must wake the queue
            assertAllAnswered(rig, sent);
        }
    }

    /**
     * Two writes held on the stalled engine with the queue thread asleep, then a third made available, for which
     * virtio's kick_prepare with EVENT_IDX (kick when avail.idx passed avail_event since the last kick) must say
     * no kick.
     */
    private static Sent[] twoOnTheEngineThenAThirdWithoutAKick(DmaQueueRig rig) throws Exception {
        BlkGuest guest = rig.guest;
        rig.stall.on = true;
        Sent first = guest.write(0, filled(1), 4, false);
        Sent second = guest.write(WRITE / 512, filled(2), 4, false);
        rig.kick.signal();
        Waits.await("both writes taken and held on the engine", () -> rig.queue.inFlight() == 2);
        Waits.await("the queue thread asleep, both writes on the engine", DmaQueueRig::queueThreadSleeps);
        int before = rig.ring.availIdx();
        Sent third = guest.write(2L * WRITE / 512, filled(3), 4, false);
        int event = rig.ring.availEvent();
        assertThat(SplitRingLayout.needEvent(event, rig.ring.availIdx(), before))
                .as("a kick wanted for a request made available while two were on the engine"
                        + " (avail_event " + event + ", avail.idx " + before + " -> " + rig.ring.availIdx() + ")")
                .isFalse();
        return new Sent[] {first, second, third};
    }

    /** Every request answered OK; with the three of {@link #twoOnTheEngineThenAThirdWithoutAKick}, the third's data in the region. */
    private static void assertAllAnswered(DmaQueueRig rig, Sent... sent) throws InterruptedException {
        Waits.await("all answered", () -> {
            rig.guest.answered();
            return rig.guest.inFlight() == 0;
        });
        for (Sent s : sent) {
            assertThat(rig.guest.status(s)).isZero();
        }
        if (sent.length == 3) {
            assertThat(rig.region.memory().asSlice(2L * WRITE, WRITE).toArray(ValueLayout.JAVA_BYTE))
                    .as("the third write's data in the region").isEqualTo(filled(3));
        }
    }

    private static byte[] filled(int n) {
        byte[] b = new byte[WRITE];
        Arrays.fill(b, (byte) n);
        return b;
    }
}
