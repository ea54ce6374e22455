package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;

import io.pmemblk.block.HardwareQueue;
import io.pmemblk.block.Op;
import io.pmemblk.block.Request;
import io.pmemblk.block.Status;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.util.concurrent.TimeUnit;

/**
 * One client: a reader thread ({@code nbd-conn-N-rx}: handshake, then requests) and a sender thread
 * ({@code nbd-conn-N-tx}: replies), over one blocking channel, bound to one hardware queue.
 *
 * <p>Hot path, allocation-free: the reader parses headers out of a direct input buffer, reads WRITE payloads
 * straight into the request's registered buffers, gathers every request already received into one batch and
 * dispatches the batch before it would block on the socket (seed 004: plug the whole queue drain). Completions
 * land in a {@link ReplyRing}; the sender drains it whole and writes all those replies with one gathering
 * write (reply headers from a reusable direct buffer, READ data from the request's buffers), then releases.
 * Requests the driver completed inline (the CPU route) are answered by the reader itself right after the
 * dispatch, when the sender is not busy: one thread hand-off (a futex wake and a context switch) fewer per
 * batch, which is what small requests and reads on a 2-core machine pay most for. While large WRITE payloads
 * stream in, replies stay with the sender so that receiving and replying overlap.
 *
 * <p>Teardown: whatever ends the reader (DISC, EOF, a protocol violation, an I/O error), requests already
 * given to the driver still complete; the sender replies to them unless the socket is broken, releases them,
 * and closes the channel when the last one is back. Requests the driver never saw are released by the reader.
 */
final class NbdConnection implements Request.Completion {
    private static final System.Logger LOG = System.getLogger(NbdConnection.class.getName());
    private static final int INPUT_BUFFER_BYTES = 64 * 1024;
    /** A WRITE payload at least this long makes the next header read a short one (see fill). */
    private static final int LARGE_WRITE = 32 * 1024;
    private static final int SMALL_READ_AHEAD = 4096;
    /** Largest reply header we build: chunk header + block status payload (context id + one descriptor). */
    private static final int HEADER_SLOT_BYTES = 32;

    private final NbdServer server;
    final int id;
    private final SocketChannel channel;
    final String peer;
    private final HardwareQueue queue;
    private final int depth;
    private final int maxRequestBytes;
    private final long exportSize;
    private final ReplyRing ring;
    private final Request[] batch;
    private int batched;
    /** NBD command and flags per tag, for the reply (the block layer's Op does not say DF, REQ_ONE...). */
    private final short[] commandOf;
    private final short[] flagsOf;

    private final Thread reader;
    private Thread sender;
    private volatile boolean structured;
    private volatile boolean baseAllocation;
    /** Replies cannot (or must not) be written any more: release completed requests without replying. */
    private volatile boolean broken;
    private volatile boolean inTransmission;
    private volatile String closeReason = "closed";
    private volatile boolean handshakeTimedOut;
    private final java.util.concurrent.atomic.AtomicBoolean handshakeOver = new java.util.concurrent.atomic.AtomicBoolean();
    /**
     * Serialises reply writing between the sender and the reader's inline replies (below). The scratch it
     * guards (header buffer, its views, the iovec array) is made once at the start of transmission.
     */
    private final java.util.concurrent.locks.ReentrantLock sendLock = new java.util.concurrent.locks.ReentrantLock();
    private ByteBuffer headers;
    private ByteBuffer[] headerViews;
    private ByteBuffer[] iov;
    /** Reader-side drain array for inline replies. */
    private Request[] inlineDone;
    /** The last WRITE was large: read headers with a short read-ahead. */
    private boolean largeWrites;
    /** Request acquired by the reader but not yet in the batch (a WRITE whose payload is being read). */
    private Request pending;
    private long requests;

    NbdConnection(NbdServer server, int id, SocketChannel channel, String peer, HardwareQueue queue,
                  int maxRequestBytes, long exportSize) {
        this.server = server;
        this.id = id;
        this.channel = channel;
        this.peer = peer;
        this.queue = queue;
        this.depth = queue.depth();
        this.maxRequestBytes = maxRequestBytes;
        this.exportSize = exportSize;
        this.ring = new ReplyRing(depth);
        this.batch = new Request[depth];
        this.commandOf = new short[depth];
        this.flagsOf = new short[depth];
        this.reader = Thread.ofPlatform().name("nbd-conn-" + id + "-rx").unstarted(this::readerMain);
    }

    void start() {
        reader.start();
    }

    boolean inTransmission() {
        return inTransmission;
    }

    /** Server shutdown: stop reading; in-flight requests finish and their replies still go out. */
    void shutdownInput() {
        try {
            channel.shutdownInput();
        } catch (IOException e) {
            // already closed
        }
    }

    /** The handshake took too long: closing the channel fails the reader's blocking read. */
    void handshakeTimedOut() {
        if (handshakeOver.compareAndSet(false, true)) { // else the handshake finished first: leave it be
            handshakeTimedOut = true;
            closeQuietly();
        }
    }

    /** Last resort after the bounded wait of a shutdown. */
    void forceClose() {
        broken = true;
        closeQuietly();
        reader.interrupt();
        Thread s = sender;
        if (s != null) {
            s.interrupt();
        }
    }

    /** Waits for both threads until the deadline (System.nanoTime), not for each in turn. */
    void join(long deadlineNanos) throws InterruptedException {
        reader.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadlineNanos - System.nanoTime())));
        Thread s = sender;
        if (s != null) {
            s.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadlineNanos - System.nanoTime())));
        }
    }

    /** When the reader began waiting for the rest of a WRITE payload, or the sender for the socket; 0 = not. */
    private volatile long receivingSince;
    private volatile long sendingSince;

    /** Called by the server's watchdog. */
    void closeIfStalled(long now, long limitNanos) {
        long r = receivingSince;
        long s = sendingSince;
        String why = null;
        if (r != 0 && now - r > limitNanos) {
            why = "client stalled in the middle of a WRITE payload for more than "
                    + TimeUnit.NANOSECONDS.toSeconds(limitNanos) + " s";
        } else if (s != 0 && now - s > limitNanos) {
            why = "client stopped reading replies for more than " + TimeUnit.NANOSECONDS.toSeconds(limitNanos) + " s";
        }
        if (why != null && !broken) {
            closeReason = why;
            broken = true;
            closeQuietly(); // the blocked read or write fails; in-flight requests are released as on any error
        }
    }

    boolean isAlive() {
        Thread s = sender;
        return reader.isAlive() || (s != null && s.isAlive());
    }

    // ---------------------------------------------------------------- reader

    private void readerMain() {
        boolean senderStarted = false;
        try {
            Handshake.Negotiated n = server.handshake(this, channel);
            if (!handshakeOver.compareAndSet(false, true)) {
                throw new IOException("handshake timed out"); // the timer won the race and closed the channel
            }
            if (n == null) {
                closeReason = "client aborted the handshake";
                return;
            }
            structured = n.structuredReplies();
            baseAllocation = n.baseAllocation();
            inTransmission = true;
            LOG.log(System.Logger.Level.DEBUG, "nbd connection {0} from {1}: transmission (structured replies {2},"
                    + " base:allocation {3}, hardware queue {4})", id, peer, structured, baseAllocation,
                    queue.index());
            int maxSegments = io.pmemblk.block.BufferPool.chunksFor(maxRequestBytes);
            headers = ByteBuffer.allocateDirect(depth * HEADER_SLOT_BYTES);
            headerViews = new ByteBuffer[depth];
            for (int i = 0; i < depth; i++) {
                headerViews[i] = headers.duplicate();
            }
            iov = new ByteBuffer[depth * (2 + maxSegments)]; // header + data (or up to 2 device views)
            inlineDone = new Request[depth];
            sender = Thread.ofPlatform().name("nbd-conn-" + id + "-tx").start(this::senderMain);
            senderStarted = true;
            transmission();
        } catch (NbdProtocolException e) {
            broken = true;
            closeReason = "protocol violation: " + e.getMessage();
        } catch (EOFException e) {
            if (server.closing()) {
                closeReason = "server shutdown"; // our own shutdownInput: replies still go out
            } else {
                broken = true;
                closeReason = e.getMessage();
            }
        } catch (IOException e) {
            if (!broken) { // else an inline reply write failed and already said why
                closeReason = handshakeTimedOut ? "handshake timed out" : "read failed: " + e;
            }
            broken = true;
        } catch (InterruptedException e) {
            broken = true;
            closeReason = "interrupted (forced shutdown)";
        } catch (RuntimeException | Error e) {
            broken = true;
            closeReason = "internal error: " + e;
            LOG.log(System.Logger.Level.ERROR, "nbd connection " + id + " from " + peer + ": internal error", e);
        } finally {
            releaseUndispatched();
            ring.readerDone();
            if (!senderStarted) {
                finish();
            } else if (broken) {
                // Unblock a sender stuck writing to a peer that went away; it still releases everything.
                try {
                    channel.shutdownOutput();
                } catch (IOException | RuntimeException e) {
                    // nothing to unblock
                }
            }
        }
    }

    private void releaseUndispatched() {
        int n = 0;
        if (pending != null) {
            pending.release();
            pending = null;
            n++;
        }
        for (int i = 0; i < batched; i++) {
            batch[i].release();
            batch[i] = null;
            n++;
        }
        batched = 0;
        if (n > 0) {
            ring.released(n);
        }
    }

    private void transmission() throws IOException, InterruptedException {
        ByteBuffer in = ByteBuffer.allocateDirect(INPUT_BUFFER_BYTES);
        in.flip();
        for (;;) {
            if (in.remaining() < REQUEST_HEADER_BYTES) {
                fill(in, REQUEST_HEADER_BYTES);
            }
            int magic = in.getInt();
            if (magic != REQUEST_MAGIC) {
                throw new NbdProtocolException("request magic 0x" + Integer.toHexString(magic) + ", expected 0x"
                        + Integer.toHexString(REQUEST_MAGIC));
            }
            int flags = Short.toUnsignedInt(in.getShort());
            int command = Short.toUnsignedInt(in.getShort());
            long cookie = in.getLong();
            long offset = in.getLong();
            long length = Integer.toUnsignedLong(in.getInt());
            requests++;

            if (command == CMD_DISC) {
                flushBatch();
                closeReason = "client disconnected (NBD_CMD_DISC)";
                return;
            }
            int error = validate(command, flags, offset, length);
            if (command == CMD_WRITE) {
                if (length > maxRequestBytes) {
                    // Never read (or allocate) an oversized payload: answer, then hang up.
                    replyNow(command, flags, cookie, Status.EINVAL);
                    flushBatch();
                    closeReason = "WRITE of " + length + " bytes exceeds the maximum " + maxRequestBytes;
                    return;
                }
                if (error != 0) {
                    skip(in, length);
                    replyNow(command, flags, cookie, error);
                    continue;
                }
                largeWrites = length >= LARGE_WRITE;
                Request r;
                if (queue.driver().receivesInPlace(offset, length)) {
                    // CPU route: the payload goes straight into the device, no buffers, one copy
                    r = acquire(0);
                    prepare(r, command, flags, cookie, Op.WRITE, offset);
                    r.length = length;
                    queue.driver().receiveInPlace(r);
                } else {
                    r = acquire((int) length);
                    prepare(r, command, flags, cookie, Op.WRITE, offset);
                }
                pending = r;
                readPayload(in, r);
                pending = null;
                addToBatch(r);
                continue;
            }
            if (error != 0) {
                replyNow(command, flags, cookie, error);
                continue;
            }
            switch (command) {
                case CMD_READ -> {
                    Request r = acquire((int) length);
                    prepare(r, command, flags, cookie, Op.READ, offset);
                    addToBatch(r);
                }
                case CMD_BLOCK_STATUS -> {
                    // Answered here: every byte of a pmem device is allocated data (status 0 is always right).
                    Request r = acquire(0);
                    prepare(r, command, flags, cookie, null, offset);
                    r.length = length; // validate() keeps it within the export; the reply's u32 holds it
                    r.complete(Status.OK);
                }
                default -> {
                    Op op = switch (command) {
                        case CMD_FLUSH -> Op.FLUSH;
                        case CMD_TRIM -> Op.TRIM;
                        case CMD_CACHE -> Op.CACHE;
                        default -> Op.WRITE_ZEROES;
                    };
                    Request r = acquire(0);
                    prepare(r, command, flags, cookie, op, offset);
                    r.length = length; // up to 4 GiB - 1: a data-less request is not bounded by maxRequestBytes
                    addToBatch(r);
                }
            }
            if (batched == batch.length) {
                flushBatch();
            }
        }
    }

    /**
     * proto.md "Request types" / "Error values" (and nbdkit's validate_request): 0 or the errno to reply.
     * DISC never gets here; WRITE length over the maximum is handled by the caller (it needs a disconnect).
     */
    private int validate(int command, int flags, long offset, long length) {
        int allowed = CMD_FLAG_FUA; // valid on every command once SEND_FUA is advertised
        switch (command) {
            case CMD_READ -> allowed |= structured ? CMD_FLAG_DF : 0;
            case CMD_WRITE, CMD_FLUSH, CMD_TRIM, CMD_CACHE -> { }
            case CMD_WRITE_ZEROES -> allowed |= CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO;
            case CMD_BLOCK_STATUS -> {
                if (!structured || !baseAllocation) {
                    return Status.EINVAL; // no metadata context was negotiated
                }
                allowed |= CMD_FLAG_REQ_ONE;
            }
            default -> {
                return Status.EINVAL; // unknown command
            }
        }
        if ((flags & ~allowed) != 0) {
            return Status.EINVAL;
        }
        if (command == CMD_FLUSH) {
            return offset == 0 && length == 0 ? 0 : Status.EINVAL;
        }
        if (command == CMD_READ && length > maxRequestBytes) {
            return Status.EINVAL;
        }
        if (length == 0) {
            return Status.EINVAL;
        }
        boolean writes = command == CMD_WRITE || command == CMD_WRITE_ZEROES;
        // Unsigned: an offset >= 2^63 is negative here and out of range like any other.
        if (offset < 0 || offset > exportSize || length > exportSize - offset) {
            return writes ? Status.ENOSPC : Status.EINVAL;
        }
        return 0;
    }

    private void prepare(Request r, int command, int flags, long cookie, Op op, long offset) {
        int t = r.tag();
        commandOf[t] = (short) command;
        flagsOf[t] = (short) flags;
        r.op = op;
        r.offset = offset;
        r.fua = (flags & CMD_FLAG_FUA) != 0;
        r.cookie = cookie;
        r.owner = this;
        r.completion = this;
        r.sinkReadsDevice = op == Op.READ; // the sender writes READ data with writev: it can send from pmem itself
    }

    /** A reply decided by the frontend (a validation error): takes a tag so it queues like any other reply. */
    private void replyNow(int command, int flags, long cookie, int error) throws InterruptedException {
        Request r = acquire(0);
        prepare(r, command, flags, cookie, null, 0);
        r.complete(error);
    }

    private Request acquire(int dataBytes) throws InterruptedException {
        Request r = queue.tryAcquire(dataBytes);
        if (r == null) {
            // Out of tags or buffers: what we hold must reach the driver before we wait for more (the tags and
            // chunks we would wait for may be in our own batch).
            flushBatch();
            r = queue.acquire(dataBytes);
        }
        ring.acquired();
        return r;
    }

    private void addToBatch(Request r) {
        batch[batched++] = r;
    }

    private void flushBatch() {
        if (batched > 0) {
            int n = batched;
            batched = 0;
            queue.dispatch(batch, n);
            for (int i = 0; i < n; i++) {
                batch[i] = null;
            }
        }
    }

    /**
     * Dispatches the batch, then (if the sender is not mid-write) writes the replies of whatever completed
     * inline. While the reader dispatches, completions do not wake the sender; afterwards it is woken only if
     * replies are left for it.
     */
    private void dispatchAndReplyInline() throws IOException {
        if (batched == 0) {
            return;
        }
        if (largeWrites) {
            // While large payloads stream in, the reader's time is best spent receiving them: the sender
            // answers in parallel (measured: 64 KiB writes at QD16 ~4200 MiB/s this way, ~3300 inline).
            flushBatch();
            return;
        }
        ring.inlineBegin();
        try {
            flushBatch();
            if (sendLock.tryLock()) {
                try {
                    int n = ring.drainNow(inlineDone);
                    if (n > 0) {
                        sendAndRelease(inlineDone, n);
                    }
                } finally {
                    sendLock.unlock();
                }
            }
        } finally {
            ring.inlineEnd();
        }
        if (broken) {
            throw new IOException(closeReason);
        }
    }

    /** Makes at least {@code need} bytes readable in {@code in}, dispatching the batch before blocking. */
    private void fill(ByteBuffer in, int need) throws IOException {
        in.compact();
        dispatchAndReplyInline();
        // After a large WRITE, read only a little ahead: the next request is likely another large WRITE, and
        // payload bytes that land in this buffer are copied once more on their way to the request's buffers;
        // read directly there instead (readPayload's scattering read).
        int window = largeWrites ? SMALL_READ_AHEAD : in.capacity();
        while (in.position() < need) {
            in.limit(Math.min(in.capacity(), Math.max(need, in.position() + window)));
            if (channel.read(in) < 0) {
                boolean clean = in.position() == 0;
                in.flip();
                throw new EOFException(clean ? "client closed the connection without NBD_CMD_DISC"
                        : "client closed the connection in the middle of a request header");
            }
        }
        in.flip();
    }

    /** Copies what the input buffer already holds, then reads the rest of the payload in place. */
    private void readPayload(ByteBuffer in, Request r) throws IOException {
        ByteBuffer[] bufs = r.dataBuffers();
        int segs = r.dataBufferCount();
        int first = 0;
        while (in.hasRemaining() && first < segs) {
            ByteBuffer dst = bufs[first];
            int k = Math.min(in.remaining(), dst.remaining());
            int limit = in.limit();
            in.limit(in.position() + k);
            dst.put(in);
            in.limit(limit);
            if (!dst.hasRemaining()) {
                first++;
            }
        }
        if (first < segs) {
            dispatchAndReplyInline();
            while (first < segs) {
                receivingSince = System.nanoTime(); // progress restarts the stall clock
                long got = channel.read(bufs, first, segs - first);
                receivingSince = 0;
                if (got < 0) {
                    throw new EOFException("client closed the connection in the middle of a WRITE payload");
                }
                while (first < segs && !bufs[first].hasRemaining()) {
                    first++;
                }
            }
        }
    }

    /** Discards the payload of a refused WRITE (at most maxRequestBytes) through the input buffer. */
    private void skip(ByteBuffer in, long length) throws IOException {
        long left = length;
        while (left > 0) {
            if (!in.hasRemaining()) {
                in.clear();
                flushBatch();
                if (channel.read(in) < 0) {
                    throw new EOFException("client closed the connection in the middle of a WRITE payload");
                }
                in.flip();
            }
            int k = (int) Math.min(left, in.remaining());
            in.position(in.position() + k);
            left -= k;
        }
    }

    // ---------------------------------------------------------------- completion (any thread)

    @Override
    public void completed(Request request) {
        ring.push(request);
    }

    // ---------------------------------------------------------------- sender

    private void senderMain() {
        Request[] done = new Request[depth];
        try {
            int n;
            while ((n = ring.drain(done)) >= 0) {
                sendLock.lock();
                try {
                    sendAndRelease(done, n);
                } finally {
                    sendLock.unlock();
                }
            }
        } catch (InterruptedException e) {
            closeReason = "interrupted (forced shutdown)";
        } catch (RuntimeException | Error e) {
            closeReason = "internal error: " + e;
            LOG.log(System.Logger.Level.ERROR, "nbd connection " + id + " from " + peer + ": internal error", e);
        } finally {
            // Whatever is still in flight (a forced close leaves some) is released as it completes, so the
            // queue gets every tag back and a shutdown does not wait for requests nobody will answer.
            ring.abandon();
            finish();
        }
    }

    /** Writes the replies of {@code done[0..n)} (unless the socket is broken) and releases them. Holds sendLock. */
    private void sendAndRelease(Request[] done, int n) {
        if (!broken) {
            try {
                writeReplies(done, n, headers, headerViews, iov);
            } catch (IOException e) {
                if (!broken) { // else a forced close or the stall watchdog already said why
                    closeReason = "write failed: " + e;
                }
                broken = true;
                shutdownInput(); // the reader stops; in-flight requests still drain through here
            }
        }
        for (int i = 0; i < n; i++) {
            done[i].release();
            done[i] = null;
        }
        ring.released(n);
    }

    private void writeReplies(Request[] done, int n, ByteBuffer headers, ByteBuffer[] headerViews, ByteBuffer[] iov)
            throws IOException {
        headers.clear();
        int iovs = 0;
        int views = 0;
        int runStart = -1; // start of the current run of headers not yet added to iov
        long total = 0;
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
                long len = Math.min(r.length, exportSize - r.offset);
                headers.putInt(STRUCTURED_REPLY_MAGIC).putShort((short) REPLY_FLAG_DONE)
                        .putShort((short) REPLY_TYPE_BLOCK_STATUS).putLong(r.cookie).putInt(12)
                        .putInt(META_ID_BASE_ALLOCATION).putInt((int) len).putInt(0);
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
            }
        }
        if (runStart >= 0) {
            ByteBuffer v = headerViews[views];
            v.limit(headers.position()).position(runStart);
            iov[iovs++] = v;
            total += headers.position() - runStart;
        }
        int first = 0;
        while (total > 0) {
            sendingSince = System.nanoTime(); // progress restarts the stall clock
            long w = channel.write(iov, first, iovs - first);
            sendingSince = 0;
            total -= w;
            while (first < iovs && !iov[first].hasRemaining()) {
                iov[first++] = null;
            }
        }
        for (int i = first; i < iovs; i++) {
            iov[i] = null;
        }
    }

    /** Driver status -> an error proto.md allows (ENOTSUP only with FAST_ZERO, EOVERFLOW only with DF). */
    private static int nbdError(int status, int flags) {
        return switch (status) {
            case Status.OK, Status.EPERM, Status.EIO, Status.ENOMEM, Status.EINVAL, Status.ENOSPC,
                 Status.ESHUTDOWN -> status;
            case Status.ENOTSUP -> (flags & CMD_FLAG_FAST_ZERO) != 0 ? Status.ENOTSUP : Status.EINVAL;
            case Status.EOVERFLOW -> (flags & CMD_FLAG_DF) != 0 ? Status.EOVERFLOW : Status.EINVAL;
            default -> Status.EIO;
        };
    }

    // ---------------------------------------------------------------- teardown

    private void finish() {
        closeQuietly();
        LOG.log(broken ? System.Logger.Level.WARNING : System.Logger.Level.INFO,
                "nbd connection {0} from {1} closed after {2} requests: {3}",
                id, peer, requests, closeReason);
        server.connectionClosed(this);
    }

    private void closeQuietly() {
        try {
            channel.close();
        } catch (IOException e) {
            // nothing left to do
        }
    }
}
