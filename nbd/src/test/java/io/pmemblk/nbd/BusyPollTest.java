package io.pmemblk.nbd;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.queueing.testing.Waits;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/** Busy-polling a real socket: it ends when bytes arrive or the budget is spent, and it is bounded. */
@Timeout(60)
class BusyPollTest {
    static final Duration LONG = Duration.ofSeconds(30);

    @TempDir
    Path dir;
    SocketChannel server;
    SocketChannel client;
    int fd;

    @BeforeEach
    void connect() throws Exception {
        assertTrue(ChannelFd.available(), "the test JVM needs --add-exports java.base/sun.nio.ch=ALL-UNNAMED"
                + " (surefire.argLine), as the launcher gives the server --add-exports ...=io.pmemblk.nbd");
        try (ServerSocketChannel listener = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
            listener.bind(UnixDomainSocketAddress.of(dir.resolve("s.sock")));
            client = SocketChannel.open(UnixDomainSocketAddress.of(dir.resolve("s.sock")));
            server = listener.accept();
        }
        fd = ChannelFd.of(server);
        assertTrue(fd >= 0, "a JDK socket channel's fd");
    }

    @AfterEach
    void close() throws Exception {
        client.close();
        server.close();
    }

    @Test
    void aRequestThatArrivesWithinTheBudgetIsFoundByPolling() throws Exception {
        BusyPoll.Poller p = new BusyPoll(LONG, 1).forSocket(fd);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        AtomicBoolean readable = new AtomicBoolean();
        Thread t = ConnectionParts.thread("poller", failed, () -> readable.set(p.awaitReadable()));
        client.write(ByteBuffer.wrap(new byte[]{1}));
        Waits.join("polling to see the byte (well within its 30 s budget)", t);
        assertNull(failed.get());
        assertTrue(readable.get());
        assertEquals(0, p.timeouts);
    }

    @Test
    void aSilentClientIsPolledForTheBudgetThenLeftAloneForAWhile() {
        BusyPoll.Poller p = new BusyPoll(Duration.ofMillis(2), 1).forSocket(fd);
        for (int i = 0; i < BusyPoll.MISSES_BEFORE_REST; i++) {
            long t0 = System.nanoTime();
            assertFalse(p.awaitReadable());
            assertTrue(System.nanoTime() - t0 >= Duration.ofMillis(2).toNanos(), "polled for the whole budget");
        }
        assertEquals(BusyPoll.MISSES_BEFORE_REST, p.timeouts);
        for (int i = 0; i < BusyPoll.REST; i++) {
            assertFalse(p.awaitReadable());
        }
        assertEquals(BusyPoll.MISSES_BEFORE_REST, p.timeouts, "resting: the next waits sleep at once, no polling");
        assertFalse(p.awaitReadable());
        assertEquals(BusyPoll.MISSES_BEFORE_REST + 1, p.timeouts, "after the rest it polls again");
    }

    @Test
    void noMoreReadersPollAtOnceThanTheLimit() throws Exception {
        BusyPoll poll = new BusyPoll(LONG, 1);
        BusyPoll.Poller first = poll.forSocket(fd);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        AtomicBoolean readable = new AtomicBoolean();
        Thread t = ConnectionParts.thread("first-poller", failed, () -> readable.set(first.awaitReadable()));
        Waits.await("the first reader to poll", () -> poll.polling() == 1);
        BusyPoll.Poller second = poll.forSocket(fd);
        long t0 = System.nanoTime();
        assertFalse(second.awaitReadable(), "no slot: the second reader goes to its read at once");
        assertTrue(System.nanoTime() - t0 < LONG.toNanos() / 2, "it did not poll");
        assertEquals(0, second.timeouts);
        client.write(ByteBuffer.wrap(new byte[]{1}));
        Waits.join("the first reader to see the byte", t);
        assertNull(failed.get());
        assertTrue(readable.get());
        assertEquals(0, poll.polling(), "the slot is given back");
    }

    @Test
    void offOrWithoutAnFdThereIsNoPoller() {
        assertNull(new BusyPoll(Duration.ZERO, 1).forSocket(fd));
        assertNull(new BusyPoll(LONG, 1).forSocket(-1));
        assertNotNull(new BusyPoll(LONG, 1).forSocket(fd));
    }

    @Test
    void aClosedSocketEndsPollingAtOnce() throws Exception {
        BusyPoll.Poller p = new BusyPoll(LONG, 1).forSocket(fd);
        server.close(); // the fd is gone: the read that follows reports it, polling must not wait 30 s for it
        long t0 = System.nanoTime();
        assertTrue(p.awaitReadable());
        assertTrue(System.nanoTime() - t0 < LONG.toNanos() / 2);
    }
}
