package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;

import io.pmemblk.nbd.tls.TlsChannel;
import io.pmemblk.nbd.tls.TlsServer;
import io.pmemblk.queueing.BlockDriver;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.function.BooleanSupplier;

/**
 * Fixed-newstyle option haggling (proto.md "Option haggling", nbdkit protocol-handshake-newstyle.c).
 * Runs once per connection before transmission, so it may allocate freely; what it must not do is trust a
 * length from the client before checking it (option data is bounded by {@link #MAX_OPTION_BYTES}, the number
 * of options by {@link #MAX_OPTIONS}; the caller bounds the time).
 *
 * <p>TLS (proto.md "TLS support"): with TLS off ({@link TlsServer#off()}) STARTTLS is refused with
 * NBD_REP_ERR_POLICY; offered, a client may upgrade; required, every option before STARTTLS but ABORT gets NBD_REP_ERR_TLS_REQD and
 * EXPORT_NAME ends the session. After the upgrade haggling starts again inside TLS: what was negotiated in
 * plaintext (structured replies, metadata contexts) is forgotten, since a man in the middle could have chosen it.
 * The channel the connection goes on with is in {@link Negotiated#channel()}: the same one, or the TLS one.
 */
final class Handshake {
    /** Larger option data is refused without reading it (the largest legal option here is ~8 KiB). */
    static final int MAX_OPTION_BYTES = 64 * 1024;
    /** A client still haggling after this many options is not going anywhere. */
    static final int MAX_OPTIONS = 1024;
    static final int PREFERRED_BLOCK_SIZE = 4096;

    /** What the client ends up with. */
    record Negotiated(boolean structuredReplies, boolean baseAllocation, int transmissionFlags, SocketChannel channel,
                      java.util.List<String> bitmaps) {
        /** Whether some metadata context was selected, so that NBD_CMD_BLOCK_STATUS is allowed. */
        boolean metaContexts() {
            return baseAllocation || !bitmaps.isEmpty();
        }
    }

    /** The plain channel, then the TLS one once STARTTLS succeeded. */
    private SocketChannel channel;
    private final TlsServer tls;
    private final NbdConfig config;
    private final long exportSize;
    /** The driver's minimum block size: 1, or a BTT's sector. */
    private final int minimumBlock;
    /** From the driver's capability queries; SEND_DF joins them once structured replies are negotiated. */
    private final int exportFlags;
    private final BooleanSupplier shuttingDown;
    private boolean noZeroes;
    private boolean structured;
    private boolean baseAllocation;
    /** The dirty bitmaps offered, and those SET_META_CONTEXT selected (in the order of their context ids). */
    private final DirtyBitmapContexts offered;
    private java.util.List<String> bitmaps = java.util.List.of();

    Handshake(SocketChannel channel, TlsServer tls, NbdConfig config, BlockDriver driver, BooleanSupplier shuttingDown,
              DirtyBitmapContexts offered) {
        this.channel = channel;
        this.offered = offered;
        this.tls = tls;
        this.config = config;
        this.exportSize = driver.size();
        this.minimumBlock = driver.minimumBlockSize();
        this.exportFlags = exportFlags(driver);
        this.shuttingDown = shuttingDown;
    }

    /**
     * The transmission flags the driver's capability queries give, as nbdkit's protocol-handshake.c derives
     * them: a read-only export advertises no writing command (nor FUA, which only writes carry meaningfully),
     * FAST_ZERO needs WRITE_ZEROES. SEND_DF is not among them: it depends on the client (structured replies).
     */
    static int exportFlags(BlockDriver d) {
        int f = TFLAG_HAS_FLAGS;
        if (d.isReadOnly()) {
            f |= TFLAG_READ_ONLY;
        } else {
            f |= d.canFua() ? TFLAG_SEND_FUA : 0;
            f |= d.canTrim() ? TFLAG_SEND_TRIM : 0;
            if (d.canZero()) {
                f |= TFLAG_SEND_WRITE_ZEROES | (d.canFastZero() ? TFLAG_SEND_FAST_ZERO : 0);
            }
        }
        f |= d.canFlush() ? TFLAG_SEND_FLUSH : 0;
        f |= d.canCache() ? TFLAG_SEND_CACHE : 0;
        f |= d.isRotational() ? TFLAG_ROTATIONAL : 0;
        f |= d.canMultiConn() ? TFLAG_CAN_MULTI_CONN : 0;
        return f;
    }

    int transmissionFlags() {
        // proto.md: SEND_DF MUST be clear unless structured replies were negotiated.
        return structured ? exportFlags | TFLAG_SEND_DF : exportFlags;
    }

    /** Returns the negotiated state, or null when the client ended the session (ABORT) during haggling. */
    Negotiated run() throws IOException {
        ByteBuffer greeting = ByteBuffer.allocate(18);
        greeting.putLong(NBDMAGIC).putLong(IHAVEOPT).putShort((short) (FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES));
        writeFully(greeting.flip());

        int clientFlags = readBytes(4).getInt();
        if ((clientFlags & ~(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES)) != 0) {
            throw new NbdProtocolException("unknown client flags 0x" + Integer.toHexString(clientFlags)
                    + " (allowed: FIXED_NEWSTYLE 1, NO_ZEROES 2)");
        }
        noZeroes = (clientFlags & CLIENT_FLAG_NO_ZEROES) != 0;

        for (int options = 0; ; options++) {
            if (options == MAX_OPTIONS) {
                throw new NbdProtocolException("more than " + MAX_OPTIONS + " options without choosing an export");
            }
            ByteBuffer h = readBytes(16);
            long magic = h.getLong();
            if (magic != IHAVEOPT) {
                throw new NbdProtocolException("option magic 0x" + Long.toHexString(magic) + ", expected IHAVEOPT");
            }
            int option = h.getInt();
            long length = Integer.toUnsignedLong(h.getInt());
            if (length > MAX_OPTION_BYTES) {
                // Not reading 4 GiB to be polite: say why, then hang up (proto.md allows a hard disconnect
                // for a client whose behaviour amounts to a denial of service).
                reply(option, REP_ERR_TOO_BIG, utf8("option data of " + length + " bytes exceeds the "
                        + MAX_OPTION_BYTES + "-byte limit"));
                throw new NbdProtocolException("option " + option + " with " + length + " bytes of data (limit "
                        + MAX_OPTION_BYTES + ")");
            }
            ByteBuffer data = readBytes((int) length);

            if (option == OPT_EXPORT_NAME) {
                if (tlsRequired()) {
                    // proto.md FORCEDTLS: EXPORT_NAME cannot be refused, so the session ends.
                    throw new NbdProtocolException("NBD_OPT_EXPORT_NAME in plaintext while nbd.tls=require: a client"
                            + " must send NBD_OPT_STARTTLS first");
                }
                String name = string(data, (int) length);
                if (!exportMatches(name)) {
                    // EXPORT_NAME cannot return an error: the only answer is to terminate the session.
                    throw new NbdProtocolException("NBD_OPT_EXPORT_NAME for unknown export '" + NbdProtocol.printable(name) + "'");
                }
                ByteBuffer r = ByteBuffer.allocate(noZeroes ? 10 : 134);
                r.putLong(exportSize).putShort((short) transmissionFlags());
                writeFully(r.position(r.capacity()).flip());
                return negotiated();
            }
            if (shuttingDown.getAsBoolean() && option != OPT_ABORT) {
                reply(option, REP_ERR_SHUTDOWN, utf8("server is shutting down"));
                continue;
            }
            if (option == OPT_STARTTLS) {
                startTls(length);
                continue;
            }
            if (tlsRequired() && option != OPT_ABORT) {
                reply(option, REP_ERR_TLS_REQD, utf8("TLS is required here (nbd.tls=require): send NBD_OPT_STARTTLS"
                        + " first"));
                continue;
            }
            switch (option) {
                case OPT_ABORT -> {
                    try {
                        reply(option, REP_ACK, null);
                    } catch (IOException gone) {
                        // proto.md: a client may close right after ABORT without waiting for the ACK (libnbd does,
                        // on NBD_REP_ERR_TLS_REQD): it has ended the session as it should
                    }
                    return null;
                }
                case OPT_LIST -> {
                    if (length != 0) {
                        reply(option, REP_ERR_INVALID, utf8("NBD_OPT_LIST takes no data"));
                    } else {
                        byte[] name = utf8(config.exportName());
                        byte[] desc = utf8(config.description());
                        ByteBuffer s = ByteBuffer.allocate(4 + name.length + desc.length);
                        s.putInt(name.length).put(name).put(desc);
                        reply(option, REP_SERVER, s.array());
                        reply(option, REP_ACK, null);
                    }
                }
                case OPT_STRUCTURED_REPLY -> {
                    if (length != 0) {
                        reply(option, REP_ERR_INVALID, utf8("NBD_OPT_STRUCTURED_REPLY takes no data"));
                    } else {
                        structured = true;
                        reply(option, REP_ACK, null);
                    }
                }
                case OPT_INFO, OPT_GO -> {
                    if (infoOrGo(option, data, (int) length) && option == OPT_GO) {
                        return negotiated();
                    }
                }
                case OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT -> metaContext(option, data, (int) length);
                // EXTENDED_HEADERS and anything unknown: haggling continues.
                default -> reply(option, REP_ERR_UNSUP, utf8("option " + option + " is not supported"));
            }
        }
    }

    private Negotiated negotiated() {
        return new Negotiated(structured, structured && baseAllocation, transmissionFlags(), channel,
                structured ? bitmaps : java.util.List.of());
    }

    private boolean tlsRequired() {
        return tls.required() && !(channel instanceof TlsChannel);
    }

    /** NBD_OPT_STARTTLS: acknowledge, then the TLS handshake; a failed one ends the session (it is too late then). */
    private void startTls(long length) throws IOException {
        if (length != 0) {
            reply(OPT_STARTTLS, REP_ERR_INVALID, utf8("NBD_OPT_STARTTLS takes no data"));
        } else if (!tls.offered()) {
            reply(OPT_STARTTLS, REP_ERR_POLICY, utf8("TLS is off on this server (nbd.tls=off)"));
        } else if (channel instanceof TlsChannel) {
            reply(OPT_STARTTLS, REP_ERR_INVALID, utf8("TLS is already running on this connection"));
        } else {
            reply(OPT_STARTTLS, REP_ACK, null);
            channel = tls.start(channel);
            structured = false;
            baseAllocation = false;
            bitmaps = java.util.List.of();
        }
    }

    private boolean exportMatches(String name) {
        return name.isEmpty() || name.equals(config.exportName());
    }

    /** NBD_OPT_INFO / NBD_OPT_GO: u32 name length, name, u16 count, count x u16 info. True when acked. */
    private boolean infoOrGo(int option, ByteBuffer d, int length) throws IOException {
        if (length < 6) {
            reply(option, REP_ERR_INVALID, utf8("option data of " + length + " bytes, at least 6 needed"));
            return false;
        }
        long nameLen = Integer.toUnsignedLong(d.getInt());
        if (nameLen > length - 6) {
            reply(option, REP_ERR_INVALID, utf8("export name length " + nameLen + " overruns the option"));
            return false;
        }
        String name = string(d, (int) nameLen);
        int count = Short.toUnsignedInt(d.getShort());
        if (length != 4 + nameLen + 2 + 2L * count) {
            reply(option, REP_ERR_INVALID, utf8("option length " + length + " does not match " + count
                    + " information requests"));
            return false;
        }
        boolean wantName = false;
        boolean wantDescription = false;
        for (int i = 0; i < count; i++) {
            int info = Short.toUnsignedInt(d.getShort());
            wantName |= info == INFO_NAME;
            wantDescription |= info == INFO_DESCRIPTION;
        }
        if (!exportMatches(name)) {
            reply(option, REP_ERR_UNKNOWN, utf8("no export named '" + NbdProtocol.printable(name) + "'; this server has '"
                    + config.exportName() + "'"));
            return false;
        }
        ByteBuffer export = ByteBuffer.allocate(12);
        export.putShort((short) INFO_EXPORT).putLong(exportSize).putShort((short) transmissionFlags());
        reply(option, REP_INFO, export.array());
        if (wantName) {
            byte[] n = utf8(config.exportName());
            reply(option, REP_INFO, ByteBuffer.allocate(2 + n.length).putShort((short) INFO_NAME).put(n).array());
        }
        if (wantDescription && !config.description().isEmpty()) {
            byte[] s = utf8(config.description());
            reply(option, REP_INFO,
                    ByteBuffer.allocate(2 + s.length).putShort((short) INFO_DESCRIPTION).put(s).array());
        }
        ByteBuffer sizes = ByteBuffer.allocate(14);
        sizes.putShort((short) INFO_BLOCK_SIZE).putInt(minimumBlock).putInt(Math.max(PREFERRED_BLOCK_SIZE, minimumBlock))
                .putInt(config.maxRequestBytes());
        reply(option, REP_INFO, sizes.array());
        reply(option, REP_ACK, null);
        return true;
    }

    /**
     * NBD_OPT_LIST/SET_META_CONTEXT: u32 name length, name, u32 query count, count x (u32 length, query).
     * The contexts are base:allocation and a {@code qemu:dirty-bitmap:NAME} per bitmap offered. As QEMU's server
     * answers (nbd/server.c nbd_negotiate_meta_queries): LIST with no query, or with the namespace queries
     * {@code base:}, {@code qemu:} and {@code qemu:dirty-bitmap:}, lists what they cover; SET takes full names
     * only, and replaces what an earlier SET selected, also when it fails ("NBD_OPT_SET_META_CONTEXT": a client
     * that saw the failure believes nothing is selected). An unknown name matches nothing.
     */
    private void metaContext(int option, ByteBuffer d, int length) throws IOException {
        if (option == OPT_SET_META_CONTEXT) {
            baseAllocation = false;
            bitmaps = java.util.List.of();
        }
        if (length < 8) {
            reply(option, REP_ERR_INVALID, utf8("option data of " + length + " bytes, at least 8 needed"));
            return;
        }
        long nameLen = Integer.toUnsignedLong(d.getInt());
        if (nameLen > length - 8) {
            reply(option, REP_ERR_INVALID, utf8("export name length " + nameLen + " overruns the option"));
            return;
        }
        String name = string(d, (int) nameLen);
        long queries = Integer.toUnsignedLong(d.getInt());
        java.util.List<String> list = new java.util.ArrayList<>();
        for (long i = 0; i < queries; i++) {
            if (d.remaining() < 4) {
                reply(option, REP_ERR_INVALID, utf8("query " + i + " of " + queries + " overruns the option"));
                return;
            }
            long qlen = Integer.toUnsignedLong(d.getInt());
            if (qlen > d.remaining()) {
                reply(option, REP_ERR_INVALID, utf8("query length " + qlen + " overruns the option"));
                return;
            }
            list.add(string(d, (int) qlen));
        }
        if (d.hasRemaining()) {
            reply(option, REP_ERR_INVALID, utf8(d.remaining() + " trailing bytes after the queries"));
            return;
        }
        if (!structured) {
            reply(option, REP_ERR_INVALID, utf8("negotiate NBD_OPT_STRUCTURED_REPLY before metadata contexts"));
            return;
        }
        if (!exportMatches(name)) {
            reply(option, REP_ERR_UNKNOWN, utf8("no export named '" + NbdProtocol.printable(name) + "'"));
            return;
        }
        boolean set = option == OPT_SET_META_CONTEXT;
        boolean base = list.isEmpty() && !set; // LIST with no query lists everything; SET with none selects nothing
        java.util.List<String> names = offered.names();
        java.util.Set<String> picked = new java.util.LinkedHashSet<>(base ? names : java.util.List.of());
        for (String q : list) {
            if (q.equals(META_BASE_ALLOCATION) || (!set && q.equals("base:"))) {
                base = true;
            } else if (!set && (q.equals(META_QEMU) || q.equals(META_DIRTY_BITMAP))) {
                picked.addAll(names);
            } else if (q.startsWith(META_DIRTY_BITMAP) && names.contains(q.substring(META_DIRTY_BITMAP.length()))) {
                picked.add(q.substring(META_DIRTY_BITMAP.length()));
            }
        }
        if (set) {
            baseAllocation = base;
            bitmaps = java.util.List.copyOf(picked);
        }
        if (base) {
            metaContextReply(option, set ? META_ID_BASE_ALLOCATION : 0, META_BASE_ALLOCATION);
        }
        int id = META_ID_FIRST_BITMAP;
        for (String b : picked) {
            metaContextReply(option, set ? id++ : 0, META_DIRTY_BITMAP + b);
        }
        reply(option, REP_ACK, null);
    }

    /** NBD_REP_META_CONTEXT: u32 context id (0 when listing), the context's name. */
    private void metaContextReply(int option, int id, String context) throws IOException {
        byte[] ctx = utf8(context);
        reply(option, REP_META_CONTEXT, ByteBuffer.allocate(4 + ctx.length).putInt(id).put(ctx).array());
    }

    private void reply(int option, int type, byte[] data) throws IOException {
        if (type < 0) { // the error replies have the top bit set ("Option reply types")
            if (NbdProtocol.REFUSALS.enabled()) {
                NbdProtocol.REFUSALS.refused("refused {0}: reply 0x{1} {2}", NbdProtocol.optionName(option),
                        Integer.toHexString(type),
                        data == null ? "" : new String(data, java.nio.charset.StandardCharsets.UTF_8));
            }
        }
        int n = data == null ? 0 : data.length;
        ByteBuffer r = ByteBuffer.allocate(20 + n);
        r.putLong(OPTION_REPLY_MAGIC).putInt(option).putInt(type).putInt(n);
        if (data != null) {
            r.put(data);
        }
        writeFully(r.flip());
    }

    private ByteBuffer readBytes(int n) throws IOException {
        ByteBuffer b = ByteBuffer.allocate(n);
        while (b.hasRemaining()) {
            if (channel.read(b) < 0) {
                throw new EOFException("client closed the connection during the handshake");
            }
        }
        return b.flip();
    }

    private void writeFully(ByteBuffer b) throws IOException {
        while (b.hasRemaining()) {
            channel.write(b);
        }
    }

    private static String string(ByteBuffer b, int n) {
        byte[] s = new byte[n];
        b.get(s);
        return new String(s, StandardCharsets.UTF_8);
    }

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }
}
