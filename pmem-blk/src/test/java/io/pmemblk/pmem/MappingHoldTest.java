package io.pmemblk.pmem;

import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.pmem.btt.LaneHandle;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * {@link MappingHold}: a BTT group copies and writes back through a view the linker does not keep alive, so the
 * region's close must wait for the hold and refuse to unmap under it; after the close a group fails, it does not
 * store into unmapped memory (which would kill the JVM).
 */
class MappingHoldTest {
    private static final long SIZE = 32L << 20;

    @TempDir
    Path dir;

    @Test
    void theRegionIsNotUnmappedWhileHeldAndAClosedOneIsNotEnteredAgain() throws Exception {
        PmemRegion region = PmemRegion.open(dir.resolve("p.img"), SIZE, false, PmemRegion.Mapper.AUTO);
        MappingHold hold = region.hold();
        MemorySegment view = hold.enter(3);
        assertThat(view.address()).isEqualTo(region.memory().address());
        assertThat(view.byteSize()).isEqualTo(region.size());
        assertThatThrownBy(region::close).isInstanceOf(IOException.class)
                .hasMessageContaining("still holds the mapping");
        view.set(java.lang.foreign.ValueLayout.JAVA_LONG, 4096, 42); // still mapped: no fault
        assertThat(region.memory().get(java.lang.foreign.ValueLayout.JAVA_LONG, 4096)).isEqualTo(42);
        hold.exit(3);

        region.close();
        assertThat(region.memory().scope().isAlive()).as("unmapped once nothing held it").isFalse();
        assertThatThrownBy(() -> hold.enter(3)).isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("closed");
        assertThatThrownBy(() -> hold.enter(4)).isInstanceOf(IllegalStateException.class);
    }

    @Test
    void aCloseWaitsForAHoldToEnd() throws Exception {
        PmemRegion region = PmemRegion.open(dir.resolve("p.img"), SIZE, false, PmemRegion.Mapper.AUTO);
        MappingHold hold = region.hold();
        hold.enter(0);
        CompletableFuture<Void> closed = CompletableFuture.runAsync(() -> {
            try {
                region.close();
            } catch (IOException e) {
                throw new RuntimeException(e);
            }
        });
        // The closer is refusing new holds and waiting for this one: a new enter fails from the moment it starts.
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (true) {
            try {
                hold.enter(1);
                hold.exit(1);
            } catch (IllegalStateException e) {
                break;
            }
            assertThat(System.nanoTime()).as("the close never began refusing holds").isLessThan(deadline);
            Thread.onSpinWait();
        }
        assertThat(closed).as("closed while a hold is on").isNotDone();
        hold.exit(0);
        closed.get(5, TimeUnit.SECONDS);
        assertThat(region.memory().scope().isAlive()).isFalse();
    }

    /** A group whose region was closed under it: every block fails with why, and the JVM is still here. */
    @Test
    void aGroupOnAClosedRegionFailsItsBlocksInsteadOfStoringIntoUnmappedMemory() throws Exception {
        PmemRegion region = PmemRegion.open(dir.resolve("p.img"), SIZE, false, PmemRegion.Mapper.AUTO);
        BttRegion.format(region, 4096);
        Btt btt = BttRegion.open(region, 1, 4096);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment buf = arena.allocate(4096, 4096);
            buf.fill((byte) 7);
            try (LaneHandle lane = btt.claim(0)) {
                Btt.Group g = lane.group();
                int a = g.add(1, 0), b = g.add(2, 1);
                g.source(a, buf, 0);
                g.source(b, buf, 0);
                region.close();
                g.commit();
                assertThat(g.failure(a)).isInstanceOf(IllegalStateException.class).hasMessageContaining("closed");
                assertThat(g.failure(b)).isInstanceOf(IllegalStateException.class);
            }
        }
    }
}
