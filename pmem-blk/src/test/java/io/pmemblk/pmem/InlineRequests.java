package io.pmemblk.pmem;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;

import java.nio.ByteBuffer;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * One request through a driver with no DMA engine, which completes it inline on the CPU route: the tests that
 * put single requests against a damaged mapping (a truncated file, known bad blocks) share this.
 * {@code sink}: a READ sent from the mapping (its data read back from the device views); {@code out}: where a
 * READ's data goes (null: not copied). Returns the request's status.
 */
public final class InlineRequests {
    private InlineRequests() {
    }

    /** Puts {@code data} into r's pool buffers, in order (a WRITE's payload). */
    static void fill(Request r, byte[] data) {
        int pos = 0;
        for (ByteBuffer b : r.buffers()) {
            if (b == null || pos == data.length) break;
            int k = Math.min(b.remaining(), data.length - pos);
            b.put(data, pos, k);
            pos += k;
        }
    }

    /** The first {@code length} bytes of r's pool buffers (a READ's data), leaving the buffers as they are. */
    static byte[] gather(Request r, int length) {
        byte[] out = new byte[length];
        int pos = 0;
        for (ByteBuffer b : r.buffers()) {
            if (b == null || pos == length) break;
            int k = Math.min(b.remaining(), length - pos);
            b.duplicate().get(out, pos, k);
            pos += k;
        }
        return out;
    }

    /**
     * A request from {@code q} for {@code op} on [off, off + len), its completion not set yet; a WRITE's pool
     * buffers filled with {@code fill}. {@code sink}: a READ sent from the mapping, given no pool buffers.
     */
    public static Request acquire(HardwareQueue q, Op op, long off, int len, byte fill, boolean sink)
            throws InterruptedException {
        Request r = q.acquire(op.carriesData() && !sink ? len : 0);
        r.op = op;
        r.offset = off;
        r.length = len;
        r.sinkReadsDevice = sink;
        if (op == Op.WRITE) {
            for (ByteBuffer b : r.buffers()) {
                if (b == null) break;
                while (b.hasRemaining()) b.put(fill);
            }
        }
        return r;
    }

    static int run(HardwareQueue q, Op op, long off, int len, byte fill, boolean sink, byte[] out)
            throws InterruptedException {
        Request r = acquire(q, op, off, len, fill, sink);
        AtomicInteger done = new AtomicInteger(-1);
        r.completion = req -> done.set(req.status());
        q.dispatch(new Request[]{r}, 1);
        assertThat(done.get()).as("CPU route completes inline").isGreaterThanOrEqualTo(0);
        if (op == Op.READ && done.get() == 0 && out != null) {
            int pos = 0;
            for (int s = 0, n = sink ? r.dataBufferCount() : r.segments(); s < n; s++) {
                ByteBuffer b = sink ? r.dataBuffers()[s] : r.buffers()[s];
                int k = sink ? b.remaining() : r.segmentLength(s);
                b.get(out, pos, k);
                pos += k;
            }
        }
        r.release();
        return done.get();
    }
}
