package io.pmemblk.vhost.virtq;

import io.pmemblk.queueing.Request;
import io.pmemblk.vhost.memory.ScatterSink;
import io.pmemblk.vhost.spec.Le;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * One popped descriptor chain, its buffers resolved to pieces of guest memory (a buffer split where it crosses
 * from one region into the next, buffers that follow one another in a region's memory joined): pieces {@code [0, readable())} are device-readable, {@code [readable(), count())}
 * device-writable (a readable buffer after a writable one is refused when popped). A queue thread's scratch, reused
 * for every pop: nothing in it is valid after the next one. A chain with more pieces than fit is still popped, with
 * {@link #overflowed()} set and its byte counts whole, so the caller can answer it with an error.
 */
public final class Chain implements ScatterSink {
    private final MemorySegment[] mapping;
    private final long[] offset;
    private final long[] length;
    private final long[] iova;
    private int head;
    private int count;
    private int readable;
    private boolean writing;
    private boolean overflowed;
    private long readableBytes;
    private long writableBytes;
    /** The chain's last device-writable byte (virtio-blk's status), kept even when the pieces overflowed. */
    private MemorySegment lastWritableMapping;
    private long lastWritableOffset;

    /** @param capacity the most pieces a chain may have and still be served */
    public Chain(int capacity) {
        this.mapping = new MemorySegment[capacity];
        this.offset = new long[capacity];
        this.length = new long[capacity];
        this.iova = new long[capacity];
    }

    void reset(int head) {
        this.head = head;
        count = 0;
        readable = 0;
        writing = false;
        overflowed = false;
        readableBytes = 0;
        writableBytes = 0;
        lastWritableMapping = null;
    }

    /** From now on the buffers are device-writable. */
    void startWritable() {
        writing = true;
        readable = count;
    }

    boolean writing() {
        return writing;
    }

    void finish() {
        if (!writing) {
            readable = count;
        }
    }

    @Override
    public void piece(MemorySegment mapping, long offset, long length, long iova) {
        if (writing) {
            writableBytes += length;
            lastWritableMapping = mapping;
            lastWritableOffset = offset + length - 1;
        } else {
            readableBytes += length;
        }
        int n = count;
        if (n > (writing ? readable : 0) && continues(n - 1, mapping, offset, iova)) {
            this.length[n - 1] += length; // the buffer before ended where this one starts: one piece
            return;
        }
        if (n == this.mapping.length) {
            overflowed = true;
            return;
        }
        this.mapping[n] = mapping;
        this.offset[n] = offset;
        this.length[n] = length;
        this.iova[n] = iova;
        count = n + 1;
    }

    /**
     * Whether a piece at {@code offset} of {@code mapping} starts where piece {@code i} ends, at the engine address
     * that follows too. A guest's descriptors for one request often lie back to back (the pages of a large buffer,
     * an I/O's segments): as one piece the block layer and the DMA engine see one iov, not one per descriptor.
     */
    private boolean continues(int i, MemorySegment mapping, long offset, long iova) {
        long end = this.offset[i] + this.length[i];
        return this.mapping[i] == mapping && end == offset
                && (iova == Request.NO_IOVA ? this.iova[i] == Request.NO_IOVA : this.iova[i] + this.length[i] == iova);
    }

    public int head() {
        return head;
    }

    public int count() {
        return count;
    }

    public int readable() {
        return readable;
    }

    public boolean overflowed() {
        return overflowed;
    }

    public long readableBytes() {
        return readableBytes;
    }

    public long writableBytes() {
        return writableBytes;
    }

    /** The mapping holding the chain's last device-writable byte, or null when no buffer is device-writable. */
    public MemorySegment lastWritableMapping() {
        return lastWritableMapping;
    }

    /** That byte's offset in {@link #lastWritableMapping()}. */
    public long lastWritableOffset() {
        return lastWritableOffset;
    }

    /** Piece i: its region's mapping, the piece's offset there, its length and engine address (or NO_IOVA). */
    public MemorySegment mapping(int i) {
        return mapping[i];
    }

    public long offset(int i) {
        return offset[i];
    }

    public long length(int i) {
        return length[i];
    }

    public long iova(int i) {
        return iova[i];
    }

    /**
     * The little-endian value of {@code bytes} (1..8) device-readable bytes from byte {@code at} of the readable
     * part, across pieces; the caller has checked they exist. A guest may split a 16-byte header anywhere.
     */
    public long readLE(long at, int bytes) {
        if (readable > 0 && at + bytes <= length[0]) { // the usual case: the header is one buffer of its own
            MemorySegment m = mapping[0];
            long p = offset[0] + at;
            return switch (bytes) {
                case 8 -> m.get(Le.U64_UNALIGNED, p);
                case 4 -> Integer.toUnsignedLong(m.get(Le.U32_UNALIGNED, p));
                default -> slowLE(at, bytes);
            };
        }
        return slowLE(at, bytes);
    }

    private long slowLE(long at, int bytes) {
        long v = 0;
        int got = 0;
        for (int i = 0; i < readable && got < bytes; i++) {
            long len = length[i];
            if (at >= len) {
                at -= len;
                continue;
            }
            for (long p = offset[i] + at, end = offset[i] + len; p < end && got < bytes; p++, got++) {
                v |= (mapping[i].get(ValueLayout.JAVA_BYTE, p) & 0xffL) << (8 * got);
            }
            at = 0;
        }
        return v;
    }

    /**
     * Writes {@code src} into the device-writable part from its byte 0, across pieces, at most {@code max} bytes;
     * returns how many were written.
     */
    public long writeFrom(MemorySegment src, long max) {
        long want = Math.min(src.byteSize(), max);
        long done = 0;
        for (int i = readable; i < count && done < want; i++) {
            long take = Math.min(length[i], want - done);
            MemorySegment.copy(src, done, mapping[i], offset[i], take);
            done += take;
        }
        return done;
    }
}
