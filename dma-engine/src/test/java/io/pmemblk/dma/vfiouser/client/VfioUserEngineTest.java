package io.pmemblk.dma.vfiouser.client;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.vfiouser.device.IoatVfioUserDevice;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Queue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The engine against the project's I/OAT device served over vfio-user by libvfio-user (in this process, as
 * {@code pmemblk dma-device} runs it): the same IoatChannel driver copies through BAR0 over the socket, memory
 * given by descriptor; the device going away fails exactly the copies it held, and new ones find no room; the
 * device coming back brings the channels back behind the same DmaChannel objects.
 */
class VfioUserEngineTest {
    private static final int BLOCK = 64 * 1024;

    @TempDir
    Path dir;

    /** Bounded wait for a condition another thread makes true; fails naming it. */
    private static void await(String what, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (!done.getAsBoolean()) {
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("timed out after 20 s waiting for " + what);
            }
            Thread.sleep(5); // polling another thread's progress
        }
    }

    @Test
    void copiesRunThroughTheDeviceProcessAndSurviveItsLossAndReturn() throws Exception {
        Path socket = dir.resolve("ioat.sock");
        IoatVfioUserDevice device = IoatVfioUserDevice.start(socket, 2, 20);
        try (Arena arena = Arena.ofShared()) {
            DmaEngine engine = VfioUserEngine.open(socket.toString(), 64, Duration.ofSeconds(5));
            try {
                assertThat(engine.channelCount()).isEqualTo(2);
                MemorySegment src = engine.iovaSpace().allocate(64L * BLOCK, 4096, arena);
                MemorySegment dst = engine.iovaSpace().allocate(64L * BLOCK, 4096, arena);
                for (long i = 0; i < src.byteSize(); i += 8) {
                    src.set(ValueLayout.JAVA_LONG, i, i * 0x9E3779B97F4A7C15L);
                }
                long srcIova = engine.iovaSpace().map(src);
                long dstIova = engine.iovaSpace().map(dst);
                ConcurrentHashMap<Integer, Integer> status = new ConcurrentHashMap<>();
                // every report of every ctx, in order: a second report is told apart from a status (a marker
                // value in status could be a status a channel really reports, as 0xffffffff once was)
                ConcurrentHashMap<Integer, Queue<Integer>> every = new ConcurrentHashMap<>();
                AtomicInteger reports = new AtomicInteger();
                engine.onCompletion((ctx, st) -> {
                    every.computeIfAbsent((Integer) ctx, k -> new ConcurrentLinkedQueue<>()).add(st);
                    status.put((Integer) ctx, st);
                    reports.incrementAndGet();
                });

                // 1: copies through the device
                DmaChannel ch = engine.channel(0);
                for (int i = 0; i < 16; i++) {
                    assertThat(ch.place(srcIova + (long) i * BLOCK, dstIova + (long) i * BLOCK, BLOCK, i)).isTrue();
                }
                ch.submit();
                await("16 copies reported", () -> reports.get() == 16);
                assertThat(status.values()).containsOnly(0);
                assertThat(dst.asSlice(0, 16L * BLOCK).mismatch(src.asSlice(0, 16L * BLOCK))).isEqualTo(-1);
                assertThat(engine.deviceTransfers()).as("completion interrupts came by eventfd").isPositive();

                // 2: the device goes away with copies in its hands
                status.clear();
                every.clear();
                reports.set(0);
                dst.fill((byte) 0);
                int placed = 0;
                for (int i = 0; i < 48; i++) {
                    if (engine.channel(i % 2).place(srcIova + (long) i * BLOCK, dstIova + (long) i * BLOCK, BLOCK, 100 + i)) {
                        placed++;
                    }
                }
                engine.channel(0).submit();
                engine.channel(1).submit();
                device.close();
                int expected = placed;
                await("every copy placed before the loss reported", () -> reports.get() >= expected);
                assertThat(status).hasSize(placed);
                assertThat(every.values()).as("each reported once: %s", every).allMatch(q -> q.size() == 1);
                assertThat(status.values()).as("done or lost: %s", status)
                        .allMatch(s -> s == 0 || s == DmaCompletionListener.STATUS_DEVICE_LOST);
                status.forEach((ctx, st) -> {
                    if (st == 0) {
                        long off = (long) (ctx - 100) * BLOCK;
                        assertThat(dst.asSlice(off, BLOCK).mismatch(src.asSlice(off, BLOCK))).as("copy %d done", ctx).isEqualTo(-1);
                    }
                });
                await("the channels detached", () -> engine.channel(0).freeSlots() == 0 && engine.channel(1).freeSlots() == 0);
                assertThat(engine.channel(0).place(srcIova, dstIova, BLOCK, 999)).as("no room while gone").isFalse();

                // 3: the device comes back on the same socket: the channels come back, regions mapped again
                device = IoatVfioUserDevice.start(socket, 2, 20);
                await("channel 0 back", () -> engine.channel(0).freeSlots() > 0);
                status.clear();
                reports.set(0);
                dst.fill((byte) 0);
                for (int i = 0; i < 8; i++) {
                    assertThat(engine.channel(1).place(srcIova + (long) i * BLOCK, dstIova + (long) i * BLOCK, BLOCK, 200 + i)).isTrue();
                }
                engine.channel(1).submit();
                await("8 copies after the return", () -> reports.get() == 8);
                assertThat(status.values()).containsOnly(0);
                assertThat(dst.asSlice(0, 8L * BLOCK).mismatch(src.asSlice(0, 8L * BLOCK))).isEqualTo(-1);
                engine.iovaSpace().unmap(srcIova);
                engine.iovaSpace().unmap(dstIova);
            } finally {
                engine.close();
            }
        } finally {
            device.close();
        }
    }

    /**
     * The device goes away while it is copying and a poller reaps both channels without pause (as a vhost queue
     * thread does): the device halts a channel as it unmaps its ring, the poller finds the halt at once and reads
     * CHANERR from a device whose socket has just closed. Each copy is still reported exactly once, done or lost.
     * A bounded stress loop: the halt falls between the loss and the engine's own handling in some of the rounds.
     */
    @Test
    void aDeviceGoingAwayMidCopyUnderAPollerReportsEachCopyOnceDoneOrLost() throws Exception {
        StringBuilder wrong = new StringBuilder();
        for (int round = 0; round < 12; round++) {
            Path socket = dir.resolve("stress" + round + ".sock");
            IoatVfioUserDevice device = IoatVfioUserDevice.start(socket, 2, 20);
            try (Arena arena = Arena.ofShared()) {
                DmaEngine engine = VfioUserEngine.open(socket.toString(), 64, Duration.ofSeconds(5));
                AtomicBoolean stop = new AtomicBoolean();
                Thread poller = Thread.ofPlatform().name("test-poller").start(() -> {
                    while (!stop.get()) {
                        engine.channel(0).poll();
                        engine.channel(1).poll();
                    }
                });
                try {
                    MemorySegment src = engine.iovaSpace().allocate(48L * BLOCK, 4096, arena);
                    MemorySegment dst = engine.iovaSpace().allocate(48L * BLOCK, 4096, arena);
                    long srcIova = engine.iovaSpace().map(src);
                    long dstIova = engine.iovaSpace().map(dst);
                    ConcurrentHashMap<Integer, Queue<Integer>> every = new ConcurrentHashMap<>();
                    AtomicInteger reports = new AtomicInteger();
                    engine.onCompletion((ctx, st) -> {
                        every.computeIfAbsent((Integer) ctx, k -> new ConcurrentLinkedQueue<>()).add(st);
                        reports.incrementAndGet();
                    });
                    int placed = 0;
                    for (int i = 0; i < 48; i++) {
                        if (engine.channel(i % 2).place(srcIova + (long) i * BLOCK, dstIova + (long) i * BLOCK, BLOCK, i)) {
                            placed++;
                        }
                    }
                    engine.channel(0).submit();
                    engine.channel(1).submit();
                    int started = 1 + round % 4;
                    await(started + " copies done before the device goes", () -> reports.get() >= started);
                    device.close();
                    int expected = placed;
                    await("every copy reported", () -> reports.get() >= expected);
                    boolean once = every.size() == placed && every.values().stream().allMatch(q -> q.size() == 1
                            && (q.peek() == 0 || q.peek() == DmaCompletionListener.STATUS_DEVICE_LOST));
                    if (!once) {
                        wrong.append("round ").append(round).append(": ").append(every).append('\n');
                    }
                } finally {
                    stop.set(true);
                    poller.join(TimeUnit.SECONDS.toMillis(20));
                    engine.close();
                }
            } finally {
                device.close();
            }
        }
        assertThat(wrong).as("rounds where a copy was not reported exactly once as done (0) or lost").isEmpty();
    }

    /**
     * A device that stops answering while its process still runs (here: a proxy that holds what the client sends,
     * in this process) may still copy later: the copies it holds are not handed to the CPU when the client gives
     * up on it (reply timeout), but only once it answered again and was reset. The device never saw the doorbell,
     * so none of them was copied, and each is reported once, lost.
     */
    @Test
    void copiesOfADeviceThatStoppedAnsweringWaitUntilItIsResetThenGoToTheCpu() throws Exception {
        Path deviceSocket = dir.resolve("ioat.sock");
        Path proxySocket = dir.resolve("proxy.sock");
        IoatVfioUserDevice device = IoatVfioUserDevice.start(deviceSocket, 1, 20);
        try (FreezingProxy proxy = new FreezingProxy(proxySocket, deviceSocket); Arena arena = Arena.ofShared()) {
            DmaEngine engine = VfioUserEngine.open(proxySocket.toString(), 64, Duration.ofMillis(500));
            try {
                MemorySegment src = engine.iovaSpace().allocate(8L * BLOCK, 4096, arena);
                MemorySegment dst = engine.iovaSpace().allocate(8L * BLOCK, 4096, arena);
                src.fill((byte) 0x5a);
                long srcIova = engine.iovaSpace().map(src);
                long dstIova = engine.iovaSpace().map(dst);
                ConcurrentHashMap<Integer, Integer> status = new ConcurrentHashMap<>();
                AtomicInteger reports = new AtomicInteger();
                engine.onCompletion((ctx, st) -> {
                    status.merge((Integer) ctx, st, (a, b) -> -1);
                    reports.incrementAndGet();
                });
                DmaChannel ch = engine.channel(0);
                for (int i = 0; i < 4; i++) {
                    assertThat(ch.place(srcIova + (long) i * BLOCK, dstIova + (long) i * BLOCK, BLOCK, i)).isTrue();
                }
                proxy.freeze();
                ch.submit(); // the doorbell is held by the proxy: the device never sees it
                // a command that waits for its reply (DMA_MAP of new memory) gives up after 500 ms
                MemorySegment more = engine.iovaSpace().allocate(4096, 4096, arena);
                long moreIova = engine.iovaSpace().map(more);
                await("the channel detached after the timeout", () -> ch.freeSlots() == 0);
                long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(700);
                while (System.nanoTime() < until) { // an observation window: nothing may be reported in it
                    assertThat(reports.get()).as("copies held while the device process runs").isZero();
                    Thread.sleep(20);
                }
                proxy.drop(); // the device sees its client go (and resets); the reconnect goes through
                await("the held copies reported after the device answered again", () -> reports.get() == 4);
                assertThat(status.values()).containsOnly(DmaCompletionListener.STATUS_DEVICE_LOST);
                assertThat(dst.asSlice(0, 4L * BLOCK).mismatch(MemorySegment.ofArray(new byte[4 * BLOCK])))
                        .as("the device copied none of them").isEqualTo(-1);
                await("channel 0 back", () -> ch.freeSlots() > 0);
                assertThat(ch.place(srcIova, dstIova, BLOCK, 9)).isTrue();
                ch.submit();
                await("a copy after the return", () -> status.containsKey(9));
                assertThat(status.get(9)).isZero();
                engine.iovaSpace().unmap(moreIova);
            } finally {
                engine.close();
            }
        } finally {
            device.close();
        }
    }
}
