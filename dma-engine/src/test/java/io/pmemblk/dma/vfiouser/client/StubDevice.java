package io.pmemblk.dma.vfiouser.client;

import static io.pmemblk.dma.vfiouser.client.VfioUserSpec.*;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.UnixMessages;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A scripted vfio-user server for the client's robustness tests: it accepts one connection and hands each
 * message it receives to the test's {@link Script}, which answers with bytes (well-formed or not), nothing, or
 * by closing. Test code only: the real device is {@code pmemblk dma-device} and libvfio-user's samples.
 */
final class StubDevice implements AutoCloseable {
    /** One received message. */
    record Message(int id, int command, int flags, byte[] payload) {}

    /** What the server does with a message: the script writes to the connection itself. */
    @FunctionalInterface
    interface Script {
        void on(Message m, StubDevice device) throws Exception;
    }

    private final int listenFd;
    private volatile int conn = -1;
    private final Thread thread;
    private final Script script;
    final LinkedBlockingQueue<Message> received = new LinkedBlockingQueue<>();
    volatile Throwable failure;

    StubDevice(Path socket, Script script) throws NativeException {
        this.script = script;
        this.listenFd = Sockets.unixStreamSocket();
        Sockets.listen(listenFd, socket.toString(), 1);
        this.thread = Thread.ofPlatform().daemon().name("stub-vfio-user").start(this::serve);
    }

    private void serve() {
        try {
            conn = Sockets.accept(listenFd);
            try (Arena a = Arena.ofConfined()) {
                MemorySegment header = a.allocate(HEADER);
                while (true) {
                    if (!readFully(header)) {
                        return;
                    }
                    int size = header.get(ValueLayout.JAVA_INT_UNALIGNED, H_SIZE);
                    byte[] payload = new byte[size - HEADER];
                    if (payload.length > 0) {
                        MemorySegment p = a.allocate(payload.length);
                        if (!readFully(p)) {
                            return;
                        }
                        MemorySegment.copy(p, ValueLayout.JAVA_BYTE, 0, payload, 0, payload.length);
                    }
                    Message m = new Message(Short.toUnsignedInt(header.get(ValueLayout.JAVA_SHORT_UNALIGNED, H_MSG_ID)),
                            Short.toUnsignedInt(header.get(ValueLayout.JAVA_SHORT_UNALIGNED, H_COMMAND)),
                            header.get(ValueLayout.JAVA_INT_UNALIGNED, H_FLAGS), payload);
                    received.add(m);
                    script.on(m, this);
                }
            }
        } catch (Throwable t) {
            if (conn >= 0) {
                failure = t;
            }
        }
    }

    private boolean readFully(MemorySegment into) throws NativeException {
        long got = 0;
        while (got < into.byteSize()) {
            int n = Sockets.recv(conn, into.asSlice(got), 0);
            if (n == 0) {
                return false;
            }
            got += n;
        }
        return true;
    }

    /** Sends raw bytes. */
    void send(byte[] bytes) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment s = a.allocate(bytes.length);
            MemorySegment.copy(bytes, 0, s, ValueLayout.JAVA_BYTE, 0, bytes.length);
            UnixMessages.send(conn, s);
        }
    }

    /** A message: header (size computed unless {@code size} >= 0) and payload. */
    static byte[] message(int id, int command, int flags, int error, int size, byte[] payload) {
        ByteBuffer b = ByteBuffer.allocate(HEADER + payload.length).order(ByteOrder.LITTLE_ENDIAN);
        b.putShort((short) id).putShort((short) command).putInt(size >= 0 ? size : HEADER + payload.length)
                .putInt(flags).putInt(error).put(payload);
        return b.array();
    }

    /** The reply to m carrying {@code payload}. */
    static byte[] reply(Message m, byte[] payload) {
        return message(m.id(), m.command(), TYPE_REPLY, 0, -1, payload);
    }

    /** A good VERSION reply (0.2, max_msg_fds 4). */
    static byte[] versionReply(Message m) {
        byte[] json = "{\"capabilities\":{\"max_msg_fds\":4,\"max_data_xfer_size\":1048576}}\0".getBytes(StandardCharsets.UTF_8);
        ByteBuffer b = ByteBuffer.allocate(4 + json.length).order(ByteOrder.LITTLE_ENDIAN);
        b.putShort((short) VERSION_MAJOR).putShort((short) VERSION_MINOR).put(json);
        return reply(m, b.array());
    }

    /** The REGION_READ reply for m with {@code value} (count bytes of it). */
    static byte[] readReply(Message m, long value) {
        ByteBuffer in = ByteBuffer.wrap(m.payload()).order(ByteOrder.LITTLE_ENDIAN);
        long offset = in.getLong(0);
        int region = in.getInt(8), count = in.getInt(12);
        ByteBuffer b = ByteBuffer.allocate(16 + count).order(ByteOrder.LITTLE_ENDIAN);
        b.putLong(offset).putInt(region).putInt(count);
        for (int i = 0; i < count; i++) {
            b.put((byte) (value >>> (8 * i)));
        }
        return reply(m, b.array());
    }

    /** Closes the connection from the server's side (a device process that died). */
    void hangUp() throws NativeException {
        Sockets.shutdown(conn, Sockets.SHUT_RDWR);
    }

    Message next(long millis) throws InterruptedException {
        return received.poll(millis, TimeUnit.MILLISECONDS);
    }

    @Override
    public void close() throws Exception {
        try {
            Sockets.shutdown(listenFd, Sockets.SHUT_RDWR);
        } catch (NativeException ignored) {
            // not listening
        }
        int c = conn;
        if (c >= 0) {
            try {
                Sockets.shutdown(c, Sockets.SHUT_RDWR);
            } catch (NativeException ignored) {
                // gone already
            }
        }
        thread.join(5000);
        Libc.close(listenFd);
        if (c >= 0) {
            Libc.close(c);
        }
    }
}
