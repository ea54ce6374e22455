package io.pmemblk.pmem;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.posix.Mman;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/** Every native copy, set and flush goes through checked segments: wrong ranges and closed mappings are exceptions. */
class SafetyNetTest {
    static final int SIZE = 4 << 20;
    @TempDir
    Path dir;

    @EachMapper
    void outOfRangeCopiesZeroesAndFlushesAreIndexOutOfBounds(PmemRegion.Mapper mapper) throws IOException {
        EachMapper.Assume.available(mapper);
        try (PmemRegion r = PmemRegion.open(dir.resolve("r"), SIZE, false, mapper); Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(65536);
            assertThatThrownBy(() -> r.write(buf, 0, SIZE - 100, 4096)).isInstanceOf(IndexOutOfBoundsException.class);
            assertThatThrownBy(() -> r.write(buf, 65000, 0, 4096)).as("past the source").isInstanceOf(IndexOutOfBoundsException.class);
            assertThatThrownBy(() -> r.read(SIZE - 100, buf, 0, 8192)).isInstanceOf(IndexOutOfBoundsException.class);
            assertThatThrownBy(() -> r.read(0, buf, 60000, 8192)).as("past the destination").isInstanceOf(IndexOutOfBoundsException.class);
            assertThatThrownBy(() -> r.zero(SIZE, 1)).isInstanceOf(IndexOutOfBoundsException.class);
            assertThatThrownBy(() -> r.zero(-1, 10)).isInstanceOf(IndexOutOfBoundsException.class);
            assertThatThrownBy(() -> r.writeBack().deviceWrote(SIZE - 1, 2, true)).isInstanceOf(IndexOutOfBoundsException.class);
            assertThatThrownBy(() -> r.writeBack().persistRange(SIZE - 1, 2)).isInstanceOf(IndexOutOfBoundsException.class);
        }
    }

    @EachMapper
    void copiesIntoAClosedRegionAreIllegalStateNotACrash(PmemRegion.Mapper mapper) throws IOException {
        EachMapper.Assume.available(mapper);
        PmemRegion r = PmemRegion.open(dir.resolve("r"), SIZE, false, mapper);
        r.close();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(65536);
            assertThatThrownBy(() -> r.write(buf, 0, 0, 4096)).isInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> r.write(buf, 0, 0, 100)).isInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> r.read(0, buf, 0, 65536)).as("libc memcpy path").isInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> r.read(0, buf, 0, 100)).isInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> r.zero(0, 3 << 20)).isInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> r.writeBack().deviceWrote(0, 4096, true)).isInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> r.writeBack().persistRange(0, 4096)).isInstanceOf(IllegalStateException.class);
        }
    }

    /** Device.close after awaitIdle timed out: the region is gone under a request, which fails alone with EIO. */
    @EachMapper
    void aRequestAgainstAClosedRegionFailsWithEio(PmemRegion.Mapper mapper) throws Exception {
        EachMapper.Assume.available(mapper);
        PmemBlockDriver driver = new PmemBlockDriver(PmemRegion.open(dir.resolve("d"), SIZE, false, mapper), new CopyStats());
        try (BlockLayer layer = new BlockLayer(driver, 1, 8, 4 << 20, 1 << 20)) {
            HardwareQueue q = layer.queue(0);
            driver.region().close();
            for (Op op : new Op[]{Op.WRITE, Op.READ, Op.WRITE_ZEROES}) {
                Request r = q.acquire(op == Op.WRITE_ZEROES ? 0 : 65536);
                r.op = op;
                r.offset = 8192;
                r.length = 65536;
                r.fua = true;
                AtomicInteger status = new AtomicInteger(-1);
                r.completion = req -> status.set(req.status());
                q.dispatch(new Request[]{r}, 1);
                assertThat(status.get()).as("%s on a closed region", op).isEqualTo(Status.EIO);
                r.release();
            }
        } finally {
            driver.close();
        }
    }

    /**
     * Close while another thread keeps zeroing 8 MiB ranges (plain downcalls, each holding the mapping): either
     * close finds a call in flight and refuses to unmap (IOException; the region stays usable and closes once
     * the copies stop), or it unmaps between two calls and the next one is an IllegalStateException. Never a fault.
     */
    @EachMapper
    void closeDuringLongCopiesRefusesOrFailsTheNextCopyButNeverFaults(PmemRegion.Mapper mapper) throws Exception {
        EachMapper.Assume.available(mapper);
        int refused = 0;
        for (int attempt = 0; attempt < 5; attempt++) {
            PmemRegion r = PmemRegion.open(dir.resolve("z" + attempt), 8 << 20, false, mapper);
            CountDownLatch zeroing = new CountDownLatch(1);
            AtomicBoolean stop = new AtomicBoolean();
            AtomicReference<Throwable> end = new AtomicReference<>();
            Thread z = Thread.ofPlatform().start(() -> {
                try {
                    while (!stop.get()) {
                        r.zero(0, 8 << 20);
                        zeroing.countDown();
                    }
                } catch (Throwable t) {
                    end.set(t);
                }
            });
            assertThat(zeroing.await(30, TimeUnit.SECONDS)).isTrue();
            try {
                r.close();
                z.join(30_000);
                assertThat(end.get()).as("the copy after the unmap").isInstanceOf(IllegalStateException.class);
            } catch (IOException e) {
                refused++;
                assertThat(e).hasMessageContaining("was not unmapped: a copy into it is still running");
                assertThat(r.memory().scope().isAlive()).as("refused: still mapped").isTrue();
                stop.set(true);
                z.join(30_000);
                assertThat(end.get()).as("the copy in flight finished normally").isNull();
                r.close();
                assertThatThrownBy(() -> r.zero(0, 4096)).isInstanceOf(IllegalStateException.class);
            }
            assertThat(z.isAlive()).as("the zeroing thread ended").isFalse();
            r.close(); // idempotent
        }
        System.out.println(mapper + ": close refused while a copy ran in " + refused + " of 5 attempts");
    }

    @Test
    void libpmemCallsOfEveryLengthCheckTheirSegments() {
        Libpmem lib = Libpmem.load().orElse(null);
        assumeTrue(lib != null, "libpmem not installed");
        long n = 3 * Libpmem.CRITICAL_MAX + 5; // above the critical limit: the plain handles
        MemorySegment leaked;
        try (Arena a = Arena.ofShared()) {
            MemorySegment dst = a.allocate(n);
            MemorySegment src = a.allocate(n);
            for (long i = 0; i < n; i++) src.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 31));
            lib.memcpy(dst, src, Libpmem.PMEM_F_MEM_NODRAIN);
            lib.drain();
            assertThat(dst.mismatch(src)).isEqualTo(-1);
            lib.memset(dst.asSlice(7), 0x5a, Libpmem.PMEM_F_MEM_NODRAIN);
            lib.flush(dst);
            lib.drain();
            assertThat(dst.get(ValueLayout.JAVA_BYTE, 6)).isEqualTo((byte) (6 * 31));
            for (long i = 7; i < n; i += 4093) assertThat(dst.get(ValueLayout.JAVA_BYTE, i)).isEqualTo((byte) 0x5a);
            assertThat(dst.get(ValueLayout.JAVA_BYTE, n - 1)).isEqualTo((byte) 0x5a);
            assertThatThrownBy(() -> lib.memcpy(dst, src.asSlice(1), 0)).isInstanceOf(IllegalArgumentException.class);
            leaked = dst;
        }
        assertThatThrownBy(() -> lib.memset(leaked.asSlice(0, 100), 0, 0)).isInstanceOf(IllegalStateException.class);
        assertThatThrownBy(() -> lib.flush(leaked)).isInstanceOf(IllegalStateException.class);
    }

    @Test
    void libcMemcpyAndMemsetOfEveryLengthCheckTheirSegments() {
        long n = 2 * Mman.CRITICAL_MAX + 3;
        MemorySegment leaked;
        try (Arena a = Arena.ofShared()) {
            MemorySegment dst = a.allocate(n);
            MemorySegment src = a.allocate(n);
            for (long i = 0; i < n; i++) src.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 17));
            Mman.memcpy(dst, src);
            assertThat(dst.mismatch(src)).isEqualTo(-1);
            assertThatThrownBy(() -> Mman.memcpy(dst, src.asSlice(1))).isInstanceOf(IllegalArgumentException.class);
            Mman.memset(dst.asSlice(1), 7);
            Mman.memset(dst.asSlice(2, 10), 9);
            assertThat(dst.get(ValueLayout.JAVA_BYTE, 0)).isEqualTo(src.get(ValueLayout.JAVA_BYTE, 0));
            assertThat(dst.get(ValueLayout.JAVA_BYTE, 1)).isEqualTo((byte) 7);
            assertThat(dst.get(ValueLayout.JAVA_BYTE, 11)).isEqualTo((byte) 9);
            assertThat(dst.get(ValueLayout.JAVA_BYTE, 12)).isEqualTo((byte) 7);
            assertThat(dst.get(ValueLayout.JAVA_BYTE, n - 1)).isEqualTo((byte) 7);
            leaked = src;
        }
        try (Arena b = Arena.ofConfined()) {
            MemorySegment live = b.allocate(100);
            assertThatThrownBy(() -> Mman.memcpy(live, leaked.asSlice(0, 100))).isInstanceOf(IllegalStateException.class);
            assertThatThrownBy(() -> Mman.memset(leaked, 0)).isInstanceOf(IllegalStateException.class);
        }
    }
}
