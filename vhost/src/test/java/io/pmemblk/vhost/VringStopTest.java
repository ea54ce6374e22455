package io.pmemblk.vhost;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.Libc;
import io.pmemblk.queueing.testing.ThreadShortage;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestDriver.Buf;
import io.pmemblk.vhost.testing.GuestRam;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * How a ring stops, against the real server over its socket: GET_VRING_BASE answers the ring's true position only,
 * however long its requests take (a FLUSH held in the device, as an msync that outlasts any bound); a front-end
 * that goes away, or a server that closes, ends the wait without an answer; guest memory a stuck request may still
 * touch stays mapped until it is done, and no longer; SET_VRING_ENABLE(0) stops the ring's processing and (1)
 * resumes it; a vhost.queue-size no request fits in is refused; and a ring whose thread cannot be made ends the
 * session. The guest is {@link BlkGuest} over a memfd that the server maps as QEMU's guest RAM.
 */
class VringStopTest extends ServedMemoryDisk {
    static final long MIB = 1 << 20, DISK = 4 * MIB;
    static final int RING = 64;
    /** The stop bound the server once had (VhostBlkQueue's 10 s drain): a FLUSH held longer than it. */
    static final int OLD_STOP_BOUND_MS = 10_000;
    /** What QEMU 7.2 acks for a Linux guest (note section 3C), bit 30 included. */
    static final long LINUX_ACK = 0x170007e46L;

    GuestRam ram;
    /** The guest's vring 0 and the virtio-blk driver over it, its data area from 0x40000 to the end of RAM. */
    GuestDriver ring;
    BlkGuest guest;

    VringStopTest() {
        super(new Sizes(DISK, 1, 1, 128, GuestRam.bytesFor(0, MIB)));
    }

    @BeforeEach
    void start() {
        ram = new GuestRam(null, ramView, 0, MIB);
        ring = new GuestDriver(ram, RING, 0x10000);
        guest = new BlkGuest(ring, 0x40000, MIB);
    }

    /** /proc/self/maps lines of the guest RAM memfd: the test's own mapping, plus the server's while it has one. */
    private static long ramMappings() throws IOException {
        return Files.readAllLines(Path.of("/proc/self/maps")).stream().filter(l -> l.contains("/memfd:guest-ram")).count();
    }

    /** Realize and features as QEMU 7.2 sends them, and guest RAM as one region (ADD_MEM_REG). */
    private TestFrontEnd connect() throws IOException {
        TestFrontEnd fe = TestFrontEnd.connect(socket);
        long offered = fe.get(GET_FEATURES);
        fe.set(SET_PROTOCOL_FEATURES, fe.get(GET_PROTOCOL_FEATURES) & 0x1ffff);
        fe.send(SET_OWNER, 0, fe.empty());
        fe.set(SET_FEATURES, LINUX_ACK & offered);
        MemorySegment p = fe.memRegion(0, MIB, ram.user(0), GuestRam.GUARD); // GUARD: where GuestRam put gpa 0
        assertThat(fe.acked(ADD_MEM_REG, p, ramFd)).isZero();
        return fe;
    }

    /** Starts vring 0 at {@code base} (NUM, BASE, ADDR, CALL, KICK, and ENABLE(1) when asked); its kick fd. */
    private EventFd startRing(TestFrontEnd fe, GuestDriver ring, int base, EventFd call, boolean enable)
            throws IOException {
        EventFd kick = eventFds.create();
        fe.startVring(ring, base, call.fd(), kick.fd(), enable);
        assertThat(fe.get(GET_QUEUE_NUM)).as("every message before it handled").isEqualTo(1);
        return kick;
    }

    /**
     * Starts vring 0 (enabled, {@code call} its call fd) and kicks in a FLUSH for the disk to hold (the test said
     * {@code driver.hold()}); returns the FLUSH once the disk holds it.
     */
    private Sent heldFlush(TestFrontEnd fe, GuestDriver ring, BlkGuest guest, EventFd call) throws Exception {
        EventFd kick = startRing(fe, ring, 0, call, true);
        Sent flush = guest.send(BlkGuest.FLUSH, 0, null, 0, 1, false);
        kick.signal();
        assertThat(driver.awaitHeld(1, Waits.BOUND.toMillis())).isTrue();
        return flush;
    }

    /** The guest's answers until {@code n} more have come (bounded). */
    private static Map<Integer, Integer> awaitAnswers(BlkGuest guest, int n) throws InterruptedException {
        Map<Integer, Integer> got = new HashMap<>();
        Waits.await(n + " answers", () -> {
            got.putAll(guest.answered());
            return got.size() >= n;
        });
        return got;
    }

    private static byte[] pattern(int seed) {
        byte[] b = new byte[4096];
        new java.util.Random(seed).nextBytes(b);
        return b;
    }

    /**
     * The review's reproduction: a WRITE answered, then a FLUSH whose msync outlasts the old 10 s stop bound.
     * GET_VRING_BASE must answer 2 (both were taken), not 0 (where the ring started), and only once the FLUSH is
     * done; QEMU restarts the ring from the answer, so a 0 would run the WRITE again from its buffer, which the
     * guest has reused since it was answered.
     */
    @Test
    void getVringBaseWaitsForAFlushSlowerThanTheOldStopBoundAndTheRestartRunsNothingTwice() throws Exception {
        EventFd call = eventFds.create();
        try (TestFrontEnd fe = connect()) {
            EventFd kick = startRing(fe, ring, 0, call, true);
            byte[] first = pattern(1);
            long h = guest.alloc(16), data = guest.alloc(4096), status = guest.alloc(1);
            MemorySegment hdr = ram.at(h, 16);
            hdr.set(ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), 0, BlkGuest.OUT);
            hdr.set(ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), 8, 0L);
            ram.write(data, first);
            Sent write = guest.raw(List.of(new Buf(h, 16, false), new Buf(data, 4096, false), new Buf(status, 1, true)),
                    status);
            kick.signal();
            awaitAnswers(guest, 1);
            assertThat(guest.status(write)).isZero();
            ram.write(data, pattern(2)); // the write is answered: the guest uses its buffer for something else

            driver.hold(); // the FLUSH's msync: it returns when the test says so
            Sent flush = guest.send(BlkGuest.FLUSH, 0, null, 0, 1, false);
            kick.signal();
            assertThat(driver.awaitHeld(1, Waits.BOUND.toMillis())).as("the FLUSH reached the device").isTrue();
            fe.send(SET_VRING_ENABLE, 0, fe.state(0, 0)); // QEMU's stop: disable, then GET_VRING_BASE
            fe.send(GET_VRING_BASE, 0, fe.state(0, 0));
            fe.assertSilentFor(OLD_STOP_BOUND_MS + 1_000, "GET_VRING_BASE while the ring's FLUSH is in flight");
            assertThat(log).as("the wait is logged").anyMatch(l -> l.contains("vring 0 stopping: waited 10 s")
                    && l.contains("heads " + flush.head()));
            driver.releaseHeld();
            TestFrontEnd.Reply base = fe.reply(GET_VRING_BASE);
            assertThat(base.payload().get(ValueLayout.JAVA_INT_UNALIGNED, STATE_NUM))
                    .as("the ring's true position: the WRITE and the FLUSH were taken").isEqualTo(2);
            assertThat(awaitAnswers(guest, 1)).as("the FLUSH answered before the ring stopped").containsKey(flush.head());
            assertThat(guest.status(flush)).isZero();

            // QEMU starts the ring again from what GET_VRING_BASE said.
            kick = startRing(fe, ring, 2, call, true);
            Sent read = guest.read(0, 4096, 1, false);
            kick.signal();
            awaitAnswers(guest, 1);
            assertThat(guest.data(read)).as("sector 0 holds the WRITE as answered, not run again from its reused"
                    + " buffer").isEqualTo(first);
            assertThat(driver.requests.get()).as("WRITE, FLUSH, READ: each once").isEqualTo(3);
            assertThat(driver.flushes.get()).isEqualTo(1);
        }
        ram.assertGuardsIntact();
    }

    /**
     * A front-end that goes away while a ring's FLUSH is stuck (with GET_VRING_BASE waiting for it, or without):
     * the session ends at once, leaves guest RAM mapped while the FLUSH may still use it, and unmaps it when it is
     * done. Three times over: the mappings do not pile up (they did, one per stuck stop, for good).
     */
    @Test
    void aFrontEndGoneWhileAFlushIsStuckEndsTheSessionAndItsMemoryIsUnmappedOnceTheFlushIsDone() throws Exception {
        for (int round = 0; round < 3; round++) {
            GuestDriver ring = new GuestDriver(ram, RING, 0x10000); // the guest starts over each time
            BlkGuest guest = new BlkGuest(ring, 0x40000, MIB);
            driver.hold();
            try (TestFrontEnd fe = connect()) {
                heldFlush(fe, ring, guest, eventFds.create());
                if (round != 1) {
                    fe.send(GET_VRING_BASE, 0, fe.state(0, 0));
                    fe.assertSilentFor(300, "GET_VRING_BASE while the FLUSH is in flight");
                }
            }
            assertThat(server.awaitDisconnected(Duration.ofSeconds(5))).as("round " + round + ": the session ended"
                    + " without waiting for the FLUSH").isTrue();
            assertThat(ramMappings()).as("round " + round + ": guest RAM stays mapped while the FLUSH may touch it")
                    .isEqualTo(2);
            driver.releaseHeld();
            Waits.await("round " + round + ": the server's mapping of guest RAM released once the FLUSH is done",
                    () -> {
                        try {
                            return ramMappings() == 1;
                        } catch (IOException e) {
                            throw new java.io.UncheckedIOException(e);
                        }
                    });
            assertThat(ring.usedIdx()).as("round " + round + ": nothing written into a ring no longer ours").isZero();
        }
        assertThat(log).anyMatch(l -> l.contains("vring 0 stopped with requests still in flight"));
        ram.assertGuardsIntact();
    }

    /**
     * QEMU's reconnect with the inflight region: the front-end goes while a FLUSH is stuck; the FLUSH stays marked in
     * the region, the next session resubmits it, and the guest sees it answered once, by the new session: the old
     * execution's late completion writes nothing into the ring (nor unmarks it in the region).
     */
    @Test
    void aFlushLeftInFlightByAGoneFrontEndIsResubmittedFromTheInflightRegionAndAnsweredOnce() throws Exception {
        EventFd call = eventFds.create();
        int[] inflightFd = new int[1];
        MemorySegment inflight;
        driver.hold();
        Sent flush;
        try (TestFrontEnd fe = connect()) {
            MemorySegment ask = fe.payload(INFLIGHT_SIZE);
            ask.set(ValueLayout.JAVA_SHORT, INFLIGHT_NUM_QUEUES, (short) 1);
            ask.set(ValueLayout.JAVA_SHORT, INFLIGHT_QUEUE_SIZE, (short) RING);
            fe.send(GET_INFLIGHT_FD, 0, ask);
            inflight = arena.allocate(INFLIGHT_SIZE);
            inflight.copyFrom(fe.reply(GET_INFLIGHT_FD, inflightFd).payload());
            fe.send(SET_INFLIGHT_FD, 0, inflight, inflightFd[0]);
            flush = heldFlush(fe, ring, guest, call);
        }
        try {
            assertThat(server.awaitDisconnected(Duration.ofSeconds(5))).as("the session ended").isTrue();
            // reconnect=1: QEMU restores last_avail_idx = used.idx (0) and hands the same region back
            try (TestFrontEnd fe = connect()) {
                fe.send(SET_INFLIGHT_FD, 0, inflight, inflightFd[0]);
                startRing(fe, ring, ring.usedIdx(), call, true);
                assertThat(driver.awaitHeld(2, Waits.BOUND.toMillis())).as("the FLUSH resubmitted from the region")
                        .isTrue();
                driver.releaseHeld(); // both executions complete: the old one first
                assertThat(awaitAnswers(guest, 1)).as("answered once (BlkGuest fails on a second answer)")
                        .containsOnlyKeys(flush.head());
                assertThat(guest.status(flush)).isZero();
                fe.send(GET_VRING_BASE, 0, fe.state(0, 0));
                assertThat(fe.reply(GET_VRING_BASE).payload().get(ValueLayout.JAVA_INT_UNALIGNED, STATE_NUM))
                        .isEqualTo(1);
                assertThat(ring.usedIdx()).as("one used entry").isEqualTo(1);
                assertThat(guest.answered()).as("and no late one").isEmpty();
                assertThat(ramMappings()).as("the first session's mapping released once its FLUSH was done")
                        .isEqualTo(2);
            }
        } finally {
            Libc.close(inflightFd[0]);
        }
        assertThat(driver.flushes.get()).as("run twice, which a FLUSH may be").isEqualTo(2);
    }

    /** The server closes while GET_VRING_BASE waits: the session ends without an answer (never a stale one). */
    @Test
    void aServerClosingWhileGetVringBaseWaitsEndsTheSessionWithoutAnAnswer() throws Exception {
        driver.hold();
        try (TestFrontEnd fe = connect()) {
            heldFlush(fe, ring, guest, eventFds.create());
            fe.send(GET_VRING_BASE, 0, fe.state(0, 0));
            fe.assertSilentFor(300, "GET_VRING_BASE while the FLUSH is in flight");
            long from = System.nanoTime();
            server.close();
            assertThat(Duration.ofNanos(System.nanoTime() - from)).as("close").isLessThan(Duration.ofSeconds(5));
            assertThat(server.awaitDisconnected(Duration.ofSeconds(1))).isTrue();
            assertThat(fe.closedByBackEnd()).as("closed without answering GET_VRING_BASE").isTrue();
        }
        driver.releaseHeld();
        assertThat(ring.usedIdx()).as("the FLUSH's late completion is not written into the ring").isZero();
    }

    /**
     * A ring started with VHOST_USER_F_PROTOCOL_FEATURES negotiated is disabled until SET_VRING_ENABLE(1); (0)
     * stops its processing (the requests stay in the avail ring, untouched), (1) resumes it.
     */
    @Test
    void aDisabledRingIsNotProcessedUntilItIsEnabled() throws Exception {
        EventFd call = eventFds.create();
        try (TestFrontEnd fe = connect()) {
            EventFd kick = startRing(fe, ring, 0, call, false);
            guest.read(0, 4096, 1, false);
            kick.signal();
            assertThat(call.await(500)).as("a ring not yet enabled answers nothing").isFalse();
            assertThat(driver.requests.get()).isZero();
            fe.send(SET_VRING_ENABLE, 0, fe.state(0, 1));
            assertThat(call.await(10_000)).as("enabled: the request is served").isTrue();
            assertThat(awaitAnswers(guest, 1)).hasSize(1);
            call.drain();

            fe.send(SET_VRING_ENABLE, 0, fe.state(0, 0));
            assertThat(fe.get(GET_QUEUE_NUM)).as("the disable handled").isEqualTo(1);
            ring.usedEvent(1); // EVENT_IDX: interrupt me for the next answer
            guest.write(8, pattern(3), 1, false);
            kick.signal();
            assertThat(call.await(500)).as("a disabled ring answers nothing").isFalse();
            assertThat(driver.requests.get()).as("nor takes anything to the device").isEqualTo(1);
            assertThat(ring.usedIdx()).isEqualTo(1);
            fe.send(SET_VRING_ENABLE, 0, fe.state(0, 1));
            assertThat(call.await(10_000)).as("enabled again: it resumes").isTrue();
            assertThat(awaitAnswers(guest, 1)).hasSize(1);
            assertThat(driver.memory.asSlice(8 * 512, 4096).toArray(ValueLayout.JAVA_BYTE)).isEqualTo(pattern(3));
            fe.send(GET_VRING_BASE, 0, fe.state(0, 0));
            assertThat(fe.reply(GET_VRING_BASE).payload().get(ValueLayout.JAVA_INT_UNALIGNED, STATE_NUM)).isEqualTo(2);
        }
    }

    /**
     * vhost.queue-size 1 or 2 was accepted, and every connection then failed at GET_CONFIG (seg_max = size - 2
     * has no room): refused at the start, naming what is allowed; 3, the least, serves GET_CONFIG.
     */
    @Test
    void aQueueSizeNoRequestFitsInIsRefusedAndTheLeastThatFitsServesGetConfig() throws Exception {
        for (int size : new int[]{1, 2}) {
            assertThatThrownBy(() -> new VhostUserBlkConfig(dir.resolve("q.sock"), 1, size))
                    .isInstanceOf(IllegalArgumentException.class)
                    .hasMessage("vhost.queue-size " + size + " is not allowed; allowed: 3..1024 (a request takes 3"
                            + " descriptors: header, data, status)");
        }
        server.close();
        try (VhostUserBlkServer small = new VhostUserBlkServer(new VhostUserBlkConfig(socket, 1, 3), layer)) {
            small.start();
            try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
                fe.set(SET_PROTOCOL_FEATURES, fe.get(GET_PROTOCOL_FEATURES) & 0x1ffff);
                MemorySegment p = fe.payload(CONFIG_REGION + 57);
                p.set(ValueLayout.JAVA_INT, CONFIG_SIZE, 57);
                fe.send(GET_CONFIG, 0, p);
                MemorySegment cfg = fe.reply(GET_CONFIG).payload().asSlice(CONFIG_REGION);
                assertThat(cfg.get(ValueLayout.JAVA_INT_UNALIGNED, 12)).as("seg_max: 3 descriptors, 1 for data")
                        .isEqualTo(1);
                assertThat(cfg.get(ValueLayout.JAVA_LONG_UNALIGNED, 0)).isEqualTo(DISK / 512);
            }
        }
        assertThat(Arrays.asList(log.toArray())).noneMatch(l -> l.toString().contains("closing after a failure"));
    }

    /**
     * A system that makes no more threads: a ring whose queue thread cannot be made ends the session with a line
     * saying so, and gives back what the queue had opened (its wake eventfd and epoll) and guest memory; the next
     * front-end's ring is served. Thread.start's OutOfMemoryError once ended the session thread with a stack trace,
     * and the queue's two descriptors stayed open.
     */
    @Test
    void aRingWithoutAThreadEndsTheSessionLeavingNothingOpenAndTheNextIsServed() throws Exception {
        server.threads = new ThreadShortage().refuse(2); // 1: the session's thread, 2: its vring 0's
        EventFd call = eventFds.create(), kick = eventFds.create();
        long fds = openFds();
        try (TestFrontEnd fe = connect()) {
            fe.startVring(ring, 0, call.fd(), kick.fd(), false);
            assertThat(fe.closedByBackEnd()).as("the session ends when its ring cannot start").isTrue();
        }
        assertThat(server.awaitDisconnected(Duration.ofSeconds(10))).as("the session ended").isTrue();
        Waits.await("the session's descriptors closed (" + fds + " before it)", () -> openFds() == fds);
        assertThat(ramMappings()).as("guest RAM unmapped by the server").isEqualTo(1);
        assertThat(Arrays.asList(log.toArray())).anyMatch(l -> l.toString().contains(
                "closing after a failure: java.lang.IllegalStateException: virtqueue 0: no thread could be made for it"));
        try (TestFrontEnd next = connect()) {
            EventFd nextKick = startRing(next, ring, 0, call, true);
            Sent flush = guest.send(BlkGuest.FLUSH, 0, null, 0, 1, false);
            nextKick.signal();
            awaitAnswers(guest, 1);
            assertThat(guest.status(flush)).as("the next front-end's FLUSH answered OK").isZero();
        }
    }

    private static long openFds() {
        try (var s = Files.list(Path.of("/proc/self/fd"))) {
            return s.count();
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }
}
