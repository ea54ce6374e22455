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
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
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
                AtomicInteger reports = new AtomicInteger();
                engine.onCompletion((ctx, st) -> {
                    status.merge((Integer) ctx, st, (a, b) -> -1); // a second report of one ctx marks it -1
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
                assertThat(status.values()).as("each reported once, done or lost")
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
}
