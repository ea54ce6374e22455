package io.pmemblk.dma;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

class IovaSpaceTest {
    /** A fresh space per test, and the native memory its tests map (shared: one test maps from several threads). */
    final IovaSpace space = new IovaSpace();
    final Arena arena = Arena.ofShared();

    @AfterEach
    void freeMemory() {
        arena.close();
    }

    @Test
    void mapsPageAlignedNonOverlappingWithGuardGaps() {
        long a = space.map(arena.allocate(100));
        long b = space.map(arena.allocate(8192));
        long c = space.map(arena.allocate(1));
        assertThat(a).isNotZero().isEqualTo(IovaSpace.DEFAULT_BASE);
        assertThat(a % IovaSpace.PAGE).isZero();
        assertThat(b % IovaSpace.PAGE).isZero();
        assertThat(b).isGreaterThanOrEqualTo(a + IovaSpace.PAGE + IovaSpace.GUARD);
        assertThat(c).isGreaterThanOrEqualTo(b + 8192 + IovaSpace.GUARD);
        // The guard gap after a region faults.
        assertThatThrownBy(() -> space.translate(a + IovaSpace.PAGE, 1)).isInstanceOf(IovaFault.class);
    }

    /**
     * A vfio-user device's view of its client's DMA_MAP regions: placed at the client's IOVAs (0 included, out of
     * order, touching), overlaps refused, map() refused. Seen failing with the check against the region before
     * taken out: "Expecting code to raise a throwable" (the overlap from below was taken).
     */
    @Test
    void aSpacePlacedByTheCallerKeepsTheClientsAddressesAndRefusesOverlaps() {
        IovaSpace client = IovaSpace.placedByCaller();
        MemorySegment low = arena.allocate(0xa0000);
        MemorySegment high = arena.allocate(0x10000);
        MemorySegment mid = arena.allocate(0x20000);
        client.mapAt(0x100000, high);
        client.mapAt(0, low);
        client.mapAt(0xc0000, mid); // ends at 0xe0000
        client.mapAt(0xe0000, arena.allocate(0x20000)); // touches both neighbours
        assertThat(client.regions()).isEqualTo(4);
        low.set(ValueLayout.JAVA_BYTE, 0x9ffff, (byte) 7);
        assertThat(client.translate(0x9ffff, 1).get(ValueLayout.JAVA_BYTE, 0)).isEqualTo((byte) 7);
        assertThat(client.translate(0x100000, 0x10000).address()).isEqualTo(high.address());
        assertThatThrownBy(() -> client.translate(0xa0000, 1)).as("the hole between regions").isInstanceOf(IovaFault.class);
        assertThatThrownBy(() -> client.translate(0xdffff, 2)).as("across two regions").isInstanceOf(IovaFault.class);
        assertThatThrownBy(() -> client.mapAt(0x9f000, arena.allocate(0x2000))).as("overlapping from below")
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("overlaps the mapped region [0x0, 0xa0000)");
        assertThatThrownBy(() -> client.mapAt(0xbf000, arena.allocate(0x2000))).as("overlapping the next region")
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("[0xc0000, 0xe0000)");
        assertThatThrownBy(() -> client.mapAt(0x100000, arena.allocate(1))).as("the same start")
                .isInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> client.mapAt(Long.MAX_VALUE - 10, arena.allocate(100))).as("wrapping")
                .isInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> client.map(arena.allocate(1))).isInstanceOf(IllegalStateException.class);
        assertThatThrownBy(() -> space.mapAt(0x100000, arena.allocate(1))).as("a space that hands out its own")
                .isInstanceOf(IllegalStateException.class);
        client.unmap(0);
        assertThatThrownBy(() -> client.translate(0, 1)).isInstanceOf(IovaFault.class);
        assertThat(client.regions()).isEqualTo(3);
    }

    @Test
    void translateReturnsTheSliceOfTheRegisteredSegment() {
        MemorySegment seg = arena.allocate(4096);
        seg.set(ValueLayout.JAVA_BYTE, 1000, (byte) 42);
        long iova = space.map(seg);
        MemorySegment s = space.translate(iova + 1000, 10);
        assertThat(s.byteSize()).isEqualTo(10);
        assertThat(s.address()).isEqualTo(seg.address() + 1000);
        assertThat(s.get(ValueLayout.JAVA_BYTE, 0)).isEqualTo((byte) 42);
        assertThat(space.translate(iova, 4096).byteSize()).isEqualTo(4096);
        assertThat(space.translate(iova + 4096, 0).byteSize()).isZero();
    }

    @Test
    void outOfRangeFaultsWithIovaAndLength() {
        long iova = space.map(arena.allocate(4096));
        assertThatThrownBy(() -> space.translate(iova + 4000, 97))
                .isInstanceOfSatisfying(IovaFault.class, f -> {
                    assertThat(f.iova()).isEqualTo(iova + 4000);
                    assertThat(f.length()).isEqualTo(97);
                });
        assertThatThrownBy(() -> space.translate(0, 8)).isInstanceOf(IovaFault.class);
        assertThatThrownBy(() -> space.translate(iova - 1, 2)).isInstanceOf(IovaFault.class);
        assertThatThrownBy(() -> space.translate(-64, 8)).isInstanceOf(IovaFault.class);
        assertThatThrownBy(() -> space.translate(iova, Long.MAX_VALUE)).isInstanceOf(IovaFault.class);
        assertThatThrownBy(() -> space.translate(iova, -1)).isInstanceOf(IovaFault.class);
    }

    @Test
    void unmapMakesTheRegionFaultAndKeepsOthers() {
        long a = space.map(arena.allocate(4096));
        long b = space.map(arena.allocate(4096));
        long c = space.map(arena.allocate(4096));
        space.unmap(b);
        assertThatThrownBy(() -> space.translate(b, 1)).isInstanceOf(IovaFault.class);
        assertThat(space.translate(a, 4096).byteSize()).isEqualTo(4096);
        assertThat(space.translate(c, 4096).byteSize()).isEqualTo(4096);
        assertThat(space.regions()).isEqualTo(2);
        assertThatThrownBy(() -> space.unmap(b)).isInstanceOf(IllegalArgumentException.class);
        long d = space.map(arena.allocate(4096));
        assertThat(d).isNotEqualTo(b).isGreaterThan(c);
    }

    @Test
    void rejectsHeapAndEmptySegments() {
        assertThatThrownBy(() -> space.map(MemorySegment.ofArray(new byte[16]))).isInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> space.map(arena.allocate(0))).isInstanceOf(IllegalArgumentException.class);
    }

    @Test
    void concurrentMapUnmapWhileTranslating() throws Exception {
        MemorySegment stable = arena.allocate(65536);
        stable.set(ValueLayout.JAVA_LONG, 512, 0x1234_5678_9abcL);
        long stableIova = space.map(stable);
        AtomicBoolean stop = new AtomicBoolean();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        CountDownLatch done = new CountDownLatch(3);
        List<Thread> threads = new ArrayList<>();
        for (int r = 0; r < 2; r++) {
            threads.add(Thread.ofPlatform().start(() -> {
                try {
                    while (!stop.get()) {
                        MemorySegment s = space.translate(stableIova + 512, 8);
                        if (s.get(ValueLayout.JAVA_LONG, 0) != 0x1234_5678_9abcL) {
                            throw new AssertionError("translated to the wrong memory");
                        }
                    }
                } catch (Throwable t) {
                    failure.compareAndSet(null, t);
                } finally {
                    done.countDown();
                }
            }));
        }
        threads.add(Thread.ofPlatform().start(() -> {
            try {
                for (int i = 0; i < 2000; i++) {
                    MemorySegment seg = arena.allocate(4096);
                    long iova = space.map(seg);
                    if (space.translate(iova + 10, 20).address() != seg.address() + 10) {
                        throw new AssertionError("fresh mapping translated wrong");
                    }
                    space.unmap(iova);
                    try {
                        space.translate(iova, 1);
                        throw new AssertionError("unmapped IOVA still translates");
                    } catch (IovaFault expected) {
                        // the point
                    }
                }
            } catch (Throwable t) {
                failure.compareAndSet(null, t);
            } finally {
                stop.set(true);
                done.countDown();
            }
        }));
        assertThat(done.await(30, TimeUnit.SECONDS)).as("map/translate threads finished").isTrue();
        assertThat(failure.get()).isNull();
        assertThat(space.regions()).isEqualTo(1);
    }
}
