package io.pmemblk.queueing;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Caller-memory requests ({@link FrontendQueue#acquireIov}, {@link Request#addIov}) on the seam: no pool chunks,
 * the pieces bounded by {@link HardwareQueue#MAX_IOVS} and by the length, gone from the tag at release; and the
 * in-memory driver other modules' tests drive copies them.
 */
@Timeout(60)
class CallerMemoryRequestsTest {
    static final int DEPTH = 2;

    final MemoryBlockDriver driver = new MemoryBlockDriver(4L << 20);
    final BlockLayer layer = new BlockLayer(driver, 1, DEPTH, 4L * BufferPool.CHUNK, BufferPool.CHUNK);
    final FrontendQueue frontend = new FrontendQueue(layer.queue(0));
    final Arena arena = Arena.ofShared();
    final MemorySegment guest = arena.allocate(1 << 20, 4096);

    @AfterEach
    void close() {
        layer.close();
        driver.close();
        arena.close();
    }

    @Test
    void aCallerMemoryRequestTakesATagAndNoChunks() throws Exception {
        int free = layer.queue(0).pool().freeChunks();
        Request r = frontend.acquireIov(Op.WRITE, 4096, 3 * BufferPool.CHUNK / 4);
        assertEquals(0, r.segments(), "no pool chunks");
        assertEquals(free, layer.queue(0).pool().freeChunks());
        assertTrue(r.callerMemory());
        assertEquals(Op.WRITE, r.op);
        assertEquals(4096, r.offset);
        assertEquals(1, layer.queue(0).inflight());
        r.release();
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> frontend.acquireIov(Op.FLUSH, 0, 0));
        assertTrue(e.getMessage().contains("allowed READ or WRITE"), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> frontend.acquireIov(Op.READ, 0, BufferPool.CHUNK + 1));
        assertEquals(0, layer.queue(0).inflight(), "a refused acquire takes nothing");
    }

    @Test
    void atMostMaxIovsPiecesAndNothingPastTheLength() throws Exception {
        Request r = frontend.acquireIov(Op.WRITE, 0, HardwareQueue.MAX_IOVS + 10);
        for (int i = 0; i < HardwareQueue.MAX_IOVS; i++) {
            r.addIov(guest.asSlice(i * 2L, 1), Request.NO_IOVA);
        }
        IllegalStateException full = assertThrows(IllegalStateException.class,
                () -> r.addIov(guest.asSlice(4096, 1), 0x1000));
        assertTrue(full.getMessage().contains("HardwareQueue.MAX_IOVS (256)"), full.getMessage());
        assertEquals(HardwareQueue.MAX_IOVS, r.iovCount(), "the refused piece was not added");
        assertEquals(HardwareQueue.MAX_IOVS, r.iovBytes());
        r.release();

        Request s = frontend.acquireIov(Op.READ, 0, 100);
        s.addIov(guest.asSlice(0, 60), 0x10_0000);
        IllegalArgumentException past = assertThrows(IllegalArgumentException.class,
                () -> s.addIov(guest.asSlice(100, 41), 0x10_0100));
        assertTrue(past.getMessage().contains("allowed: 1..40 bytes"), past.getMessage());
        assertThrows(IllegalArgumentException.class, () -> s.addIov(guest.asSlice(100, 0), 0x10_0100));
        assertThrows(IllegalArgumentException.class, () -> s.addIov(guest.asSlice(100, 40), -7));
        long size = guest.byteSize();
        IllegalArgumentException outside = assertThrows(IllegalArgumentException.class,
                () -> s.addIov(guest, size - 20, 40, 0x10_0100));
        assertTrue(outside.getMessage().contains("allowed: inside the mapping"), outside.getMessage());
        assertThrows(IllegalArgumentException.class, () -> s.addIov(guest, -1, 40, 0x10_0100));
        assertEquals(1, s.iovCount());
        assertTrue(s.iovsReachable());
        s.addIov(guest.asSlice(200, 40), Request.NO_IOVA);
        assertFalse(s.iovsReachable(), "one piece without an iova");
        assertEquals(60, s.iovOffset(1));
        assertEquals("Request[q0 tag " + s.tag() + " READ off 0 len 100 iovs 2 [60@0x100000, 40@no-iova]]", s.toString());
        s.release();

        Request pooled = frontend.acquire(BufferPool.CHUNK);
        assertThrows(IllegalStateException.class, () -> pooled.addIov(guest.asSlice(0, 1), 0x1000),
                "a pool-buffer request takes no pieces");
        pooled.release();
    }

    @Test
    void theTagHoldsNoPieceAfterItsRelease() throws Exception {
        Request r = frontend.acquireIov(Op.WRITE, 0, 300);
        for (int i = 0; i < 6; i++) {
            r.addIov(guest.asSlice(i * 1000L, 50), 0x20_0000 + i * 1000L);
        }
        assertTrue(r.toString().endsWith("iovs 6 [50@0x200000, 50@0x2003e8, 50@0x2007d0, 50@0x200bb8, +2 more]]"),
                r.toString());
        r.release();
        // Both tags taken: one of them is r's, acquired again.
        Request a = frontend.acquire(0);
        Request b = frontend.acquireIov(Op.READ, 0, 10);
        Request again = a == r ? a : b;
        assertSame(r, again, "a depth of 2 hands r's tag out again");
        assertEquals(0, again.iovCount());
        assertEquals(0, again.iovBytes());
        assertTrue(again.iovsReachable());
        assertEquals(again == b, again.callerMemory());
        a.release();
        b.release();
    }

    @Test
    void theMemoryDriverCopiesBetweenThePiecesAndTheDevice() throws Exception {
        byte[] data = new byte[5000];
        new Random(3).nextBytes(data);
        MemorySegment.copy(data, 0, guest, ValueLayout.JAVA_BYTE, 0, data.length);
        Request w = frontend.acquireIov(Op.WRITE, 8192, data.length);
        w.addIov(guest.asSlice(0, 1), Request.NO_IOVA);
        w.addIov(guest.asSlice(1, 3000), Request.NO_IOVA);
        w.addIov(guest.asSlice(3001, 1999), Request.NO_IOVA);
        assertEquals(Status.OK, run(w));
        assertArrayEquals(data, driver.memory.asSlice(8192, data.length).toArray(ValueLayout.JAVA_BYTE));

        Request rd = frontend.acquireIov(Op.READ, 8192, data.length);
        rd.addIov(guest.asSlice(100_000, 2500), Request.NO_IOVA);
        rd.addIov(guest.asSlice(200_000, 2500), Request.NO_IOVA);
        assertEquals(Status.OK, run(rd));
        byte[] got = new byte[data.length];
        MemorySegment.copy(guest, ValueLayout.JAVA_BYTE, 100_000, got, 0, 2500);
        MemorySegment.copy(guest, ValueLayout.JAVA_BYTE, 200_000, got, 2500, 2500);
        assertArrayEquals(data, got);

        Request shortOne = frontend.acquireIov(Op.WRITE, 0, 100);
        shortOne.addIov(guest.asSlice(0, 99), Request.NO_IOVA);
        assertEquals(Status.EINVAL, run(shortOne), "pieces short of the length");
    }

    /** Dispatches r through the seam and releases it; returns its status (the memory driver completes inline). */
    private int run(Request r) {
        int[] status = {-1};
        r.completion = q -> status[0] = q.status();
        frontend.add(r);
        frontend.dispatch();
        r.release();
        return status[0];
    }
}
