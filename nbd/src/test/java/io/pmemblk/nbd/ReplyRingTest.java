package io.pmemblk.nbd;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.testing.Waits;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** When the sender thread is woken: only for replies to write, and for the end of a closing connection. */
@Timeout(60)
class ReplyRingTest {
    /**
     * An open connection's in-flight count touches 0 whenever its client's queue drains for an instant. Waking the
     * sender there cost a futex wake and a context switch per request, and made two connections slower than one.
     * Only a closing connection's sender waits for that count.
     */
    @Test
    void anOpenConnectionsIdleMomentsDoNotWakeItsSender() throws Exception {
        ReplyRing ring = new ReplyRing(4);
        AtomicInteger drained = new AtomicInteger(Integer.MIN_VALUE);
        Thread sender = Thread.ofPlatform().name("sender-under-test").start(() -> {
            try {
                drained.set(ring.drain(new Request[4]));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        Waits.awaitWaiting("the sender to wait for replies", sender);
        for (int i = 0; i < 1000; i++) { // a request answered inline, then the client's queue empty for an instant
            ring.acquired();
            ring.released(1);
        }
        ring.readerDone();
        Waits.join("the sender to stop once the reader is done and nothing is in flight", sender);
        assertEquals(-1, drained.get(), "drain's answer once the reader is done and nothing is in flight");
        assertEquals(1, ring.senderWakeups(), "the sender woke for the end of the connection only, not at every idle moment");
    }
}
