package io.pmemblk.dma.edu;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.RingPlacement;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A {@link DmaChannel} over QEMU's edu device: each copy goes RAM -> edu buffer -> RAM in {@link EduSpec#CHUNK}
 * pieces, one transfer at a time, on the channel's worker thread. It is slow by design (QEMU finishes each transfer
 * about 100 ms after it starts): it proves the VFIO path end to end, it does not serve load.
 *
 * <p>Copies are kept in a preallocated ring (placing allocates nothing); one slot per copy whatever its length.
 * {@code head} (placed), {@code submitted} (doorbell) and {@code tail} (reported) are free-running counts. The
 * listener runs on the worker with no lock held, so it may place and submit.
 */
public final class EduChannel implements DmaChannel {
    /** Longest wait for one transfer; QEMU takes ~100 ms, a busy TCG guest a few times that. */
    private static final long TRANSFER_TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(5);

    private final int index;
    private final EduDevice device;
    private final int size;
    private final long[] src;
    private final long[] dst;
    private final long[] len;
    private final Object[] ctx;
    /** Per slot: how many placed copies it stands for (a merged run's, {@link RingPlacement}). */
    private final int[] copies;
    private final ReentrantLock submitLock = new ReentrantLock();
    private final RingPlacement placement = new RingPlacement(submitLock, new Slots());
    private volatile long head;
    private volatile long submitted;
    private volatile long tail;
    private volatile long bytes;
    private volatile boolean closed;
    private volatile boolean broken;
    private volatile DmaCompletionListener listener = (c, s) -> { };
    private final Thread worker;

    public EduChannel(int index, EduDevice device, int ringSize) {
        if (ringSize < 1) {
            throw new IllegalArgumentException("ring size " + ringSize + " must be at least 1");
        }
        this.index = index;
        this.device = device;
        this.size = ringSize;
        this.src = new long[ringSize];
        this.dst = new long[ringSize];
        this.len = new long[ringSize];
        this.ctx = new Object[ringSize];
        this.copies = new int[ringSize];
        this.worker = Thread.ofPlatform().daemon().name("edu-dma-ch" + index).start(this::run);
    }

    @Override
    public int index() {
        return index;
    }

    @Override
    public void listener(DmaCompletionListener listener) {
        this.listener = listener == null ? (c, s) -> { } : listener;
    }

    @Override
    public int freeSlots() {
        return (int) (size - (head - tail));
    }

    @Override
    public int slotsFor(long length) {
        return 1;
    }

    @Override
    public boolean place(long srcIova, long dstIova, long length, Object c) {
        return placement.place(srcIova, dstIova, length, c);
    }

    @Override
    public boolean placeAll(Copies copies, Object c) {
        return placement.placeAll(copies, c);
    }

    /** The ring as {@link RingPlacement} fills it: one slot per copy, all {@code size} of them usable. */
    private final class Slots implements RingPlacement.Ring {
        @Override
        public void checkOpen() {
            EduChannel.this.checkOpen();
        }

        @Override
        public long room() {
            return size - (head - tail);
        }

        @Override
        public int slotsFor(long length) {
            return 1;
        }

        /** A slot takes a copy of any length, moved chunk by chunk: runs are bounded only by their copies. */
        @Override
        public long mergeLimit() {
            return Long.MAX_VALUE;
        }

        @Override
        public void put(long srcIova, long dstIova, long length, Object ctx, int copies) {
            EduChannel.this.put(srcIova, dstIova, length, ctx, copies);
        }
    }

    private void checkOpen() {
        if (closed || broken) {
            throw new IllegalStateException("edu DMA channel " + index + (closed ? " is closed" : " is broken: a transfer did not finish"));
        }
    }

    private void put(long s, long d, long l, Object c, int n) {
        int slot = (int) (head % size);
        src[slot] = s;
        dst[slot] = d;
        len[slot] = l;
        ctx[slot] = c;
        copies[slot] = n;
        head = head + 1;
    }

    @Override
    public void submit() {
        submitLock.lock();
        try {
            submitted = head;
        } finally {
            submitLock.unlock();
        }
        LockSupport.unpark(worker);
    }

    /** Completions are reported by the worker as the device finishes; nothing to reap here. */
    @Override
    public int poll() {
        return 0;
    }

    /** Bytes this channel copied. */
    public long bytesCopied() {
        return bytes;
    }

    public EduDevice device() {
        return device;
    }

    private void run() {
        while (!closed || tail != submitted) {
            if (tail == submitted) {
                LockSupport.parkNanos(this, TimeUnit.MILLISECONDS.toNanos(200)); // unparked by submit and close
                continue;
            }
            int slot = (int) (tail % size);
            Object c = ctx[slot];
            int n = copies[slot];
            int status = broken ? DmaCompletionListener.STATUS_ABORTED : copy(src[slot], dst[slot], len[slot]);
            ctx[slot] = null;
            tail = tail + 1; // frees the slot: a placer may fill it again from here
            if (c != null) {
                listener.completed(c, status, n);
            }
        }
    }

    /** One copy through the device buffer; 0 when done, STATUS_ABORTED when a transfer did not finish. */
    private int copy(long s, long d, long l) {
        try {
            for (long off = 0; off < l; off += EduSpec.CHUNK) {
                long n = Math.min(EduSpec.CHUNK, l - off);
                if (!device.transfer(s + off, n, false, TRANSFER_TIMEOUT_NANOS)
                        || !device.transfer(d + off, n, true, TRANSFER_TIMEOUT_NANOS)) {
                    // The engine may still be running: no further transfer may be started on it.
                    broken = true;
                    return DmaCompletionListener.STATUS_ABORTED;
                }
            }
            bytes += l;
            return 0;
        } catch (InterruptedException e) {
            broken = true;
            return DmaCompletionListener.STATUS_ABORTED;
        }
    }

    /**
     * Lets submitted copies finish (bounded: about a second per 4 KiB), reports copies placed but never submitted
     * as closed, and stops the worker. Idempotent.
     */
    @Override
    public void close() {
        submitLock.lock();
        try {
            if (closed) {
                return;
            }
            closed = true;
        } finally {
            submitLock.unlock();
        }
        LockSupport.unpark(worker);
        try {
            worker.join(TimeUnit.SECONDS.toMillis(60));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (worker.isAlive()) {
            broken = true; // the remaining copies are reported aborted by the worker when it gets there
            return;
        }
        for (long i = tail; i < head; i++) {
            int slot = (int) (i % size);
            Object c = ctx[slot];
            ctx[slot] = null;
            if (c != null) {
                listener.completed(c, DmaCompletionListener.STATUS_CLOSED, copies[slot]);
            }
        }
        tail = head;
    }
}
