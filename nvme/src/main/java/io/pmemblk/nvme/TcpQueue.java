package io.pmemblk.nvme;

import io.pmemblk.queueing.HardwareQueue;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.util.concurrent.locks.ReentrantLock;
import java.util.zip.CRC32C;

/**
 * One NVMe/TCP connection: one queue pair (NVMe/TCP 1.0 2.1: a connection carries exactly one queue). Its reader
 * thread ({@code nvme-q-N-rx}) runs ICReq, Connect, then the admin commands (admin queue) or hands the I/O
 * commands to its {@link IoQueue}, which submits them to one hardware queue of the block layer as an NBD
 * connection does; the I/O queue's sender thread ({@link IoAnswers}) answers them. Control PDUs (ICResp, R2T,
 * admin answers, C2HTermReq) are written by the reader under the same lock as the sender's answers.
 *
 * <p>A fatal transport error (a bad PDU) answers C2HTermReq and closes this connection only: other connections,
 * even of the same controller, go on (the host resets the association itself).
 */
final class TcpQueue {
    private static final System.Logger LOG = System.getLogger(TcpQueue.class.getName());
    /** How long a closing queue waits for the driver to complete what it holds (the server's own close waits 10 s). */
    private static final long SENDER_DRAIN_MILLIS = 10_000;

    final NvmeTcpServer server;
    final SocketChannel channel;
    final int id;
    final String peer;
    private final PduReader in;
    private final Thread reader;
    /** When the connection was accepted: it must have a controller within the server's handshake timeout. */
    final long acceptedNanos = System.nanoTime();
    final ReentrantLock writeLock = new ReentrantLock();
    /** Control PDUs the reader (or a teardown) writes under writeLock. */
    private final ByteBuffer ctl = ByteBuffer.allocateDirect(Pdu.IC_HLEN + Pdu.TERM_MAX_DATA + Pdu.DIGEST)
            .order(ByteOrder.LITTLE_ENDIAN);
    private final CRC32C ctlCrc = new CRC32C();
    private final CRC32C rxCrc = new CRC32C();
    /** Connect's data. */
    private final ByteBuffer scratch = ByteBuffer.allocate(Nvme.CONNECT_DATA_SIZE).order(ByteOrder.LITTLE_ENDIAN);
    /**
     * The host NQN and host ID of this queue's Connect, copied whole: a Connect allocates nothing to read them. An
     * admin queue's become its controller's (set once: a queue takes one Connect).
     */
    private final byte[] hostNqn = new byte[Nvme.NQN_FIELD];
    private final byte[] hostId = new byte[Nvme.HOST_ID_SIZE];
    /** An admin command's C2HData header and data digest, and zeros for a log read past its page's end. */
    private final ByteBuffer dataHead = ByteBuffer.allocateDirect(Pdu.DATA_HLEN + Pdu.DIGEST + 128)
            .order(ByteOrder.LITTLE_ENDIAN);
    private final ByteBuffer dataDigest = ByteBuffer.allocateDirect(Pdu.DIGEST).order(ByteOrder.LITTLE_ENDIAN);
    private final ByteBuffer zeros = ByteBuffer.allocateDirect(4096);
    private final CRC32C dataCrc = new CRC32C();
    private volatile boolean closed;

    // Negotiated at ICReq
    boolean hdgst, ddgst;
    int c2hPdo;

    // Set by Connect
    private volatile Controller controller;
    int qid = -1;
    private int sqSize;
    boolean sqFlowOff;
    volatile int sqHead;

    /** I/O queues only: the NVM command set on the queue's hardware queue. */
    private IoQueue io;
    private final long[] result = new long[1];

    TcpQueue(NvmeTcpServer server, SocketChannel channel, int id, String peer) {
        this.server = server;
        this.channel = channel;
        this.id = id;
        this.peer = peer;
        this.in = new PduReader(channel, this::dispatch);
        this.in.maxInCapsule = server.config.inCapsuleBeforeConnect();
        this.in.maxH2cData = server.config.maxH2cData();
        this.reader = server.queueThreads.newThread(this::readerMain);
        reader.setName("nvme-q-" + id + "-rx");
    }

    void start() {
        reader.start();
    }

    void join(long millis) throws InterruptedException {
        reader.join(Math.max(1, millis));
        IoQueue q = io;
        if (q != null) {
            q.answers.join(millis);
        }
    }

    boolean isClosed() {
        return closed;
    }

    Controller controller() {
        return controller;
    }

    /** True once Connect made this an admin or I/O queue of a controller. */
    boolean connected() {
        return controller != null;
    }

    /** Parked commands of this I/O queue (0 on an admin queue or before Connect): for tests. */
    int parkedCount() {
        IoQueue q = io;
        return q == null ? 0 : q.parkedCount();
    }

    /** Closes the socket: the reader's read fails and it tears the queue down. Idempotent, any thread. */
    void close() {
        closed = true;
        try {
            channel.close();
        } catch (IOException e) {
            // closing: nothing left to tell the host
        }
    }

    // ------------------------------------------------------------------ reader

    private void readerMain() {
        String end = "closed";
        try {
            while (!closed) {
                if (io != null) {
                    io.resumeParked();
                }
                int type = in.next();
                switch (type) {
                    case Pdu.ICREQ -> icReq();
                    case Pdu.CMD -> command();
                    case Pdu.H2C_DATA -> {
                        if (io == null) {
                            throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.D_TTAG, "H2CData on a queue that"
                                    + " is no I/O queue (no R2T outstanding)");
                        }
                        io.h2cData();
                    }
                    case Pdu.H2C_TERM -> {
                        end = "H2CTermReq FES " + in.header.getShort(Pdu.TERM_FES);
                        return;
                    }
                    default -> throw new AssertionError(type); // PduReader admits only the four above
                }
            }
        } catch (PduException e) {
            end = "fatal transport error: " + e.getMessage();
            LOG.log(System.Logger.Level.WARNING, "nvme: queue {0} from {1}: {2}; C2HTermReq FES {3} FEI {4}",
                    id, peer, e.getMessage(), e.fes, e.fei);
            terminate(e.fes, e.fei);
        } catch (EOFException e) {
            end = e.getMessage();
        } catch (IOException e) {
            end = closed ? "closed" : "I/O error: " + e;
        } catch (InterruptedException e) {
            end = "interrupted";
        } catch (RuntimeException e) {
            end = "internal error: " + e;
            LOG.log(System.Logger.Level.ERROR, "nvme: queue " + id + " from " + peer, e);
        } finally {
            teardown(end);
        }
    }

    private void teardown(String why) {
        close();
        if (io != null) {
            io.teardown();
        }
        Controller c = controller;
        if (c != null) {
            if (qid == 0) {
                c.teardown("admin queue " + why); // its I/O queues go with it
            } else {
                c.detach(qid, this);
            }
        }
        if (io != null) {
            // The queue leaves the server's set only when its sender has answered (or dropped) and released every
            // request it holds: the server's close joins the queues in the set, and the device must not be closed
            // under a request that still views it
            try {
                io.answers.join(SENDER_DRAIN_MILLIS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        server.removed(this);
        LOG.log(System.Logger.Level.DEBUG, "nvme: queue {0} (qid {1}) from {2} ended: {3}", id, qid, peer, why);
    }

    /** Before a read that may block: the batch gathered so far goes to the driver in one call. */
    private void dispatch() {
        if (io != null) {
            io.dispatch();
        }
    }

    private void icReq() throws IOException, PduException {
        ByteBuffer h = in.header;
        int pfv = h.getShort(Pdu.IC_PFV) & 0xFFFF;
        int hpda = h.get(Pdu.IC_HPDA_CPDA) & 0xFF;
        int digest = h.get(Pdu.IC_DIGEST) & 0xFF;
        if (pfv != Pdu.PFV_1_0) {
            throw new PduException(Pdu.FES_UNSUPPORTED, Pdu.IC_PFV, "ICReq PFV " + pfv + ": only 0 (NVMe/TCP 1.0)");
        }
        if (hpda > Pdu.MAX_HPDA) {
            throw new PduException(Pdu.FES_UNSUPPORTED, Pdu.IC_HPDA_CPDA, "ICReq HPDA " + hpda + ": at most 31");
        }
        // Digests: on when the host asks and the configuration allows (an ICResp echoing a bit we refuse
        // leaves it off, and the host gives up if it required it: nvme_tcp_init_connection compares them)
        hdgst = (digest & Pdu.DIGEST_HDR) != 0 && server.config.headerDigest();
        ddgst = (digest & Pdu.DIGEST_DATA) != 0 && server.config.dataDigest();
        int align = (hpda + 1) * 4;
        int hd = hdgst ? Pdu.DIGEST : 0;
        c2hPdo = (Pdu.DATA_HLEN + hd + align - 1) / align * align;
        writeLock.lock();
        try {
            Wire.header(ctl, Pdu.ICRESP, 0, Pdu.IC_HLEN, 0, Pdu.IC_HLEN, false, ctlCrc);
            for (int i = Pdu.CH_SIZE; i < Pdu.IC_HLEN; i++) {
                ctl.put(i, (byte) 0);
            }
            ctl.putShort(Pdu.IC_PFV, (short) Pdu.PFV_1_0).put(Pdu.IC_HPDA_CPDA, (byte) 0)
                    .put(Pdu.IC_DIGEST, (byte) ((hdgst ? Pdu.DIGEST_HDR : 0) | (ddgst ? Pdu.DIGEST_DATA : 0)))
                    .putInt(Pdu.IC_MAXR2T_MAXDATA, server.config.maxH2cData());
            ctl.position(0).limit(Pdu.IC_HLEN);
            writeFully(ctl);
        } finally {
            writeLock.unlock();
        }
        in.negotiated(hdgst, ddgst);
    }

    private void terminate(int fes, int fei) {
        ByteBuffer h = in.header;
        int offending = Math.min(h.limit(), Pdu.TERM_MAX_DATA);
        writeLock.lock();
        try {
            Wire.header(ctl, Pdu.C2H_TERM, 0, Pdu.TERM_HLEN, 0, Pdu.TERM_HLEN + offending, false, ctlCrc);
            ctl.putShort(Pdu.TERM_FES, (short) fes).putInt(Pdu.TERM_FEI, fei).putLong(14, 0).putShort(22, (short) 0);
            ctl.put(Pdu.TERM_HLEN, h, 0, offending);
            ctl.position(0).limit(Pdu.TERM_HLEN + offending);
            writeFully(ctl);
        } catch (IOException e) {
            // the host is gone already; closing is all that is left
        } finally {
            writeLock.unlock();
        }
    }

    private void command() throws IOException, PduException, InterruptedException {
        ByteBuffer sqe = in.sqe;
        int opcode = sqe.get(Nvme.SQE_OPCODE) & 0xFF;
        int cid = sqe.getShort(Nvme.SQE_CID) & 0xFFFF;
        if (qid >= 0) {
            sqHead = sqHead == sqSize ? 0 : sqHead + 1;
            controller.touch();
        }
        int flags = sqe.get(Nvme.SQE_FLAGS);
        if ((flags & Nvme.FUSE_MASK) != 0 || (flags & Nvme.PSDT_MASK) != Nvme.PSDT_SGL) {
            // As nvmet_req_init, for every command, fabrics and admin ones too: no fused pair is served (FUSES 0:
            // run alone, the Write of a Compare and Write would write whether or not the compare matched), and
            // data is described by an SGL, the one way NVMe/TCP carries it (PSDT 01); a PRP is Invalid Field
            in.skipData();
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), 0);
            return;
        }
        if (opcode == Nvme.FABRICS) {
            fabrics(sqe, cid);
            return;
        }
        if (controller == null || !controller.enabled()) {
            in.skipData();
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_CMD_SEQ_ERROR, true), 0);
            return;
        }
        if (qid == 0) {
            in.skipData(); // no admin command we serve carries data to the controller
            controller.admin(this, sqe, cid);
        } else {
            io.command(sqe, opcode, cid);
        }
    }

    // ------------------------------------------------------------------ fabrics

    private void fabrics(ByteBuffer sqe, int cid) throws IOException {
        int fctype = sqe.get(Nvme.FCTYPE) & 0xFF;
        if (fctype == Nvme.FCTYPE_CONNECT) {
            connect(sqe, cid);
            return;
        }
        in.skipData();
        if (controller == null) {
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_CMD_SEQ_ERROR, true), 0);
        } else if (qid != 0 || (fctype != Nvme.FCTYPE_PROPERTY_GET && fctype != Nvme.FCTYPE_PROPERTY_SET)) {
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_OPCODE, true), 0);
        } else if (fctype == Nvme.FCTYPE_PROPERTY_GET) {
            short st = controller.propertyGet(sqe, result);
            respond(cid, st, result[0]);
        } else {
            respond(cid, controller.propertySet(sqe), 0);
        }
    }

    private void connect(ByteBuffer sqe, int cid) throws IOException {
        short bad = Nvme.status(Nvme.SCT_COMMAND, Nvme.SC_CONNECT_INVALID_PARAM, true);
        if (controller != null) {
            in.skipData();
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_CMD_SEQ_ERROR, true), 0);
            return;
        }
        int sgl = sqe.get(Nvme.SGL_TYPE) & 0xFF;
        if (in.dataLength != Nvme.CONNECT_DATA_SIZE || sgl != Nvme.SGL_INCAPSULE) {
            in.skipData();
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true), 0);
            return;
        }
        scratch.clear();
        rxCrc.reset();
        in.readData(scratch, Nvme.CONNECT_DATA_SIZE, in.dataDigest ? rxCrc : null);
        if (in.dataDigest && in.readDigest() != (int) rxCrc.getValue()) {
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_TRANSIENT_TRANSPORT, false), 0);
            return;
        }
        ByteBuffer d = scratch;
        int recfmt = sqe.getShort(Nvme.CONNECT_RECFMT) & 0xFFFF;
        int q = sqe.getShort(Nvme.CONNECT_QID) & 0xFFFF;
        int sqsize = sqe.getShort(Nvme.CONNECT_SQSIZE) & 0xFFFF;
        int cattr = sqe.get(Nvme.CONNECT_CATTR) & 0xFF;
        long kato = sqe.getInt(Nvme.CONNECT_KATO) & 0xFFFFFFFFL;
        int wantCntlid = d.getShort(Nvme.CD_CNTLID) & 0xFFFF;
        d.get(Nvme.CD_HOSTNQN, hostNqn);
        d.get(Nvme.CD_HOSTID, hostId);
        NvmeTcpConfig cfg = server.config;
        if (recfmt != 0) {
            respond(cid, Nvme.status(Nvme.SCT_COMMAND, Nvme.SC_CONNECT_FORMAT, true), Nvme.CONNECT_RECFMT);
            return;
        }
        boolean discovery = Nqn.isDiscovery(d, Nvme.CD_SUBNQN);
        if (!discovery && !Nqn.equals(d, Nvme.CD_SUBNQN, server.subsystemNqn)) {
            LOG.log(System.Logger.Level.WARNING, "nvme: {0} asked for subsystem {1}; this target serves {2}", peer,
                    Nqn.text(d, Nvme.CD_SUBNQN), cfg.subsystemNqn());
            respond(cid, bad, Nvme.ipoData(Nvme.CD_SUBNQN));
            return;
        }
        if (!discovery && !server.hostAllowed(hostNqn)) {
            LOG.log(System.Logger.Level.WARNING, "nvme: host {0} from {1} is not in nvme.allowed-hosts",
                    Nqn.text(hostNqn), peer);
            respond(cid, Nvme.status(Nvme.SCT_COMMAND, Nvme.SC_CONNECT_INVALID_HOST, true), 0);
            return;
        }
        int limit = q == 0 ? Nvme.ADMIN_QUEUE_DEPTH : cfg.queueDepth();
        if (sqsize == 0 || sqsize + 1 > limit) {
            respond(cid, bad, Nvme.CONNECT_SQSIZE);
            return;
        }
        if (q == 0) {
            if (wantCntlid != Nvme.DYNAMIC_CNTLID && wantCntlid != 0) {
                // The dynamic controller model: the host asks for "any" (0xFFFF); nvmet also takes 0 for old hosts
                respond(cid, bad, Nvme.ipoData(Nvme.CD_CNTLID));
                return;
            }
            Controller c = server.newController(discovery, hostNqn, hostId, this, kato);
            if (c == null) {
                respond(cid, Nvme.status(Nvme.SCT_COMMAND, Nvme.SC_CONNECT_CTRL_BUSY, true), 0); // as nvmet: no ID left
                return;
            }
            bind(c, 0, sqsize, cattr);
            respond(cid, Nvme.OK, c.cntlid);
            return;
        }
        Controller c = server.controller(wantCntlid);
        if (discovery || c == null || c.discovery || !Nqn.same(c.hostNqn, hostNqn)) {
            respond(cid, bad, Nvme.ipoData(Nvme.CD_CNTLID));
            return;
        }
        if (q > cfg.ioQueues()) {
            respond(cid, bad, Nvme.CONNECT_QID);
            return;
        }
        if (!c.enabled() || !c.attach(q, this)) {
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_CMD_SEQ_ERROR, true), 0);
            return;
        }
        bindIo(c, q, sqsize, cattr);
        respond(cid, Nvme.OK, c.cntlid);
    }

    private void bind(Controller c, int q, int sqsize, int cattr) {
        this.sqSize = sqsize;
        this.sqFlowOff = (cattr & Nvme.CATTR_DISABLE_SQFLOW) != 0;
        this.sqHead = 1 % (sqsize + 1); // the Connect itself was consumed
        this.qid = q;
        this.controller = c;
        in.maxInCapsule = q == 0 ? NvmeTcpConfig.ADMIN_IN_CAPSULE : server.config.inCapsuleBytes();
    }

    private void bindIo(Controller c, int q, int sqsize, int cattr) {
        // I/O queue qid lands on hardware queue qid-1 (mod their count): the host's per-CPU queues spread
        // over the block layer's queues as NBD's connections do
        HardwareQueue hw = server.layer.queue((q - 1) % server.layer.queueCount());
        IoQueue io = new IoQueue(this, in, server, hw, sqsize + 1);
        io.answers.start();
        this.io = io;
        bind(c, q, sqsize, cattr);
    }

    /** An answer without data (admin commands, errors found before the driver), from the reader or a teardown. */
    void respond(int cid, short status, long result) {
        writeLock.lock();
        try {
            Wire.capsuleResp(ctl, result, sqFlowOff ? 0xFFFF : sqHead, Math.max(qid, 0), cid, status, hdgst, ctlCrc);
            writeFully(ctl);
        } catch (IOException e) {
            close();
        } finally {
            writeLock.unlock();
        }
    }

    /**
     * An admin command's data (Identify, a log page): C2HData of {@code length} bytes, at most the host's buffer
     * (its SGL), then the answer. The bytes are {@code page}'s from {@code from} up to its limit, then zeros (a log
     * read past its page's end). Written from the preallocated header, digest and zeros: nothing allocated.
     */
    void respondData(ByteBuffer sqe, int cid, ByteBuffer page, int from, int length) {
        int sgl = sqe.get(Nvme.SGL_TYPE) & 0xFF;
        long hostLength = sqe.getInt(Nvme.SGL_LENGTH) & 0xFFFFFFFFL;
        if (sgl != Nvme.SGL_TRANSPORT) {
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_TYPE, true), 0);
            return;
        }
        int n = (int) Math.min(length, hostLength);
        if (n == 0) {
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true), 0);
            return;
        }
        int valid = Math.max(0, Math.min(n, page.limit() - from));
        Wire.c2hData(dataHead, cid, n, true, false, hdgst, ddgst, c2hPdo, dataCrc);
        dataCrc.reset();
        writeLock.lock();
        try {
            writeFully(dataHead);
            int end = page.limit();
            page.limit(from + valid).position(from);
            if (ddgst) {
                dataCrc.update(page);
                page.position(from);
            }
            writeFully(page);
            page.limit(end).position(0);
            for (int left = n - valid; left > 0; ) {
                zeros.clear().limit(Math.min(zeros.capacity(), left));
                left -= zeros.remaining();
                if (ddgst) {
                    dataCrc.update(zeros);
                    zeros.position(0);
                }
                writeFully(zeros);
            }
            if (ddgst) {
                dataDigest.clear();
                dataDigest.putInt(0, (int) dataCrc.getValue());
                writeFully(dataDigest);
            }
        } catch (IOException e) {
            close();
            return;
        } finally {
            writeLock.unlock();
        }
        respond(cid, Nvme.OK, 0);
    }

    void writeFully(ByteBuffer b) throws IOException {
        while (b.hasRemaining()) {
            channel.write(b);
        }
    }
}
