package io.pmemblk.nvme;

import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.ReentrantLock;
import java.util.zip.CRC32C;

/**
 * One NVMe/TCP connection: one queue pair (NVMe/TCP 1.0 2.1: a connection carries exactly one queue). Its reader
 * thread ({@code nvme-q-N-rx}) runs ICReq, Connect, then the admin commands (admin queue) or submits the I/O
 * commands to one hardware queue of the block layer through a {@link FrontendQueue}, as an NBD connection does.
 * Its sender thread ({@code nvme-q-N-tx}) answers completed I/O: it drains every completion that is waiting
 * and writes their PDUs in one gathering write. Control PDUs (ICResp, R2T, admin answers, C2HTermReq) are
 * written by the reader under the same lock.
 *
 * <p>A fatal transport error (a bad PDU) answers C2HTermReq and closes this connection only: other connections,
 * even of the same controller, go on (the host resets the association itself).
 */
final class TcpQueue {
    private static final System.Logger LOG = System.getLogger(TcpQueue.class.getName());

    private final NvmeTcpServer server;
    private final SocketChannel channel;
    final int id;
    final String peer;
    private final PduReader in;
    private final Thread reader;
    private Thread sender;
    private final ReentrantLock writeLock = new ReentrantLock();
    /** Control PDUs the reader (or a teardown) writes under writeLock. */
    private final ByteBuffer ctl = ByteBuffer.allocateDirect(Pdu.IC_HLEN + Pdu.TERM_MAX_DATA + Pdu.DIGEST)
            .order(ByteOrder.LITTLE_ENDIAN);
    private final CRC32C ctlCrc = new CRC32C();
    private final CRC32C rxCrc = new CRC32C();
    /** Heap scratch for command data that is not a block write (Connect data, DSM ranges). */
    private final ByteBuffer scratch = ByteBuffer.allocate(NvmeTcpConfig.ADMIN_IN_CAPSULE + 4096).order(ByteOrder.LITTLE_ENDIAN);
    private volatile boolean closed;

    // Negotiated at ICReq
    private boolean hdgst, ddgst;
    private int c2hPdo;

    // Set by Connect
    private Controller controller;
    int qid = -1;
    private int sqSize;
    private boolean sqFlowOff;
    private volatile int sqHead;

    // I/O queues only
    private FrontendQueue frontend;
    private IoSlot[] slots;
    /** The request last acquired and not yet added or completed here (FrontendQueue's own "filling"). */
    private Request filling;
    private ArrayBlockingQueue<IoSlot> completed;
    private final AtomicInteger outstanding = new AtomicInteger();
    private final Request.Completion onComplete = this::completed;
    private final long[] result = new long[1];

    TcpQueue(NvmeTcpServer server, SocketChannel channel, int id, String peer) {
        this.server = server;
        this.channel = channel;
        this.id = id;
        this.peer = peer;
        this.in = new PduReader(channel, this::dispatch);
        this.in.maxInCapsule = server.config.inCapsuleBeforeConnect();
        this.in.maxH2cData = server.config.maxH2cData();
        this.reader = Thread.ofPlatform().name("nvme-q-" + id + "-rx").unstarted(this::readerMain);
    }

    void start() {
        reader.start();
    }

    void join(long millis) throws InterruptedException {
        reader.join(Math.max(1, millis));
        Thread s = sender;
        if (s != null) {
            s.join(Math.max(1, millis));
        }
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
                int type = in.next();
                switch (type) {
                    case Pdu.ICREQ -> icReq();
                    case Pdu.CMD -> command();
                    case Pdu.H2C_DATA -> h2cData();
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
        if (frontend != null) {
            // Writes still waiting for H2CData never reach the driver: give their tags back (the one being
            // filled is FrontendQueue's to release, with the undispatched batch)
            for (IoSlot s : slots) {
                if (s.awaitingData && s.request != null) {
                    s.awaitingData = false;
                    if (s.request != filling) { // else releaseUndispatched releases (and counts) it
                        s.request.release();
                        outstanding.decrementAndGet();
                    }
                }
            }
            outstanding.addAndGet(-frontend.releaseUndispatched());
        }
        Controller c = controller;
        if (c != null) {
            if (qid == 0) {
                c.teardown("admin queue " + why); // its I/O queues go with it
            } else {
                c.detach(qid, this);
            }
        }
        server.removed(this);
        LOG.log(System.Logger.Level.DEBUG, "nvme: queue {0} (qid {1}) from {2} ended: {3}", id, qid, peer, why);
    }

    /** Before a read that may block: the batch gathered so far goes to the driver in one call. */
    private void dispatch() {
        if (frontend != null) {
            frontend.dispatch();
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
            io(sqe, opcode, cid);
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
        String subnqn = nqn(d, Nvme.CD_SUBNQN);
        String hostnqn = nqn(d, Nvme.CD_HOSTNQN);
        byte[] hostId = new byte[16];
        d.get(Nvme.CD_HOSTID, hostId);
        NvmeTcpConfig cfg = server.config;
        if (recfmt != 0) {
            respond(cid, Nvme.status(Nvme.SCT_COMMAND, Nvme.SC_CONNECT_FORMAT, true), Nvme.CONNECT_RECFMT);
            return;
        }
        boolean discovery = subnqn.equals(Nvme.DISCOVERY_NQN);
        if (!discovery && !subnqn.equals(cfg.subsystemNqn())) {
            LOG.log(System.Logger.Level.WARNING, "nvme: {0} asked for subsystem {1}; this target serves {2}", peer,
                    subnqn, cfg.subsystemNqn());
            respond(cid, bad, Nvme.ipoData(Nvme.CD_SUBNQN));
            return;
        }
        if (!discovery && !cfg.allowedHosts().isEmpty() && !cfg.allowedHosts().contains(hostnqn)) {
            LOG.log(System.Logger.Level.WARNING, "nvme: host {0} from {1} is not in nvme.allowed-hosts", hostnqn, peer);
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
            Controller c = server.newController(discovery, hostnqn, hostId, this, kato);
            bind(c, 0, sqsize, cattr);
            respond(cid, Nvme.OK, c.cntlid);
            return;
        }
        Controller c = server.controller(wantCntlid);
        if (discovery || c == null || c.discovery || !c.hostNqn.equals(hostnqn)) {
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

    private static String nqn(ByteBuffer d, int at) {
        int n = 0;
        while (n < Nvme.NQN_FIELD && d.get(at + n) != 0) {
            n++;
        }
        return new String(d.array(), d.arrayOffset() + at, n, StandardCharsets.UTF_8);
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
        frontend = new FrontendQueue(hw);
        slots = new IoSlot[hw.depth() + hw.reservedDepth()];
        for (int i = 0; i < slots.length; i++) {
            slots[i] = new IoSlot(i);
        }
        completed = new ArrayBlockingQueue<>(slots.length);
        sender = Thread.ofPlatform().name("nvme-q-" + id + "-tx").start(this::senderMain);
        bind(c, q, sqsize, cattr);
    }

    // ------------------------------------------------------------------ I/O commands (NVM command set 1.0)

    private void io(ByteBuffer sqe, int opcode, int cid) throws IOException, PduException, InterruptedException {
        Namespace ns = server.namespace;
        int nsid = sqe.getInt(Nvme.SQE_NSID);
        boolean flushAll = opcode == Nvme.IO_FLUSH && nsid == 0xFFFFFFFF;
        short st = Nvme.OK;
        if (opcode != Nvme.IO_READ && opcode != Nvme.IO_WRITE && opcode != Nvme.IO_FLUSH
                && opcode != Nvme.IO_WRITE_ZEROES && opcode != Nvme.IO_DSM) {
            st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_OPCODE, true);
        } else if (nsid != 1 && !flushAll) {
            st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_NS, true);
        }
        long slba = (sqe.getInt(Nvme.SQE_CDW10) & 0xFFFFFFFFL) | ((long) sqe.getInt(Nvme.SQE_CDW11) << 32);
        int cdw12 = sqe.getInt(Nvme.SQE_CDW12);
        long nlb = (cdw12 & 0xFFFF) + 1L;
        boolean fua = (cdw12 & (1 << 30)) != 0 || !controller.writeCacheEnabled;
        int sgl = sqe.get(Nvme.SGL_TYPE) & 0xFF;
        long sglLength = sqe.getInt(Nvme.SGL_LENGTH) & 0xFFFFFFFFL;
        boolean rangeCmd = opcode == Nvme.IO_READ || opcode == Nvme.IO_WRITE || opcode == Nvme.IO_WRITE_ZEROES;
        if (st == Nvme.OK && rangeCmd && (slba < 0 || slba + nlb > ns.blocks() || slba + nlb < 0)) {
            st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_LBA_RANGE, true);
        }
        long bytes = nlb << ns.lbaShift();
        if (st == Nvme.OK && (opcode == Nvme.IO_READ || opcode == Nvme.IO_WRITE)) {
            if (bytes > server.config.maxTransferBytes()) {
                st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true); // beyond MDTS
            } else if (sglLength != bytes) {
                st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true);
            } else if (opcode == Nvme.IO_READ && sgl != Nvme.SGL_TRANSPORT) {
                st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_TYPE, true);
            } else if (opcode == Nvme.IO_WRITE && sgl == Nvme.SGL_INCAPSULE) {
                if (in.dataLength != bytes) {
                    st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true);
                } else if (sqe.getLong(Nvme.SGL_ADDR) != 0) {
                    st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_OFFSET, true);
                }
            } else if (opcode == Nvme.IO_WRITE && (sgl != Nvme.SGL_TRANSPORT || in.dataLength != 0)) {
                st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_TYPE, true);
            }
        }
        if (st == Nvme.OK && opcode == Nvme.IO_DSM && (sgl != Nvme.SGL_INCAPSULE
                || in.dataLength != ((sqe.getInt(Nvme.SQE_CDW10) & 0xFF) + 1) * 16)) {
            // The ranges must come in the capsule: nvme.in-capsule-bytes is at least 4 KiB, 256 ranges
            st = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true);
        }
        if (st != Nvme.OK) {
            in.skipData();
            respond(cid, st, 0);
            return;
        }
        switch (opcode) {
            case Nvme.IO_READ -> {
                Request r = acquired(frontend.acquireRead(slba << ns.lbaShift(), (int) bytes), cid, opcode);
                add(r);
            }
            case Nvme.IO_WRITE -> write(cid, slba << ns.lbaShift(), (int) bytes, fua, sgl == Nvme.SGL_INCAPSULE);
            case Nvme.IO_FLUSH -> {
                Request r = acquired(frontend.acquire(0), cid, opcode);
                r.op = Op.FLUSH;
                r.offset = 0;
                r.length = 0;
                add(r);
            }
            case Nvme.IO_WRITE_ZEROES -> {
                Request r = acquired(frontend.acquire(0), cid, opcode);
                r.op = Op.WRITE_ZEROES;
                r.offset = slba << ns.lbaShift();
                r.length = bytes;
                r.fua = fua;
                add(r);
            }
            case Nvme.IO_DSM -> dsm(sqe, cid);
            default -> throw new AssertionError(opcode);
        }
    }

    private Request acquired(Request r, int cid, int opcode) {
        filling = r;
        outstanding.incrementAndGet();
        r.completion = onComplete;
        r.cookie = cid;
        slots[r.tag()].reset(r, cid, opcode);
        return r;
    }

    private void add(Request r) {
        filling = null;
        frontend.add(r);
        if (frontend.full()) {
            frontend.dispatch();
        }
    }

    private void completeHere(Request r, int errno) {
        if (filling == r) {
            filling = null;
        }
        frontend.completeHere(r, errno);
    }

    private void write(int cid, long offset, int bytes, boolean fua, boolean inCapsule) throws IOException,
            InterruptedException {
        Request r;
        if (ddgst) {
            // With a data digest the payload is checked before it may touch the device: into buffers first
            r = frontend.acquire(bytes);
            r.op = Op.WRITE;
            r.offset = offset;
        } else {
            r = frontend.acquireWrite(offset, bytes);
        }
        acquired(r, cid, Nvme.IO_WRITE);
        r.fua = fua;
        IoSlot s = slots[r.tag()];
        s.length = bytes;
        if (inCapsule) {
            rxCrc.reset();
            in.readData(r.dataBuffers(), r.dataBufferCount(), 0, bytes, in.dataDigest ? rxCrc : null);
            if (in.dataDigest && in.readDigest() != (int) rxCrc.getValue()) {
                s.override = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_TRANSIENT_TRANSPORT, false);
                completeHere(r, Status.EIO);
                return;
            }
            add(r);
            return;
        }
        // One R2T for the whole transfer (as nvmet): the host splits it into H2CData PDUs of at most MAXH2CDATA
        s.awaitingData = true;
        writeLock.lock();
        try {
            Wire.r2t(s.r2t, cid, s.tag, 0, bytes, hdgst, s.crc);
            writeFully(s.r2t);
        } finally {
            writeLock.unlock();
        }
    }

    private void h2cData() throws IOException, PduException {
        ByteBuffer h = in.header;
        int cccid = h.getShort(Pdu.D_CCCID) & 0xFFFF;
        int ttag = h.getShort(Pdu.D_TTAG) & 0xFFFF;
        long datao = h.getInt(Pdu.D_OFFSET) & 0xFFFFFFFFL;
        long datal = h.getInt(Pdu.D_LENGTH) & 0xFFFFFFFFL;
        if (datal != in.dataLength) {
            throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.D_LENGTH, "H2CData DATAL " + datal + " but the PDU"
                    + " carries " + in.dataLength + " bytes");
        }
        IoSlot s = slots == null || ttag >= slots.length ? null : slots[ttag];
        if (s == null || !s.awaitingData || s.cid != cccid) {
            throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.D_TTAG, "H2CData TTAG " + ttag + " CCCID " + cccid
                    + " names no command waiting for data (no R2T outstanding)");
        }
        if (datao != s.received) {
            throw new PduException(Pdu.FES_OUT_OF_RANGE, Pdu.D_OFFSET, "H2CData DATAO " + datao + ": expected "
                    + s.received + " (data in order)");
        }
        if (datao + datal > s.length) {
            throw new PduException(Pdu.FES_OUT_OF_RANGE, Pdu.D_LENGTH, "H2CData DATAO " + datao + " + DATAL "
                    + datal + " past the command's " + s.length + " bytes");
        }
        Request r = s.request;
        s.crc.reset();
        in.readData(r.dataBuffers(), r.dataBufferCount(), datao, (int) datal, in.dataDigest ? s.crc : null);
        if (in.dataDigest && in.readDigest() != (int) s.crc.getValue()) {
            s.override = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_TRANSIENT_TRANSPORT, false);
        }
        s.received += (int) datal;
        boolean last = (in.flags & Pdu.F_DATA_LAST) != 0;
        if (last != (s.received == s.length)) {
            throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.CH_FLAGS, "H2CData LAST flag " + last + " at "
                    + s.received + " of " + s.length + " bytes");
        }
        if (last) {
            s.awaitingData = false;
            if (s.override != Nvme.OK) {
                completeHere(r, Status.EIO);
            } else {
                add(r);
            }
        }
    }

    private void dsm(ByteBuffer sqe, int cid) throws IOException, InterruptedException {
        int ranges = (sqe.getInt(Nvme.SQE_CDW10) & 0xFF) + 1;
        boolean deallocate = (sqe.getInt(Nvme.SQE_CDW11) & (1 << 2)) != 0;
        scratch.clear();
        rxCrc.reset();
        in.readData(scratch, ranges * 16, in.dataDigest ? rxCrc : null);
        if (in.dataDigest && in.readDigest() != (int) rxCrc.getValue()) {
            respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_TRANSIENT_TRANSPORT, false), 0);
            return;
        }
        Namespace ns = server.namespace;
        for (int i = 0; i < ranges; i++) {
            long nlb = scratch.getInt(i * 16 + 4) & 0xFFFFFFFFL;
            long slba = scratch.getLong(i * 16 + 8);
            if (slba < 0 || slba + nlb > ns.blocks() || slba + nlb < 0) {
                respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_LBA_RANGE, true), 0);
                return;
            }
        }
        if (!deallocate) {
            respond(cid, Nvme.OK, 0); // attributes only (integral read/write hints): advisory, nothing to do
            return;
        }
        IoSlot parent = null;
        for (int i = 0; i < ranges; i++) {
            long nlb = scratch.getInt(i * 16 + 4) & 0xFFFFFFFFL;
            long slba = scratch.getLong(i * 16 + 8);
            Request r = acquired(frontend.acquire(0), cid, Nvme.IO_DSM);
            IoSlot s = slots[r.tag()];
            if (parent == null) {
                parent = s;
                parent.remaining = ranges;
            }
            s.parent = parent;
            r.op = Op.TRIM;
            r.offset = slba << ns.lbaShift();
            r.length = nlb << ns.lbaShift();
            r.fua = !controller.writeCacheEnabled; // write-through covers deallocation too
            add(r);
        }
    }

    // ------------------------------------------------------------------ answers

    /** Driver side, any thread: hand the slot to the sender (never blocks: one place per tag). */
    private void completed(Request r) {
        IoSlot s = slots[r.tag()];
        IoSlot p = s.parent;
        if (p != null && p != s) {
            // A DSM range other than the first: fold its status into the command's, give its tag back
            short st = status(s, r);
            boolean lastOne;
            synchronized (p) {
                if (p.worst == Nvme.OK) {
                    p.worst = st;
                }
                lastOne = --p.remaining == 0;
            }
            r.release();
            outstanding.decrementAndGet();
            if (lastOne) {
                completed.add(p);
            }
            return;
        }
        if (p == s) {
            boolean lastOne;
            synchronized (p) {
                short st = status(s, r);
                if (p.worst == Nvme.OK) {
                    p.worst = st;
                }
                lastOne = --p.remaining == 0;
            }
            if (!lastOne) {
                return; // the last range to finish sends it
            }
        }
        completed.add(s);
    }

    private short status(IoSlot s, Request r) {
        if (s.override != Nvme.OK) {
            return s.override;
        }
        int errno = r.status();
        return switch (errno) {
            case Status.OK -> Nvme.OK;
            case Status.EOVERFLOW -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_LBA_RANGE, true);
            case Status.EINVAL -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true);
            case Status.ENOTSUP -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_OPCODE, true);
            case Status.EPERM -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_NS_WRITE_PROTECTED, true);
            case Status.ENOSPC -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_CAPACITY_EXCEEDED, true);
            // The sticky write-back error and media faults: a write or flush that did not reach the media
            case Status.EIO -> s.opcode == Nvme.IO_READ ? Nvme.status(Nvme.SCT_MEDIA, Nvme.SC_READ_ERROR, false)
                    : Nvme.status(Nvme.SCT_MEDIA, Nvme.SC_WRITE_FAULT, false);
            default -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INTERNAL, false);
        };
    }

    private void senderMain() {
        // An answer takes at most: C2HData header, the data's buffers, its digest, CapsuleResp
        int perAnswer = server.config.maxTransferBytes() / io.pmemblk.queueing.BufferPool.CHUNK + 6;
        ByteBuffer[] gather = new ByteBuffer[Math.max(256, 2 * perAnswer)];
        IoSlot[] batch = new IoSlot[slots.length];
        boolean broken = false;
        try {
            while (true) {
                IoSlot first = completed.poll(100, TimeUnit.MILLISECONDS);
                if (first == null) {
                    if (closed && outstanding.get() == 0) {
                        return;
                    }
                    continue;
                }
                int n = 0;
                batch[n++] = first;
                for (IoSlot s; n < batch.length && (s = completed.poll()) != null; ) {
                    batch[n++] = s; // everything completed meanwhile goes out in the same write
                }
                int g = 0;
                writeLock.lock();
                try {
                    for (int i = 0; i < n; i++) {
                        if (g + perAnswer > gather.length || broken) {
                            if (!broken) {
                                broken = !writeAll(gather, g);
                            }
                            g = 0;
                        }
                        g = answer(batch[i], gather, g);
                    }
                    if (!broken && g > 0) {
                        broken = !writeAll(gather, g);
                    }
                } finally {
                    writeLock.unlock();
                }
                for (int i = 0; i < n; i++) {
                    batch[i].request.release();
                    batch[i] = null;
                    outstanding.decrementAndGet();
                }
                java.util.Arrays.fill(gather, null); // hold no device views or finished buffers
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Puts slot s's answer PDUs into gather from g; returns the new count. */
    private int answer(IoSlot s, ByteBuffer[] gather, int g) {
        Request r = s.request;
        short st = s.parent == s ? s.worst : status(s, r);
        if (s.opcode == Nvme.IO_READ && st == Nvme.OK) {
            int length = (int) r.length;
            boolean success = sqFlowOff; // C2HData SUCCESS replaces the CapsuleResp only without SQ flow control
            Wire.c2hData(s.c2h, s.cid, length, true, success, hdgst, ddgst, c2hPdo, s.crc);
            gather[g++] = s.c2h;
            ByteBuffer[] data = r.dataBuffers();
            int count = r.dataBufferCount();
            if (ddgst) {
                s.crc.reset();
            }
            long left = length;
            for (int i = 0; i < count && left > 0; i++) {
                ByteBuffer b = data[i];
                if (b.remaining() > left) {
                    b.limit(b.position() + (int) left);
                }
                left -= b.remaining();
                if (ddgst) {
                    int p = b.position();
                    s.crc.update(b);
                    b.position(p);
                }
                gather[g++] = b;
            }
            if (ddgst) {
                s.ddgst.clear();
                s.ddgst.putInt(0, (int) s.crc.getValue()).limit(Pdu.DIGEST);
                gather[g++] = s.ddgst;
            }
            if (success) {
                return g;
            }
        }
        Wire.capsuleResp(s.rsp, 0, sqFlowOff ? 0xFFFF : sqHead, qid, s.cid, st, hdgst, s.crc);
        gather[g++] = s.rsp;
        return g;
    }

    private boolean writeAll(ByteBuffer[] gather, int count) {
        try {
            long left = 0;
            for (int i = 0; i < count; i++) {
                left += gather[i].remaining();
            }
            int from = 0;
            while (left > 0) {
                long n = channel.write(gather, from, count - from);
                left -= n;
                while (from < count && !gather[from].hasRemaining()) {
                    from++;
                }
            }
            return true;
        } catch (IOException e) {
            close(); // the host is gone: the reader stops; completions still release their tags
            return false;
        }
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

    /** An admin command's data (Identify, a log page): C2HData of at most the host's buffer (SGL), then the answer. */
    void respondData(ByteBuffer sqe, int cid, ByteBuffer page, int length) {
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
        ByteBuffer data = page.duplicate().position(0).limit(n);
        ByteBuffer head = ByteBuffer.allocate(Pdu.DATA_HLEN + Pdu.DIGEST + 128).order(ByteOrder.LITTLE_ENDIAN);
        CRC32C crc = new CRC32C();
        Wire.c2hData(head, cid, n, true, false, hdgst, ddgst, c2hPdo, crc);
        ByteBuffer digest = ByteBuffer.allocate(Pdu.DIGEST).order(ByteOrder.LITTLE_ENDIAN);
        if (ddgst) {
            crc.reset();
            crc.update(data.duplicate());
            digest.putInt(0, (int) crc.getValue());
        } else {
            digest.limit(0);
        }
        writeLock.lock();
        try {
            writeFully(head);
            writeFully(data);
            writeFully(digest);
        } catch (IOException e) {
            close();
            return;
        } finally {
            writeLock.unlock();
        }
        respond(cid, Nvme.OK, 0);
    }

    private void writeFully(ByteBuffer b) throws IOException {
        while (b.hasRemaining()) {
            channel.write(b);
        }
    }
}
