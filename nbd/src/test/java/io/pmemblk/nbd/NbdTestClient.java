package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.Channels;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/** A raw NBD client for the protocol tests: every byte on the wire is written out here. */
final class NbdTestClient implements AutoCloseable {
    /** What close() closes: the unix channel, the TCP socket, or the TLS socket over it. */
    private java.io.Closeable channel;
    DataInputStream in;
    DataOutputStream out;
    long exportSize;
    int transmissionFlags;
    boolean structured;
    /** Lengths of READs in flight, needed to parse simple replies (which do not carry a length). */
    final Map<Long, Integer> readLengths = new ConcurrentHashMap<>();

    record OptionReply(int option, int type, byte[] data) {
        String text() {
            return new String(data, StandardCharsets.UTF_8);
        }
    }

    /** A simple reply or one structured chunk. */
    record Reply(boolean simple, int flags, int type, long cookie, int error, long offset, byte[] data) {
        boolean done() {
            return simple || (flags & REPLY_FLAG_DONE) != 0;
        }
    }

    NbdTestClient(Path socket) throws IOException {
        SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX);
        ch.connect(UnixDomainSocketAddress.of(socket));
        channel = ch;
        in = new DataInputStream(new BufferedInputStream(Channels.newInputStream(ch), 1 << 16));
        out = new DataOutputStream(new BufferedOutputStream(Channels.newOutputStream(ch), 1 << 16));
    }

    /** Over TCP (a java.net.Socket, so that the JDK's SSLSocket can take it over for STARTTLS). */
    NbdTestClient(java.net.Socket tcp) throws IOException {
        channel = tcp;
        streams(tcp);
    }

    private void streams(java.net.Socket s) throws IOException {
        in = new DataInputStream(new BufferedInputStream(s.getInputStream(), 1 << 16));
        out = new DataOutputStream(new BufferedOutputStream(s.getOutputStream(), 1 << 16));
    }

    /**
     * After NBD_REP_ACK to STARTTLS: the JDK's client TLS over the TCP socket (an independent implementation of
     * the client side); everything after goes through it.
     */
    javax.net.ssl.SSLSocket startTls(javax.net.ssl.SSLContext client) throws IOException {
        java.net.Socket tcp = (java.net.Socket) channel;
        javax.net.ssl.SSLSocket tls = (javax.net.ssl.SSLSocket) client.getSocketFactory()
                .createSocket(tcp, "localhost", tcp.getPort(), true);
        tls.setUseClientMode(true);
        tls.startHandshake();
        channel = tls;
        streams(tls);
        return tls;
    }

    /** Reads the greeting and answers with the client flags. Returns the handshake flags. */
    int greet(int clientFlags) throws IOException {
        assertEquals(NBDMAGIC, in.readLong(), "NBDMAGIC");
        assertEquals(IHAVEOPT, in.readLong(), "IHAVEOPT");
        int flags = in.readUnsignedShort();
        out.writeInt(clientFlags);
        out.flush();
        return flags;
    }

    void option(int option, byte[] data) throws IOException {
        out.writeLong(IHAVEOPT);
        out.writeInt(option);
        out.writeInt(data.length);
        out.write(data);
        out.flush();
    }

    OptionReply optionReply() throws IOException {
        assertEquals(OPTION_REPLY_MAGIC, in.readLong(), "option reply magic");
        int option = in.readInt();
        int type = in.readInt();
        int len = in.readInt();
        byte[] data = new byte[len];
        in.readFully(data);
        return new OptionReply(option, type, data);
    }

    /** Replies up to and including the final one (ACK or an error). */
    List<OptionReply> optionReplies() throws IOException {
        List<OptionReply> all = new ArrayList<>();
        OptionReply r;
        do {
            r = optionReply();
            all.add(r);
        } while (r.type() != REP_ACK && r.type() >= 0);
        return all;
    }

    static byte[] infoData(String name, int... infos) {
        byte[] n = name.getBytes(StandardCharsets.UTF_8);
        java.nio.ByteBuffer b = java.nio.ByteBuffer.allocate(4 + n.length + 2 + 2 * infos.length);
        b.putInt(n.length).put(n).putShort((short) infos.length);
        for (int i : infos) {
            b.putShort((short) i);
        }
        return b.array();
    }

    static byte[] metaData(String name, String... queries) {
        byte[] n = name.getBytes(StandardCharsets.UTF_8);
        int len = 4 + n.length + 4;
        for (String q : queries) {
            len += 4 + q.getBytes(StandardCharsets.UTF_8).length;
        }
        java.nio.ByteBuffer b = java.nio.ByteBuffer.allocate(len);
        b.putInt(n.length).put(n).putInt(queries.length);
        for (String q : queries) {
            byte[] qb = q.getBytes(StandardCharsets.UTF_8);
            b.putInt(qb.length).put(qb);
        }
        return b.array();
    }

    /** Full handshake ending in GO on {@code name}; optionally structured replies and base:allocation. */
    NbdTestClient go(String name, boolean structuredReplies, boolean baseAllocation) throws IOException {
        greet(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
        return negotiate(name, structuredReplies, baseAllocation);
    }

    /** As {@link #go} after the greeting (e.g. after STARTTLS). */
    NbdTestClient negotiate(String name, boolean structuredReplies, boolean baseAllocation) throws IOException {
        if (structuredReplies) {
            option(OPT_STRUCTURED_REPLY, new byte[0]);
            assertEquals(REP_ACK, optionReply().type());
            structured = true;
        }
        if (baseAllocation) {
            option(OPT_SET_META_CONTEXT, metaData(name, META_BASE_ALLOCATION));
            List<OptionReply> r = optionReplies();
            assertEquals(2, r.size(), "one META_CONTEXT then ACK");
            assertEquals(REP_META_CONTEXT, r.get(0).type());
        }
        option(OPT_GO, infoData(name));
        for (OptionReply r : optionReplies()) {
            if (r.type() == REP_INFO) {
                java.nio.ByteBuffer d = java.nio.ByteBuffer.wrap(r.data());
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

    void request(int flags, int type, long cookie, long offset, long length, byte[] payload) throws IOException {
        out.writeInt(REQUEST_MAGIC);
        out.writeShort(flags);
        out.writeShort(type);
        out.writeLong(cookie);
        out.writeLong(offset);
        out.writeInt((int) length);
        if (payload != null) {
            out.write(payload);
        }
        if (type == CMD_READ) {
            readLengths.put(cookie, (int) length);
        }
    }

    void flush() throws IOException {
        out.flush();
    }

    Reply reply() throws IOException {
        int magic = in.readInt();
        if (magic == SIMPLE_REPLY_MAGIC) {
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
        assertEquals(STRUCTURED_REPLY_MAGIC, magic, "reply magic");
        int flags = in.readUnsignedShort();
        int type = in.readUnsignedShort();
        long cookie = in.readLong();
        int len = in.readInt();
        byte[] payload = new byte[len];
        in.readFully(payload);
        java.nio.ByteBuffer p = java.nio.ByteBuffer.wrap(payload);
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
    Reply call(int flags, int type, long offset, long length, byte[] payload) throws IOException {
        long cookie = System.nanoTime();
        request(flags, type, cookie, offset, length, payload);
        flush();
        Reply r = reply();
        assertEquals(cookie, r.cookie(), "reply cookie");
        return r;
    }

    /** True when the server has closed the connection (EOF), false if it sent something instead. */
    boolean closedByServer() throws IOException {
        try {
            return in.read() < 0;
        } catch (EOFException | java.net.SocketException e) {
            return true;
        } catch (IOException e) {
            return e.getMessage() != null && e.getMessage().contains("reset");
        }
    }

    void disconnect() throws IOException {
        request(0, CMD_DISC, 0, 0, 0, null);
        flush();
    }

    @Override
    public void close() throws IOException {
        channel.close();
    }
}
