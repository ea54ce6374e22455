package io.pmemblk.nvme;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.util.zip.CRC32C;

/**
 * The receive side of one connection: frames PDUs out of the byte stream and checks each header strictly
 * against its type and what ICReq negotiated (NVMe/TCP 1.0 3.6.1 common header, 3.6.2 per type, 3.6.1.x digests)
 * before anything acts on it. A violation is a {@link PduException} with the FES and FEI the specification names.
 *
 * <p>Bytes come through one receive buffer; data may go straight into a caller's buffers (a WRITE's request
 * buffers, the device itself) without passing through it. Before each read from the socket that may block,
 * {@link #idle} runs: the queue dispatches the commands it gathered from the bytes it had, so a batch is what one
 * drain of the socket gave. Nothing is allocated per PDU.
 */
final class PduReader {
    private final SocketChannel channel;
    private final Runnable idle;
    private final ByteBuffer rx = ByteBuffer.allocateDirect(64 * 1024).order(ByteOrder.LITTLE_ENDIAN);
    /** The current PDU's header (and its digest), copied out of rx: field reads by absolute offset. */
    final ByteBuffer header = ByteBuffer.allocate(Pdu.MAX_HOST_HEADER).order(ByteOrder.LITTLE_ENDIAN);
    /** The SQE of a CapsuleCmd in {@link #header}: a view made once, so a command costs no allocation. */
    final ByteBuffer sqe = header.slice(Pdu.CH_SIZE, Nvme.SQE_SIZE).order(ByteOrder.LITTLE_ENDIAN);
    private final CRC32C crc = new CRC32C();

    /** Negotiated by ICReq. */
    private boolean connected;
    boolean hdgst, ddgst;
    /** The largest in-capsule data accepted now (admin 8 KiB, I/O the configured size; before Connect the larger). */
    int maxInCapsule;
    int maxH2cData;

    // The current PDU
    int type, flags, hlen, pdo, plen;
    /** Data bytes the PDU carries (without padding or digest); its data digest follows them when {@link #dataDigest}. */
    int dataLength;
    boolean dataDigest;

    PduReader(SocketChannel channel, Runnable idle) {
        this.channel = channel;
        this.idle = idle;
        rx.flip(); // read mode, empty
    }

    void negotiated(boolean hdgst, boolean ddgst) {
        this.connected = true;
        this.hdgst = hdgst;
        this.ddgst = ddgst;
    }

    /**
     * Reads and checks the next PDU's header; the data (if any) is left for {@link #readData}/{@link #skipData}.
     * When the header fails a check, {@link #header} holds what of it has arrived (up to its HLEN), for the
     * C2HTermReq to return to the host as the offending header, not the PDU's before it.
     */
    int next() throws IOException, PduException {
        ensure(Pdu.CH_SIZE);
        int p = rx.position();
        try {
            return take(p);
        } catch (PduException e) {
            if (rx.position() == p) { // failed before the header was taken
                int n = Math.min(rx.remaining(), Math.min(Math.max(hlen, Pdu.CH_SIZE), header.capacity()));
                header.clear();
                header.put(0, rx, p, n);
                header.limit(n);
            }
            throw e;
        }
    }

    private int take(int p) throws IOException, PduException {
        type = rx.get(p + Pdu.CH_TYPE) & 0xFF;
        flags = rx.get(p + Pdu.CH_FLAGS) & 0xFF;
        hlen = rx.get(p + Pdu.CH_HLEN) & 0xFF;
        pdo = rx.get(p + Pdu.CH_PDO) & 0xFF;
        long plenU = rx.getInt(p + Pdu.CH_PLEN) & 0xFFFFFFFFL;
        int expectedHlen;
        switch (type) {
            case Pdu.ICREQ -> {
                if (connected) {
                    throw new PduException(Pdu.FES_SEQUENCE, Pdu.CH_TYPE, "ICReq after the connection was initialized");
                }
                expectedHlen = Pdu.IC_HLEN;
            }
            case Pdu.CMD, Pdu.H2C_DATA, Pdu.H2C_TERM -> {
                if (!connected) {
                    throw new PduException(Pdu.FES_SEQUENCE, Pdu.CH_TYPE, Pdu.typeName(type) + " before ICReq");
                }
                expectedHlen = type == Pdu.CMD ? Pdu.CMD_HLEN : type == Pdu.H2C_DATA ? Pdu.DATA_HLEN : Pdu.TERM_HLEN;
            }
            default -> throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_TYPE,
                    "PDU type 0x" + Integer.toHexString(type) + ": a controller receives ICReq, CapsuleCmd, H2CData, H2CTermReq");
        }
        if (hlen != expectedHlen) {
            throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_HLEN, Pdu.typeName(type) + " HLEN " + hlen
                    + ": must be " + expectedHlen);
        }
        // ICReq and the TermReqs never carry digests (3.6.2.2, 3.6.2.9); every other PDU carries what was negotiated.
        boolean digests = type == Pdu.CMD || type == Pdu.H2C_DATA;
        int hd = digests && hdgst ? Pdu.DIGEST : 0;
        if (digests && ((flags & Pdu.F_HDGST) != 0) != hdgst) {
            throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_FLAGS, Pdu.typeName(type) + " HDGST flag "
                    + ((flags & Pdu.F_HDGST) != 0) + " but the header digest was negotiated " + hdgst);
        }
        int headerEnd = hlen + hd;
        if (plenU < headerEnd) {
            throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_PLEN, Pdu.typeName(type) + " PLEN " + plenU
                    + " is shorter than its header (" + headerEnd + ")");
        }
        dataDigest = false;
        switch (type) {
            case Pdu.ICREQ -> {
                if (plenU != Pdu.IC_HLEN) {
                    throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_PLEN, "ICReq PLEN " + plenU + ": must be 128");
                }
                if (pdo != 0) {
                    throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_PDO, "ICReq PDO " + pdo + ": must be 0");
                }
                dataLength = 0;
            }
            case Pdu.H2C_TERM -> {
                if (plenU > Pdu.TERM_HLEN + Pdu.TERM_MAX_DATA) {
                    throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_PLEN, "H2CTermReq PLEN " + plenU
                            + ": at most " + (Pdu.TERM_HLEN + Pdu.TERM_MAX_DATA));
                }
                dataLength = (int) plenU - Pdu.TERM_HLEN;
            }
            default -> { // CMD, H2C_DATA
                if (plenU == headerEnd) {
                    if (type == Pdu.H2C_DATA) {
                        throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_PLEN, "H2CData without data");
                    }
                    if (pdo != 0 && pdo != headerEnd) {
                        throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_PDO, Pdu.typeName(type) + " PDO " + pdo
                                + " without data: must be 0");
                    }
                    if ((flags & Pdu.F_DDGST) != 0) {
                        throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_FLAGS, "DDGST flag on a PDU without data");
                    }
                    dataLength = 0;
                } else {
                    // CPDA is 0: data starts right after the header (and its digest)
                    if (pdo != headerEnd) {
                        throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_PDO, Pdu.typeName(type) + " PDO " + pdo
                                + ": must be " + headerEnd + " (CPDA 0)");
                    }
                    if (((flags & Pdu.F_DDGST) != 0) != ddgst) {
                        throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_FLAGS, Pdu.typeName(type) + " DDGST flag "
                                + ((flags & Pdu.F_DDGST) != 0) + " but the data digest was negotiated " + ddgst);
                    }
                    dataDigest = ddgst;
                    long data = plenU - headerEnd - (ddgst ? Pdu.DIGEST : 0);
                    long limit = type == Pdu.CMD ? maxInCapsule : maxH2cData;
                    if (data <= 0 || data > limit) {
                        throw new PduException(type == Pdu.CMD ? Pdu.FES_INVALID_HEADER : Pdu.FES_LIMIT_EXCEEDED,
                                Pdu.CH_PLEN, Pdu.typeName(type) + " PLEN " + plenU + " carries " + data
                                + " data bytes: allowed 1.." + limit);
                    }
                    dataLength = (int) data;
                }
            }
        }
        plen = (int) plenU;
        ensure(headerEnd);
        header.clear();
        header.put(0, rx, rx.position(), headerEnd);
        header.limit(headerEnd);
        rx.position(rx.position() + headerEnd);
        if (hd != 0) {
            crc.reset();
            crc.update(header.array(), header.arrayOffset(), hlen);
            int want = header.getInt(hlen);
            if ((int) crc.getValue() != want) {
                throw new PduException(Pdu.FES_HDR_DIGEST, 0, Pdu.typeName(type) + " header digest 0x"
                        + Integer.toHexString(want) + ", computed 0x" + Integer.toHexString((int) crc.getValue()));
            }
        }
        return type;
    }

    /**
     * Reads {@code length} data bytes into {@code buffers[0..count)} starting at byte {@code at} of their
     * concatenation, folding them into {@code digest} when it is not null. Buffers' positions and limits are
     * changed.
     */
    void readData(java.nio.ByteBuffer[] buffers, int count, long at, int length, CRC32C digest) throws IOException {
        long skip = at;
        int left = length;
        for (int i = 0; i < count && left > 0; i++) {
            ByteBuffer b = buffers[i];
            int cap = b.limit();
            // The buffers come positioned at their data's start: skip whole ones, then part of one
            int start = b.position();
            int size = cap - start;
            if (skip >= size) {
                skip -= size;
                continue;
            }
            int from = start + (int) skip;
            skip = 0;
            int n = Math.min(left, cap - from);
            b.limit(from + n).position(from);
            fill(b);
            if (digest != null) {
                digest.update(b.flip().position(from));
            }
            b.limit(cap).position(start);
            left -= n;
        }
        if (left > 0) {
            throw new IllegalStateException(left + " data bytes do not fit the request's buffers");
        }
    }

    /** Reads {@code length} bytes into {@code dst} at its position (heap scratch: Connect data, DSM ranges). */
    void readData(ByteBuffer dst, int length, CRC32C digest) throws IOException {
        int from = dst.position();
        dst.limit(from + length);
        fill(dst);
        if (digest != null) {
            digest.update(dst.duplicate().flip().position(from));
        }
    }

    /** The data digest that follows the data just read. */
    int readDigest() throws IOException {
        ensure(Pdu.DIGEST);
        int d = rx.getInt(rx.position());
        rx.position(rx.position() + Pdu.DIGEST);
        return d;
    }

    /** Discards the current PDU's data and its digest. */
    void skipData() throws IOException {
        long left = dataLength + (dataDigest ? Pdu.DIGEST : 0);
        while (left > 0) {
            if (!rx.hasRemaining()) {
                refill();
            }
            int n = (int) Math.min(left, rx.remaining());
            rx.position(rx.position() + n);
            left -= n;
        }
    }

    private void fill(ByteBuffer dst) throws IOException {
        if (rx.hasRemaining()) {
            int n = Math.min(rx.remaining(), dst.remaining());
            dst.put(dst.position(), rx, rx.position(), n);
            dst.position(dst.position() + n);
            rx.position(rx.position() + n);
        }
        while (dst.hasRemaining()) {
            idle.run();
            if (channel.read(dst) < 0) {
                throw new EOFException("the host closed the connection within a PDU's data");
            }
        }
    }

    private void ensure(int n) throws IOException {
        while (rx.remaining() < n) {
            refill();
        }
    }

    private void refill() throws IOException {
        idle.run(); // the read below may block: what was gathered goes to the driver first
        rx.compact();
        int n = channel.read(rx);
        rx.flip();
        if (n < 0) {
            throw new EOFException("the host closed the connection");
        }
    }
}
