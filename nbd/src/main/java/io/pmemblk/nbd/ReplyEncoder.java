package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;

import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import java.nio.ByteBuffer;

/**
 * Turns completed requests into the bytes of their NBD replies, as one iovec array for one gathering write:
 * runs of reply headers as views of one reusable direct buffer, each READ's data as the request's own buffers
 * (or the device views the driver put there), never copied. No socket here: {@link ReplySender} writes what
 * this builds. Formats: NetworkBlockDevice/nbd {@code doc/proto.md}, "Simple reply message" and "Structured
 * reply chunk message" (NBD_REPLY_TYPE_OFFSET_DATA, NBD_REPLY_TYPE_BLOCK_STATUS, NBD_REPLY_TYPE_ERROR).
 *
 * <p>Everything is allocated once per connection; encoding allocates nothing. One thread at a time (the
 * sender's lock), except {@link #remember}, which the reader calls for a tag no reply is being encoded for.
 */
final class ReplyEncoder {
    /** Largest reply header we build without bitmaps: chunk header + block status payload (context id + one descriptor). */
    static final int HEADER_SLOT_BYTES = 32;
    /**
     * Extents of a bitmap per block status reply: proto.md lets a server describe less than was asked (the client
     * asks again from where the reply ended), and a fixed bound keeps each tag's slot of the headers buffer fixed.
     */
    static final int MAX_EXTENTS = 128;
    /** Bytes a bitmap adds to a block status reply: a chunk header, its context id, {@link #MAX_EXTENTS} descriptors. */
    static final int BITMAP_CHUNK_BYTES = 20 + 4 + 8 * MAX_EXTENTS;
    /** The longest extent: a u32 that is a multiple of every granularity (at most 1 GiB). */
    static final long MAX_EXTENT_BYTES = 1L << 31;

    private final boolean structured;
    private final long exportSize;
    /** Which metadata contexts block status answers with: base:allocation, and the bitmaps by name. */
    private final boolean baseAllocation;
    private final String[] bitmaps;
    private final DirtyBitmapContexts contexts;
    /** NBD command and flags per tag, for the reply (the block layer's Op does not say DF, REQ_ONE...). */
    private final short[] commandOf;
    private final short[] flagsOf;
    private final ByteBuffer headers;
    private final ByteBuffer[] headerViews;
    private final ByteBuffer[] iov;
    private long encodedBytes;
    private long largestData;

    /**
     * @param depth       tags of the hardware queue: the most replies one encode can hold
     * @param maxSegments the most data buffers one READ reply can carry
     * @param bitmaps     the dirty bitmaps the client selected, their context ids in this order
     */
    ReplyEncoder(int depth, int maxSegments, boolean structured, long exportSize, boolean baseAllocation,
                 java.util.List<String> bitmaps, DirtyBitmapContexts contexts) {
        this.structured = structured;
        this.exportSize = exportSize;
        this.baseAllocation = baseAllocation;
        this.bitmaps = bitmaps.toArray(new String[0]);
        this.contexts = contexts;
        this.commandOf = new short[depth];
        this.flagsOf = new short[depth];
        this.headers = ByteBuffer.allocateDirect(depth * (HEADER_SLOT_BYTES + this.bitmaps.length * BITMAP_CHUNK_BYTES));
        this.headerViews = new ByteBuffer[depth];
        for (int i = 0; i < depth; i++) {
            headerViews[i] = headers.duplicate();
        }
        // header + data: the request's segments, or up to 2 device views, whichever is more
        this.iov = new ByteBuffer[depth * (2 + maxSegments)];
    }

    /** The NBD command and flags of the request on {@code tag}, which its reply needs. */
    void remember(int tag, int command, int flags) {
        commandOf[tag] = (short) command;
        flagsOf[tag] = (short) flags;
    }

    /** The iovec array {@link #encode} filled; the writer nulls the entries it is done with. */
    ByteBuffer[] iov() {
        return iov;
    }

    /** The longest READ data of the last {@link #encode} (0: none). */
    long largestData() {
        return largestData;
    }

    /** Bytes the last {@link #encode} put in {@link #iov()}. */
    long encodedBytes() {
        return encodedBytes;
    }

    /**
     * Encodes the replies of {@code done[0..n)} into {@link #iov()}, in that order; returns how many entries it
     * filled. Consecutive headers share one entry; a READ's data follows its header.
     */
    int encode(Request[] done, int n) {
        ByteBuffer headers = this.headers;
        ByteBuffer[] iov = this.iov;
        headers.clear();
        int iovs = 0;
        int views = 0;
        int runStart = -1; // start of the current run of headers not yet added to iov
        long total = 0;
        long largest = 0;
        for (int i = 0; i < n; i++) {
            Request r = done[i];
            int t = r.tag();
            int command = commandOf[t];
            int flags = flagsOf[t];
            int error = nbdError(r.status(), flags);
            if (runStart < 0) {
                runStart = headers.position();
            }
            boolean data = false;
            if (command == CMD_READ && error == 0) {
                if (structured) {
                    headers.putInt(STRUCTURED_REPLY_MAGIC).putShort((short) REPLY_FLAG_DONE)
                            .putShort((short) REPLY_TYPE_OFFSET_DATA).putLong(r.cookie).putInt(8 + (int) r.length)
                            .putLong(r.offset);
                } else {
                    headers.putInt(SIMPLE_REPLY_MAGIC).putInt(0).putLong(r.cookie);
                }
                data = true;
            } else if (command == CMD_BLOCK_STATUS && error == 0) {
                blockStatus(headers, r, (flags & CMD_FLAG_REQ_ONE) != 0);
            } else if (error != 0 && structured) {
                headers.putInt(STRUCTURED_REPLY_MAGIC).putShort((short) REPLY_FLAG_DONE)
                        .putShort((short) REPLY_TYPE_ERROR).putLong(r.cookie).putInt(6)
                        .putInt(error).putShort((short) 0);
            } else {
                headers.putInt(SIMPLE_REPLY_MAGIC).putInt(error).putLong(r.cookie);
            }
            if (data) {
                ByteBuffer v = headerViews[views++];
                v.limit(headers.position()).position(runStart);
                iov[iovs++] = v;
                total += headers.position() - runStart;
                runStart = -1;
                ByteBuffer[] bufs = r.dataBuffers();
                for (int s = 0, segs = r.dataBufferCount(); s < segs; s++) {
                    iov[iovs++] = bufs[s];
                }
                total += r.length;
                largest = Math.max(largest, r.length);
            }
        }
        if (runStart >= 0) {
            ByteBuffer v = headerViews[views];
            v.limit(headers.position()).position(runStart);
            iov[iovs++] = v;
            total += headers.position() - runStart;
        }
        encodedBytes = total;
        largestData = largest;
        return iovs;
    }

    /**
     * A chunk per selected context, the last one flagged DONE (proto.md "NBD_REPLY_TYPE_BLOCK_STATUS"). Every byte
     * of a pmem device is allocated data: base:allocation is one descriptor, status 0, up to the end. A bitmap is
     * described run by run from the request's offset, as QEMU's bitmap_to_extents does: flag
     * {@link NbdProtocol#STATE_DIRTY} or 0, the last extent cut at the request's end; with REQ_ONE one extent.
     */
    private void blockStatus(ByteBuffer headers, Request r, boolean reqOne) {
        long end = r.offset + Math.min(r.length, exportSize - r.offset);
        if (baseAllocation) {
            headers.putInt(STRUCTURED_REPLY_MAGIC).putShort((short) (bitmaps.length == 0 ? REPLY_FLAG_DONE : 0))
                    .putShort((short) REPLY_TYPE_BLOCK_STATUS).putLong(r.cookie).putInt(12)
                    .putInt(META_ID_BASE_ALLOCATION).putInt((int) (end - r.offset)).putInt(0);
        }
        int max = reqOne ? 1 : MAX_EXTENTS;
        for (int i = 0; i < bitmaps.length; i++) {
            headers.putInt(STRUCTURED_REPLY_MAGIC).putShort((short) (i == bitmaps.length - 1 ? REPLY_FLAG_DONE : 0))
                    .putShort((short) REPLY_TYPE_BLOCK_STATUS).putLong(r.cookie);
            int lengthAt = headers.position();
            headers.putInt(0).putInt(META_ID_FIRST_BITMAP + i);
            DirtyBitmapContexts.Bitmap b = contexts.find(bitmaps[i]);
            int n = 0;
            for (long at = r.offset; at < end && n < max; n++) {
                long run = b == null ? -end : b.run(at, end); // a bitmap gone: dirty, which never misses a block
                long len = Math.min(Math.abs(run) - at, MAX_EXTENT_BYTES);
                headers.putInt((int) len).putInt(run < 0 ? STATE_DIRTY : 0);
                at += len;
            }
            headers.putInt(lengthAt, 4 + 8 * n);
        }
    }

    /**
     * Driver status -> an error the reply may carry ("Error values"): ENOTSUP only for a WRITE_ZEROES with
     * FAST_ZERO, EOVERFLOW only for a READ with DF; anything the protocol has no name for becomes EIO.
     */
    static int nbdError(int status, int flags) {
        return switch (status) {
            case Status.OK, Status.EPERM, Status.EIO, Status.ENOMEM, Status.EINVAL, Status.ENOSPC,
                 Status.ESHUTDOWN -> status;
            case Status.ENOTSUP -> (flags & CMD_FLAG_FAST_ZERO) != 0 ? Status.ENOTSUP : Status.EINVAL;
            case Status.EOVERFLOW -> (flags & CMD_FLAG_DF) != 0 ? Status.EOVERFLOW : Status.EINVAL;
            default -> Status.EIO;
        };
    }
}
