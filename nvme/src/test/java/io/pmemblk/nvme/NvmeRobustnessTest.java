package io.pmemblk.nvme;

import static org.junit.jupiter.api.Assertions.*;

import io.pmemblk.nvme.testing.RawHost;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.ThreadShortage;
import io.pmemblk.queueing.testing.Waits;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.Random;
import java.util.Set;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * What a target must survive besides bad PDUs: hosts that share a hardware queue and run it out of tags, sockets
 * that never finish their handshake, media errors under a command, and a host that asks for padded data PDUs.
 * Over the real pmem driver on a file (with a fault-injecting decorator for the media errors), driven by
 * {@link RawHost}.
 */
@Timeout(60)
class NvmeRobustnessTest {
    static final long SIZE = 16L << 20;
    static final String NQN = "nqn.2026-12.io.pmemblk:robust";
    static final int BLOCK = 512;

    @TempDir
    Path dir;
    PmemBlockDriver pmem;
    BlockLayer layer;
    NvmeTcpServer server;
    InetSocketAddress at;

    void start(BlockDriver driver, int hwQueues, int tags) throws IOException {
        layer = new BlockLayer(driver, hwQueues, tags, 8L << 20, 1 << 20);
        server = new NvmeTcpServer(new NvmeTcpConfig("127.0.0.1", 0, NQN, Set.of(), 2, 64, 8192, 1 << 20, 32 * 1024,
                true, true, "robust-serial"), layer, !pmem.isPmem());
        at = server.start();
    }

    PmemBlockDriver pmem() throws IOException {
        pmem = new PmemBlockDriver(PmemRegion.open(dir.resolve("pmem.img"), SIZE, false, PmemRegion.Mapper.AUTO),
                new CopyStats());
        return pmem;
    }

    @AfterEach
    void stop() throws Exception {
        Closing.closeAll(server, layer, pmem);
    }

    byte[] fileBytes(long off, int len) throws IOException {
        try (RandomAccessFile f = new RandomAccessFile(dir.resolve("pmem.img").toFile(), "r")) {
            byte[] b = new byte[len];
            f.seek(off);
            f.readFully(b);
            return b;
        }
    }

    /** Admin queue enabled and I/O queue 1 with {@code sqsize}: returns {admin, io}. */
    RawHost[] host(int digest, int hpda, int sqsize) throws IOException {
        RawHost a = new RawHost(at);
        a.icReq(digest, 0);
        int cntlid = a.enableAdmin(NQN);
        RawHost io = new RawHost(at);
        io.icReq(digest, hpda);
        assertEquals(0, io.connect(1, 1, sqsize, cntlid, NQN, RawHost.HOSTNQN, 0, 0).cqeStatus(), "I/O Connect");
        return new RawHost[] {a, io};
    }

    /**
     * A target the system makes no more threads for (ulimit -u, a cgroup's pids.max): a connection it cannot give a
     * thread is closed, and the next host is served. Once the OutOfMemoryError of Thread.start ended the accept loop,
     * and the queue stayed counted with its socket open.
     */
    @Test
    void aConnectionWithoutAThreadIsClosedAndTheListenerGoesOn() throws Exception {
        start(pmem(), 1, 64);
        server.queueThreads = new ThreadShortage().refuseFirst(3);
        for (int i = 1; i <= 3; i++) {
            String which = "connection " + i;
            try (RawHost h = new RawHost(at)) {
                assertThrows(IOException.class, () -> h.icReq(0, 0), which + " without a thread must be closed");
            }
        }
        Waits.await("the refused connections gone", () -> server.connectionCount() == 0);
        RawHost[] next = host(0, 0, 32);
        for (RawHost h : next) {
            h.close();
        }
    }

    static ByteBuffer r2tWriteCommand(int cid, long slba, int bytes) {
        ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, cid, slba, bytes / BLOCK);
        RawHost.transportSgl(w, bytes);
        return w;
    }

    static int status(int sct, int sc, boolean dnr) {
        return Nvme.status(sct, sc, dnr) & 0xFFFF;
    }

    // ------------------------------------------------------------------ tags shared by several hosts

    @Test
    void hostsSharingAHardwareQueueParkWhatFindsNoTagAndAllAreServed() throws Exception {
        start(pmem(), 1, 8); // one hardware queue of 8 tags for every host: 4 each once two submit
        RawHost[] a = host(0, 0, 63);
        RawHost[] b = host(0, 0, 63);
        RawHost[] c = host(0, 0, 63);
        try (RawHost aa = a[0]; RawHost ai = a[1]; RawHost ba = b[0]; RawHost bi = b[1]; RawHost ca = c[0];
             RawHost ci = c[1]) {
            // Host A: 16 writes by R2T at once, more than its share of tags; each R2T'd write holds its tag until
            // its data comes, and that data is behind the other commands in A's socket
            int writes = 16, bytes = 4096;
            Random rnd = new Random(451);
            byte[][] data = new byte[writes + 1][bytes];
            ByteBuffer burst = ByteBuffer.allocate(writes * (Pdu.CMD_HLEN + 4));
            for (int cid = 1; cid <= writes; cid++) {
                rnd.nextBytes(data[cid]);
                ByteBuffer cmd = ai.capsule(r2tWriteCommand(cid, cid * 64L, bytes), null);
                burst.put(cmd.position(0));
            }
            ai.send(burst.flip());
            int answered = 0;
            boolean othersChecked = false;
            while (answered < writes) {
                RawHost.Received p = ai.receive();
                if (p.type() == Pdu.R2T) {
                    int cid = p.header().getShort(Pdu.D_CCCID) & 0xFFFF;
                    int ttag = p.header().getShort(Pdu.D_TTAG) & 0xFFFF;
                    if (!othersChecked) {
                        // A holds tags waiting for data it has not sent: B and C are served meanwhile
                        for (RawHost other : new RawHost[] {bi, ci}) {
                            byte[] mine = new byte[bytes];
                            rnd.nextBytes(mine);
                            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 40, 4000, bytes / BLOCK);
                            RawHost.inCapsuleSgl(w, bytes);
                            assertEquals(0, other.command(w, mine).cqeStatus(), "another host's write while A waits");
                            assertArrayEquals(mine, NvmeTcpTargetTest.read(other, 41, 4000, bytes));
                        }
                        othersChecked = true;
                    }
                    ai.send(NvmeTcpTargetTest.h2c(ai, cid, ttag, 0, data[cid], true));
                } else {
                    assertEquals(Pdu.typeName(Pdu.RSP), Pdu.typeName(p.type()), "A gets R2Ts and answers only");
                    assertEquals(0, p.cqeStatus(), "write " + p.cqeCid());
                    answered++;
                }
            }
            for (int cid = 1; cid <= writes; cid++) {
                assertArrayEquals(data[cid], fileBytes(cid * 64L * BLOCK, bytes), "A's write " + cid + " in the file");
            }
            assertTrue(layer.queue(0).awaitIdle(5000), "every tag back");
        }
    }

    @Test
    void aHostBeyondItsSubmissionQueueIsClosedNotQueuedWithoutBound() throws Exception {
        start(pmem(), 1, 8);
        RawHost[] a = host(0, 0, 3); // a submission queue of 4 entries
        RawHost[] b = host(0, 0, 63); // a second submitter: A's fair share is 4 tags
        try (RawHost aa = a[0]; RawHost ai = a[1]; RawHost ba = b[0]; RawHost bi = b[1]) {
            // 4 writes take A's 4 tags and wait for data; 4 more park (the queue's 4 entries); the ninth is past
            // anything the host may have outstanding
            ByteBuffer burst = ByteBuffer.allocate(9 * (Pdu.CMD_HLEN + 4));
            for (int cid = 1; cid <= 9; cid++) {
                burst.put(ai.capsule(r2tWriteCommand(cid, cid * 8L, 4096), null).position(0));
            }
            ai.send(burst.flip());
            RawHost.Received p;
            do {
                p = ai.receive();
            } while (p.type() == Pdu.R2T);
            assertEquals(Pdu.typeName(Pdu.C2H_TERM), Pdu.typeName(p.type()));
            assertEquals(Pdu.FES_SEQUENCE, p.header().getShort(Pdu.TERM_FES), "FES");
            assertTrue(ai.closedByTarget(), "closed after C2HTermReq");
            assertTrue(layer.queue(0).awaitIdle(5000), "the waiting writes' tags back");
            byte[] mine = new byte[512];
            Arrays.fill(mine, (byte) 7);
            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 3, 1, 1);
            RawHost.inCapsuleSgl(w, 512);
            assertEquals(0, bi.command(w, mine).cqeStatus(), "the other host is still served");
        }
    }

    // ------------------------------------------------------------------ handshake timeout

    @Test
    void connectionsWithoutAConnectAreClosedAfterTheHandshakeTimeout() throws Exception {
        start(pmem(), 1, 32);
        server.handshakeTimeout(Duration.ofMillis(300));
        try (RawHost good = new RawHost(at); RawHost silent = new RawHost(at); RawHost cut = new RawHost(at)) {
            good.icReq(0, 0);
            good.enableAdmin(NQN);
            // cut: ICReq, then half of a CapsuleCmd (its Connect never completes)
            cut.icReq(0, 0);
            ByteBuffer half = cut.capsule(RawHost.sqe(Nvme.FABRICS, 1, 0), null);
            cut.send(half.limit(40));
            assertTrue(silent.closedByTarget(), "a socket that never sends ICReq is closed");
            assertTrue(cut.closedByTarget(), "a socket stopped mid-PDU before Connect is closed");
            // the good one is older than the timeout too, and still served: the timeout is for handshakes only
            assertEquals(0, good.command(RawHost.sqe(Nvme.ADMIN_KEEP_ALIVE, 9, 0), null).cqeStatus());
            long deadline = System.nanoTime() + Duration.ofSeconds(5).toNanos();
            while (server.connectionCount() != 1 && System.nanoTime() < deadline) {
                Thread.onSpinWait(); // the readers' teardown after the close: bounded, checked below
            }
            assertEquals(1, server.connectionCount(), "the closed connections hold no slot");
        }
        assertThrows(IllegalArgumentException.class, () -> server.handshakeTimeout(Duration.ZERO));
    }

    // ------------------------------------------------------------------ media errors

    @Test
    void mediaErrorsAnswerWriteFaultAndUnrecoveredReadError() throws Exception {
        long badFrom = 1000L * BLOCK, badTo = 1008L * BLOCK;
        MediaFaults faults = new MediaFaults(pmem(), badFrom, badTo);
        start(faults, 1, 32);
        RawHost[] h = host(0, 0, 63);
        try (RawHost a = h[0]; RawHost io = h[1]) {
            byte[] before = fileBytes(badFrom, (int) (badTo - badFrom));
            byte[] data = new byte[4096];
            Arrays.fill(data, (byte) 0x3C);
            ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, 1, 1000, 8);
            RawHost.inCapsuleSgl(w, 4096);
            assertEquals(status(Nvme.SCT_MEDIA, Nvme.SC_WRITE_FAULT, false), io.command(w, data).cqeStatus(),
                    "a write the media refused: Write Fault, retryable");
            assertArrayEquals(before, fileBytes(badFrom, (int) (badTo - badFrom)), "nothing written");
            // by R2T too
            ByteBuffer w2 = r2tWriteCommand(2, 1004, 4096);
            io.send(io.capsule(w2, null));
            RawHost.Received r2t = io.receive();
            assertEquals(Pdu.R2T, r2t.type());
            io.send(NvmeTcpTargetTest.h2c(io, 2, r2t.header().getShort(Pdu.D_TTAG) & 0xFFFF, 0, data, true));
            assertEquals(status(Nvme.SCT_MEDIA, Nvme.SC_WRITE_FAULT, false), io.receive().cqeStatus());
            // a read of a bad block: Unrecovered Read Error and no data
            Object[] r = io.dataCommand(RawHost.rw(Nvme.IO_READ, 3, 1002, 2), 1024);
            assertNull(r[0], "no C2HData for a failed read");
            assertEquals(status(Nvme.SCT_MEDIA, Nvme.SC_READ_ERROR, false), ((RawHost.Received) r[1]).cqeStatus());
            // the sticky write-back error: Flush fails as a write that did not reach the media
            faults.failFlushes = true;
            assertEquals(status(Nvme.SCT_MEDIA, Nvme.SC_WRITE_FAULT, false),
                    io.command(RawHost.sqe(Nvme.IO_FLUSH, 4, 1), null).cqeStatus());
            // the queue still serves what is good
            assertArrayEquals(fileBytes(0, 512), NvmeTcpTargetTest.read(io, 5, 0, 512));
        }
    }

    // ------------------------------------------------------------------ HPDA

    @Test
    void hpdaPadsC2hDataToTheHostsAlignment() throws Exception {
        start(pmem(), 1, 32);
        byte[] data = new byte[4096];
        new Random(3).nextBytes(data);
        // {digests, HPDA, PDO expected}: (HPDA+1)*4 bytes of alignment after the 24-byte header (+4 digest)
        int[][] cases = {{0, 0, 24}, {0, 3, 32}, {Pdu.DIGEST_HDR | Pdu.DIGEST_DATA, 3, 32}, {0, 31, 128},
                {Pdu.DIGEST_HDR, 7, 32}};
        int cid = 1;
        for (int[] c : cases) {
            RawHost[] h = host(c[0], c[1], 63);
            try (RawHost a = h[0]; RawHost io = h[1]) {
                ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, cid++, 64, 8);
                RawHost.inCapsuleSgl(w, 4096);
                assertEquals(0, io.command(w, data).cqeStatus());
                ByteBuffer rd = RawHost.rw(Nvme.IO_READ, cid++, 64, 8);
                RawHost.transportSgl(rd, 4096);
                io.send(io.capsule(rd, null));
                RawHost.Received d = io.receive();
                String what = "digests " + c[0] + " HPDA " + c[1];
                assertEquals(Pdu.C2H_DATA, d.type(), what);
                assertEquals(c[2], d.pdo(), what + ": PDO");
                int headerEnd = Pdu.DATA_HLEN + ((c[0] & Pdu.DIGEST_HDR) != 0 ? 4 : 0);
                for (int i = headerEnd; i < d.pdo(); i++) {
                    assertEquals(0, d.raw().get(i), what + ": pad byte " + i);
                }
                assertArrayEquals(data, d.data(), what + ": data after the pad");
                assertEquals(0, io.receive().cqeStatus(), what);
            }
        }
    }
}
