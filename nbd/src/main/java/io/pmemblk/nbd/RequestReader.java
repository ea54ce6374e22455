package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;

import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;

/**
 * The transmission phase's receiving half (nbdkit's {@code protocol_recv_request_send_reply} up to the
 * handler): parses request headers out of a direct input buffer, refuses what {@link RequestValidator}
 * refuses, reads WRITE payloads straight into the request's data buffers (the device itself when the driver
 * receives in place), gathers every request already received into one batch of the {@link FrontendQueue} and
 * dispatches the batch before it would block on the socket, so the driver rings one doorbell per batch.
 * After a dispatch it has the {@link ReplySender} answer what completed inline, unless large WRITE payloads
 * are streaming in: then the sender answers in parallel while this thread keeps receiving.
 *
 * <p>Allocation-free per request. One thread ({@code nbd-conn-N-rx}) runs it; whatever ends it (an exception,
 * DISC) leaves undispatched requests for the caller to release ({@link FrontendQueue#releaseUndispatched}).
 */
final class RequestReader {
    static final int INPUT_BUFFER_BYTES = 64 * 1024;
    /** A WRITE payload at least this long makes the next header read a short one (see fill). */
    static final int LARGE_WRITE = 32 * 1024;
    static final int SMALL_READ_AHEAD = 4096;
    /**
     * Requests a batch of WRITEs gathers, at most, while the socket already holds the next one (see beforeRead):
     * after a large WRITE, and after a small one (whose read brings many at a time).
     */
    static final int DEFERRED_BATCH = 4;
    static final int DEFERRED_SMALL_BATCH = 32;

    private final SocketChannel channel;
    private final FrontendQueue queue;
    private final ReplyRing ring;
    /** The connection's unreplied ranges: a request overlapping one waits for its reply (see awaitOverlapping). */
    private final OverlapGuard guard;
    private final ReplySender sender;
    private final ReplyEncoder encoder;
    private final CloseState state;
    /** What the handshake advertised: requests it does not offer are refused. */
    private final int transmissionFlags;
    private final boolean structured;
    private final boolean baseAllocation;
    private final long exportSize;
    private final int maxRequestBytes;
    /** The last WRITE was large: read headers with a short read-ahead. */
    private boolean largeWrites;
    /** The last WRITE was large and copied by the driver at dispatch: the sender answers in parallel. */
    private boolean repliesInParallel;
    private long requests;
    /** The scattering read of a payload's rest plus the input buffer: a request's data buffers, then one. */
    private final ByteBuffer[] scatter;
    /**
     * The last read took less than it asked for, so it emptied the socket: only then may the next one block and
     * is worth polling for. After a read that filled its buffers more bytes likely wait, and asking (FIONREAD)
     * would be one system call per read for nothing.
     */
    private boolean drained = true;
    /** The last request read was a WRITE: its batch may wait for what the socket already holds. */
    private boolean lastWrite;
    /** Polls the socket before a read would sleep; null: no polling (off, TLS, or the fd is unknown). */
    private final BusyPoll.Poller poller;
    /** When the reader began waiting for the rest of a WRITE payload; 0 = not. Read by the stall watchdog. */
    private volatile long receivingSince;

    /**
     * @param transmissionFlags what the handshake advertised ({@link Handshake.Negotiated#transmissionFlags()})
     * @param poller  busy-polls the socket before a read would sleep, or null
     */
    RequestReader(SocketChannel channel, FrontendQueue queue, ReplyRing ring, ReplySender sender,
                  ReplyEncoder encoder, CloseState state, int transmissionFlags, boolean structured, boolean baseAllocation,
                  long exportSize, int maxRequestBytes, BusyPoll.Poller poller) {
        this.channel = channel;
        this.queue = queue;
        this.ring = ring;
        this.guard = ring.guard();
        this.sender = sender;
        this.encoder = encoder;
        this.state = state;
        this.transmissionFlags = transmissionFlags;
        this.structured = structured;
        this.baseAllocation = baseAllocation;
        this.exportSize = exportSize;
        this.maxRequestBytes = maxRequestBytes;
        this.poller = poller;
        this.scatter = new ByteBuffer[Math.max(2, BufferPool.chunksFor(maxRequestBytes)) + 1];
    }

    /**
     * Before every socket read: dispatches the batch and replies inline (a batch must never wait for input that
     * is not there yet; a WRITE batch may take in what the socket already holds), then, when the read would
     * block, polls the socket a while rather than sleep at once.
     */
    private void beforeRead() throws IOException {
        if (!drained && lastWrite && poller != null
                && queue.batched() < (largeWrites ? DEFERRED_BATCH : DEFERRED_SMALL_BATCH) && poller.readable()) {
            // WRITEs streaming in and the next bytes already here, so the read will not block: the batch takes
            // more requests, and their replies go out in one write that wakes the client once (one FIONREAD per
            // read that filled its buffers). Not after a READ: its reply, data and all, is worth sending at once
            // (measured: 4k random reads at QD32 0.88x when READ batches waited too).
            return;
        }
        dispatchAndReplyInline();
        if (poller != null && drained) {
            poller.awaitReadable();
        }
    }

    /** Request headers read so far (DISC included). */
    long requests() {
        return requests;
    }

    private static final java.lang.invoke.VarHandle REQUESTS;

    static {
        try {
            REQUESTS = java.lang.invoke.MethodHandles.lookup().findVarHandle(RequestReader.class, "requests", long.class);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    /** {@link #requests()} from another thread (the idle watchdog): a coarse count that must not be torn or stale forever. */
    long requestsSeen() {
        return (long) REQUESTS.getOpaque(this);
    }

    long receivingSince() {
        return receivingSince;
    }

    /**
     * Reads and submits requests until DISC or a WRITE too large to read (both return normally, with the
     * reason in the close state) or an exception.
     * @throws EOFException when the client closes the connection (cleanly between requests or not)
     * @throws NbdProtocolException on a bad request magic
     * @throws IOException on a failed read, or when an inline reply found the connection broken
     */
    void run() throws IOException, InterruptedException {
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
            lastWrite = command == CMD_WRITE;

            if (command == CMD_DISC) {
                queue.dispatch();
                state.reason = "client disconnected (NBD_CMD_DISC)";
                return;
            }
            int error = RequestValidator.validate(command, flags, offset, length, transmissionFlags, structured,
                    baseAllocation,
                    exportSize, maxRequestBytes);
            if (command == CMD_WRITE) {
                if (RequestValidator.writeTooLarge(length, maxRequestBytes)) {
                    // Never read (or allocate) an oversized payload: answer, then hang up.
                    replyNow(command, flags, cookie, offset, length, Status.EINVAL);
                    queue.dispatch();
                    state.reason = "WRITE of " + length + " bytes exceeds the maximum " + maxRequestBytes;
                    return;
                }
                if (error != 0) {
                    skip(in, length);
                    replyNow(command, flags, cookie, offset, length, error);
                    continue;
                }
                if (guard.overlaps(offset, length, true)) {
                    awaitOverlapping(offset, length, true); // before its payload may land in the device
                }
                largeWrites = length >= LARGE_WRITE;
                Request r = queue.acquireWrite(offset, (int) length);
                ring.acquired();
                prepare(r, command, flags, cookie, Op.WRITE, offset);
                guard.register(r.tag(), offset, length, true);
                repliesInParallel = largeWrites && !r.dataInPlace;
                readPayload(in, r);
                queue.add(r);
                continue;
            }
            if (error != 0) {
                replyNow(command, flags, cookie, offset, length, error);
                continue;
            }
            switch (command) {
                case CMD_READ -> {
                    if (guard.overlaps(offset, length, false)) {
                        awaitOverlapping(offset, length, false);
                    }
                    Request r = queue.acquireRead(offset, (int) length); // no buffers when sent from the device
                    ring.acquired();
                    prepare(r, command, flags, cookie, Op.READ, offset);
                    guard.register(r.tag(), offset, length, false);
                    queue.add(r);
                }
                case CMD_BLOCK_STATUS -> {
                    // Answered here: every byte of a pmem device is allocated data (status 0 is always right).
                    Request r = acquire(0);
                    prepare(r, command, flags, cookie, null, offset);
                    r.length = length; // validate() keeps it within the export; the reply's u32 holds it
                    queue.completeHere(r, Status.OK);
                }
                default -> {
                    Op op = switch (command) {
                        case CMD_FLUSH -> Op.FLUSH;
                        case CMD_TRIM -> Op.TRIM;
                        case CMD_CACHE -> Op.CACHE;
                        default -> Op.WRITE_ZEROES;
                    };
                    boolean changesData = op == Op.TRIM || op == Op.WRITE_ZEROES;
                    if (changesData && guard.overlaps(offset, length, true)) {
                        awaitOverlapping(offset, length, true);
                    }
                    Request r = acquire(0);
                    prepare(r, command, flags, cookie, op, offset);
                    r.length = length; // up to 4 GiB - 1: a data-less request is not bounded by maxRequestBytes
                    if (changesData) {
                        guard.register(r.tag(), offset, length, true);
                    }
                    queue.add(r);
                }
            }
            if (queue.full()) {
                queue.dispatch();
            }
        }
    }

    private void prepare(Request r, int command, int flags, long cookie, Op op, long offset) {
        encoder.remember(r.tag(), command, flags);
        r.op = op;
        r.offset = offset;
        r.fua = (flags & CMD_FLAG_FUA) != 0;
        r.cookie = cookie;
        r.completion = ring;
        r.sinkReadsDevice = op == Op.READ; // the sender writes READ data with writev: it can send from pmem itself
    }

    /** A reply decided here (a validation error): takes a tag so it queues like any other reply. */
    /** Answers a refused request without the driver; the refusal is logged (at DEBUG, rate-limited). */
    private void replyNow(int command, int flags, long cookie, long offset, long length, int error)
            throws InterruptedException {
        if (NbdProtocol.REFUSALS.enabled()) {
            NbdProtocol.REFUSALS.refused("refused {0} (flags 0x{1}, offset {2}, length {3}): {4}",
                    NbdProtocol.commandName(command), Integer.toHexString(flags), Long.toUnsignedString(offset),
                    length, NbdProtocol.errorName(error));
        }
        Request r = acquire(0);
        prepare(r, command, flags, cookie, null, 0);
        queue.completeHere(r, error);
    }

    private Request acquire(int dataBytes) throws InterruptedException {
        Request r = queue.acquire(dataBytes);
        ring.acquired();
        return r;
    }

    /**
     * Dispatches the batch, then (if the sender is not mid-write) writes the replies of whatever completed
     * inline. While the reader dispatches, completions do not wake the sender; afterwards it is woken only if
     * replies are left for it.
     */
    private void dispatchAndReplyInline() throws IOException {
        if (queue.batched() == 0) {
            return;
        }
        if (repliesInParallel) {
            // While large payloads stream in and each costs a copy at dispatch, the reader's time is best spent
            // receiving them: the sender answers in parallel (measured: 64 KiB writes at QD16 ~4200 MiB/s this
            // way, ~3300 inline). A payload received in place costs nothing at dispatch: its reply is one
            // short write here, cheaper than waking the sender for it.
            queue.dispatch();
            return;
        }
        ring.inlineBegin();
        try {
            queue.dispatch();
            sender.replyInlineIfIdle();
        } finally {
            ring.inlineEnd();
        }
        if (state.broken) {
            throw new IOException(state.reason);
        }
    }

    /**
     * Before a request over [offset, offset + length) is acquired, when {@link OverlapGuard#overlaps} found an
     * unreplied request of this connection it overlaps where either changes data: dispatches the batch (the
     * earlier one may be in it) and waits for those replies, so overlapping requests run and answer in request
     * order ({@link OverlapGuard} says why). Out of line: the common case, no overlap, is the guard's check alone.
     * A client that stops reading replies while it sends keeps this wait going only until the stall watchdog cuts
     * it off, as it would the sender.
     */
    private void awaitOverlapping(long offset, long length, boolean changesData)
            throws IOException, InterruptedException {
        guard.waited();
        dispatchAndReplyInline();
        ring.awaitReplies(offset, length, changesData);
        if (state.broken) {
            throw new IOException(state.reason);
        }
    }

    /** Requests that waited for the reply of an earlier overlapping one (tests). */
    long overlapWaits() {
        return guard.waits();
    }

    /** Makes at least {@code need} bytes readable in {@code in}, dispatching the batch before blocking. */
    private void fill(ByteBuffer in, int need) throws IOException {
        in.compact();
        // After a large WRITE, read only a little ahead: the next request is likely another large WRITE, and
        // payload bytes that land in this buffer are copied once more on their way to the request's buffers;
        // read directly there instead (readPayload's scattering read).
        int window = largeWrites ? SMALL_READ_AHEAD : in.capacity();
        while (in.position() < need) {
            in.limit(Math.min(in.capacity(), Math.max(need, in.position() + window)));
            beforeRead();
            int got = channel.read(in);
            drained = in.hasRemaining();
            if (got < 0) {
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
            // The rest of the payload, and in the same read whatever follows it (the next request's header, with
            // a little of its payload after a large WRITE) into the input buffer, now empty: one read per
            // request instead of a payload read and a header read.
            ByteBuffer[] scatter = this.scatter;
            int n = segs - first;
            System.arraycopy(bufs, first, scatter, 0, n);
            in.clear();
            if (largeWrites) {
                in.limit(SMALL_READ_AHEAD);
            }
            scatter[n] = in;
            int at = 0;
            try {
                while (at < n) {
                    beforeRead();
                    receivingSince = System.nanoTime(); // progress restarts the stall clock
                    long got = channel.read(scatter, at, n + 1 - at);
                    drained = in.hasRemaining();
                    receivingSince = 0;
                    if (got < 0) {
                        throw new EOFException("client closed the connection in the middle of a WRITE payload");
                    }
                    while (at < n && !scatter[at].hasRemaining()) {
                        at++;
                    }
                }
            } finally {
                java.util.Arrays.fill(scatter, 0, n + 1, null);
                in.flip();
            }
        }
    }

    /**
     * Discards the payload of a refused WRITE (at most maxRequestBytes) through the input buffer, on the stall
     * watchdog's clock as a payload received is: a client that stops in the middle holds its connection no longer.
     */
    private void skip(ByteBuffer in, long length) throws IOException {
        long left = length;
        while (left > 0) {
            if (!in.hasRemaining()) {
                in.clear();
                queue.dispatch();
                receivingSince = System.nanoTime();
                int got = channel.read(in);
                receivingSince = 0;
                if (got < 0) {
                    throw new EOFException("client closed the connection in the middle of a WRITE payload");
                }
                in.flip();
            }
            int k = (int) Math.min(left, in.remaining());
            in.position(in.position() + k);
            left -= k;
        }
    }
}
