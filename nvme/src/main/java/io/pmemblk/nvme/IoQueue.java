package io.pmemblk.nvme;

import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.zip.CRC32C;

/**
 * The NVM command set on one I/O queue (NVM command set 1.0: Read, Write, Flush, Write Zeroes, Dataset
 * Management), run by the queue's reader thread: each command is checked, given a tag of the queue's hardware
 * queue and a slot, filled (in-capsule data from the socket, or an R2T for the rest) and batched for the driver;
 * {@link IoAnswers} answers it.
 *
 * <p>Tags: a write waiting for its H2CData holds a tag, and that data comes in the socket behind later commands.
 * So the reader never waits for a tag while one of its writes waits for data: a command that finds no tag then is
 * parked ({@link ParkedCommands}) and the reader goes on reading; at each PDU boundary the parked commands are
 * started in order as tags allow, and once no write of this queue waits for data the reader may wait for a tag
 * (every tag it holds is then in the driver and comes back without it), so a parked command never waits on a
 * busy spin or on the host.
 */
final class IoQueue {
    private final TcpQueue link;
    private final PduReader in;
    private final Namespace ns;
    private final NvmeTcpConfig config;
    private final FrontendQueue frontend;
    private final IoSlot[] slots;
    final IoAnswers answers;
    private final ParkedCommands parked;
    /** The request last acquired and not yet added or completed here (FrontendQueue's own "filling"). */
    private Request filling;
    /** Slots whose write waits for H2CData: while any does, the reader must not wait for a tag. */
    private int awaiting;
    private final CRC32C rxCrc = new CRC32C();
    /** DSM ranges read from the socket (at most 256 ranges of 16 bytes). */
    private final ByteBuffer ranges = ByteBuffer.allocate(256 * 16).order(ByteOrder.LITTLE_ENDIAN);

    /**
     * @param hw      the hardware queue this I/O queue submits to
     * @param entries the host's submission queue size (SQSIZE + 1): what may be parked at most
     */
    IoQueue(TcpQueue link, PduReader in, NvmeTcpServer server, HardwareQueue hw, int entries) {
        this.link = link;
        this.in = in;
        this.ns = server.namespace;
        this.config = server.config;
        this.frontend = new FrontendQueue(hw);
        this.slots = new IoSlot[hw.depth() + hw.reservedDepth()];
        for (int i = 0; i < slots.length; i++) {
            slots[i] = new IoSlot(i);
        }
        this.answers = new IoAnswers(link, slots);
        this.parked = new ParkedCommands(entries, config.inCapsuleBytes());
    }

    /** Commands parked now (for tests). */
    int parkedCount() {
        return parked.size();
    }

    /** Before a read that may block: the batch gathered so far goes to the driver in one call. */
    void dispatch() {
        frontend.dispatch();
    }

    /** The reader stopped: tags of writes still waiting for data and of the undispatched batch go back. */
    void teardown() {
        // Writes still waiting for H2CData never reach the driver: give their tags back (the one being
        // filled is FrontendQueue's to release, with the undispatched batch)
        for (IoSlot s : slots) {
            if (s.awaitingData && s.request != null) {
                s.awaitingData = false;
                if (s.request != filling) { // else releaseUndispatched releases (and counts) it
                    s.request.release();
                    answers.outstanding.decrementAndGet();
                }
            }
        }
        awaiting = 0;
        answers.outstanding.addAndGet(-frontend.releaseUndispatched());
    }

    /** A command on this I/O queue, its header in {@code sqe}, its in-capsule data (if any) next in the socket. */
    void command(ByteBuffer sqe, int opcode, int cid) throws IOException, PduException, InterruptedException {
        short st = check(sqe, opcode);
        if (st != Nvme.OK) {
            in.skipData();
            link.respond(cid, st, 0);
            return;
        }
        if (parked.isEmpty() && start(sqe, opcode, cid, null)) {
            return;
        }
        park(sqe, cid);
    }

    /** At a PDU boundary: the parked commands start, oldest first, as far as tags allow. */
    void resumeParked() throws IOException, InterruptedException {
        while (!parked.isEmpty()) {
            ByteBuffer sqe = parked.headSqe();
            if (!start(sqe, sqe.get(Nvme.SQE_OPCODE) & 0xFF, sqe.getShort(Nvme.SQE_CID) & 0xFFFF, parked.headData())) {
                return; // a write of ours waits for data: the host sends it, the reader reads it, then again
            }
            parked.pop();
        }
    }

    private void park(ByteBuffer sqe, int cid) throws IOException, PduException {
        if (parked.full()) {
            throw new PduException(Pdu.FES_SEQUENCE, Pdu.CH_TYPE, "CapsuleCmd CID " + cid + " beyond the "
                    + parked.capacity() + " entries of the host's submission queue");
        }
        parked.add(sqe);
        int length = in.dataLength;
        if (length > 0) {
            ByteBuffer d = parked.lastData(length);
            rxCrc.reset();
            in.readData(d, length, in.dataDigest ? rxCrc : null);
            if (in.dataDigest && in.readDigest() != (int) rxCrc.getValue()) {
                parked.dropLast();
                link.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_TRANSIENT_TRANSPORT, false), 0);
            }
        }
    }

    /** The status a command gets before it may run (OK: it may), from its SQE and the PDU's data length. */
    private short check(ByteBuffer sqe, int opcode) {
        int nsid = sqe.getInt(Nvme.SQE_NSID);
        boolean flushAll = opcode == Nvme.IO_FLUSH && nsid == 0xFFFFFFFF;
        if (opcode != Nvme.IO_READ && opcode != Nvme.IO_WRITE && opcode != Nvme.IO_FLUSH
                && opcode != Nvme.IO_WRITE_ZEROES && opcode != Nvme.IO_DSM) {
            return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_OPCODE, true);
        } else if (nsid != 1 && !flushAll) {
            return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_NS, true);
        }
        long slba = slba(sqe);
        long nlb = nlb(sqe);
        int sgl = sqe.get(Nvme.SGL_TYPE) & 0xFF;
        long sglLength = sqe.getInt(Nvme.SGL_LENGTH) & 0xFFFFFFFFL;
        boolean rangeCmd = opcode == Nvme.IO_READ || opcode == Nvme.IO_WRITE || opcode == Nvme.IO_WRITE_ZEROES;
        if (rangeCmd && (slba < 0 || slba + nlb > ns.blocks() || slba + nlb < 0)) {
            return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_LBA_RANGE, true);
        }
        long bytes = nlb << ns.lbaShift();
        if (opcode == Nvme.IO_READ || opcode == Nvme.IO_WRITE) {
            if (bytes > config.maxTransferBytes()) {
                return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true); // beyond MDTS
            } else if (sglLength != bytes) {
                return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true);
            } else if (opcode == Nvme.IO_READ && sgl != Nvme.SGL_TRANSPORT) {
                return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_TYPE, true);
            } else if (opcode == Nvme.IO_WRITE && sgl == Nvme.SGL_INCAPSULE) {
                if (in.dataLength != bytes) {
                    return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true);
                } else if (sqe.getLong(Nvme.SGL_ADDR) != 0) {
                    return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_OFFSET, true);
                }
            } else if (opcode == Nvme.IO_WRITE && (sgl != Nvme.SGL_TRANSPORT || in.dataLength != 0)) {
                return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_TYPE, true);
            }
        }
        if (in.dataLength != 0 && opcode != Nvme.IO_WRITE && opcode != Nvme.IO_DSM) {
            // Read, Flush and Write Zeroes move no data to the controller: nothing would read what the capsule
            // carries, and the next PDU's header would be taken from it. Refused here, the data is skipped
            return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true);
        }
        if (opcode == Nvme.IO_DSM) {
            int rangeBytes = ((sqe.getInt(Nvme.SQE_CDW10) & 0xFF) + 1) * 16;
            if (sgl != Nvme.SGL_INCAPSULE || in.dataLength != rangeBytes || sglLength != rangeBytes) {
                // The ranges must come in the capsule (nvme.in-capsule-bytes is at least 4 KiB, 256 ranges), and
                // NR, the SGL and the capsule must agree on them: which ranges to deallocate is not guessed
                return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_DATA_LENGTH, true);
            } else if (sqe.getLong(Nvme.SGL_ADDR) != 0) {
                // as for a Write: the data starts the capsule's data (ICDOFF 0), nothing else is read
                return Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_SGL_INVALID_OFFSET, true);
            }
        }
        return Nvme.OK;
    }

    private static long slba(ByteBuffer sqe) {
        return (sqe.getInt(Nvme.SQE_CDW10) & 0xFFFFFFFFL) | ((long) sqe.getInt(Nvme.SQE_CDW11) << 32);
    }

    private static long nlb(ByteBuffer sqe) {
        return (sqe.getInt(Nvme.SQE_CDW12) & 0xFFFF) + 1L;
    }

    /**
     * Starts a checked command: false when it needs a tag and none is free while a write of this queue waits for
     * data (nothing consumed then). {@code data}: its in-capsule data when it was parked, null to read it from
     * the socket.
     */
    private boolean start(ByteBuffer sqe, int opcode, int cid, ByteBuffer data) throws IOException,
            InterruptedException {
        boolean mayWait = awaiting == 0;
        long offset = slba(sqe) << ns.lbaShift();
        int bytes = (int) (nlb(sqe) << ns.lbaShift());
        boolean fua = (sqe.getInt(Nvme.SQE_CDW12) & (1 << 30)) != 0 || !link.controller().writeCacheEnabled;
        switch (opcode) {
            case Nvme.IO_READ -> {
                Request r = mayWait ? frontend.acquireRead(offset, bytes) : frontend.tryAcquireRead(offset, bytes);
                if (r == null) {
                    return false;
                }
                add(acquired(r, cid, opcode));
            }
            case Nvme.IO_WRITE -> {
                return write(cid, offset, bytes, fua, (sqe.get(Nvme.SGL_TYPE) & 0xFF) == Nvme.SGL_INCAPSULE, data,
                        mayWait);
            }
            case Nvme.IO_FLUSH, Nvme.IO_WRITE_ZEROES -> {
                Request r = mayWait ? frontend.acquire(0) : frontend.tryAcquire(0);
                if (r == null) {
                    return false;
                }
                acquired(r, cid, opcode);
                if (opcode == Nvme.IO_FLUSH) {
                    r.op = Op.FLUSH;
                    r.offset = 0;
                    r.length = 0;
                } else {
                    r.op = Op.WRITE_ZEROES;
                    r.offset = offset;
                    r.length = bytes;
                    r.fua = fua;
                }
                add(r);
            }
            case Nvme.IO_DSM -> {
                if (!mayWait) {
                    return false; // one tag per range: it starts when it may wait for them
                }
                dsm(sqe, cid, data);
            }
            default -> throw new AssertionError(opcode); // check() admits only the five above
        }
        return true;
    }

    private Request acquired(Request r, int cid, int opcode) {
        filling = r;
        answers.outstanding.incrementAndGet();
        r.completion = answers.onComplete;
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

    private boolean write(int cid, long offset, int bytes, boolean fua, boolean inCapsule, ByteBuffer data,
                          boolean mayWait) throws IOException, InterruptedException {
        Request r;
        if (link.ddgst) {
            // With a data digest the payload is checked before it may touch the device: into buffers first
            r = mayWait ? frontend.acquire(bytes) : frontend.tryAcquire(bytes);
            if (r != null) {
                r.op = Op.WRITE;
                r.offset = offset;
            }
        } else {
            r = mayWait ? frontend.acquireWrite(offset, bytes) : frontend.tryAcquireWrite(offset, bytes);
        }
        if (r == null) {
            return false;
        }
        acquired(r, cid, Nvme.IO_WRITE);
        r.fua = fua;
        IoSlot s = slots[r.tag()];
        s.length = bytes;
        if (inCapsule) {
            if (data != null) {
                copy(data, r.dataBuffers(), r.dataBufferCount()); // its digest was checked when it was parked
                add(r);
                return true;
            }
            rxCrc.reset();
            in.readData(r.dataBuffers(), r.dataBufferCount(), 0, bytes, in.dataDigest ? rxCrc : null);
            if (in.dataDigest && in.readDigest() != (int) rxCrc.getValue()) {
                s.override = Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_TRANSIENT_TRANSPORT, false);
                completeHere(r, Status.EIO);
                return true;
            }
            add(r);
            return true;
        }
        // One R2T for the whole transfer (as nvmet): the host splits it into H2CData PDUs of at most MAXH2CDATA
        s.awaitingData = true;
        awaiting++;
        link.writeLock.lock();
        try {
            Wire.r2t(s.r2t, cid, s.tag, 0, bytes, link.hdgst, s.crc);
            link.writeFully(s.r2t);
        } finally {
            link.writeLock.unlock();
        }
        return true;
    }

    /** Copies a parked command's data into a request's buffers (positioned at their data's start). */
    private static void copy(ByteBuffer from, ByteBuffer[] buffers, int count) {
        for (int i = 0; i < count && from.hasRemaining(); i++) {
            ByteBuffer b = buffers[i];
            int n = Math.min(b.remaining(), from.remaining());
            b.put(b.position(), from, from.position(), n);
            from.position(from.position() + n);
        }
    }

    void h2cData() throws IOException, PduException {
        ByteBuffer h = in.header;
        int cccid = h.getShort(Pdu.D_CCCID) & 0xFFFF;
        int ttag = h.getShort(Pdu.D_TTAG) & 0xFFFF;
        long datao = h.getInt(Pdu.D_OFFSET) & 0xFFFFFFFFL;
        long datal = h.getInt(Pdu.D_LENGTH) & 0xFFFFFFFFL;
        if (datal != in.dataLength) {
            throw new PduException(Pdu.FES_INVALID_HEADER, Pdu.D_LENGTH, "H2CData DATAL " + datal + " but the PDU"
                    + " carries " + in.dataLength + " bytes");
        }
        IoSlot s = ttag >= slots.length ? null : slots[ttag];
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
            awaiting--;
            if (s.override != Nvme.OK) {
                completeHere(r, Status.EIO);
            } else {
                add(r);
            }
        }
    }

    /** Dataset Management; {@code data}: the ranges when the command was parked, null to read them now. */
    private void dsm(ByteBuffer sqe, int cid, ByteBuffer data) throws IOException, InterruptedException {
        int count = (sqe.getInt(Nvme.SQE_CDW10) & 0xFF) + 1;
        boolean deallocate = (sqe.getInt(Nvme.SQE_CDW11) & (1 << 2)) != 0;
        ByteBuffer list = data;
        if (list == null) {
            list = ranges.clear();
            rxCrc.reset();
            in.readData(list, count * 16, in.dataDigest ? rxCrc : null);
            if (in.dataDigest && in.readDigest() != (int) rxCrc.getValue()) {
                link.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_TRANSIENT_TRANSPORT, false), 0);
                return;
            }
        }
        for (int i = 0; i < count; i++) {
            long nlb = list.getInt(i * 16 + 4) & 0xFFFFFFFFL;
            long slba = list.getLong(i * 16 + 8);
            if (slba < 0 || slba + nlb > ns.blocks() || slba + nlb < 0) {
                link.respond(cid, Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_LBA_RANGE, true), 0);
                return;
            }
        }
        if (!deallocate) {
            link.respond(cid, Nvme.OK, 0); // attributes only (integral read/write hints): advisory, nothing to do
            return;
        }
        IoSlot parent = null;
        for (int i = 0; i < count; i++) {
            long nlb = list.getInt(i * 16 + 4) & 0xFFFFFFFFL;
            long slba = list.getLong(i * 16 + 8);
            Request r = acquired(frontend.acquire(0), cid, Nvme.IO_DSM);
            IoSlot s = slots[r.tag()];
            if (parent == null) {
                parent = s;
                parent.remaining = count;
            }
            s.parent = parent;
            r.op = Op.TRIM;
            r.offset = slba << ns.lbaShift();
            r.length = nlb << ns.lbaShift();
            r.fua = !link.controller().writeCacheEnabled; // write-through covers deallocation too
            add(r);
        }
    }
}
