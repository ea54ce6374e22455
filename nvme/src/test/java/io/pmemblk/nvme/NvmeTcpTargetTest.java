package io.pmemblk.nvme;

import static org.junit.jupiter.api.Assertions.*;

import io.pmemblk.nvme.testing.RawHost;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.BlockLayer;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Random;
import java.util.Set;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/** The target in-process over the real pmem driver on a file, driven by {@link RawHost}; data checked in the file. */
@Timeout(60)
class NvmeTcpTargetTest {
    static final long SIZE = 16L << 20;
    static final String NQN = "nqn.2026-12.io.pmemblk:test";

    @TempDir
    Path dir;
    Path file;
    PmemBlockDriver driver;
    BlockLayer layer;
    NvmeTcpServer server;
    InetSocketAddress at;

    NvmeTcpConfig config(boolean digests, int depth) {
        return new NvmeTcpConfig("127.0.0.1", 0, NQN, Set.of(), 2, depth, 8192, 1 << 20, 32 * 1024, digests, digests,
                "test-serial");
    }

    @BeforeEach
    void start() throws IOException {
        file = dir.resolve("pmem.img");
        driver = new PmemBlockDriver(PmemRegion.open(file, SIZE, false, PmemRegion.Mapper.AUTO), new CopyStats());
        layer = new BlockLayer(driver, 2, 32, 8L << 20, 1 << 20);
        startServer(config(true, 64));
    }

    void startServer(NvmeTcpConfig cfg) throws IOException {
        if (server != null) {
            server.close();
        }
        server = new NvmeTcpServer(cfg, layer, !driver.isPmem());
        at = server.start();
    }

    @AfterEach
    void stop() throws IOException {
        server.close();
        layer.close();
        driver.close();
    }

    static int status(int sct, int sc, boolean dnr) {
        return Nvme.status(sct, sc, dnr) & 0xFFFF;
    }

    byte[] fileBytes(long off, int len) throws IOException {
        try (RandomAccessFile f = new RandomAccessFile(file.toFile(), "r")) {
            byte[] b = new byte[len];
            f.seek(off);
            f.readFully(b);
            return b;
        }
    }

    /** A host with admin + one I/O queue up; returns the I/O queue's host (the admin one in admin[0]). */
    RawHost ioQueue(RawHost[] admin, int digest) throws IOException {
        RawHost a = new RawHost(at);
        a.icReq(digest, 0);
        int cntlid = a.enableAdmin(NQN);
        admin[0] = a;
        RawHost io = new RawHost(at);
        io.icReq(digest, 0);
        RawHost.Received r = io.connect(1, 1, 63, cntlid, NQN, RawHost.HOSTNQN, 0, 0);
        assertEquals(0, r.cqeStatus(), "I/O Connect status");
        return io;
    }

    // ------------------------------------------------------------------ ICReq

    @Test
    void icReqNegotiatesDigestsAndMaxH2cData() throws IOException {
        try (RawHost h = new RawHost(at)) {
            RawHost.Received r = h.icReq(Pdu.DIGEST_HDR | Pdu.DIGEST_DATA, 0);
            assertTrue(h.hdgst && h.ddgst, "both digests echoed");
            assertEquals(32 * 1024, h.maxH2cData);
            assertEquals(0, h.cpda);
            assertEquals(0, r.header().getShort(Pdu.IC_PFV));
        }
        try (RawHost h = new RawHost(at)) {
            h.icReq(Pdu.DIGEST_DATA, 0);
            assertFalse(h.hdgst, "header digest not asked, not on");
            assertTrue(h.ddgst);
        }
        startServer(config(false, 64));
        try (RawHost h = new RawHost(at)) {
            h.icReq(Pdu.DIGEST_HDR | Pdu.DIGEST_DATA, 0);
            assertFalse(h.hdgst || h.ddgst, "digests refused by the configuration are not echoed");
        }
    }

    @Test
    void icReqWithUnsupportedPfvIsTerminated() throws IOException {
        try (RawHost h = new RawHost(at)) {
            ByteBuffer b = RawHost.le(Pdu.IC_HLEN);
            b.put(Pdu.CH_TYPE, (byte) Pdu.ICREQ).put(Pdu.CH_HLEN, (byte) Pdu.IC_HLEN).putInt(Pdu.CH_PLEN, Pdu.IC_HLEN)
                    .putShort(Pdu.IC_PFV, (short) 1);
            h.send(b);
            assertTerm(h, Pdu.FES_UNSUPPORTED, Pdu.IC_PFV);
        }
    }

    // ------------------------------------------------------------------ Connect, properties

    @Test
    void connectAdminAndIoQueues() throws IOException {
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            RawHost.Received c = a.connect(1, 0, 31, 0xFFFF, NQN, RawHost.HOSTNQN, 15000, 0);
            assertEquals(0, c.cqeStatus());
            int cntlid = (int) (c.cqeResult() & 0xFFFF);
            assertTrue(cntlid >= 1 && cntlid < 0xFFF0, "cntlid " + cntlid);
            RawHost.Received cap = a.propertyGet(2, Nvme.PROP_CAP, true);
            assertEquals(63, cap.cqeResult() & 0xFFFF, "CAP.MQES = depth - 1");
            assertEquals(Nvme.VERSION_1_3, a.propertyGet(3, Nvme.PROP_VS, false).cqeResult());
            assertEquals(0, a.propertyGet(4, Nvme.PROP_CSTS, false).cqeResult() & 1, "not ready before CC.EN");
            // Each property at its own size only, as nvmet: CAP is 8 bytes, VS, CC and CSTS 4; sizes 2..7 reserved.
            // Was: CAP's low half for a 4-byte read, VS, CC, CSTS and a CC write at 8 bytes, a reserved size as 4.
            int invalidField = status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true);
            assertEquals(invalidField, a.propertyGet(4, Nvme.PROP_CAP, false).cqeStatus(), "CAP read as 4 bytes");
            assertEquals(invalidField, a.propertyGet(4, Nvme.PROP_VS, true).cqeStatus(), "VS read as 8 bytes");
            assertEquals(invalidField, a.propertyGet(4, Nvme.PROP_CSTS, 2).cqeStatus(), "a reserved size");
            assertEquals(invalidField, a.propertySet(4, Nvme.PROP_CC, Nvme.CC_EN, Nvme.PROP_SIZE_8).cqeStatus(),
                    "CC written as 8 bytes");
            assertEquals(0, a.propertyGet(4, Nvme.PROP_CSTS, false).cqeResult() & 1, "the refused write changed nothing");
            // An I/O queue before CC.EN: sequence error
            try (RawHost early = new RawHost(at)) {
                early.icReq(0, 0);
                assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_CMD_SEQ_ERROR, true),
                        early.connect(1, 1, 63, cntlid, NQN, RawHost.HOSTNQN, 0, 0).cqeStatus());
            }
            assertEquals(0, a.propertySet(5, Nvme.PROP_CC, RawHost.CC_ENABLE).cqeStatus());
            assertEquals(1, a.propertyGet(6, Nvme.PROP_CSTS, false).cqeResult() & 1, "CSTS.RDY after CC.EN");

            int invalidParam = status(Nvme.SCT_COMMAND, Nvme.SC_CONNECT_INVALID_PARAM, true);
            try (RawHost io = new RawHost(at)) {
                io.icReq(0, 0);
                assertEquals(invalidParam, io.connect(1, 1, 63, cntlid, NQN, "nqn.2014-08.other:host", 0, 0).cqeStatus(),
                        "another host's NQN cannot attach to this controller");
                RawHost.Received ok = io.connect(2, 1, 63, cntlid, NQN, RawHost.HOSTNQN, 0, Nvme.CATTR_DISABLE_SQFLOW);
                assertEquals(0, ok.cqeStatus());
                assertEquals(0xFFFF, ok.sqhd(), "SQ flow control disabled: SQHD 0xFFFF");
            }
            try (RawHost io = new RawHost(at)) {
                io.icReq(0, 0);
                assertEquals(invalidParam, io.connect(1, 2, 64, cntlid, NQN, RawHost.HOSTNQN, 0, 0).cqeStatus(),
                        "SQSIZE 64 (65 entries) above MQES");
                assertEquals(invalidParam, io.connect(2, 3, 63, cntlid, NQN, RawHost.HOSTNQN, 0, 0).cqeStatus(),
                        "qid 3 beyond the 2 I/O queues");
            }
        }
        try (RawHost other = new RawHost(at)) {
            other.icReq(0, 0);
            RawHost.Received r = other.connect(1, 0, 31, 0xFFFF, "nqn.2026-12.io.pmemblk:nope", RawHost.HOSTNQN, 0, 0);
            assertEquals(status(Nvme.SCT_COMMAND, Nvme.SC_CONNECT_INVALID_PARAM, true), r.cqeStatus());
            assertEquals(Nvme.ipoData(Nvme.CD_SUBNQN), r.cqeResult(), "IATTR/IPO name the subsystem NQN");
        }
    }

    @Test
    void allowedHostsRefuseOthers() throws IOException {
        startServer(new NvmeTcpConfig("127.0.0.1", 0, NQN, Set.of("nqn.2014-08.allowed:host"), 2, 64, 8192, 1 << 20,
                32768, true, true, "s"));
        try (RawHost h = new RawHost(at)) {
            h.icReq(0, 0);
            assertEquals(status(Nvme.SCT_COMMAND, Nvme.SC_CONNECT_INVALID_HOST, true),
                    h.connect(1, 0, 31, 0xFFFF, NQN, RawHost.HOSTNQN, 0, 0).cqeStatus());
            assertEquals(0, h.connect(2, 0, 31, 0xFFFF, NQN, "nqn.2014-08.allowed:host", 0, 0).cqeStatus());
        }
    }

    // ------------------------------------------------------------------ Identify, features, discovery

    @Test
    void identifyFields() throws IOException {
        try (RawHost a = new RawHost(at)) {
            a.icReq(Pdu.DIGEST_HDR | Pdu.DIGEST_DATA, 0);
            int cntlid = a.enableAdmin(NQN);
            ByteBuffer c = ByteBuffer.wrap(a.identify(10, Nvme.CNS_CONTROLLER, 0)).order(ByteOrder.LITTLE_ENDIAN);
            assertEquals("pmemblk", ascii(c, Nvme.IC_MN, 40).trim());
            assertEquals("test-serial", ascii(c, Nvme.IC_SN, 20).trim());
            assertEquals(cntlid, c.getShort(Nvme.IC_CNTLID) & 0xFFFF);
            assertEquals(Nvme.VERSION_1_3, c.getInt(Nvme.IC_VER));
            assertEquals(NQN, ascii(c, Nvme.IC_SUBNQN, 256).trim());
            assertEquals((64 + 8192) / 16, c.getInt(Nvme.IC_IOCCSZ));
            assertEquals(1, c.getInt(Nvme.IC_IORCSZ));
            assertEquals(8, c.get(Nvme.IC_MDTS), "1 MiB = 2^8 x 4 KiB");
            assertEquals(Nvme.ONCS_DSM | Nvme.ONCS_WRITE_ZEROES, c.getShort(Nvme.IC_ONCS));
            assertEquals(driver.isPmem() ? 0 : 1, c.get(Nvme.IC_VWC), "VWC 1 on the page-cache mapping");
            assertEquals(0x100001, c.getInt(Nvme.IC_SGLS));
            assertEquals(1, c.getInt(Nvme.IC_NN));
            ByteBuffer n = ByteBuffer.wrap(a.identify(11, Nvme.CNS_NAMESPACE, 1)).order(ByteOrder.LITTLE_ENDIAN);
            assertEquals(SIZE / 512, n.getLong(Nvme.IN_NSZE));
            assertEquals(9, (n.getInt(Nvme.IN_LBAF0) >> 16) & 0xFF, "LBADS 512 bytes");
            byte[] nguid = new byte[16];
            n.get(Nvme.IN_NGUID, nguid);
            assertArrayEquals(Namespace.of(SIZE, 1, true, "test-serial").nguid(), nguid, "NGUID stable per serial");
            assertFalse(Arrays.equals(nguid, new byte[16]));
            ByteBuffer list = ByteBuffer.wrap(a.identify(12, Nvme.CNS_ACTIVE_NS_LIST, 0)).order(ByteOrder.LITTLE_ENDIAN);
            assertEquals(1, list.getInt(0));
            assertEquals(0, list.getInt(4));
            ByteBuffer d = ByteBuffer.wrap(a.identify(13, Nvme.CNS_NS_DESCRIPTORS, 1));
            assertEquals(Nvme.NIDT_EUI64, d.get(0));
            assertEquals(Nvme.NIDT_NGUID, d.get(12));
            byte[] dn = new byte[16];
            d.get(16, dn);
            assertArrayEquals(nguid, dn, "descriptor NGUID = Identify NGUID");
            // Number of Queues: granted 2 whatever was asked
            ByteBuffer sf = RawHost.sqe(Nvme.ADMIN_SET_FEATURES, 14, 0);
            sf.putInt(Nvme.SQE_CDW10, Nvme.FID_NUM_QUEUES).putInt(Nvme.SQE_CDW11, 7 | 7 << 16);
            assertEquals(1L | 1L << 16, a.command(sf, null).cqeResult());
            // An unknown admin opcode
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_OPCODE, true),
                    a.command(RawHost.sqe(0x7E, 15, 0), null).cqeStatus());
            // Abort answers "not aborted"
            RawHost.Received ab = a.command(RawHost.sqe(Nvme.ADMIN_ABORT, 16, 0), null);
            assertEquals(0, ab.cqeStatus());
            assertEquals(1, ab.cqeResult() & 1);
        }
    }

    @Test
    void activeNamespaceListStartsAfterAnUnsignedNsid() throws IOException {
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            a.enableAdmin(NQN);
            // NSID is where the list starts (namespaces above it), an unsigned 32-bit value
            ByteBuffer above = ByteBuffer.wrap(a.identify(3, Nvme.CNS_ACTIVE_NS_LIST, 0x80000000))
                    .order(ByteOrder.LITTLE_ENDIAN);
            assertEquals(0, above.getInt(0), "no namespace above 0x80000000");
            assertEquals(1, ByteBuffer.wrap(a.identify(4, Nvme.CNS_ACTIVE_NS_LIST, 0)).order(ByteOrder.LITTLE_ENDIAN)
                    .getInt(0));
            // FFFFFFFEh and FFFFFFFFh can start no list: Invalid Namespace or Format (NVMe base 1.4 5.15.2)
            int cid = 5;
            for (int nsid : new int[] {0xFFFFFFFE, 0xFFFFFFFF}) {
                ByteBuffer s = RawHost.sqe(Nvme.ADMIN_IDENTIFY, cid++, nsid);
                s.putInt(Nvme.SQE_CDW10, Nvme.CNS_ACTIVE_NS_LIST);
                Object[] r = a.dataCommand(s, 4096);
                assertNull(r[0], "no list for NSID 0x" + Integer.toHexString(nsid));
                assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_NS, true), ((RawHost.Received) r[1]).cqeStatus());
            }
        }
    }

    @Test
    void aLogPageOffsetIsUnsigned() throws IOException {
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            a.enableAdmin(NQN);
            // LPOU:LPOL is a 64-bit unsigned offset: with the top bit set it is past every page, not before it
            int cid = 3;
            for (long offset : new long[] {0xFFFF_FFFF_FFFF_FFFCL, 1L << 63}) {
                ByteBuffer s = RawHost.sqe(Nvme.ADMIN_GET_LOG_PAGE, cid++, 0xFFFFFFFF);
                s.putInt(Nvme.SQE_CDW10, Nvme.LID_SMART | (512 / 4 - 1) << 16).putLong(Nvme.SQE_CDW12, offset);
                Object[] r = a.dataCommand(s, 512);
                assertNull(r[0], "no data from offset 0x" + Long.toHexString(offset));
                assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), ((RawHost.Received) r[1]).cqeStatus(),
                        "offset 0x" + Long.toHexString(offset));
            }
            // the admin queue (and its controller) still serves
            assertEquals(0, a.command(RawHost.sqe(Nvme.ADMIN_KEEP_ALIVE, cid, 0), null).cqeStatus());
        }
    }

    /** The discovery log page as {@code hostNqn} is given it, read whole (3 KiB: the header and two entries). */
    private ByteBuffer discoveryLog(String hostNqn) throws IOException {
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            assertEquals(0, a.connect(1, 0, 31, 0xFFFF, Nvme.DISCOVERY_NQN, hostNqn, 0, 0).cqeStatus());
            assertEquals(0, a.propertySet(2, Nvme.PROP_CC, Nvme.CC_EN | 6 << 16 | 4 << 20).cqeStatus());
            ByteBuffer s = RawHost.sqe(Nvme.ADMIN_GET_LOG_PAGE, 3, 0);
            int numd = 3072 / 4 - 1;
            s.putInt(Nvme.SQE_CDW10, Nvme.LID_DISCOVERY | (numd & 0xFFFF) << 16);
            Object[] r = a.dataCommand(s, 3072);
            assertEquals(0, ((RawHost.Received) r[1]).cqeStatus());
            return ByteBuffer.wrap((byte[]) r[0]).order(ByteOrder.LITTLE_ENDIAN);
        }
    }

    @Test
    void discoveryLeavesOutTheSubsystemForAHostItRefuses() throws IOException {
        // Was: every host told the subsystem's NQN, and nvme connect-all tried it and failed.
        startServer(new NvmeTcpConfig("127.0.0.1", 0, NQN, Set.of("nqn.2014-08.allowed:host"), 2, 64, 8192, 1 << 20,
                32768, true, true, "s"));
        ByteBuffer refused = discoveryLog(RawHost.HOSTNQN);
        assertEquals(1, refused.getLong(Nvme.DISC_NUMREC));
        assertEquals(Nvme.SUBTYPE_DISCOVERY, refused.get(1024 + Nvme.DE_SUBTYPE));
        assertEquals(Nvme.DISCOVERY_NQN, ascii(refused, 1024 + 256, 256).trim());
        ByteBuffer allowed = discoveryLog("nqn.2014-08.allowed:host");
        assertEquals(2, allowed.getLong(Nvme.DISC_NUMREC));
        assertEquals(NQN, ascii(allowed, 1024 + 256, 256).trim());
    }

    @Test
    void discoveryListsTheSubsystem() throws IOException {
        ByteBuffer log = discoveryLog(RawHost.HOSTNQN);
        assertEquals(2, log.getLong(Nvme.DISC_NUMREC));
        assertEquals(Nvme.TRTYPE_TCP, log.get(1024 + Nvme.DE_TRTYPE));
        // Offsets spelled out here, not taken from Nvme: struct nvmf_disc_rsp_page_entry has SUBNQN at 256 and
        // TRADDR at 512 (the kernel host's nvme discover showed them swapped before this was fixed)
        assertEquals(NQN, ascii(log, 1024 + 256, 256).trim());
        assertEquals("127.0.0.1", ascii(log, 1024 + 512, 256).trim());
        assertEquals(Integer.toString(at.getPort()), ascii(log, 1024 + Nvme.DE_TRSVCID, 32).trim());
        assertEquals("127.0.0.1", ascii(log, 1024 + Nvme.DE_TRADDR, 256).trim());
    }

    static String ascii(ByteBuffer b, int at, int len) {
        byte[] v = new byte[len];
        b.get(at, v);
        return new String(v, StandardCharsets.US_ASCII).replace("\0", "");
    }

    // ------------------------------------------------------------------ I/O

    @Test
    void writeReadFlushZeroesDsmRoundTripsInTheFile() throws IOException {
        roundTrips(0);
    }

    @Test
    void roundTripsWithDigests() throws IOException {
        roundTrips(Pdu.DIGEST_HDR | Pdu.DIGEST_DATA);
    }

    void roundTrips(int digest) throws IOException {
        RawHost[] admin = new RawHost[1];
        try (RawHost io = ioQueue(admin, digest); RawHost a = admin[0]) {
            Random rnd = new Random(45);
            // In-capsule write (4 KiB <= 8 KiB ICD) with FUA
            byte[] small = new byte[4096];
            rnd.nextBytes(small);
            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 1, 8, 8);
            w.putInt(Nvme.SQE_CDW12, 7 | 1 << 30);
            RawHost.inCapsuleSgl(w, 4096);
            assertEquals(0, io.command(w, small).cqeStatus());
            assertArrayEquals(small, fileBytes(8 * 512, 4096), "in-capsule write in the file");
            // R2T write of 96 KiB: several H2CData PDUs of MAXH2CDATA (32 KiB)
            byte[] big = new byte[96 * 1024];
            rnd.nextBytes(big);
            r2tWrite(io, 2, 100, big);
            assertArrayEquals(big, fileBytes(100 * 512, big.length), "R2T write in the file");
            // Read back through C2HData
            assertArrayEquals(big, read(io, 3, 100, big.length));
            assertArrayEquals(small, read(io, 4, 8, 4096));
            // Flush
            assertEquals(0, io.command(RawHost.sqe(Nvme.IO_FLUSH, 5, 1), null).cqeStatus());
            // Write Zeroes over part of the big write
            ByteBuffer wz = RawHost.rw(Nvme.IO_WRITE_ZEROES, 6, 110, 16);
            assertEquals(0, io.command(wz, null).cqeStatus());
            byte[] expect = big.clone();
            Arrays.fill(expect, 10 * 512, 26 * 512, (byte) 0);
            assertArrayEquals(expect, fileBytes(100 * 512, big.length), "Write Zeroes in the file");
            // DSM deallocate of two ranges: trimmed ranges read back as zeros on this driver
            ByteBuffer dsm = RawHost.sqe(Nvme.IO_DSM, 7, 1);
            dsm.putInt(Nvme.SQE_CDW10, 1).putInt(Nvme.SQE_CDW11, 1 << 2);
            RawHost.inCapsuleSgl(dsm, 32);
            ByteBuffer ranges = RawHost.le(32);
            ranges.putInt(4, 8).putLong(8, 8).putInt(16 + 4, 4).putLong(16 + 8, 150);
            assertEquals(0, io.command(dsm, ranges.array()).cqeStatus());
            assertArrayEquals(new byte[4096], fileBytes(8 * 512, 4096), "DSM range 1 deallocated");
            Arrays.fill(expect, 50 * 512, 54 * 512, (byte) 0);
            assertArrayEquals(expect, fileBytes(100 * 512, big.length), "DSM range 2 deallocated, the rest kept");
            assertArrayEquals(expect, read(io, 8, 100, big.length));
        }
    }

    static void r2tWrite(RawHost io, int cid, long slba, byte[] data) throws IOException {
        ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, cid, slba, data.length / 512);
        RawHost.transportSgl(w, data.length);
        io.send(io.capsule(w, null));
        RawHost.Received r2t = io.receive();
        assertEquals(Pdu.R2T, r2t.type(), "R2T for a write beyond the in-capsule size");
        int ttag = r2t.header().getShort(Pdu.D_TTAG) & 0xFFFF;
        assertEquals(0, r2t.header().getInt(Pdu.D_OFFSET));
        assertEquals(data.length, r2t.header().getInt(Pdu.D_LENGTH));
        for (int off = 0; off < data.length; off += io.maxH2cData) {
            int n = Math.min(io.maxH2cData, data.length - off);
            io.send(h2c(io, cid, ttag, off, Arrays.copyOfRange(data, off, off + n), off + n == data.length));
        }
        RawHost.Received resp = io.receive();
        assertEquals(Pdu.RSP, resp.type());
        assertEquals(0, resp.cqeStatus());
    }

    static ByteBuffer h2c(RawHost io, int cid, int ttag, int off, byte[] chunk, boolean last) {
        ByteBuffer h = RawHost.le(Pdu.DATA_HLEN);
        h.put(Pdu.CH_TYPE, (byte) Pdu.H2C_DATA).putShort(Pdu.D_CCCID, (short) cid).putShort(Pdu.D_TTAG, (short) ttag)
                .putInt(Pdu.D_OFFSET, off).putInt(Pdu.D_LENGTH, chunk.length);
        return io.pdu(h, Pdu.DATA_HLEN, last ? Pdu.F_DATA_LAST : 0, chunk);
    }

    static byte[] read(RawHost io, int cid, long slba, int bytes) throws IOException {
        Object[] r = io.dataCommand(RawHost.rw(Nvme.IO_READ, cid, slba, bytes / 512), bytes);
        assertEquals(0, ((RawHost.Received) r[1]).cqeStatus(), "Read status");
        return (byte[]) r[0];
    }

    @Test
    void outOfRangeAndUnknownOpcodeGetTheirStatus() throws IOException {
        RawHost[] admin = new RawHost[1];
        try (RawHost io = ioQueue(admin, 0); RawHost a = admin[0]) {
            long blocks = SIZE / 512;
            Object[] r = io.dataCommand(RawHost.rw(Nvme.IO_READ, 1, blocks - 1, 2), 1024);
            assertNull(r[0], "no data for a refused read");
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_LBA_RANGE, true), ((RawHost.Received) r[1]).cqeStatus());
            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 2, blocks, 1);
            RawHost.inCapsuleSgl(w, 512);
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_LBA_RANGE, true), io.command(w, new byte[512]).cqeStatus());
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_OPCODE, true),
                    io.command(RawHost.sqe(0x05, 3, 1), null).cqeStatus(), "Compare is not served");
            ByteBuffer bad = RawHost.rw(Nvme.IO_WRITE, 4, 0, 2);
            RawHost.inCapsuleSgl(bad, 1024);
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true),
                    io.command(bad, new byte[512]).cqeStatus(), "in-capsule data shorter than NLB says");
            ByteBuffer wrongNs = RawHost.rw(Nvme.IO_READ, 5, 0, 1);
            wrongNs.putInt(Nvme.SQE_NSID, 2);
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_NS, true),
                    ((RawHost.Received) io.dataCommand(wrongNs, 512)[1]).cqeStatus());
            // the queue still serves
            assertArrayEquals(fileBytes(0, 512), read(io, 6, 0, 512));
        }
    }

    @Test
    void inCapsuleDataOnACommandThatTakesNoneIsRefusedAndSkipped() throws IOException {
        RawHost[] admin = new RawHost[1];
        try (RawHost io = ioQueue(admin, Pdu.DIGEST_HDR | Pdu.DIGEST_DATA); RawHost a = admin[0]) {
            // 512 zero bytes in the capsule of commands that move no data to the controller: left in the stream,
            // they would be read as the next PDU's header (a zero header is an ICReq)
            byte[] stray = new byte[512];
            ByteBuffer rd = RawHost.rw(Nvme.IO_READ, 1, 0, 1);
            RawHost.transportSgl(rd, 512);
            ByteBuffer wz = RawHost.rw(Nvme.IO_WRITE_ZEROES, 3, 0, 1);
            for (ByteBuffer sqe : new ByteBuffer[] {rd, RawHost.sqe(Nvme.IO_FLUSH, 2, 1), wz}) {
                int cid = sqe.getShort(Nvme.SQE_CID);
                RawHost.Received r = io.command(sqe, stray);
                assertEquals(Pdu.typeName(Pdu.RSP), Pdu.typeName(r.type()), "opcode " + sqe.get(0) + ": no data sent");
                assertEquals(cid, r.cqeCid());
                assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true), r.cqeStatus(),
                        "opcode " + sqe.get(0) + " with in-capsule data it does not take");
            }
            // the stream is still framed: the next command is read as one
            assertEquals(0, io.command(RawHost.sqe(Nvme.IO_FLUSH, 4, 1), null).cqeStatus());
            assertArrayEquals(fileBytes(0, 512), read(io, 5, 0, 512));
        }
    }

    @Test
    void aDsmWhoseSglDisagreesWithItsRangesDeallocatesNothing() throws IOException {
        RawHost[] admin = new RawHost[1];
        try (RawHost io = ioQueue(admin, 0); RawHost a = admin[0]) {
            byte[] data = new byte[512];
            Arrays.fill(data, (byte) 0x77);
            for (int lba : new int[] {200, 300}) {
                ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 1, lba, 1);
                RawHost.inCapsuleSgl(w, 512);
                assertEquals(0, io.command(w, data).cqeStatus());
            }
            ByteBuffer ranges = RawHost.le(32);
            ranges.putInt(4, 1).putLong(8, 200).putInt(16 + 4, 1).putLong(16 + 8, 300);
            // NR says two ranges and the capsule carries two, but the SGL describes one (16 bytes)
            ByteBuffer shortSgl = RawHost.sqe(Nvme.IO_DSM, 2, 1);
            shortSgl.putInt(Nvme.SQE_CDW10, 1).putInt(Nvme.SQE_CDW11, 1 << 2);
            RawHost.inCapsuleSgl(shortSgl, 16);
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true),
                    io.command(shortSgl, ranges.array()).cqeStatus(), "SGL length 16 for 2 ranges");
            // the SGL puts the ranges 16 bytes into the capsule's data, which holds only their 32 bytes
            ByteBuffer offsetSgl = RawHost.sqe(Nvme.IO_DSM, 3, 1);
            offsetSgl.putInt(Nvme.SQE_CDW10, 1).putInt(Nvme.SQE_CDW11, 1 << 2);
            RawHost.inCapsuleSgl(offsetSgl, 32);
            offsetSgl.putLong(Nvme.SGL_ADDR, 16);
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_OFFSET, true),
                    io.command(offsetSgl, ranges.array()).cqeStatus(), "SGL offset 16");
            assertArrayEquals(data, fileBytes(200 * 512, 512), "LBA 200 kept");
            assertArrayEquals(data, fileBytes(300 * 512, 512), "LBA 300 kept");
        }
    }

    @Test
    void aFusedCompareAndWriteIsRefusedWholeNotWrittenHalf() throws IOException {
        RawHost[] admin = new RawHost[1];
        try (RawHost io = ioQueue(admin, 0); RawHost a = admin[0]) {
            // Identify FUSES is 0, yet a host sends Compare (FUSE first) + Write (FUSE second): the Compare is not
            // served, so the Write, meant to happen only if the compare matched, must not happen either
            byte[] before = fileBytes(32 * 512, 512);
            ByteBuffer cmp = RawHost.rw(0x05, 1, 32, 1);
            RawHost.inCapsuleSgl(cmp, 512);
            cmp.put(Nvme.SQE_FLAGS, (byte) (0x40 | 1));
            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 2, 32, 1);
            RawHost.inCapsuleSgl(w, 512);
            w.put(Nvme.SQE_FLAGS, (byte) (0x40 | 2));
            byte[] data = new byte[512];
            Arrays.fill(data, (byte) 0xC5);
            assertNotEquals(0, io.command(cmp, new byte[512]).cqeStatus(), "Compare is not served");
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), io.command(w, data).cqeStatus(),
                    "the fused Write: Invalid Field (FUSE)");
            assertArrayEquals(before, fileBytes(32 * 512, 512), "the second half of a refused pair wrote nothing");
            w.put(Nvme.SQE_FLAGS, (byte) 0x40).putShort(Nvme.SQE_CID, (short) 3);
            assertEquals(0, io.command(w, data).cqeStatus(), "the same Write unfused");
            assertArrayEquals(data, fileBytes(32 * 512, 512));
        }
    }

    @Test
    void sqFlowControlDisabledReadsEndWithC2hSuccess() throws IOException {
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            int cntlid = a.enableAdmin(NQN);
            try (RawHost io = new RawHost(at)) {
                io.icReq(0, 0);
                assertEquals(0, io.connect(1, 1, 63, cntlid, NQN, RawHost.HOSTNQN, 0, Nvme.CATTR_DISABLE_SQFLOW).cqeStatus());
                ByteBuffer r = RawHost.rw(Nvme.IO_READ, 2, 0, 8);
                RawHost.transportSgl(r, 4096);
                io.send(io.capsule(r, null));
                RawHost.Received d = io.receive();
                assertEquals(Pdu.C2H_DATA, d.type());
                assertEquals(Pdu.F_DATA_LAST | Pdu.F_DATA_SUCCESS, d.flags() & (Pdu.F_DATA_LAST | Pdu.F_DATA_SUCCESS),
                        "LAST and SUCCESS on the only C2HData");
                assertArrayEquals(fileBytes(0, 4096), d.data());
                // No CapsuleResp follows: the next PDU is the answer to the next command
                RawHost.Received f = io.command(RawHost.sqe(Nvme.IO_FLUSH, 3, 1), null);
                assertEquals(Pdu.RSP, f.type());
                assertEquals(3, f.cqeCid(), "the Flush's answer, not a CapsuleResp for the read");
                assertEquals(0xFFFF, f.sqhd());
            }
        }
    }

    @Test
    void writeCacheTurnedOffIsAcceptedWhereThereIsOne() throws IOException {
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            a.enableAdmin(NQN);
            ByteBuffer sf = RawHost.sqe(Nvme.ADMIN_SET_FEATURES, 3, 0);
            sf.putInt(Nvme.SQE_CDW10, Nvme.FID_VWC).putInt(Nvme.SQE_CDW11, 0);
            ByteBuffer gf = RawHost.sqe(Nvme.ADMIN_GET_FEATURES, 4, 0);
            gf.putInt(Nvme.SQE_CDW10, Nvme.FID_VWC);
            if (driver.isPmem()) {
                assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), a.command(sf, null).cqeStatus(),
                        "no volatile write cache to turn off");
                return;
            }
            assertEquals(1, a.command(gf, null).cqeResult(), "cache on at start (VWC 1)");
            assertEquals(0, a.command(sf, null).cqeStatus(), "WCE=0 accepted: write-through, not refused");
            gf.putShort(Nvme.SQE_CID, (short) 5);
            assertEquals(0, a.command(gf, null).cqeResult());
        }
    }

    // ------------------------------------------------------------------ bad PDUs

    interface Bad {
        void send(RawHost io) throws IOException;
    }

    /** Sends a bad PDU on a fresh I/O queue: C2HTermReq with fes/fei, the connection closed, another one served. */
    RawHost.Received badPdu(int digest, int fes, int fei, Bad bad) throws IOException {
        RawHost[] admin = new RawHost[1];
        RawHost[] admin2 = new RawHost[1];
        RawHost.Received term;
        try (RawHost good = ioQueue(admin2, 0); RawHost a2 = admin2[0]) {
            try (RawHost io = ioQueue(admin, digest); RawHost a = admin[0]) {
                bad.send(io);
                term = assertTerm(io, fes, fei);
            }
            byte[] data = new byte[512];
            new Random(fes * 31 + fei).nextBytes(data);
            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 9, 3, 1);
            RawHost.inCapsuleSgl(w, 512);
            assertEquals(0, good.command(w, data).cqeStatus(), "another host is still served");
            assertArrayEquals(data, read(good, 10, 3, 512));
        }
        return term;
    }

    static RawHost.Received assertTerm(RawHost io, int fes, int fei) throws IOException {
        RawHost.Received t = io.receive();
        assertEquals(Pdu.typeName(Pdu.C2H_TERM), Pdu.typeName(t.type()));
        assertEquals(fes, t.header().getShort(Pdu.TERM_FES), "FES");
        assertEquals(fei, t.header().getInt(Pdu.TERM_FEI), "FEI");
        assertTrue(io.closedByTarget(), "the target closes after C2HTermReq");
        return t;
    }

    /** One field of a Flush capsule's header made wrong, on the capsule as the host built it. */
    interface Corrupt {
        void apply(ByteBuffer capsule);
    }

    /** The bad Flush capsules: a queue with these digests, the C2HTermReq's fes and fei, and the corruption. */
    static Stream<Arguments> badFlushCapsules() {
        return Stream.of(
                Arguments.of("badHlen", 0, Pdu.FES_INVALID_HEADER, Pdu.CH_HLEN,
                        (Corrupt) c -> c.put(Pdu.CH_HLEN, (byte) 70)),
                Arguments.of("badPlen", 0, Pdu.FES_INVALID_HEADER, Pdu.CH_PLEN,
                        (Corrupt) c -> c.putInt(Pdu.CH_PLEN, 40)),
                Arguments.of("badHeaderDigest", Pdu.DIGEST_HDR, Pdu.FES_HDR_DIGEST, 0,
                        (Corrupt) c -> c.putInt(Pdu.CMD_HLEN, c.getInt(Pdu.CMD_HLEN) ^ 1)),
                Arguments.of("unknownPduType", 0, Pdu.FES_INVALID_HEADER, Pdu.CH_TYPE,
                        (Corrupt) c -> c.put(Pdu.CH_TYPE, (byte) 0x08)));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("badFlushCapsules")
    void aFlushCapsuleWithABadHeaderIsTerminated(String name, int digest, int fes, int fei, Corrupt corrupt)
            throws IOException {
        ByteBuffer sent = ByteBuffer.allocate(Pdu.CH_SIZE);
        RawHost.Received term = badPdu(digest, fes, fei, io -> {
            ByteBuffer c = io.capsule(RawHost.sqe(Nvme.IO_FLUSH, 1, 1), null);
            corrupt.apply(c);
            sent.put(0, c, 0, Pdu.CH_SIZE);
            io.send(c);
        });
        // The C2HTermReq's data is the offending PDU's header (once: the header of the PDU before it, the Connect's)
        assertArrayEquals(sent.array(), Arrays.copyOf(term.data(), Pdu.CH_SIZE), "the offending header returned");
    }

    @Test
    void inCapsuleDataBeyondTheIcdIsRefused() throws IOException {
        badPdu(0, Pdu.FES_INVALID_HEADER, Pdu.CH_PLEN, io -> {
            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 1, 0, 32);
            RawHost.inCapsuleSgl(w, 16384);
            io.send(io.capsule(w, new byte[16384]));
        });
    }

    @Test
    void h2cDataNeverAskedFor() throws IOException {
        badPdu(0, Pdu.FES_INVALID_HEADER, Pdu.D_TTAG, io -> io.send(h2c(io, 7, 3, 0, new byte[512], true)));
    }

    @Test
    void h2cDataPastTheCommandsLength() throws IOException {
        badPdu(0, Pdu.FES_OUT_OF_RANGE, Pdu.D_LENGTH, io -> {
            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 5, 0, 32); // 16 KiB: beyond the 8 KiB ICD
            RawHost.transportSgl(w, 16384);
            io.send(io.capsule(w, null));
            RawHost.Received r2t = io.receive();
            assertEquals(Pdu.R2T, r2t.type());
            int ttag = r2t.header().getShort(Pdu.D_TTAG) & 0xFFFF;
            io.send(h2c(io, 5, ttag, 0, new byte[8192], false));
            io.send(h2c(io, 5, ttag, 8192, new byte[16384], true)); // 8 KiB past the command's 16 KiB
        });
    }

    @Test
    void badDataDigestFailsTheWriteAndLeavesTheFile() throws IOException {
        RawHost[] admin = new RawHost[1];
        try (RawHost io = ioQueue(admin, Pdu.DIGEST_DATA); RawHost a = admin[0]) {
            byte[] before = fileBytes(64 * 512, 4096);
            byte[] data = new byte[4096];
            Arrays.fill(data, (byte) 0x5A);
            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 1, 64, 8);
            RawHost.inCapsuleSgl(w, 4096);
            ByteBuffer c = io.capsule(w, data);
            c.putInt(c.limit() - 4, c.getInt(c.limit() - 4) ^ 0x100);
            io.send(c);
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_TRANSIENT_TRANSPORT, false), io.receive().cqeStatus());
            assertArrayEquals(before, fileBytes(64 * 512, 4096), "nothing of a payload with a bad digest written");
        }
    }

    // ------------------------------------------------------------------ teardown

    @Test
    void keepAliveExpiryTearsTheControllerDown() throws Exception {
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            RawHost.Received c = a.connect(1, 0, 31, 0xFFFF, NQN, RawHost.HOSTNQN, 600, 0);
            int cntlid = (int) (c.cqeResult() & 0xFFFF);
            assertEquals(0, a.propertySet(2, Nvme.PROP_CC, RawHost.CC_ENABLE).cqeStatus());
            try (RawHost io = new RawHost(at)) {
                io.icReq(0, 0);
                assertEquals(0, io.connect(1, 1, 63, cntlid, NQN, RawHost.HOSTNQN, 0, 0).cqeStatus());
                assertEquals(1, server.controllerCount());
                // no command for 600 ms: the I/O queue and the admin queue are closed by the target
                assertTrue(io.closedByTarget(), "I/O queue closed at keep-alive expiry");
                assertTrue(a.closedByTarget(), "admin queue closed at keep-alive expiry");
                assertEquals(0, server.controllerCount());
                assertTrue(layer.awaitIdle(5000), "every tag back");
            }
        }
    }

    @Test
    void closingTheAdminQueueClosesItsIoQueues() throws Exception {
        RawHost[] admin = new RawHost[1];
        try (RawHost io = ioQueue(admin, 0)) {
            admin[0].close();
            assertTrue(io.closedByTarget(), "I/O queue closed with its controller");
        }
    }
}
