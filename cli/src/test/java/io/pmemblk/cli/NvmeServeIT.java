package io.pmemblk.cli;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.nvme.Nvme;
import io.pmemblk.nvme.Pdu;
import io.pmemblk.nvme.testing.RawHost;
import java.io.RandomAccessFile;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The real {@code pmemblk serve --set nvme.listen=...} driven by the nvme module's raw-socket host: it says where it
 * serves and which subsystem, a host connects (admin and I/O queue), identifies, writes in the capsule and by R2T,
 * reads back and flushes; the bytes are in the pmem file; a hostile PDU closes only its own connection; SIGTERM
 * stops it cleanly (exit 0) with the data persistent. The kernel's host against the same target: scripts/vm-test
 * nvme-tcp.
 */
class NvmeServeIT {
    @TempDir
    Path dir;

    @Test
    void aHostConnectsIdentifiesWritesReadsFlushesAndSigtermStopsCleanly() throws Exception {
        Path file = dir.resolve("nvme.img");
        int port = freeTcpPort();
        String nqn = "nqn.2026-12.io.pmemblk:serve-it";
        try (ServerProcess serve = ServerProcess.start(dir, Map.of(), ServerProcess.sets("pmem.path=" + file,
                "pmem.size=16M", "nbd.socket=", "nbd.port=0", "nvme.listen=127.0.0.1:" + port,
                "nvme.subsystem-nqn=" + nqn), 1)) {
            assertThat(serve.uris).as(serve.stdout.toString()).containsExactly("nvme-tcp 127.0.0.1:" + port + " " + nqn);
            InetSocketAddress at = new InetSocketAddress("127.0.0.1", port);
            byte[] small = new byte[4096];
            byte[] big = new byte[256 * 1024];
            Random rnd = new Random(45);
            rnd.nextBytes(small);
            rnd.nextBytes(big);
            long bigOffset;
            try (RawHost admin = new RawHost(at); RawHost io = new RawHost(at)) {
                admin.icReq(Pdu.DIGEST_HDR | Pdu.DIGEST_DATA, 0);
                int cntlid = admin.enableAdmin(nqn);
                ByteBuffer id = ByteBuffer.wrap(admin.identify(2, Nvme.CNS_CONTROLLER, 0)).order(ByteOrder.LITTLE_ENDIAN);
                assertThat(ascii(id, Nvme.IC_MN, 40)).isEqualTo("pmemblk");
                assertThat(ascii(id, Nvme.IC_SUBNQN, 256)).isEqualTo(nqn);
                ByteBuffer ns = ByteBuffer.wrap(admin.identify(3, Nvme.CNS_NAMESPACE, 1)).order(ByteOrder.LITTLE_ENDIAN);
                long blocks = ns.getLong(Nvme.IN_NSZE);
                int lbaShift = (ns.getInt(Nvme.IN_LBAF0) >> 16) & 0xFF;
                assertThat(blocks << lbaShift).as("namespace size").isEqualTo(16L << 20);

                io.icReq(Pdu.DIGEST_HDR | Pdu.DIGEST_DATA, 0);
                assertThat(io.connect(1, 1, 127, cntlid, nqn, RawHost.HOSTNQN, 0, 0).cqeStatus()).isZero();
                long smallLba = 8, bigLba = 1024;
                ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 2, smallLba, small.length >> lbaShift);
                RawHost.inCapsuleSgl(w, small.length);
                assertThat(io.command(w, small).cqeStatus()).as("in-capsule write").isZero();
                r2tWrite(io, 3, bigLba, big, lbaShift);
                assertThat(read(io, 4, bigLba, big.length, lbaShift)).isEqualTo(big);
                assertThat(read(io, 5, smallLba, small.length, lbaShift)).isEqualTo(small);
                assertThat(io.command(RawHost.sqe(Nvme.IO_FLUSH, 6, 1), null).cqeStatus()).as("flush").isZero();
                assertThat(fileBytes(file, smallLba << lbaShift, small.length)).isEqualTo(small);
                bigOffset = bigLba << lbaShift;
                assertThat(fileBytes(file, bigOffset, big.length)).isEqualTo(big);

                // A hostile PDU on a second host's queue: C2HTermReq and that connection closed, this one served
                try (RawHost bad = new RawHost(at)) {
                    bad.icReq(0, 0);
                    ByteBuffer c = bad.capsule(RawHost.sqe(Nvme.IO_FLUSH, 1, 1), null);
                    c.put(Pdu.CH_HLEN, (byte) 70);
                    bad.send(c);
                    RawHost.Received t = bad.receive();
                    assertThat(Pdu.typeName(t.type())).isEqualTo(Pdu.typeName(Pdu.C2H_TERM));
                    assertThat((int) t.header().getShort(Pdu.TERM_FES)).isEqualTo(Pdu.FES_INVALID_HEADER);
                    assertThat(bad.closedByTarget()).as("closed after C2HTermReq").isTrue();
                }
                assertThat(read(io, 7, smallLba, small.length, lbaShift)).as("still served").isEqualTo(small);
            }
            assertThat(serve.terminate()).as(serve.stderr()).isZero();
            assertThat(serve.stderr()).doesNotContain("Exception");
            assertThat(fileBytes(file, bigOffset, big.length)).as("the data after the server stopped").isEqualTo(big);
        }
    }

    static void r2tWrite(RawHost io, int cid, long slba, byte[] data, int lbaShift) throws Exception {
        ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, cid, slba, data.length >> lbaShift);
        RawHost.transportSgl(w, data.length);
        io.send(io.capsule(w, null));
        RawHost.Received r2t = io.receive();
        assertThat(Pdu.typeName(r2t.type())).isEqualTo(Pdu.typeName(Pdu.R2T));
        int ttag = r2t.header().getShort(Pdu.D_TTAG) & 0xFFFF;
        for (int off = 0; off < data.length; off += io.maxH2cData) {
            int n = Math.min(io.maxH2cData, data.length - off);
            ByteBuffer h = RawHost.le(Pdu.DATA_HLEN);
            h.put(Pdu.CH_TYPE, (byte) Pdu.H2C_DATA).putShort(Pdu.D_CCCID, (short) cid).putShort(Pdu.D_TTAG, (short) ttag)
                    .putInt(Pdu.D_OFFSET, off).putInt(Pdu.D_LENGTH, n);
            io.send(io.pdu(h, Pdu.DATA_HLEN, off + n == data.length ? Pdu.F_DATA_LAST : 0,
                    Arrays.copyOfRange(data, off, off + n)));
        }
        assertThat(io.receive().cqeStatus()).as("R2T write").isZero();
    }

    static byte[] read(RawHost io, int cid, long slba, int bytes, int lbaShift) throws Exception {
        Object[] r = io.dataCommand(RawHost.rw(Nvme.IO_READ, cid, slba, bytes >> lbaShift), bytes);
        assertThat(((RawHost.Received) r[1]).cqeStatus()).as("read").isZero();
        return (byte[]) r[0];
    }

    static byte[] fileBytes(Path file, long off, int len) throws Exception {
        try (RandomAccessFile f = new RandomAccessFile(file.toFile(), "r")) {
            byte[] b = new byte[len];
            f.seek(off);
            f.readFully(b);
            return b;
        }
    }

    static String ascii(ByteBuffer b, int at, int len) {
        byte[] v = new byte[len];
        b.get(at, v);
        return new String(v, StandardCharsets.US_ASCII).replace("\0", "").trim();
    }
}
