package io.pmemblk.vhost.blk;

import io.pmemblk.posix.EventFd;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.spec.SplitRingLayout;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestRam;
import io.pmemblk.vhost.virtq.VirtioFeatures;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

import static io.pmemblk.vhost.testing.GuestDriver.NEXT;
import static io.pmemblk.vhost.testing.GuestDriver.WRITE;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * virtio-blk requests from a test guest through {@link VhostBlkQueue} to the block layer and back: data byte for
 * byte, the data-less requests, every refusal with its status, a broken queue beside a working one, and how
 * often the guest is interrupted. Guest memory: [0, 4M) and [4M, 8M) adjacent (buffers cross between them),
 * [64M, 65M) after a hole.
 */
class VhostBlkQueueTest {
    static final long MIB = 1 << 20;
    static final int N = 128;
    static final long DEVICE = 32 * MIB;
    static final int MAX_IO = 1 << 20;
    static final long FEATURES = GuestDriver.LINUX_FEATURES;

    final GuestRam ram = GuestRam.of(0, 4 * MIB, 4 * MIB, 4 * MIB, 64 * MIB, MIB);
    final List<AutoCloseable> closing = new ArrayList<>();
    MemoryBlockDriver driver;
    BlockLayer layer;

    @AfterEach
    void close() throws Exception {
        for (int i = closing.size() - 1; i >= 0; i--) {
            Closing.closeAll(closing.get(i));
        }
        Closing.closeAll(layer, driver);
        ram.assertGuardsIntact();
        ram.close();
    }

    /** One served queue: the guest's ring and driver, the back-end's queue and its eventfds. */
    final class Served implements AutoCloseable {
        final GuestDriver ring;
        final BlkGuest guest;
        final EventFd kick;
        final EventFd call;
        final VhostBlkQueue queue;
        boolean stopped;

        Served(int index, long ringGpa, long features, BlkDevice device) throws Exception {
            this(index, ringGpa, features, device, null);
        }

        /** With {@code polling}'s bounds (busy-poll and hold), or the queue's defaults when null. */
        Served(int index, long ringGpa, long features, BlkDevice device, RingPolling polling) throws Exception {
            this(index, ringGpa, features, device, polling, true);
        }

        /** As above; {@code start} false leaves the queue thread to the test ({@code queue.start()}). */
        Served(int index, long ringGpa, long features, BlkDevice device, RingPolling polling, boolean start)
                throws Exception {
            ring = new GuestDriver(ram, N, ringGpa);
            // Queue 0's buffers may cross from region 0 into region 1 (at 4M); each queue has its own area.
            guest = new BlkGuest(ring, MIB + index * 7 * MIB / 2, MIB + (index + 1) * 7 * MIB / 2);
            kick = EventFd.create(true);
            call = EventFd.create(true);
            queue = polling == null
                    ? new VhostBlkQueue(new VringAddress(index, N, ring.descUser(), ring.availUser(), ring.usedUser(), 0),
                            new QueueWiring(features, kick, call, new FrontendQueue(layer.queue(index)), ram::memory, null,
                                    device))
                    : new VhostBlkQueue(new VringAddress(index, N, ring.descUser(), ring.availUser(), ring.usedUser(), 0),
                            new QueueWiring(features, kick, call, new FrontendQueue(layer.queue(index)), ram::memory, null,
                                    device, polling, Thread.ofPlatform().factory()));
            if (start) {
                queue.start();
            }
            closing.add(this);
        }

        /** Kicks and waits (bounded) until {@code n} more requests are answered; returns them. */
        Map<Integer, Integer> kickAndAwait(int n) throws InterruptedException {
            kick.signal();
            Map<Integer, Integer> got = new HashMap<>();
            Waits.await(n + " answers on queue " + queue.index(), () -> {
                got.putAll(guest.answered());
                return got.size() >= n;
            });
            assertThat(got).hasSize(n);
            return got;
        }

        int stop() throws InterruptedException {
            stopped = true;
            return queue.stop();
        }

        @Override
        public void close() throws Exception {
            if (!stopped) {
                queue.stop();
            }
            Closing.closeAll(kick, call);
        }
    }

    void open() {
        driver = new MemoryBlockDriver(DEVICE);
        layer = new BlockLayer(driver, 2, 64, 4 * MIB, MAX_IO);
    }

    static BlkDevice device(boolean readOnly) {
        return BlkDevice.of(DEVICE, readOnly, true, true, "pmemblk-vhost-test");
    }

    Served serve(int index) throws Exception {
        return new Served(index, 0x10000 + index * 0x40000L, FEATURES, device(false));
    }

    @Test
    void aGuestFloodingRefusedRequestsIsCutToAFewLogLines() throws Exception {
        java.util.logging.Logger jul = java.util.logging.Logger.getLogger(VhostBlkQueue.class.getName());
        List<String> lines = new java.util.concurrent.CopyOnWriteArrayList<>();
        java.util.logging.Handler capture = new java.util.logging.Handler() {
            @Override public void publish(java.util.logging.LogRecord r) { lines.add(r.getMessage()); }
            @Override public void flush() { }
            @Override public void close() { }
        };
        jul.addHandler(capture);
        jul.setLevel(java.util.logging.Level.FINE); // DEBUG: every refusal would be a line without the limit
        try {
            open();
            Served s = serve(0);
            for (int round = 0; round < 10; round++) {
                List<Sent> sent = new ArrayList<>();
                for (int i = 0; i < 40; i++) {
                    sent.add(s.guest.send(99, 0, null, 0, 1, false)); // no such request type: UNSUPP
                }
                s.kickAndAwait(sent.size());
                for (Sent r : sent) {
                    assertThat(s.guest.status(r)).isEqualTo(VirtioBlk.S_UNSUPP);
                }
            }
            assertThat(s.queue.broken()).isFalse();
        } finally {
            jul.removeHandler(capture);
            jul.setLevel(null);
        }
        assertThat(lines.stream().filter(l -> l.contains("refused")).count()).as("log lines for 400 refusals")
                .isLessThanOrEqualTo(2L * io.pmemblk.queueing.log.RateLimitedLog.LINES_PER_SECOND);
    }

    @Test
    void writesLandOnTheDeviceAndReadBackByteForByte() throws Exception {
        open();
        Served s = serve(0);
        Random rnd = new Random(24);
        int rounds = 40;
        long[] sector = new long[rounds];
        byte[][] data = new byte[rounds][];
        for (int i = 0; i < rounds; i++) {
            data[i] = new byte[512 * (1 + rnd.nextInt(i % 5 == 0 ? 512 : 16))];
            rnd.nextBytes(data[i]);
            sector[i] = (long) i * 1024 + rnd.nextInt(8);
            if (i % 7 == 3) {
                s.guest.allocAt(4 * MIB - 300); // the next buffers cross from region 0 into region 1
            }
            Sent w = s.guest.write(sector[i], data[i], 1 + rnd.nextInt(6), i % 2 == 1);
            Map<Integer, Integer> a = s.kickAndAwait(1);
            assertThat(s.guest.status(w)).as("write " + i).isZero();
            assertThat(a.get(w.head())).as("used.len of a write: the status byte").isEqualTo(1);
            assertThat(driver.memory.asSlice(sector[i] * 512, data[i].length).toArray(ValueLayout.JAVA_BYTE))
                    .as("write " + i + " on the device").isEqualTo(data[i]);
        }
        List<Sent> reads = new ArrayList<>();
        for (int i = 0; i < rounds; i++) {
            if (i % 7 == 3) {
                s.guest.allocAt(4 * MIB - 300);
            }
            reads.add(s.guest.read(sector[i], data[i].length, 1 + rnd.nextInt(6), i % 3 == 0));
            if (reads.size() % 8 == 0 || i == rounds - 1) { // several in flight at once
                Map<Integer, Integer> a = s.kickAndAwait(reads.size());
                for (int k = 0; k < reads.size(); k++) {
                    Sent r = reads.get(k);
                    int at = i - reads.size() + 1 + k;
                    assertThat(s.guest.status(r)).isZero();
                    assertThat(a.get(r.head())).as("used.len of a read: data + status").isEqualTo(data[at].length + 1);
                    assertThat(s.guest.data(r)).as("read " + at).isEqualTo(data[at]);
                }
                reads.clear();
            }
        }
        assertThat(s.queue.broken()).isFalse();
    }

    @Test
    void flushDiscardWriteZeroesAndGetId() throws Exception {
        open();
        Served s = serve(0);
        byte[] ones = new byte[64 << 10];
        Arrays.fill(ones, (byte) 1);
        s.guest.write(0, ones, 1, false);
        s.kickAndAwait(1);
        long flushes = driver.flushes.get();
        Sent flush = s.guest.send(BlkGuest.FLUSH, 0, null, 0, 1, false);
        Sent discard = s.guest.range(BlkGuest.DISCARD, 8, 8, 0);
        Sent zero = s.guest.range(BlkGuest.WRITE_ZEROES, 32, 16, 1); // UNMAP allowed on WRITE_ZEROES
        Sent id = s.guest.send(BlkGuest.GET_ID, 0, null, 20, 1, false);
        Map<Integer, Integer> a = s.kickAndAwait(4);
        assertThat(List.of(s.guest.status(flush), s.guest.status(discard), s.guest.status(zero), s.guest.status(id)))
                .containsOnly(0);
        assertThat(driver.flushes.get()).isEqualTo(flushes + 1);
        byte[] dev = driver.memory.asSlice(0, 64 << 10).toArray(ValueLayout.JAVA_BYTE);
        for (int i = 0; i < dev.length; i++) {
            boolean cleared = i >= 8 * 512 && i < 16 * 512 || i >= 32 * 512 && i < 48 * 512;
            assertThat(dev[i]).as("device byte " + i).isEqualTo((byte) (cleared ? 0 : 1));
        }
        byte[] serial = Arrays.copyOf("pmemblk-vhost-test".getBytes(StandardCharsets.US_ASCII), 20);
        assertThat(s.guest.data(id)).isEqualTo(serial);
        assertThat(a.get(id.head())).isEqualTo(21);
    }

    @Test
    void badRequestsGetTheirStatusAndTheQueueGoesOn() throws Exception {
        open();
        Served s = serve(0);
        long cap = DEVICE / 512;
        Map<String, Sent> io = new HashMap<>();
        Map<String, Sent> unsupp = new HashMap<>();
        io.put("past the end", s.guest.read(cap - 1, 1024, 1, false));
        io.put("a sector near 2^64", s.guest.read(-2L, 512, 1, false));
        io.put("not a multiple of 512", s.guest.write(0, new byte[1000], 1, false));
        io.put("no data", s.guest.read(0, 0, 1, false));
        io.put("above seg_max x size_max", s.guest.read(0, 2 * MAX_IO, 4, true));
        io.put("OUT with writable data", s.guest.send(BlkGuest.OUT, 0, new byte[512], 512, 1, false));
        io.put("IN with readable data", s.guest.send(BlkGuest.IN, 0, new byte[512], 512, 1, false));
        io.put("discard past the end", s.guest.range(BlkGuest.DISCARD, cap - 4, 8, 0));
        io.put("discard of 0 sectors", s.guest.range(BlkGuest.DISCARD, 0, 0, 0));
        io.put("discard above the maximum", s.guest.range(BlkGuest.WRITE_ZEROES, 0, 32769, 0));
        io.put("GET_ID without a buffer", s.guest.send(BlkGuest.GET_ID, 0, null, 0, 1, false));
        unsupp.put("unknown type", s.guest.send(99, 0, null, 0, 1, false));
        unsupp.put("DISCARD with UNMAP", s.guest.range(BlkGuest.DISCARD, 0, 8, 1));
        unsupp.put("unknown WRITE_ZEROES flag", s.guest.range(BlkGuest.WRITE_ZEROES, 0, 8, 2));
        unsupp.put("two segments", s.guest.send(BlkGuest.DISCARD, 0, new byte[32], 0, 1, false));
        // A header split over two buffers and too short: 8 readable bytes.
        long h = s.guest.alloc(8), st = s.guest.alloc(1);
        io.put("a header of 8 bytes", s.guest.raw(List.of(new GuestDriver.Buf(h, 8, false), new GuestDriver.Buf(st, 1, true)), st));
        s.kickAndAwait(io.size() + unsupp.size());
        io.forEach((what, r) -> assertThat(s.guest.status(r)).as(what).isEqualTo(VirtioBlk.S_IOERR));
        unsupp.forEach((what, r) -> assertThat(s.guest.status(r)).as(what).isEqualTo(VirtioBlk.S_UNSUPP));
        assertThat(driver.requests.get()).as("none reached the driver").isZero();
        Sent ok = s.guest.write(8, new byte[4096], 2, true);
        s.kickAndAwait(1);
        assertThat(s.guest.status(ok)).isZero();
        assertThat(s.queue.broken()).isFalse();
    }

    @Test
    void writesToAReadOnlyDeviceAreRefused() throws Exception {
        open();
        Served s = new Served(0, 0x10000, FEATURES, device(true));
        Sent w = s.guest.write(0, new byte[512], 1, false);
        Sent z = s.guest.range(BlkGuest.WRITE_ZEROES, 0, 8, 0);
        Sent r = s.guest.read(0, 512, 1, false);
        s.kickAndAwait(3);
        assertThat(s.guest.status(w)).isEqualTo(VirtioBlk.S_IOERR);
        assertThat(s.guest.status(z)).isEqualTo(VirtioBlk.S_IOERR);
        assertThat(s.guest.status(r)).isZero();
    }

    @Test
    void aBrokenQueueStopsAloneAndTheOtherQueueServesOn() throws Exception {
        open();
        Served bad = serve(0);
        Served good = serve(1);
        Sent before = bad.guest.write(0, new byte[512], 1, false);
        bad.kickAndAwait(1);
        assertThat(bad.guest.status(before)).isZero();
        bad.ring.reserve(100, 101);
        bad.ring.desc(100, 0x40000, 16, NEXT | WRITE, 101);
        bad.ring.desc(101, 0x40000, 16, NEXT | WRITE, 100); // a loop
        bad.ring.offer(100);
        bad.kick.signal();
        Waits.await("queue 0 broken", bad.queue::broken);
        Waits.join("queue 0's thread to end", bad.queue.thread());
        byte[] data = new byte[8192];
        new Random(5).nextBytes(data);
        Sent w = good.guest.write(64, data, 3, true);
        good.kickAndAwait(1);
        Sent r = good.guest.read(64, data.length, 2, false);
        good.kickAndAwait(1);
        assertThat(good.guest.status(w)).isZero();
        assertThat(good.guest.data(r)).isEqualTo(data);
        assertThat(good.queue.broken()).isFalse();
        assertThat(bad.stop()).as("GET_VRING_BASE: the first request was taken, the refused chain not").isEqualTo(1);
    }

    @Test
    void aChainWithoutAStatusByteBreaksTheQueueForItCannotBeAnswered() throws Exception {
        open();
        Served s = serve(0);
        long h = s.guest.alloc(16), d = s.guest.alloc(512);
        s.guest.raw(List.of(new GuestDriver.Buf(h, 16, false), new GuestDriver.Buf(d, 512, false)), d);
        s.kick.signal();
        Waits.await("queue 0 broken", s.queue::broken);
        assertThat(s.queue.brokenReason()).isEqualTo("virtqueue 0: the chain of head 0 has no device-writable byte for"
                + " its status");
        assertThat(s.stop()).as("the chain is not counted as taken").isZero();
    }

    @Test
    void stopWaitsForTheRequestsInFlightAndThenAnswersTheNextAvailIndex() throws Exception {
        open();
        Served s = serve(0);
        driver.hold();
        Sent a = s.guest.write(0, new byte[4096], 2, false);
        Sent b = s.guest.read(8, 4096, 1, true);
        s.kick.signal();
        assertThat(driver.awaitHeld(2, Waits.BOUND.toMillis())).isTrue();
        int[] base = {-1};
        Thread stopping = Thread.ofPlatform().name("get-vring-base").start(() -> {
            try {
                base[0] = s.stop();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        Waits.awaitWaiting("GET_VRING_BASE draining", stopping);
        assertThat(s.ring.usedIdx()).as("nothing answered yet").isZero();
        driver.releaseHeld();
        Waits.join("GET_VRING_BASE", stopping);
        assertThat(base[0]).isEqualTo(2);
        assertThat(s.ring.usedIdx()).as("both answered before the ring stopped").isEqualTo(2);
        assertThat(List.of(s.guest.status(a), s.guest.status(b))).containsOnly(0);
    }

    @Test
    void eventIdxInterruptsTheGuestOnceWhenUsedEventIsPassed() throws Exception {
        open();
        Served s = serve(0);
        s.guest.read(0, 512, 1, false);
        s.kickAndAwait(1);
        assertThat(s.call.await(10_000)).as("the first answer interrupts").isTrue();
        assertThat(s.call.drain()).isEqualTo(1);
        // 32 requests; interrupt me once used.idx passes 32 (= when the last of them is used).
        s.ring.usedEvent(32);
        for (int i = 0; i < 32; i++) {
            s.guest.read(i, 512, 1, i % 2 == 0);
        }
        s.kickAndAwait(32);
        // No event was passed before the last answer, and nothing is left to answer: after the queue thread (which
        // completes this driver's requests) has stopped, the count is final.
        s.stop();
        assertThat(s.call.drain()).as("interrupts for 32 answers").isEqualTo(1);
    }

    /**
     * The hold (vhost.coalesce): a burst of 32 requests is answered in two publishes of 16, one interrupt each,
     * where without it every dispatch of 4 publishes and interrupts. The guest asks for every interrupt (no
     * EVENT_IDX, no NO_INTERRUPT flag), so the call eventfd counts the publishes. The queue thread starts once all
     * 32 are in the ring (started before, it could pop the first few as they came: 9 publishes, seen in CI), and a
     * hold only waits once the ring is empty: the counts are exact.
     */
    @Test
    void heldCompletionsArePublishedSixteenAtATimeWithOneInterruptEach() throws Exception {
        open();
        long features = VirtioFeatures.bit(VirtioFeatures.VERSION_1);
        for (long hold : new long[]{50_000, 0}) {
            Served s = new Served(hold == 0 ? 1 : 0, 0x10000 + (hold == 0 ? 0x40000L : 0), features, device(false),
                    new RingPolling(0, hold, 1), false);
            for (int i = 0; i < 32; i++) {
                s.guest.read(i, 512, 1, false);
            }
            s.queue.start();
            s.kickAndAwait(32);
            s.stop();
            assertThat(s.call.drain()).as("interrupts for a burst of 32, hold " + hold + " ns")
                    .isEqualTo(hold == 0 ? 32 / VhostBlkQueue.BATCH : 32 / VhostBlkQueue.HOLD_COMPLETIONS);
        }
    }

    /** A guest that waits for each answer before it sends the next (QD1) gets every one: the hold runs out. */
    @Test
    void aGuestWaitingForEachAnswerGetsItWhenTheHoldRunsOut() throws Exception {
        open();
        Served s = new Served(0, 0x10000, FEATURES, device(false), new RingPolling(0, 1_000_000, 1));
        for (int i = 0; i < 20; i++) {
            Sent sent = s.guest.read(i, 4096, 1, false);
            s.kickAndAwait(1);
            assertThat(s.guest.status(sent)).as("answer " + i).isEqualTo(VirtioBlk.S_OK);
        }
    }

    /**
     * A guest at QD4 that waits for all four answers before it sends more: every hold gathers four and runs out with
     * no request in it, and after {@link RingPolling#HOLD_MISSES} such holds it closes; the next rounds are answered
     * at once, not a hold later each. (Counting the four gathered as a catch kept the hold, and its wait, on every
     * round: 8 rounds took 8 holds.) The hold is 400 ms, so "at once" has a margin of 8 holds over the 8 rounds.
     */
    @Test
    void aGuestWaitingForAFewAnswersAtATimeClosesTheHold() throws Exception {
        open();
        long hold = 400_000_000L;
        Served s = new Served(0, 0x10000, FEATURES, device(false), new RingPolling(0, hold, 1));
        for (int round = 0; round < RingPolling.HOLD_MISSES; round++) {
            for (int i = 0; i < 4; i++) {
                s.guest.read(round * 4 + i, 4096, 1, false);
            }
            s.kickAndAwait(4);
        }
        long from = System.nanoTime();
        for (int round = 0; round < 8; round++) {
            for (int i = 0; i < 4; i++) {
                s.guest.read(i, 4096, 1, false);
            }
            s.kickAndAwait(4);
        }
        assertThat(System.nanoTime() - from).as("8 rounds of 4 after the hold closed (one hold is " + hold + " ns)")
                .isLessThan(hold);
    }

    @Test
    void withoutEventIdxNoInterruptIsHonoured() throws Exception {
        open();
        Served s = new Served(0, 0x10000, VirtioFeatures.bit(VirtioFeatures.VERSION_1), device(false));
        s.ring.availFlags(1); // VRING_AVAIL_F_NO_INTERRUPT
        for (int i = 0; i < 8; i++) {
            s.guest.read(i, 512, 1, false);
        }
        s.kickAndAwait(8);
        s.stop();
        assertThat(s.call.drain()).as("interrupts while the guest asked for none").isZero();
    }

    /**
     * The reviewer's hostile guest: a ring of 8 whose every avail entry is head 0 (a request of an unknown type, so
     * refused on the queue thread, its completion held back with the others), and 8 more entries once the 8th
     * completion is written. Accepting a head again before its completion was published once overflowed the
     * completions waiting (ArrayIndexOutOfBoundsException), and again in the thread's way out, so the thread died
     * with its epoll and wake fds open for ever. Now the first repeat breaks the queue (signalling its err eventfd),
     * and stop closes them.
     */
    @Test
    void aHeadOfferedAgainBeforeItsCompletionIsPublishedBreaksTheQueueAndStopLeavesNoFdOpen() throws Exception {
        open();
        int size = 8;
        GuestDriver ring = new GuestDriver(ram, size, 0x10000);
        long header = 0x100000, status = 0x100100;
        MemorySegment h = ram.at(header, 16);
        h.set(ValueLayout.JAVA_INT_UNALIGNED, 0, 99); // no such request type: UNSUPP, answered on the queue thread
        ring.reserve(0, 1);
        ring.desc(0, header, 16, NEXT, 1);
        ring.desc(1, status, 1, WRITE, 0);
        for (int i = 0; i < 2 * size; i++) {
            ring.availRing(i % size, 0);
        }
        EventFd kick = EventFd.create(true), call = EventFd.create(true), err = EventFd.create(true);
        closing.add(() -> Closing.closeAll(kick, call, err));
        Arena qemu = Arena.ofShared();
        closing.add(qemu::close);
        MemorySegment inflight = qemu.allocate(16 + 16L * size, 64);
        long fds = openFds();
        // A hold longer than the test: what is answered stays held until 16 wait, or the thread leaves.
        VhostBlkQueue q = new VhostBlkQueue(new VringAddress(0, size, ring.descUser(), ring.availUser(), ring.usedUser(), 0),
                new QueueWiring(FEATURES, kick, call, err, new FrontendQueue(layer.queue(0)), ram::memory, inflight,
                        device(false), new RingPolling(0, 60_000_000_000L, 1), Thread.ofPlatform().factory()));
        q.start();
        MemorySegment lastUsedLen = ram.at(ring.usedGpa + SplitRingLayout.USED_RING
                + SplitRingLayout.USED_ELEM_BYTES * (size - 1) + 4, 4);
        ring.availIdx(size);
        kick.signal();
        Waits.await("queue 0 broken, or used.ring[7] written", () -> q.broken()
                || lastUsedLen.get(ValueLayout.JAVA_INT_UNALIGNED, 0) != 0);
        ring.availIdx(2 * size);
        kick.signal();
        Waits.await("queue 0 broken", q::broken);
        Waits.join("queue 0's thread to end", q.thread());
        assertThat(err.drain()).as("the err eventfd signalled once, for the front-end to log").isEqualTo(1);
        int base = q.stop();
        // First: whatever broke the queue, its thread's way out must leave it closable.
        Waits.await("the queue's epoll and wake fds closed (" + fds + " open before it)", () -> openFds() == fds);
        assertThat(q.brokenReason()).isEqualTo("virtqueue 0: head 0 made available again before its completion was"
                + " published: a head is the driver's again once used.idx has passed its used entry");
        assertThat(ring.usedIdx()).as("the first request's refusal, published as the thread left").isEqualTo(1);
        assertThat(ram.read(status, 1)[0]).isEqualTo((byte) VirtioBlk.S_UNSUPP);
        assertThat(base).as("GET_VRING_BASE: the first entry was taken, its repeat not").isEqualTo(1);
    }

    private static long openFds() {
        try (var s = Files.list(Path.of("/proc/self/fd"))) {
            return s.count();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
