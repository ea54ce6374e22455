package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;

/**
 * A connection's parts wired as {@link NbdConnection} wires them after the handshake, over a connected pair of
 * Unix sockets: {@link #server} is the connection's end, {@link #client} the test's. No threads are started.
 */
final class ConnectionParts implements AutoCloseable {
    static final long EXPORT = 16L << 20;
    static final int DEPTH = 8;
    static final int MAX = 2 * BufferPool.CHUNK;

    final MemoryBlockDriver driver = new MemoryBlockDriver(EXPORT);
    /** Twice DEPTH tags and chunks: a connection alone on its queue may hold half (its fair share), DEPTH tags. */
    final BlockLayer layer = new BlockLayer(driver, 1, 2 * DEPTH, 16L * BufferPool.CHUNK, MAX);
    final HardwareQueue queue = layer.queue(0);
    final FrontendQueue frontend = new FrontendQueue(queue);
    final ReplyRing ring = new ReplyRing(queue.depth());
    final CloseState state = new CloseState();
    final ReplyEncoder encoder;
    final ReplySender sender;
    final RequestReader reader;
    final SocketChannel server;
    final SocketChannel client;
    /** The server end's own descriptor, as a plain connection has one. */
    final SocketFd fd;

    ConnectionParts(Path dir, boolean structured) throws IOException {
        this(dir, structured, null);
    }

    /** With {@code busyPoll}, the reader asks the server end's socket what waits, as a plain connection's does. */
    ConnectionParts(Path dir, boolean structured, BusyPoll busyPoll) throws IOException {
        Path sock = dir.resolve("parts.sock");
        try (ServerSocketChannel listener = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
            listener.bind(UnixDomainSocketAddress.of(sock));
            client = SocketChannel.open(UnixDomainSocketAddress.of(sock));
            server = listener.accept();
        }
        encoder = new ReplyEncoder(queue.depth(), BufferPool.chunksFor(MAX), structured, EXPORT, true, java.util.List.of(),
                DirtyBitmapContexts.NONE);
        fd = SocketFd.of(server);
        sender = new ReplySender(server, fd, ring, encoder, state, queue.depth(), 0);
        reader = new RequestReader(server, frontend, ring, sender, encoder, state, RequestValidatorTest.ALL, structured, structured,
                EXPORT, MAX, busyPoll == null ? null : busyPoll.forSocket(fd.fd()));
    }

    static ByteBuffer request(int flags, int command, long cookie, long offset, long length) {
        return ByteBuffer.allocate(REQUEST_HEADER_BYTES).putInt(REQUEST_MAGIC).putShort((short) flags)
                .putShort((short) command).putLong(cookie).putLong(offset).putInt((int) length).flip();
    }

    /** A part's loop, as the connection's threads run it. */
    interface Loop {
        void run() throws Exception;
    }

    /** Runs {@code loop} on a platform thread named {@code name}; what it throws lands in {@code failed}. */
    static Thread thread(String name, java.util.concurrent.atomic.AtomicReference<Throwable> failed, Loop loop) {
        return Thread.ofPlatform().name(name).start(() -> {
            try {
                loop.run();
            } catch (Throwable e) {
                failed.set(e);
            }
        });
    }

    /** Sends the buffers from the client end, whole. */
    void send(ByteBuffer... bufs) throws IOException {
        for (ByteBuffer b : bufs) {
            while (b.hasRemaining()) {
                client.write(b);
            }
        }
    }

    /** Reads exactly {@code n} bytes from the client end. */
    ByteBuffer receive(int n) throws IOException {
        ByteBuffer b = ByteBuffer.allocate(n);
        while (b.hasRemaining()) {
            if (client.read(b) < 0) {
                throw new java.io.EOFException("after " + b.position() + " of " + n + " bytes");
            }
        }
        return b.flip();
    }

    /** What the reader's teardown does (see NbdConnection.readerMain), then the sender's drain to the end. */
    void finishAsTheConnectionDoes() throws InterruptedException {
        int n = frontend.releaseUndispatched();
        if (n > 0) {
            ring.released(n);
        }
        ring.readerDone();
        sender.run();
    }

    @Override
    public void close() throws IOException {
        client.close();
        server.close();
        fd.close();
        layer.close();
        driver.close();
    }
}
