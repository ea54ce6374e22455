package io.pmemblk.nvme.testing;

import io.pmemblk.nvme.Nvme;
import io.pmemblk.nvme.Pdu;
import java.io.EOFException;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.zip.CRC32C;

/**
 * A raw NVMe/TCP host for tests: builds every PDU byte by byte (so it can build wrong ones too) over a blocking
 * socket with a read timeout. Layouts from the main code's {@link Pdu} and {@link Nvme}: a test of the target
 * with the target's own constants checks the logic, not the numbers; the guest scenarios with the kernel host
 * check the numbers. Public in a package of its own (the module's test-jar): cli's serve IT drives the real
 * {@code pmemblk serve} with it.
 */
public final class RawHost implements AutoCloseable {
    public static final String HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
    /** CC as the Linux host writes it: EN, 64-byte SQEs, 16-byte CQEs (the rest 0: 4 KiB pages, NVM command set). */
    public static final int CC_ENABLE = Nvme.CC_EN | Nvme.SQE_SIZE_SHIFT << Nvme.CC_IOSQES_SHIFT
            | Nvme.CQE_SIZE_SHIFT << Nvme.CC_IOCQES_SHIFT;

    public final SocketChannel ch;
    public boolean hdgst, ddgst;
    public int maxH2cData;
    public int cpda;

    /** A received PDU: header (with digest stripped) and data; {@code raw}: the whole PDU as it came. */
    public record Received(int type, int flags, int hlen, int pdo, int plen, ByteBuffer header, byte[] data, ByteBuffer raw) {
        public int cqeStatus() {
            return header.getShort(Pdu.CH_SIZE + Nvme.CQE_STATUS) & 0xFFFF;
        }

        public long cqeResult() {
            return header.getLong(Pdu.CH_SIZE + Nvme.CQE_RESULT);
        }

        public int cqeCid() {
            return header.getShort(Pdu.CH_SIZE + Nvme.CQE_CID) & 0xFFFF;
        }

        public int sqhd() {
            return header.getShort(Pdu.CH_SIZE + Nvme.CQE_SQHD) & 0xFFFF;
        }
    }

    public RawHost(InetSocketAddress at) throws IOException {
        ch = SocketChannel.open(at);
        ch.socket().setSoTimeout(10_000); // a lost answer fails the test in 10 s, it does not hang it
    }

    private InputStream input() throws IOException {
        return ch.socket().getInputStream();
    }

    public static ByteBuffer le(int n) {
        return ByteBuffer.allocate(n).order(ByteOrder.LITTLE_ENDIAN);
    }

    public void send(ByteBuffer b) throws IOException {
        b.position(0);
        while (b.hasRemaining()) {
            ch.write(b);
        }
    }

    /** ICReq with the given digest bits and HPDA; returns the ICResp. */
    public Received icReq(int digest, int hpda) throws IOException {
        ByteBuffer b = le(Pdu.IC_HLEN);
        b.put(Pdu.CH_TYPE, (byte) Pdu.ICREQ).put(Pdu.CH_HLEN, (byte) Pdu.IC_HLEN).putInt(Pdu.CH_PLEN, Pdu.IC_HLEN);
        b.putShort(Pdu.IC_PFV, (short) 0).put(Pdu.IC_HPDA_CPDA, (byte) hpda).put(Pdu.IC_DIGEST, (byte) digest);
        send(b);
        Received r = receive();
        if (r.type() != Pdu.ICRESP) {
            throw new IOException("expected ICResp, got " + Pdu.typeName(r.type()));
        }
        int d = r.header().get(Pdu.IC_DIGEST);
        hdgst = (d & Pdu.DIGEST_HDR) != 0;
        ddgst = (d & Pdu.DIGEST_DATA) != 0;
        maxH2cData = r.header().getInt(Pdu.IC_MAXR2T_MAXDATA);
        cpda = r.header().get(Pdu.IC_HPDA_CPDA);
        return r;
    }

    public static int crc(ByteBuffer b, int from, int len) {
        CRC32C c = new CRC32C();
        c.update(b.duplicate().position(from).limit(from + len));
        return (int) c.getValue();
    }

    public static int crc(byte[] d) {
        CRC32C c = new CRC32C();
        c.update(d);
        return (int) c.getValue();
    }

    /** A PDU with header {@code hdr} (hlen bytes, common header filled except flags/pdo/plen) and data. */
    public ByteBuffer pdu(ByteBuffer hdr, int hlen, int extraFlags, byte[] data) {
        int hd = hdgst ? 4 : 0;
        boolean withData = data != null && data.length > 0;
        int dd = withData && ddgst ? 4 : 0;
        int pdo = withData ? hlen + hd : 0;
        int plen = hlen + hd + (withData ? data.length + dd : 0);
        ByteBuffer b = le(plen);
        b.put(0, hdr, 0, hlen);
        b.put(Pdu.CH_FLAGS, (byte) (extraFlags | (hdgst ? Pdu.F_HDGST : 0) | (dd != 0 ? Pdu.F_DDGST : 0)));
        b.put(Pdu.CH_HLEN, (byte) hlen).put(Pdu.CH_PDO, (byte) pdo).putInt(Pdu.CH_PLEN, plen);
        if (hd != 0) {
            b.putInt(hlen, crc(b, 0, hlen));
        }
        if (withData) {
            b.put(hlen + hd, data);
            if (dd != 0) {
                b.putInt(hlen + hd + data.length, crc(data));
            }
        }
        return b;
    }

    /** A command capsule for {@code sqe} (64 bytes) with optional in-capsule data. */
    public ByteBuffer capsule(ByteBuffer sqe, byte[] data) {
        ByteBuffer h = le(Pdu.CMD_HLEN);
        h.put(Pdu.CH_TYPE, (byte) Pdu.CMD);
        h.put(Pdu.CH_SIZE, sqe, 0, Nvme.SQE_SIZE);
        return pdu(h, Pdu.CMD_HLEN, 0, data);
    }

    public static ByteBuffer sqe(int opcode, int cid, int nsid) {
        ByteBuffer s = le(Nvme.SQE_SIZE);
        s.put(Nvme.SQE_OPCODE, (byte) opcode).put(Nvme.SQE_FLAGS, (byte) 0x40).putShort(Nvme.SQE_CID, (short) cid)
                .putInt(Nvme.SQE_NSID, nsid);
        return s;
    }

    public static void transportSgl(ByteBuffer sqe, int length) {
        sqe.putInt(Nvme.SGL_LENGTH, length).put(Nvme.SGL_TYPE, (byte) Nvme.SGL_TRANSPORT);
    }

    public static void inCapsuleSgl(ByteBuffer sqe, int length) {
        sqe.putLong(Nvme.SGL_ADDR, 0).putInt(Nvme.SGL_LENGTH, length).put(Nvme.SGL_TYPE, (byte) Nvme.SGL_INCAPSULE);
    }

    public Received receive() throws IOException {
        InputStream is = input();
        byte[] ch8 = readN(is, Pdu.CH_SIZE);
        ByteBuffer c = ByteBuffer.wrap(ch8).order(ByteOrder.LITTLE_ENDIAN);
        int type = c.get(0) & 0xFF, flags = c.get(1) & 0xFF, hlen = c.get(2) & 0xFF, pdo = c.get(3) & 0xFF;
        int plen = c.getInt(4);
        byte[] rest = readN(is, plen - Pdu.CH_SIZE);
        ByteBuffer all = le(plen);
        all.put(0, ch8).put(Pdu.CH_SIZE, rest);
        boolean digests = type != Pdu.ICRESP && type != Pdu.C2H_TERM;
        int hd = digests && (flags & Pdu.F_HDGST) != 0 ? 4 : 0;
        if (hd != 0 && all.getInt(hlen) != crc(all, 0, hlen)) {
            throw new IOException("bad header digest from the target on " + Pdu.typeName(type));
        }
        ByteBuffer header = le(hlen);
        header.put(0, all, 0, hlen);
        byte[] data;
        if (type == Pdu.C2H_TERM) {
            data = new byte[plen - hlen];
            all.get(hlen, data);
        } else if (pdo != 0) {
            int dd = (flags & Pdu.F_DDGST) != 0 ? 4 : 0;
            data = new byte[plen - pdo - dd];
            all.get(pdo, data);
            if (dd != 0 && all.getInt(plen - 4) != crc(data)) {
                throw new IOException("bad data digest from the target on " + Pdu.typeName(type));
            }
        } else {
            data = new byte[0];
        }
        return new Received(type, flags, hlen, pdo, plen, header, data, all);
    }

    private static byte[] readN(InputStream is, int n) throws IOException {
        byte[] b = is.readNBytes(n);
        if (b.length != n) {
            throw new EOFException("connection closed by the target after " + b.length + " of " + n + " bytes");
        }
        return b;
    }

    /** True when the target closed the connection (EOF) before {@code timeout}. */
    public boolean closedByTarget() throws IOException {
        try {
            return input().read() < 0;
        } catch (SocketTimeoutException e) {
            return false;
        } catch (IOException e) {
            return true; // reset
        }
    }

    /** Sends a command, expects a CapsuleResp; returns it. */
    public Received command(ByteBuffer sqe, byte[] data) throws IOException {
        send(capsule(sqe, data));
        return receive();
    }

    /** Connect (fabrics); returns the CapsuleResp. */
    public Received connect(int cid, int qid, int sqsize, int cntlid, String subnqn, String hostnqn, int kato, int cattr)
            throws IOException {
        ByteBuffer s = sqe(Nvme.FABRICS, cid, 0);
        s.put(Nvme.FCTYPE, (byte) Nvme.FCTYPE_CONNECT).putShort(Nvme.CONNECT_QID, (short) qid)
                .putShort(Nvme.CONNECT_SQSIZE, (short) sqsize).put(Nvme.CONNECT_CATTR, (byte) cattr)
                .putInt(Nvme.CONNECT_KATO, kato);
        inCapsuleSgl(s, Nvme.CONNECT_DATA_SIZE);
        ByteBuffer d = le(Nvme.CONNECT_DATA_SIZE);
        d.putShort(Nvme.CD_CNTLID, (short) cntlid);
        d.put(Nvme.CD_SUBNQN, subnqn.getBytes(StandardCharsets.US_ASCII));
        d.put(Nvme.CD_HOSTNQN, hostnqn.getBytes(StandardCharsets.US_ASCII));
        return command(s, d.array());
    }

    public Received propertySet(int cid, int offset, long value) throws IOException {
        return propertySet(cid, offset, value, Nvme.PROP_SIZE_4);
    }

    /** Property Set with ATTRIB.SIZE {@code size} (0: 4 bytes, 1: 8 bytes, the rest reserved). */
    public Received propertySet(int cid, int offset, long value, int size) throws IOException {
        ByteBuffer s = sqe(Nvme.FABRICS, cid, 0);
        s.put(Nvme.FCTYPE, (byte) Nvme.FCTYPE_PROPERTY_SET).put(Nvme.PROP_ATTRIB, (byte) size)
                .putInt(Nvme.PROP_OFFSET, offset).putLong(Nvme.PROP_VALUE, value);
        return command(s, null);
    }

    public Received propertyGet(int cid, int offset, boolean eight) throws IOException {
        return propertyGet(cid, offset, eight ? Nvme.PROP_SIZE_8 : Nvme.PROP_SIZE_4);
    }

    /** Property Get with ATTRIB.SIZE {@code size} (0: 4 bytes, 1: 8 bytes, the rest reserved). */
    public Received propertyGet(int cid, int offset, int size) throws IOException {
        ByteBuffer s = sqe(Nvme.FABRICS, cid, 0);
        s.put(Nvme.FCTYPE, (byte) Nvme.FCTYPE_PROPERTY_GET).put(Nvme.PROP_ATTRIB, (byte) size)
                .putInt(Nvme.PROP_OFFSET, offset);
        return command(s, null);
    }

    /** An admin command returning data: C2HData then CapsuleResp; returns {data, resp}. */
    public Object[] dataCommand(ByteBuffer sqe, int length) throws IOException {
        transportSgl(sqe, length);
        send(capsule(sqe, null));
        Received first = receive();
        if (first.type() == Pdu.RSP) {
            return new Object[] {null, first};
        }
        if (first.type() != Pdu.C2H_DATA) {
            throw new IOException("expected C2HData, got " + Pdu.typeName(first.type()));
        }
        if ((first.flags() & Pdu.F_DATA_SUCCESS) != 0) {
            return new Object[] {first.data(), null};
        }
        return new Object[] {first.data(), receive()};
    }

    public byte[] identify(int cid, int cns, int nsid) throws IOException {
        ByteBuffer s = sqe(Nvme.ADMIN_IDENTIFY, cid, nsid);
        s.putInt(Nvme.SQE_CDW10, cns);
        Object[] r = dataCommand(s, 4096);
        Received resp = (Received) r[1];
        if (resp.cqeStatus() != 0) {
            throw new IOException("Identify CNS " + cns + " status 0x" + Integer.toHexString(resp.cqeStatus()));
        }
        return (byte[]) r[0];
    }

    /** Admin queue up to CC.EN; returns the controller ID. */
    public int enableAdmin(String subnqn) throws IOException {
        Received r = connect(1, 0, 31, 0xFFFF, subnqn, HOSTNQN, 0, 0);
        if (r.cqeStatus() != 0) {
            throw new IOException("admin Connect status 0x" + Integer.toHexString(r.cqeStatus()));
        }
        int cntlid = (int) (r.cqeResult() & 0xFFFF);
        Received p = propertySet(2, Nvme.PROP_CC, CC_ENABLE);
        if (p.cqeStatus() != 0) {
            throw new IOException("Property Set CC status 0x" + Integer.toHexString(p.cqeStatus()));
        }
        return cntlid;
    }

    public static ByteBuffer rw(int opcode, int cid, long slba, int nlb) {
        ByteBuffer s = sqe(opcode, cid, 1);
        s.putLong(Nvme.SQE_CDW10, slba).putInt(Nvme.SQE_CDW12, nlb - 1);
        return s;
    }

    @Override
    public void close() throws IOException {
        ch.close();
    }
}
