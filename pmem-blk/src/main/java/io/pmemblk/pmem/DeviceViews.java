package io.pmemblk.pmem;

import io.pmemblk.queueing.Request;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;

/**
 * NIO views of the mapping for a frontend that receives or sends a request's data itself (the kernel copies
 * between its socket or ublk and the mapping). A ByteBuffer holds at most 2 GiB, so the views are made per window
 * of {@code 1 << windowShift} bytes, cached per request, and a request gets one or two of them. The views are
 * slices of the region's mapping and own nothing.
 */
final class DeviceViews {
    /** 1 GiB windows: far above any request, far below a ByteBuffer's limit. */
    static final int WINDOW_SHIFT = 30;

    private final MemorySegment memory;
    private final int windowShift;

    /**
     * Views of {@code memory} in windows of {@code 1 << windowShift} bytes (at most 1 GiB). A request may cross one
     * window boundary, not two: {@link #WINDOW_SHIFT}'s windows are far above any request; smaller ones let a test
     * cross a boundary with a small request.
     */
    DeviceViews(MemorySegment memory, int windowShift) {
        if (windowShift < 12 || windowShift > WINDOW_SHIFT) {
            throw new IllegalArgumentException("window shift " + windowShift + "; allowed: 12 (4 KiB windows) to "
                    + WINDOW_SHIFT + " (1 GiB)");
        }
        this.memory = memory;
        this.windowShift = windowShift;
    }

    /**
     * Points {@code r}'s data at [offset, offset+length) of the mapping ({@link Request#dataFromDevice}), for a
     * frontend that sends it itself. {@code windows} is the caller's per-request cache of NIO views, one per
     * window, made on first use ({@link #newWindowCache()}): in steady state nothing is allocated.
     */
    void point(Request r, ByteBuffer[] windows, long offset, int length) {
        int w = (int) (offset >>> windowShift);
        long inWindow = offset - ((long) w << windowShift);
        ByteBuffer a = window(windows, w);
        int first = (int) Math.min(length, a.capacity() - inWindow);
        a.limit((int) inWindow + first).position((int) inWindow);
        ByteBuffer b = null;
        if (first < length) { // crosses into the next window (at most one: requests are far below a window)
            b = window(windows, w + 1);
            b.limit(length - first).position(0);
        }
        r.dataFromDevice(a, b);
    }

    /** An empty per-request cache of window views for {@link #point}. */
    ByteBuffer[] newWindowCache() {
        return new ByteBuffer[(int) ((memory.byteSize() + (1L << windowShift) - 1) >>> windowShift)];
    }

    private ByteBuffer window(ByteBuffer[] windows, int w) {
        ByteBuffer b = windows[w];
        if (b == null) {
            long start = (long) w << windowShift;
            b = memory.asSlice(start, Math.min(1L << windowShift, memory.byteSize() - start)).asByteBuffer();
            windows[w] = b;
        }
        return b;
    }
}
