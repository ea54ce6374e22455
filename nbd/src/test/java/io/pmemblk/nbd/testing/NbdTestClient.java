package io.pmemblk.nbd.testing;

import static org.assertj.core.api.Assertions.assertThat;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.Closeable;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.net.Socket;
import java.net.SocketException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLSocket;

/**
 * The tests' one raw NBD client (nbd's protocol tests, cli's ITs against the real serve): every byte on the wire is
 * written out here. The constants are spelled from NetworkBlockDevice/nbd {@code doc/proto.md} on their own, not
 * taken from the server's NbdProtocol, so that a wrong constant on either side fails a test.
 *
 * <p>Two kinds of reads: the protocol tests' plain reads (greet, optionReply, reply; the test's timeout bounds
 * them), and bounded reads for hostile-client tests (greeting, optReply, recv, simpleReply, eofWithin), which close
 * the connection when their bound passes, so a server that never answers fails the test instead of hanging it.
 */
public final class NbdTestClient implements AutoCloseable {
    // Handshake (proto.md "Newstyle negotiation").
    public static final long NBDMAGIC = 0x4e42444d41474943L;
    public static final long IHAVEOPT = 0x49484156454F5054L;
    public static final long OPT_REPLY_MAGIC = 0x3e889045565a9L;
    /** Client flags NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES. */
    public static final int FIXED_NEWSTYLE_NO_ZEROES = 3;
    public static final int OPT_STARTTLS = 5, OPT_GO = 7, OPT_STRUCTURED_REPLY = 8, OPT_SET_META_CONTEXT = 10;
    public static final int REP_ACK = 1, REP_INFO = 3, REP_META_CONTEXT = 4;
    public static final int INFO_EXPORT = 0;
    // Transmission (proto.md "Transmission phase").
    public static final int REQ_MAGIC = 0x25609513;
    public static final int SIMPLE_MAGIC = 0x67446698;
    public static final int STRUCT_MAGIC = 0x668e33ef;
    public static final int READ = 0, WRITE = 1, DISC = 2, FLUSH = 3, TRIM = 4, CACHE = 5, ZEROES = 6, BSTATUS = 7;
    public static final int FUA = 1, NO_HOLE = 2, DF = 4, REQ_ONE = 8, FAST_ZERO = 16;
    public static final int REPLY_FLAG_DONE = 1;
    public static final int REPLY_TYPE_OFFSET_DATA = 1, REPLY_TYPE_ERROR = 0x8001;
    public static final String BASE_ALLOCATION = "base:allocation";
    public static final int HEADER_BYTES = 28;

    /** Runs the bounded reads; virtual threads, never shut down: a read cut off by its bound ends with the close. */
    private static final ExecutorService READERS = Executors.newVirtualThreadPerTaskExecutor();

    /** What close() closes: the unix channel, the TCP socket, or the TLS socket over it. */
    private Closeable channel;
    /** The unix channel, for readableWithin's selector; null over TCP. */
    private final SocketChannel unix;
    public DataInputStream in;
    public DataOutputStream out;
    public long exportSize;
    public int transmissionFlags;
    public boolean structured;
    /** Lengths of READs in flight, needed to parse simple replies (which do not carry a length). */
    public final Map<Long, Integer> readLengths = new ConcurrentHashMap<>();

    public record OptionReply(int option, int type, byte[] data) {
        public String text() {
            return new String(data, StandardCharsets.UTF_8);
        }
    }

    /** A simple reply or one structured chunk. */
    public record Reply(boolean simple, int flags, int type, long cookie, int error, long offset, byte[] data) {
        public boolean done() {
            return simple || (flags & REPLY_FLAG_DONE) != 0;
        }
    }

    /** Connected to the unix socket {@code socket}; nothing read yet. */
    public NbdTestClient(Path socket) throws IOException {
        SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX);
        ch.connect(UnixDomainSocketAddress.of(socket));
        channel = ch;
        unix = ch;
        in = new DataInputStream(new BufferedInputStream(Channels.newInputStream(ch), 1 << 16));
        out = new DataOutputStream(new BufferedOutputStream(Channels.newOutputStream(ch), 1 << 16));
    }

    /** Over TCP (a java.net.Socket, so that the JDK's SSLSocket can take it over for STARTTLS). */
    public NbdTestClient(Socket tcp) throws IOException {
        channel = tcp;
        unix = null;
        streams(tcp);
    }

    private void streams(Socket s) throws IOException {
        in = new DataInputStream(new BufferedInputStream(s.getInputStream(), 1 << 16));
        out = new DataOutputStream(new BufferedOutputStream(s.getOutputStream(), 1 << 16));
    }

    /** Connected to {@code socket}; nothing read yet. */
    public static NbdTestClient connect(Path socket) throws IOException {
        return new NbdTestClient(socket);
    }

    /** Connected to {@code socket} and through the handshake to transmission (export ""), every read bounded. */
    public static NbdTestClient connectGo(Path socket) throws Exception {
        NbdTestClient c = connect(socket);
        c.greetAsFixedNewstyleClient();
        c.sendGo("");
        c.goReplies(10);
        return c;
    }

    /** As {@link #connectGo}, with structured replies and the base:allocation context negotiated first. */
    public static NbdTestClient connectStructured(Path socket) throws Exception {
        NbdTestClient c = connect(socket);
        c.greetAsFixedNewstyleClient();
        c.option(OPT_STRUCTURED_REPLY, new byte[0]);
        assertThat(c.optReply(10).type()).isEqualTo(REP_ACK);
        c.option(OPT_SET_META_CONTEXT, metaData("", BASE_ALLOCATION));
        assertThat(c.optReply(10).type()).isEqualTo(REP_META_CONTEXT);
        assertThat(c.optReply(10).type()).isEqualTo(REP_ACK);
        c.sendGo("");
        c.goReplies(10);
        return c;
    }

    /**
     * After NBD_REP_ACK to STARTTLS: the JDK's client TLS over the TCP socket (an independent implementation of
     * the client side); everything after goes through it.
     */
    public SSLSocket startTls(SSLContext client) throws IOException {
        Socket tcp = (Socket) channel;
        SSLSocket tls = (SSLSocket) client.getSocketFactory().createSocket(tcp, "localhost", tcp.getPort(), true);
        tls.setUseClientMode(true);
        tls.startHandshake();
        channel = tls;
        streams(tls);
        return tls;
    }

    // ------------------------------------------------------------------ handshake

    /** Reads the greeting and answers with the client flags. Returns the handshake flags. */
    public int greet(int clientFlags) throws IOException {
        assertThat(in.readLong()).as("NBDMAGIC").isEqualTo(NBDMAGIC);
        assertThat(in.readLong()).as("IHAVEOPT").isEqualTo(IHAVEOPT);
        int flags = in.readUnsignedShort();
        out.writeInt(clientFlags);
        out.flush();
        return flags;
    }

    /** The greeting's magics, read within 10 s (the handshake flags are left unread). */
    public void greeting() throws Exception {
        ByteBuffer g = recv(18, 10);
        assertThat(g.getLong()).isEqualTo(NBDMAGIC);
        assertThat(g.getLong()).isEqualTo(IHAVEOPT);
    }

    /** The greeting (bounded), answered with the client flags FIXED_NEWSTYLE | NO_ZEROES: options may follow. */
    public void greetAsFixedNewstyleClient() throws Exception {
        greeting();
        send(ByteBuffer.allocate(4).putInt(0, FIXED_NEWSTYLE_NO_ZEROES));
    }

    public void option(int option, byte[] data) throws IOException {
        out.writeLong(IHAVEOPT);
        out.writeInt(option);
        out.writeInt(data.length);
        out.write(data);
        out.flush();
    }

    public OptionReply optionReply() throws IOException {
        assertThat(in.readLong()).as("option reply magic").isEqualTo(OPT_REPLY_MAGIC);
        int option = in.readInt();
        int type = in.readInt();
        int len = in.readInt();
        byte[] data = new byte[len];
        in.readFully(data);
        return new OptionReply(option, type, data);
    }

    /** One option reply, each part read within {@code seconds}. */
    public OptionReply optReply(int seconds) throws Exception {
        ByteBuffer h = recv(20, seconds);
        assertThat(h.getLong()).isEqualTo(OPT_REPLY_MAGIC);
        int option = h.getInt(), type = h.getInt(), len = h.getInt();
        byte[] d = new byte[len];
        recv(len, seconds).get(d);
        return new OptionReply(option, type, d);
    }

    /** Replies up to and including the final one (ACK or an error). */
    public List<OptionReply> optionReplies() throws IOException {
        List<OptionReply> all = new ArrayList<>();
        OptionReply r;
        do {
            r = optionReply();
            all.add(r);
        } while (r.type() != REP_ACK && r.type() >= 0);
        return all;
    }

    /** NBD_OPT_GO's or NBD_OPT_INFO's data: the export name, then the NBD_INFO_* items asked for. */
    public static byte[] infoData(String name, int... infos) {
        byte[] n = name.getBytes(StandardCharsets.UTF_8);
        ByteBuffer b = ByteBuffer.allocate(4 + n.length + 2 + 2 * infos.length);
        b.putInt(n.length).put(n).putShort((short) infos.length);
        for (int i : infos) {
            b.putShort((short) i);
        }
        return b.array();
    }

    /** NBD_OPT_SET_META_CONTEXT's or LIST_META_CONTEXT's data: the export name, then the queries. */
    public static byte[] metaData(String name, String... queries) {
        byte[] n = name.getBytes(StandardCharsets.UTF_8);
        int len = 4 + n.length + 4;
        for (String q : queries) {
            len += 4 + q.getBytes(StandardCharsets.UTF_8).length;
        }
        ByteBuffer b = ByteBuffer.allocate(len);
        b.putInt(n.length).put(n).putInt(queries.length);
        for (String q : queries) {
            byte[] qb = q.getBytes(StandardCharsets.UTF_8);
            b.putInt(qb.length).put(qb);
        }
        return b.array();
    }

    /** NBD_OPT_GO on {@code name}, asking for no information item. */
    public void sendGo(String name) throws IOException {
        option(OPT_GO, infoData(name));
    }

    /** GO's replies (bounded): NBD_REP_INFO items up to the ACK. */
    public void goReplies(int seconds) throws Exception {
        while (true) {
            OptionReply r = optReply(seconds);
            assertThat(r.option()).isEqualTo(OPT_GO);
            if (r.type() == REP_ACK) {
                return;
            }
            assertThat(r.type()).as("GO reply type").isEqualTo(REP_INFO);
        }
    }

    /** Full handshake ending in GO on {@code name}; optionally structured replies and base:allocation. */
    public NbdTestClient go(String name, boolean structuredReplies, boolean baseAllocation) throws IOException {
        greet(FIXED_NEWSTYLE_NO_ZEROES);
        return negotiate(name, structuredReplies, baseAllocation);
    }

    /** As {@link #go} after the greeting (e.g. after STARTTLS). */
    public NbdTestClient negotiate(String name, boolean structuredReplies, boolean baseAllocation)
            throws IOException {
        if (structuredReplies) {
            option(OPT_STRUCTURED_REPLY, new byte[0]);
            assertThat(optionReply().type()).isEqualTo(REP_ACK);
            structured = true;
        }
        if (baseAllocation) {
            option(OPT_SET_META_CONTEXT, metaData(name, BASE_ALLOCATION));
            List<OptionReply> r = optionReplies();
            assertThat(r).as("one META_CONTEXT then ACK").hasSize(2);
            assertThat(r.get(0).type()).isEqualTo(REP_META_CONTEXT);
        }
        option(OPT_GO, infoData(name));
        for (OptionReply r : optionReplies()) {
            if (r.type() == REP_INFO) {
                ByteBuffer d = ByteBuffer.wrap(r.data());
                if (d.getShort() == INFO_EXPORT) {
                    exportSize = d.getLong();
                    transmissionFlags = Short.toUnsignedInt(d.getShort());
                }
            } else if (r.type() != REP_ACK) {
                throw new IOException("GO failed with reply type 0x" + Integer.toHexString(r.type()) + ": " + r.text());
            }
        }
        return this;
    }

    // ------------------------------------------------------------------ transmission

    /** A request header (28 bytes, ready to send). */
    public static ByteBuffer header(int flags, int type, long cookie, long offset, long length) {
        return ByteBuffer.allocate(HEADER_BYTES).putInt(REQ_MAGIC).putShort((short) flags).putShort((short) type)
                .putLong(cookie).putLong(offset).putInt((int) length).flip();
    }

    /** {@code h} followed by {@code payload}, in one buffer (one write). */
    public static ByteBuffer concat(ByteBuffer h, byte[] payload) {
        return ByteBuffer.allocate(h.remaining() + payload.length).put(h).put(payload).flip();
    }

    /** {@code n} bytes of {@code b}: a payload. */
    public static byte[] fill(int n, byte b) {
        byte[] a = new byte[n];
        Arrays.fill(a, b);
        return a;
    }

    /** {@code n} pseudo-random bytes, the same for the same {@code seed}: a payload to read back and compare. */
    public static byte[] pattern(int seed, int n) {
        byte[] a = new byte[n];
        new Random(1000 + seed).nextBytes(a);
        return a;
    }

    /** Writes one request (unflushed: see {@link #flush}); a READ's length is remembered to parse its reply. */
    public void request(int flags, int type, long cookie, long offset, long length, byte[] payload) throws IOException {
        out.write(header(flags, type, cookie, offset, length).array());
        if (payload != null) {
            out.write(payload);
        }
        if (type == READ) {
            readLengths.put(cookie, (int) length);
        }
    }

    public void flush() throws IOException {
        out.flush();
    }

    public Reply reply() throws IOException {
        int magic = in.readInt();
        if (magic == SIMPLE_MAGIC) {
            int error = in.readInt();
            long cookie = in.readLong();
            Integer len = readLengths.remove(cookie);
            byte[] data = new byte[0];
            if (len != null && error == 0) {
                data = new byte[len];
                in.readFully(data);
            }
            return new Reply(true, 0, 0, cookie, error, 0, data);
        }
        assertThat(magic).as("reply magic").isEqualTo(STRUCT_MAGIC);
        int flags = in.readUnsignedShort();
        int type = in.readUnsignedShort();
        long cookie = in.readLong();
        int len = in.readInt();
        byte[] payload = new byte[len];
        in.readFully(payload);
        ByteBuffer p = ByteBuffer.wrap(payload);
        if ((flags & REPLY_FLAG_DONE) != 0) {
            readLengths.remove(cookie);
        }
        return switch (type) {
            case REPLY_TYPE_OFFSET_DATA -> {
                long off = p.getLong();
                byte[] data = new byte[len - 8];
                p.get(data);
                yield new Reply(false, flags, type, cookie, 0, off, data);
            }
            case REPLY_TYPE_ERROR -> new Reply(false, flags, type, cookie, p.getInt(), 0, payload);
            default -> new Reply(false, flags, type, cookie, 0, 0, payload);
        };
    }

    /** Sends one request and returns its (single-chunk) reply. */
    public Reply call(int flags, int type, long offset, long length, byte[] payload) throws IOException {
        long cookie = System.nanoTime();
        request(flags, type, cookie, offset, length, payload);
        flush();
        Reply r = reply();
        assertThat(r.cookie()).as("reply cookie").isEqualTo(cookie);
        return r;
    }

    /** A simple reply's header (its data, if any, left unread), read within {@code seconds}. */
    public Reply simpleReply(int seconds) throws Exception {
        ByteBuffer h = recv(16, seconds);
        assertThat(h.getInt()).as("simple reply magic").isEqualTo(SIMPLE_MAGIC);
        int error = h.getInt();
        return new Reply(true, 0, 0, h.getLong(), error, 0, new byte[0]);
    }

    /** Null when no reply arrives within the bound (the connection is closed then). */
    public Reply simpleReplyOrNull(int seconds) throws Exception {
        try {
            return simpleReply(seconds);
        } catch (AssertionError e) {
            if (e.getMessage() != null && e.getMessage().startsWith("no ")) {
                return null;
            }
            throw e;
        }
    }

    /** WRITE with cookie {@code off}, answered without error within 15 s. */
    public void write(long off, byte[] data, int flags) throws Exception {
        send(concat(header(flags, WRITE, off, off, data.length), data));
        Reply r = simpleReply(15);
        assertThat(r.cookie()).isEqualTo(off);
        assertThat(r.error()).as("WRITE at %d", off).isZero();
    }

    /** READ with cookie {@code off + 1}, answered without error within 15 s; its data. */
    public byte[] read(long off, int len) throws Exception {
        send(header(0, READ, off + 1, off, len));
        Reply r = simpleReply(15);
        assertThat(r.cookie()).isEqualTo(off + 1);
        assertThat(r.error()).as("READ at %d", off).isZero();
        byte[] d = new byte[len];
        recv(len, 15).get(d);
        return d;
    }

    /** A 64 KiB FUA WRITE at {@code offset} read back equal, then DISC: the server closes within 10 s. */
    public void roundTrip(long offset) throws Exception {
        byte[] data = pattern((int) (offset >>> 12) ^ (int) System.nanoTime(), 65536);
        write(offset, data, FUA);
        assertThat(read(offset, data.length)).isEqualTo(data);
        send(header(0, DISC, 0, 0, 0));
        assertThat(eofWithin(10)).as("server closes after DISC").isTrue();
    }

    public void disconnect() throws IOException {
        request(0, DISC, 0, 0, 0, null);
        flush();
    }

    // ------------------------------------------------------------------ raw bytes

    /** Writes all of {@code b} at once (flushed). */
    public void send(ByteBuffer b) throws IOException {
        if (b.hasArray()) {
            out.write(b.array(), b.arrayOffset() + b.position(), b.remaining());
            b.position(b.limit());
        } else {
            byte[] copy = new byte[b.remaining()];
            b.get(copy);
            out.write(copy);
        }
        out.flush();
    }

    /** As {@link #send}, where the server may hang up first (that is fine). */
    public void sendIgnoringErrors(byte[] b) {
        try {
            send(ByteBuffer.wrap(b));
        } catch (IOException e) {
            // the server hung up first: fine
        }
    }

    /** Reads exactly n bytes within the bound; EOFException on a hang-up, AssertionError on a timeout. */
    public ByteBuffer recv(int n, int seconds) throws Exception {
        byte[] b = new byte[n];
        int[] got = {0};
        Future<Integer> f = READERS.submit(() -> {
            while (got[0] < n) {
                int r = in.read(b, got[0], n - got[0]);
                if (r < 0) {
                    return -1;
                }
                got[0] += r;
            }
            return n;
        });
        int r;
        try {
            r = f.get(seconds, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
            close();
            throw new AssertionError("no " + n + " bytes from the server within " + seconds + " s (got " + got[0]
                    + ")");
        } catch (ExecutionException e) {
            if (e.getCause() instanceof IOException io) {
                throw new EOFException("read failed: " + io);
            }
            throw e;
        }
        if (r < 0) {
            throw new EOFException("server closed the connection after " + got[0] + " of " + n + " bytes");
        }
        return ByteBuffer.wrap(b);
    }

    /** True when the server closes (or resets) the connection within the bound; data before that is skipped. */
    public boolean eofWithin(int seconds) throws Exception {
        Future<Boolean> f = READERS.submit(() -> {
            byte[] b = new byte[65536];
            try {
                while (in.read(b) >= 0) {
                    // skipped
                }
            } catch (IOException e) {
                return true;
            }
            return true;
        });
        try {
            return f.get(seconds, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
            close();
            return false;
        }
    }

    public void drainToEof(int seconds) throws Exception {
        assertThat(eofWithin(seconds)).as("server hangs up").isTrue();
    }

    /** Whether at least one byte is readable within the bound (a selector wait; nothing is consumed). Unix only. */
    public boolean readableWithin(int seconds) throws Exception {
        if (in.available() > 0) {
            return true;
        }
        try (Selector sel = Selector.open()) {
            unix.configureBlocking(false);
            try {
                SelectionKey key = unix.register(sel, SelectionKey.OP_READ);
                int n = sel.select(seconds * 1000L);
                key.cancel();
                sel.selectNow();
                return n > 0;
            } finally {
                unix.configureBlocking(true);
            }
        }
    }

    /** True when the server has closed the connection (EOF), false if it sent something instead. */
    public boolean closedByServer() throws IOException {
        try {
            return in.read() < 0;
        } catch (EOFException | SocketException e) {
            return true;
        } catch (IOException e) {
            return e.getMessage() != null && e.getMessage().contains("reset");
        }
    }

    /** Closes the connection; a failure to close is nothing a test acts on. */
    @Override
    public void close() {
        try {
            channel.close();
        } catch (IOException ignored) {
            // closing
        }
    }
}
