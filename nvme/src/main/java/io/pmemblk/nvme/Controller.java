package io.pmemblk.nvme;

import java.nio.ByteBuffer;

/**
 * One host's controller (NVMe-oF 1.1 3.3: created by Connect on an admin queue, with a controller ID; I/O queues
 * attach to it by that ID). Holds the properties (CC/CSTS), the features, the keep-alive timer and the parked
 * Asynchronous Event Requests, and answers the admin and Property commands (NVMe base 1.3 section 5). A
 * discovery controller (the well-known NQN) answers only Identify, Get Log Page, Features, Keep Alive and AER.
 */
final class Controller {
    private static final System.Logger LOG = System.getLogger(Controller.class.getName());
    /** nvmet's NVMET_DISC_KATO_MS: the keep-alive timeout of a discovery controller whose host asked for none. */
    static final long DISCOVERY_KATO_MS = 120_000;

    final NvmeTcpServer server;
    final int cntlid;
    final boolean discovery;
    /** The host's NQN and host ID as its admin Connect carried them (the admin queue's own fields, set once). */
    final byte[] hostNqn;
    final byte[] hostId;
    final TcpQueue admin;
    /** I/O queues by qid (index 0 unused). */
    final TcpQueue[] io;
    /** Keep-alive timeout in ms (0: none) and the last command seen on any of its queues. */
    volatile long katoMillis;
    volatile long lastActivity = System.nanoTime();
    /** CC and CSTS: written by the admin queue's reader, read by every I/O command (enabled()): no lock. */
    private volatile int cc;
    private volatile int csts;
    private int aenConfig;
    /** Volatile write cache enabled (WCE); off means every write is made durable before it completes. */
    volatile boolean writeCacheEnabled;
    /** The command IDs of parked Asynchronous Event Requests, oldest first (AERL + 1 at most): no boxing. */
    private final int[] aers = new int[IdentifyPages.AERL + 1];
    private int aerCount;
    /** The one page admin answers are built in (admin commands run one at a time, on the admin queue's reader). */
    private final ByteBuffer page = IdentifyPages.newPage();
    private volatile boolean torn;

    Controller(NvmeTcpServer server, int cntlid, boolean discovery, byte[] hostNqn, byte[] hostId, TcpQueue admin,
               long katoMillis) {
        this.server = server;
        this.cntlid = cntlid;
        this.discovery = discovery;
        this.hostNqn = hostNqn;
        this.hostId = hostId;
        this.admin = admin;
        this.io = new TcpQueue[discovery ? 1 : server.config.ioQueues() + 1];
        this.katoMillis = kato(katoMillis);
        this.writeCacheEnabled = server.namespace.volatileCache();
    }

    /**
     * The keep-alive timeout a host asked for, in ms; for a discovery controller 0 is {@link #DISCOVERY_KATO_MS}, as
     * nvmet's nvmet_alloc_ctrl sets it "to cleanup stale discovery sessions": a one-shot `nvme discover` asks for
     * none, and a host that dies after it would otherwise hold its connection and thread for ever.
     */
    private long kato(long millis) {
        return discovery && millis == 0 ? DISCOVERY_KATO_MS : millis;
    }

    boolean enabled() {
        return (cc & Nvme.CC_EN) != 0 && (csts & Nvme.CSTS_RDY) != 0;
    }

    void touch() {
        lastActivity = System.nanoTime();
    }

    boolean expired(long now) {
        long kato = katoMillis;
        return kato > 0 && now - lastActivity > java.util.concurrent.TimeUnit.MILLISECONDS.toNanos(kato);
    }

    synchronized boolean attach(int qid, TcpQueue q) {
        if (torn || qid >= io.length || io[qid] != null) {
            return false;
        }
        io[qid] = q;
        return true;
    }

    synchronized void detach(int qid, TcpQueue q) {
        if (qid < io.length && io[qid] == q) {
            io[qid] = null;
        }
    }

    /** The controller goes away (its admin queue closed, or keep-alive expired): every queue of it closes. */
    void teardown(String why) {
        TcpQueue[] queues;
        synchronized (this) {
            if (torn) {
                return;
            }
            torn = true;
            queues = io.clone();
        }
        LOG.log(System.Logger.Level.INFO, "nvme: controller {0} ({1}) torn down: {2}", cntlid, Nqn.text(hostNqn),
                why);
        server.remove(this);
        // The sockets close first and nothing is written to them here, as nvmet's delete_ctrl shuts its sockets
        // down: the caller is the keep-alive timer or the server's close, and a host that has stopped reading
        // (its window full, a reader thread blocked writing under the queue's lock) would hold either for ever.
        // The parked AERs go with the admin queue: no host that could still read them is left.
        for (TcpQueue q : queues) {
            if (q != null) {
                q.close();
            }
        }
        admin.close();
        synchronized (this) {
            aerCount = 0;
        }
    }

    // ---- Property Get/Set (NVMe-oF 1.1 3.4, 3.5)

    long cap() {
        long mqes = server.config.queueDepth() - 1;
        long to = 30; // CAP.TO: 15 s in 500 ms units, for CSTS.RDY after CC.EN (ours is immediate)
        return mqes | 1L << 16 /* CQR */ | to << 24 | 1L << 37 /* CSS: NVM */;
    }

    /**
     * Returns the status; result[0] receives the value. Each property is read at its own size only (ATTRIB.SIZE 1,
     * 8 bytes, for CAP; 0, 4 bytes, for VS, CC and CSTS), as Linux's nvmet answers: another size, or a reserved one,
     * is Invalid Field.
     */
    short propertyGet(ByteBuffer sqe, long[] result) {
        int size = sqe.get(Nvme.PROP_ATTRIB) & 7;
        int offset = sqe.getInt(Nvme.PROP_OFFSET);
        if (size != (offset == Nvme.PROP_CAP ? Nvme.PROP_SIZE_8 : Nvme.PROP_SIZE_4)) {
            return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true);
        }
        switch (offset) {
            case Nvme.PROP_CAP -> result[0] = cap();
            case Nvme.PROP_VS -> result[0] = Nvme.VERSION_1_3;
            case Nvme.PROP_CC -> result[0] = cc & 0xFFFFFFFFL;
            case Nvme.PROP_CSTS -> result[0] = csts & 0xFFFFFFFFL;
            default -> {
                return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true);
            }
        }
        return Nvme.OK;
    }

    /** Admin queue reader only (CC is written by one thread); the shutdown's persist holds no lock. */
    short propertySet(ByteBuffer sqe) {
        int offset = sqe.getInt(Nvme.PROP_OFFSET);
        // CC, the one property a host writes, is 4 bytes: an 8-byte or reserved size is Invalid Field, as in nvmet
        if (offset != Nvme.PROP_CC || (sqe.get(Nvme.PROP_ATTRIB) & 7) != Nvme.PROP_SIZE_4) {
            return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true);
        }
        int value = (int) sqe.getLong(Nvme.PROP_VALUE);
        int was = cc;
        cc = value;
        // The transitions as nvmet_update_cc makes them, in its order
        if ((value & Nvme.CC_EN) != 0 && (was & Nvme.CC_EN) == 0) {
            csts = startable(value) ? Nvme.CSTS_RDY : Nvme.CSTS_CFS; // nothing to bring up: ready at once
        }
        if ((value & Nvme.CC_EN) == 0 && (was & Nvme.CC_EN) != 0) {
            clear(); // a controller reset: the host reconnects its I/O queues after it
        }
        if ((value & Nvme.CC_SHN_MASK) != 0 && (was & Nvme.CC_SHN_MASK) == 0) {
            // Shutdown: completed writes are made durable now (the block layer's FLUSH would wait on queues;
            // persistAll is what the server does at its own shutdown). The controller is then disabled, so a
            // command after it gets Command Sequence Error instead of being taken after "shutdown complete".
            server.persistQuietly();
            clear();
            csts |= Nvme.CSTS_SHST_COMPLETE;
        }
        return Nvme.OK; // SHST stays until the next enable sets CSTS afresh (the shutdown left CC 0, as in nvmet)
    }

    /** nvmet_clear_ctrl: not ready, CC back to 0 (SHST is the caller's). */
    private void clear() {
        csts &= ~Nvme.CSTS_RDY;
        cc = 0;
    }

    /**
     * nvmet_start_ctrl's checks: an I/O controller's queue entries are 64-byte SQEs and 16-byte CQEs (a discovery
     * controller's are not checked, as nvmet keeps old hosts working), the memory page 4 KiB (MPS 0), round robin
     * arbitration (AMS 0) and the NVM command set (CSS 0, the only one CAP.CSS offers); else CSTS.CFS instead of RDY.
     */
    private boolean startable(int value) {
        if (!discovery && (field(value, Nvme.CC_IOSQES_SHIFT, 0xF) != Nvme.SQE_SIZE_SHIFT
                || field(value, Nvme.CC_IOCQES_SHIFT, 0xF) != Nvme.CQE_SIZE_SHIFT)) {
            return false;
        }
        return field(value, Nvme.CC_MPS_SHIFT, 0xF) == 0 && field(value, Nvme.CC_AMS_SHIFT, 0x7) == 0
                && field(value, Nvme.CC_CSS_SHIFT, 0x7) == 0;
    }

    private static int field(int value, int shift, int mask) {
        return value >>> shift & mask;
    }

    // ---- Admin commands (NVMe base 1.3 section 5), run on the admin queue's reader thread

    void admin(TcpQueue q, ByteBuffer sqe, int cid) {
        int opcode = sqe.get(Nvme.SQE_OPCODE) & 0xFF;
        int cdw10 = sqe.getInt(Nvme.SQE_CDW10);
        int cdw11 = sqe.getInt(Nvme.SQE_CDW11);
        switch (opcode) {
            case Nvme.ADMIN_IDENTIFY -> identify(q, sqe, cid, cdw10 & 0xFF);
            case Nvme.ADMIN_GET_LOG_PAGE -> getLogPage(q, sqe, cid, cdw10, cdw11);
            case Nvme.ADMIN_KEEP_ALIVE -> q.respond(cid, Nvme.OK, 0);
            case Nvme.ADMIN_SET_FEATURES -> setFeatures(q, cid, cdw10 & 0xFF, cdw11);
            case Nvme.ADMIN_GET_FEATURES -> getFeatures(q, cid, cdw10 & 0xFF);
            case Nvme.ADMIN_AER -> {
                boolean parked;
                synchronized (this) {
                    parked = aerCount < aers.length;
                    if (parked) {
                        aers[aerCount++] = cid; // answered when an event happens (none yet) or at teardown
                    }
                }
                if (!parked) {
                    q.respond(cid, Nvme.status(Nvme.SCT_COMMAND, Nvme.SC_ASYNC_LIMIT, true), 0);
                }
            }
            // Abort: nothing here can be pulled back once the driver has it; answer "not aborted" (DW0 bit 0 = 1)
            case Nvme.ADMIN_ABORT -> q.respond(cid, Nvme.OK, 1);
            default -> q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_OPCODE, true), 0);
        }
    }

    private void identify(TcpQueue q, ByteBuffer sqe, int cid, int cns) {
        IdentifyPages pages = server.pages;
        int nsid = sqe.getInt(Nvme.SQE_NSID);
        if (discovery && cns != Nvme.CNS_CONTROLLER) {
            q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), 0);
            return;
        }
        switch (cns) {
            case Nvme.CNS_CONTROLLER -> pages.controller(page, cntlid, discovery);
            case Nvme.CNS_NAMESPACE, Nvme.CNS_NS_DESCRIPTORS -> {
                if (nsid != 1) {
                    q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_NS, true), 0);
                    return;
                }
                if (cns == Nvme.CNS_NAMESPACE) {
                    pages.namespace(page);
                } else {
                    pages.descriptors(page);
                }
            }
            case Nvme.CNS_ACTIVE_NS_LIST -> {
                if (Integer.compareUnsigned(nsid, 0xFFFFFFFE) >= 0) {
                    // No namespace ID lies above FFFFFFFEh or FFFFFFFFh: no list can start there (NVMe base 1.4
                    // 5.15.2, as nvmet and SPDK answer it)
                    q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_NS, true), 0);
                    return;
                }
                IdentifyPages.activeNamespaces(page, nsid);
            }
            // I/O command set specific structures of the NVM command set are all zeros (nvmet does the same)
            case Nvme.CNS_CS_CONTROLLER, Nvme.CNS_CS_NAMESPACE -> IdentifyPages.page(page, Nvme.IDENTIFY_SIZE);
            default -> {
                q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), 0);
                return;
            }
        }
        q.respondData(sqe, cid, page, 0, page.limit());
    }

    private void getLogPage(TcpQueue q, ByteBuffer sqe, int cid, int cdw10, int cdw11) {
        int lid = cdw10 & 0xFF;
        long numd = ((cdw10 >>> 16) | ((long) (cdw11 & 0xFFFF) << 16)) + 1;
        long length = numd * 4;
        long offset = (sqe.getInt(Nvme.SQE_CDW12) & 0xFFFFFFFFL) | ((long) sqe.getInt(Nvme.SQE_CDW13) << 32);
        if (discovery) {
            if (lid != Nvme.LID_DISCOVERY) {
                q.respond(cid, Nvme.status(Nvme.SCT_COMMAND, Nvme.SC_INVALID_LOG_PAGE, true), 0);
                return;
            }
            server.pages.discoveryLog(page, server.hostAllowed(hostNqn));
        } else {
            switch (lid) {
                case Nvme.LID_ERROR -> IdentifyPages.page(page, 64); // no error entries kept: one zero entry
                case Nvme.LID_SMART -> IdentifyPages.page(page, 512); // nothing measured: zeros (nvmet's file backend too)
                case Nvme.LID_FW_SLOT -> IdentifyPages.firmwareSlots(page);
                case Nvme.LID_CHANGED_NS -> IdentifyPages.page(page, 4096); // the namespace never changes
                default -> {
                    q.respond(cid, Nvme.status(Nvme.SCT_COMMAND, Nvme.SC_INVALID_LOG_PAGE, true), 0);
                    return;
                }
            }
        }
        // The offset is unsigned: with its top bit set it lies past every page (as a signed long it passed the
        // check, and an int of it started the copy before the page: the admin queue died mid C2HData)
        if ((offset & 3) != 0 || Long.compareUnsigned(offset, page.limit()) > 0) {
            q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), 0);
            return;
        }
        // Past the page's end the host reads zeros, as the specification has it for a partially valid log
        q.respondData(sqe, cid, page, (int) offset, (int) Math.min(length, 1 << 20));
    }

    private void setFeatures(TcpQueue q, int cid, int fid, int cdw11) {
        switch (fid) {
            case Nvme.FID_NUM_QUEUES -> {
                if (discovery) {
                    q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), 0);
                    return;
                }
                if ((cdw11 & 0xFFFF) == 0xFFFF || cdw11 >>> 16 == 0xFFFF) {
                    // NSQR or NCQR of 65535 would ask for 65536 queues: Invalid Field, as nvmet answers
                    q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), 0);
                    return;
                }
                // The host asks; we grant what we have, whatever it asked (0's based in both halves)
                q.respond(cid, Nvme.OK, numQueues());
            }
            case Nvme.FID_KATO -> {
                katoMillis = kato(cdw11 & 0xFFFFFFFFL);
                q.respond(cid, Nvme.OK, 0);
            }
            case Nvme.FID_ASYNC_EVENT -> {
                synchronized (this) {
                    aenConfig = cdw11;
                }
                q.respond(cid, Nvme.OK, 0);
            }
            case Nvme.FID_VWC -> {
                if (discovery || !server.namespace.volatileCache()) {
                    // No volatile write cache: there is nothing to turn on or off (VWC 0 in Identify)
                    q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), 0);
                    return;
                }
                writeCacheEnabled = (cdw11 & 1) != 0; // off: every write goes FUA, i.e. write-through
                q.respond(cid, Nvme.OK, 0);
            }
            default -> q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), 0);
        }
    }

    private void getFeatures(TcpQueue q, int cid, int fid) {
        long value;
        switch (fid) {
            case Nvme.FID_NUM_QUEUES -> value = numQueues();
            case Nvme.FID_KATO -> value = katoMillis;
            case Nvme.FID_ASYNC_EVENT -> {
                synchronized (this) {
                    value = aenConfig;
                }
            }
            case Nvme.FID_VWC -> value = writeCacheEnabled ? 1 : 0;
            default -> {
                q.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true), 0);
                return;
            }
        }
        q.respond(cid, Nvme.OK, value);
    }

    private long numQueues() {
        long n = server.config.ioQueues() - 1;
        return n | n << 16;
    }
}
