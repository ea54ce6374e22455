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
 * that never finish their handshake, media errors under a command, a host that asks for padded data PDUs, one that
 * stops reading, and controller state (CC, keep-alive, command flags) held as nvmet holds it.
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

    // ------------------------------------------------------------------ the controller's state, as nvmet keeps it

    /**
     * A host that stops reading with an AER parked: its admin reader blocks writing answers the host never takes
     * (the queue's write lock held), and its keep-alive expires. The teardown once answered the parked AER first, on
     * the keep-alive timer's thread, under that lock: the timer hung there for good, and no other host's keep-alive
     * expired after it (nor did the server's close finish). Now the sockets close first, as nvmet's.
     */
    @Test
    void aHostThatStopsReadingWithAnAerParkedHoldsNoOtherHostsKeepAlive() throws Exception {
        start(pmem(), 1, 64);
        try (RawHost stuck = new RawHost(at); RawHost other = new RawHost(at)) {
            stuck.icReq(0, 0);
            assertEquals(0, stuck.connect(1, 0, 31, 0xFFFF, NQN, RawHost.HOSTNQN, 600, 0).cqeStatus());
            assertEquals(0, stuck.propertySet(2, Nvme.PROP_CC, RawHost.CC_ENABLE).cqeStatus());
            stuck.send(stuck.capsule(RawHost.sqe(Nvme.ADMIN_AER, 3, 0), null));
            // 20000 Identify answers, 80 MiB, never read: more than both sockets' buffers hold
            Thread flood = Thread.ofPlatform().start(() -> {
                try {
                    for (int i = 0; i < 20_000; i++) {
                        ByteBuffer id = RawHost.sqe(Nvme.ADMIN_IDENTIFY, 4 + i % 60_000, 0);
                        id.putInt(Nvme.SQE_CDW10, Nvme.CNS_CONTROLLER);
                        RawHost.transportSgl(id, 4096);
                        stuck.send(stuck.capsule(id, null));
                    }
                } catch (IOException e) {
                    // the target closed the connection at the keep-alive expiry: what the test waits for
                }
            });
            Waits.await("the stuck host's controller expired", () -> server.controllerCount() == 0);
            other.icReq(0, 0);
            assertEquals(0, other.connect(1, 0, 31, 0xFFFF, NQN, RawHost.HOSTNQN, 600, 0).cqeStatus());
            assertTrue(other.closedByTarget(), "the next host's keep-alive expires too: the timer is not held");
            flood.join(10_000);
            assertFalse(flood.isAlive(), "the stuck host's connection closed by the target");
        }
    }

    /** A discovery controller whose host asks for no keep-alive (KATO 0) gets nvmet's 120 s, not none. */
    @Test
    void aDiscoveryControllerWithoutKeepAliveStillExpires() throws Exception {
        start(pmem(), 1, 64);
        try (RawHost d = new RawHost(at)) {
            d.icReq(0, 0);
            RawHost.Received c = d.connect(1, 0, 31, 0xFFFF, Nvme.DISCOVERY_NQN, RawHost.HOSTNQN, 0, 0);
            assertEquals(0, c.cqeStatus());
            Controller ctrl = server.controller((int) (c.cqeResult() & 0xFFFF));
            assertEquals(120_000, ctrl.katoMillis, "a discovery controller's KATO 0");
            ByteBuffer kato = RawHost.sqe(Nvme.ADMIN_SET_FEATURES, 2, 0);
            kato.putInt(Nvme.SQE_CDW10, Nvme.FID_KATO).putInt(Nvme.SQE_CDW11, 0);
            assertEquals(0, d.propertySet(3, Nvme.PROP_CC, Nvme.CC_EN).cqeStatus()); // a discovery CC, no sizes
            assertEquals(0, d.command(kato, null).cqeStatus());
            assertEquals(120_000, ctrl.katoMillis, "nor set to 0 by Set Features");
        }
    }

    /**
     * CC as nvmet_update_cc takes it: an enable with entry sizes other than 64/16 bytes sets CSTS.CFS, not RDY;
     * a shutdown persists, reports SHST complete and disables the controller, so a command after it gets Command
     * Sequence Error instead of being taken after "shutdown complete"; the next enable clears SHST.
     */
    @Test
    void ccIsCheckedAndAShutdownDisablesTheController() throws Exception {
        start(pmem(), 1, 64);
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            assertEquals(0, a.connect(1, 0, 31, 0xFFFF, NQN, RawHost.HOSTNQN, 0, 0).cqeStatus());
            assertEquals(0, a.propertySet(2, Nvme.PROP_CC, Nvme.CC_EN).cqeStatus(), "IOSQES/IOCQES 0");
            assertEquals(Nvme.CSTS_CFS, a.propertyGet(3, Nvme.PROP_CSTS, false).cqeResult(), "CFS, not RDY");
            assertEquals(0, a.propertySet(4, Nvme.PROP_CC, 0).cqeStatus());
            assertEquals(0, a.propertySet(5, Nvme.PROP_CC, RawHost.CC_ENABLE).cqeStatus());
            assertEquals(Nvme.CSTS_RDY, a.propertyGet(6, Nvme.PROP_CSTS, false).cqeResult());
            assertEquals(0, a.propertySet(7, Nvme.PROP_CC, RawHost.CC_ENABLE | 1 << Nvme.CC_SHN_SHIFT).cqeStatus());
            assertEquals(Nvme.CSTS_SHST_COMPLETE, a.propertyGet(8, Nvme.PROP_CSTS, false).cqeResult(),
                    "shutdown complete, no longer ready");
            assertEquals(0, a.propertyGet(9, Nvme.PROP_CC, false).cqeResult(), "CC cleared");
            ByteBuffer id = RawHost.sqe(Nvme.ADMIN_IDENTIFY, 10, 0);
            id.putInt(Nvme.SQE_CDW10, Nvme.CNS_CONTROLLER);
            RawHost.Received after = (RawHost.Received) a.dataCommand(id, 4096)[1];
            assertEquals(status(Nvme.SCT_GENERIC, Nvme.SC_CMD_SEQ_ERROR, true), after.cqeStatus(),
                    "a command after the shutdown");
            assertEquals(0, a.propertySet(11, Nvme.PROP_CC, RawHost.CC_ENABLE).cqeStatus());
            assertEquals(Nvme.CSTS_RDY, a.propertyGet(12, Nvme.PROP_CSTS, false).cqeResult(),
                    "enabled again: ready, SHST cleared");
            id.putShort(Nvme.SQE_CID, (short) 13);
            assertEquals(0, ((RawHost.Received) a.dataCommand(id, 4096)[1]).cqeStatus(), "and serving");
        }
    }

    /**
     * As nvmet_req_init, for admin and fabrics commands as for I/O: a fused command, or data described by PRPs
     * (PSDT 00) instead of an SGL, is Invalid Field; Number of Queues asking for 65536 is Invalid Field.
     */
    @Test
    void fusedPrpAndImpossibleQueueCountsAreInvalidField() throws Exception {
        start(pmem(), 1, 64);
        int invalidField = status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true);
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            a.enableAdmin(NQN);
            ByteBuffer prp = RawHost.sqe(Nvme.ADMIN_IDENTIFY, 3, 0);
            prp.put(Nvme.SQE_FLAGS, (byte) 0).putInt(Nvme.SQE_CDW10, Nvme.CNS_CONTROLLER);
            assertEquals(invalidField, ((RawHost.Received) a.dataCommand(prp, 4096)[1]).cqeStatus(), "PSDT 00");
            ByteBuffer fused = RawHost.sqe(Nvme.ADMIN_KEEP_ALIVE, 4, 0);
            fused.put(Nvme.SQE_FLAGS, (byte) (Nvme.PSDT_SGL | 1));
            assertEquals(invalidField, a.command(fused, null).cqeStatus(), "a fused admin command");
            ByteBuffer fusedGet = RawHost.sqe(Nvme.FABRICS, 5, 0);
            fusedGet.put(Nvme.SQE_FLAGS, (byte) (Nvme.PSDT_SGL | 2)).put(Nvme.FCTYPE, (byte) Nvme.FCTYPE_PROPERTY_GET)
                    .putInt(Nvme.PROP_OFFSET, Nvme.PROP_CSTS);
            assertEquals(invalidField, a.command(fusedGet, null).cqeStatus(), "a fused fabrics command");
            for (int cdw11 : new int[] {0xFFFF, 0xFFFF << 16}) {
                ByteBuffer nq = RawHost.sqe(Nvme.ADMIN_SET_FEATURES, 6, 0);
                nq.putInt(Nvme.SQE_CDW10, Nvme.FID_NUM_QUEUES).putInt(Nvme.SQE_CDW11, cdw11);
                assertEquals(invalidField, a.command(nq, null).cqeStatus(), "Number of Queues 0x" + Integer.toHexString(cdw11));
            }
            ByteBuffer nq = RawHost.sqe(Nvme.ADMIN_SET_FEATURES, 7, 0);
            nq.putInt(Nvme.SQE_CDW10, Nvme.FID_NUM_QUEUES).putInt(Nvme.SQE_CDW11, 0x00070007);
            RawHost.Received granted = a.command(nq, null);
            assertEquals(0, granted.cqeStatus());
            assertEquals(0x00010001, granted.cqeResult(), "what the target has: 2 I/O queues, 0's based");
        }
    }
}
