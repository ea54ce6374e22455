package io.pmemblk.nbd.tls;

import java.io.IOException;
import java.net.SocketAddress;
import java.net.SocketOption;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.SocketChannel;
import java.util.Set;
import java.util.concurrent.locks.ReentrantLock;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLEngineResult;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLSession;

/**
 * A TLS session over a connected, blocking {@link SocketChannel}, itself a {@code SocketChannel}: the NBD
 * frontend's readers and senders call {@code read}/{@code write} on a {@code SocketChannel} field, and a
 * connection that negotiated STARTTLS hands them this one instead of the plain channel. So the plaintext path
 * is left exactly as it was (the same call on the same JDK class), and TLS costs what TLS costs only where it
 * is used; with both kinds of connections in one process the call sites see two receiver classes, which the JIT
 * inlines behind one type check.
 *
 * <p>One reader thread and one writer at a time (callers serialise their writes; this class serialises
 * again, because the reading side must also write when the peer asks for a key update). {@link SSLEngine} allows
 * wrap and unwrap to run at the same time. Buffers are allocated once per connection: ciphertext in and
 * out, and a plaintext staging buffer used only when a read's destination is smaller than one TLS record
 * (the engine decrypts a whole record at once); a larger destination, such as a WRITE payload's buffers, is
 * decrypted into directly. What the JDK's engine allocates inside is its own.
 *
 * <p>Closing sends close_notify when it cannot block on a peer that stopped reading (see
 * {@link #implCloseSelectableChannel}); then the socket closes.
 */
public final class TlsChannel extends SocketChannel {
    private final SocketChannel raw;
    private final SSLEngine engine;
    /** Ciphertext read from the socket, not yet decrypted; kept in read mode (position..limit pending). */
    private final ByteBuffer netIn;
    /** Plaintext decrypted into staging and not yet delivered; read mode. */
    private final ByteBuffer appIn;
    /** Ciphertext to be written: room for several records, so one socket write carries a batch of them. */
    private final ByteBuffer netOut;
    private final int appBufferSize;
    private final ReentrantLock readLock = new ReentrantLock();
    private final ReentrantLock writeLock = new ReentrantLock();
    private final ByteBuffer[] single = new ByteBuffer[1]; // read(ByteBuffer) as a one-element scatter: under readLock
    private final ByteBuffer[] singleOut = new ByteBuffer[1]; // the same for write(ByteBuffer): under writeLock
    /** Status of the last wrap (under writeLock). */
    private SSLEngineResult.Status wrapStatus = SSLEngineResult.Status.OK;
    private static final ByteBuffer[] NONE = new ByteBuffer[0];
    private volatile boolean outputShut;

    private static final int RECORDS_PER_WRITE = 4;
    /** Input read and dropped after a failed handshake while the client reads the alert. */
    private static final long DRAIN_LIMIT = 1 << 20;

    /** Runs the TLS handshake (server side) on {@code raw}; on failure the peer has been sent the alert, if any. */
    static TlsChannel handshake(SocketChannel raw, SSLEngine engine) throws IOException {
        TlsChannel t = new TlsChannel(raw, engine);
        t.doHandshake();
        return t;
    }

    private TlsChannel(SocketChannel raw, SSLEngine engine) {
        super(raw.provider());
        this.raw = raw;
        this.engine = engine;
        SSLSession s = engine.getSession();
        this.appBufferSize = s.getApplicationBufferSize();
        // Room for several records: one socket read brings in what a large payload's next records hold.
        this.netIn = ByteBuffer.allocateDirect(RECORDS_PER_WRITE * s.getPacketBufferSize()).flip();
        this.appIn = ByteBuffer.allocateDirect(appBufferSize).flip();
        this.netOut = ByteBuffer.allocateDirect(RECORDS_PER_WRITE * s.getPacketBufferSize());
    }

    /** The negotiated session (protocol, cipher suite, the client's certificate chain if it sent one). */
    public SSLSession session() {
        return engine.getSession();
    }

    private void doHandshake() throws IOException {
        try {
            handshakeLoop();
        } catch (SSLException e) {
            // Thrown by unwrap, wrap, or (rethrown by either) a delegated task that checked a certificate.
            throw sendAlertAndFail(e);
        }
    }

    private void handshakeLoop() throws IOException {
        engine.beginHandshake();
        for (;;) {
            switch (engine.getHandshakeStatus()) {
                case NEED_TASK -> runTasks();
                case NEED_WRAP -> {
                    writeLock.lock();
                    try {
                        wrapAndFlush(NONE, 0, 0);
                    } finally {
                        writeLock.unlock();
                    }
                }
                case NEED_UNWRAP, NEED_UNWRAP_AGAIN -> {
                    appIn.compact();
                    SSLEngineResult r;
                    try {
                        r = engine.unwrap(netIn, appIn);
                    } finally {
                        appIn.flip();
                    }
                    if (r.getStatus() == SSLEngineResult.Status.BUFFER_UNDERFLOW) {
                        if (readRaw() < 0) {
                            throw new ClosedChannelException() {
                                @Override
                                public String getMessage() {
                                    return "client closed the connection during the TLS handshake";
                                }
                            };
                        }
                    } else if (r.getStatus() == SSLEngineResult.Status.CLOSED) {
                        throw new SSLException("client ended the TLS session during the handshake");
                    }
                }
                case FINISHED, NOT_HANDSHAKING -> {
                    return;
                }
            }
        }
    }

    /** The engine failed the handshake (a bad certificate...): its alert still goes out so the client knows why. */
    private SSLException sendAlertAndFail(SSLException e) {
        try {
            writeLock.lock();
            try {
                // The alert is one record; a few rounds at most (bounded: never spin on an engine in a bad state).
                for (int i = 0; i < 4 && engine.getHandshakeStatus() == SSLEngineResult.HandshakeStatus.NEED_WRAP; i++) {
                    wrapAndFlush(NONE, 0, 0);
                    if (wrapStatus == SSLEngineResult.Status.CLOSED) {
                        break;
                    }
                }
            } finally {
                writeLock.unlock();
            }
            // The socket stays open until the client has read the alert and hung up: closed earlier, the client's
            // next write (its first option: in TLS 1.3 its handshake is over before the server judged its
            // certificate) fails with EPIPE, or our unread input resets the connection, and the client reports
            // that instead of the alert that says why. What it sends meanwhile is dropped, at most
            // DRAIN_LIMIT bytes; the handshake timer still bounds the wait.
            raw.shutdownOutput();
            long drained = 0;
            int n;
            do {
                netIn.clear();
                n = raw.read(netIn);
                drained += Math.max(0, n);
            } while (n >= 0 && drained < DRAIN_LIMIT);
        } catch (IOException | RuntimeException alertNotSent) {
            e.addSuppressed(alertNotSent);
        }
        return e;
    }

    private void runTasks() {
        for (Runnable t; (t = engine.getDelegatedTask()) != null; ) {
            t.run();
        }
    }

    /** Reads more ciphertext into netIn (kept in read mode). */
    private int readRaw() throws IOException {
        netIn.compact();
        try {
            return raw.read(netIn);
        } finally {
            netIn.flip();
        }
    }

    // ------------------------------------------------------------------------------------------------ reading

    @Override
    public int read(ByteBuffer dst) throws IOException {
        readLock.lock();
        try {
            single[0] = dst;
            return (int) readLocked(single, 0, 1);
        } finally {
            single[0] = null;
            readLock.unlock();
        }
    }

    @Override
    public long read(ByteBuffer[] dsts, int offset, int length) throws IOException {
        readLock.lock();
        try {
            return readLocked(dsts, offset, length);
        } finally {
            readLock.unlock();
        }
    }

    /** At least one byte, or -1 at the end of the session (close_notify or the socket's end); blocks as a socket does. */
    private long readLocked(ByteBuffer[] dsts, int offset, int length) throws IOException {
        long room = 0;
        for (int i = offset; i < offset + length; i++) {
            room += dsts[i].remaining();
        }
        if (room == 0) {
            return 0;
        }
        for (;;) {
            if (appIn.hasRemaining()) {
                return deliver(dsts, offset, length);
            }
            if (engine.isInboundDone()) {
                return -1; // close_notify came with the last records (unwrapMore): the session's end, as EOF
            }
            if (netIn.hasRemaining()) {
                SSLEngineResult r;
                boolean direct = room >= appBufferSize;
                if (direct) {
                    r = engine.unwrap(netIn, dsts, offset, length);
                } else {
                    appIn.compact();
                    try {
                        r = engine.unwrap(netIn, appIn);
                    } finally {
                        appIn.flip();
                    }
                }
                answerPostHandshake(r);
                switch (r.getStatus()) {
                    case OK -> {
                        if (direct && r.bytesProduced() > 0) {
                            return r.bytesProduced() + unwrapMore(dsts, offset, length, room - r.bytesProduced());
                        }
                        continue; // staged bytes are delivered above; a record without data: read on
                    }
                    case CLOSED -> {
                        return -1; // close_notify from the client
                    }
                    case BUFFER_OVERFLOW -> throw new SSLException("TLS record larger than the session's "
                            + appBufferSize + "-byte application buffer");
                    case BUFFER_UNDERFLOW -> { } // a partial record: read more below
                }
            }
            if (readRaw() < 0) {
                return -1;
            }
        }
    }

    /**
     * After a record was decrypted straight into the caller's buffers: the complete records already read are
     * decrypted too while a whole one still fits, so one call moves as much of a large payload as arrived.
     * Never blocks: a partial record waits for the next call.
     */
    private long unwrapMore(ByteBuffer[] dsts, int offset, int length, long room) throws IOException {
        long produced = 0;
        while (room >= appBufferSize && netIn.hasRemaining()) {
            SSLEngineResult r = engine.unwrap(netIn, dsts, offset, length);
            answerPostHandshake(r);
            if (r.getStatus() != SSLEngineResult.Status.OK || r.bytesConsumed() == 0) {
                break; // a partial record (underflow), or the end of the session: the next read sees it
            }
            produced += r.bytesProduced();
            room -= r.bytesProduced();
        }
        return produced;
    }

    private long deliver(ByteBuffer[] dsts, int offset, int length) {
        long n = 0;
        for (int i = offset; i < offset + length && appIn.hasRemaining(); i++) {
            ByteBuffer d = dsts[i];
            int k = Math.min(d.remaining(), appIn.remaining());
            if (k == 0) {
                continue;
            }
            int limit = appIn.limit();
            appIn.limit(appIn.position() + k);
            d.put(appIn);
            appIn.limit(limit);
            n += k;
        }
        return n;
    }

    /** After the handshake the client may still ask for an answer (a TLS 1.3 key update): give it. */
    private void answerPostHandshake(SSLEngineResult r) throws IOException {
        SSLEngineResult.HandshakeStatus hs = r.getHandshakeStatus();
        if (hs == SSLEngineResult.HandshakeStatus.NEED_TASK) {
            runTasks();
            hs = engine.getHandshakeStatus();
        }
        if (hs == SSLEngineResult.HandshakeStatus.NEED_WRAP && !outputShut) {
            writeLock.lock();
            try {
                wrapAndFlush(NONE, 0, 0);
            } finally {
                writeLock.unlock();
            }
        }
    }

    // ------------------------------------------------------------------------------------------------ writing

    @Override
    public int write(ByteBuffer src) throws IOException {
        writeLock.lock();
        try {
            singleOut[0] = src;
            return (int) writeLocked(singleOut, 0, 1);
        } finally {
            singleOut[0] = null;
            writeLock.unlock();
        }
    }

    @Override
    public long write(ByteBuffer[] srcs, int offset, int length) throws IOException {
        writeLock.lock();
        try {
            return writeLocked(srcs, offset, length);
        } finally {
            writeLock.unlock();
        }
    }

    /**
     * Encrypts up to {@link #RECORDS_PER_WRITE} records and writes them; returns the plaintext bytes taken. A
     * caller writing a long reply loops, as it does on a socket, and each return is progress it can see.
     */
    private long writeLocked(ByteBuffer[] srcs, int offset, int length) throws IOException {
        if (outputShut) {
            throw new ClosedChannelException();
        }
        return wrapAndFlush(srcs, offset, length);
    }

    /** Holds writeLock. Wraps as many records as netOut holds (at least one call), then writes them all. */
    private long wrapAndFlush(ByteBuffer[] srcs, int offset, int length) throws IOException {
        netOut.clear();
        long consumed = 0;
        SSLEngineResult r;
        do {
            r = engine.wrap(srcs, offset, length, netOut);
            consumed += r.bytesConsumed();
            if (r.getHandshakeStatus() == SSLEngineResult.HandshakeStatus.NEED_TASK) {
                runTasks();
            }
        } while (r.getStatus() == SSLEngineResult.Status.OK && r.bytesConsumed() > 0
                && hasRemaining(srcs, offset, length) && netOut.remaining() >= engine.getSession().getPacketBufferSize());
        if (r.getStatus() == SSLEngineResult.Status.BUFFER_OVERFLOW && netOut.position() == 0) {
            throw new SSLException("TLS record larger than the " + netOut.capacity() + "-byte output buffer");
        }
        netOut.flip();
        while (netOut.hasRemaining()) {
            raw.write(netOut);
        }
        wrapStatus = r.getStatus();
        if (r.getStatus() == SSLEngineResult.Status.CLOSED && consumed == 0 && hasRemaining(srcs, offset, length)) {
            throw new SSLException("TLS session closed: cannot send");
        }
        return consumed;
    }

    private static boolean hasRemaining(ByteBuffer[] b, int offset, int length) {
        for (int i = offset; i < offset + length; i++) {
            if (b[i].hasRemaining()) {
                return true;
            }
        }
        return false;
    }

    // ------------------------------------------------------------------------- the rest of SocketChannel

    @Override
    public SocketChannel shutdownInput() throws IOException {
        raw.shutdownInput(); // the reader's next raw read sees the end: -1, as on a plain socket
        return this;
    }

    /** Unblocks a writer stuck on a peer that stopped reading; no close_notify (it could block too). */
    @Override
    public SocketChannel shutdownOutput() throws IOException {
        outputShut = true;
        raw.shutdownOutput();
        return this;
    }

    /**
     * Sends close_notify (proto.md: close the TLS session, then the socket) only when nobody else is reading or
     * writing, which is the connection's own graceful end, and then with one non-blocking write: a close from
     * another thread (the stall watchdog, a forced shutdown, the handshake timer) must never wait on a peer that
     * stopped reading, and neither must the connection's last thread.
     */
    @Override
    protected void implCloseSelectableChannel() throws IOException {
        try {
            if (!outputShut && readLock.tryLock()) {
                try {
                    if (writeLock.tryLock()) {
                        try {
                            outputShut = true;
                            engine.closeOutbound();
                            netOut.clear();
                            engine.wrap(NONE, netOut);
                            netOut.flip();
                            raw.configureBlocking(false); // nobody is in a blocking call on raw: both locks are ours
                            raw.write(netOut); // one try: what does not fit is dropped with the socket
                        } catch (IOException | RuntimeException peerGone) {
                            // the socket closes below either way
                        } finally {
                            writeLock.unlock();
                        }
                    }
                } finally {
                    readLock.unlock();
                }
            }
        } finally {
            raw.close();
        }
    }

    @Override
    protected void implConfigureBlocking(boolean block) throws IOException {
        if (!block) {
            throw new UnsupportedOperationException("TlsChannel is blocking only");
        }
    }

    @Override
    public SocketChannel bind(SocketAddress local) {
        throw new UnsupportedOperationException("TlsChannel wraps a connected channel");
    }

    @Override
    public boolean connect(SocketAddress remote) {
        throw new UnsupportedOperationException("TlsChannel wraps a connected channel");
    }

    @Override
    public boolean finishConnect() {
        return true;
    }

    @Override
    public <T> SocketChannel setOption(SocketOption<T> name, T value) throws IOException {
        raw.setOption(name, value);
        return this;
    }

    @Override
    public <T> T getOption(SocketOption<T> name) throws IOException {
        return raw.getOption(name);
    }

    @Override
    public Set<SocketOption<?>> supportedOptions() {
        return raw.supportedOptions();
    }

    @Override
    public java.net.Socket socket() {
        throw new UnsupportedOperationException("TlsChannel has no java.net.Socket view");
    }

    @Override
    public boolean isConnected() {
        return raw.isConnected();
    }

    @Override
    public boolean isConnectionPending() {
        return false;
    }

    @Override
    public SocketAddress getRemoteAddress() throws IOException {
        return raw.getRemoteAddress();
    }

    @Override
    public SocketAddress getLocalAddress() throws IOException {
        return raw.getLocalAddress();
    }
}
