package io.pmemblk.ublk;

import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.posix.FileIo;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;

import static io.pmemblk.posix.Errno.*;
import static io.pmemblk.ublk.UblkAbi.*;

/**
 * What a ublk request becomes in the block layer, and back: the descriptor's operation mapped onto a
 * {@link Request} of the queue's {@link FrontendQueue}, the data moved with UBLK_F_USER_COPY (one copy, the
 * kernel's), and the result the tag's COMMIT carries. No ring and no thread of its own: {@link UblkQueue} feeds
 * it descriptors and commits what {@link Done} reports, so it also runs against any file descriptor whose
 * {@code pread}/{@code pwrite} at the user-copy positions behave like {@code /dev/ublkcN}'s (the tests use a
 * sparse file).
 *
 * <p>WRITE: {@code pread} at the request's user-copy position straight into the pmem mapping on the CPU route
 * ({@link FrontendQueue#acquireWrite} receives in place), into the queue's registered buffers on the DMA route;
 * the driver then makes what the kernel stored durable before a FUA write completes, as for NBD's in-place
 * receives. READ: the driver leaves the data in the mapping ({@link Request#sinkReadsDevice}) or, by DMA, in
 * the registered buffers, and {@code pwrite} hands it to the kernel before the commit. Results: bytes for
 * READ/WRITE, 0 for FLUSH/DISCARD/WRITE_ZEROES (a byte count of 2 GiB or more would read as an error), -errno.
 */
final class UblkRequests implements Request.Completion {
    private static final System.Logger LOG = System.getLogger(UblkRequests.class.getName());

    /** Where a tag's result goes: the queue commits it (called on any thread, once per served request). */
    @FunctionalInterface
    interface Done {
        void done(int tag, int result);
    }

    private final int q;
    /** {@code /dev/ublkcN}, retired by the device before it closes it (a late completion must not use the number). */
    private final FdGuard ublkc;
    private final FrontendQueue frontend;
    private final int maxIoBytes;
    private final int maxDiscardBytes;
    /** The device's 512-byte sectors: no request may reach past them. */
    private final long deviceSectors;
    private final Done done;
    private final String name;
    /** Whether a request out of range was logged already (only the queue's thread serves: no race). */
    private boolean refusalLogged;

    /**
     * @param q               the ublk queue (part of the user-copy position)
     * @param ublkc           {@code /dev/ublkcN}
     * @param maxIoBytes      the device's max I/O: longer READ/WRITEs are refused (the kernel splits to it)
     * @param maxDiscardBytes the device's max DISCARD/WRITE_ZEROES ({@code max_discard_sectors} of its params):
     *                        longer ones are refused (the kernel splits to it)
     */
    UblkRequests(int q, FdGuard ublkc, FrontendQueue frontend, int maxIoBytes, int maxDiscardBytes, Done done,
            String name) {
        this.q = q;
        this.ublkc = ublkc;
        this.frontend = frontend;
        this.maxIoBytes = maxIoBytes;
        this.maxDiscardBytes = maxDiscardBytes;
        this.deviceSectors = frontend.queue().driver().size() >>> 9;
        this.done = done;
        this.name = name;
    }

    /**
     * Turns the request the kernel gave {@code tag} (its descriptor's fields) into a block-layer request, or
     * answers it here; either way {@link Done#done} follows exactly once, now or when the driver completes it.
     */
    void serve(int tag, int opFlags, long startSector, int nrSectors) {
        int op = opFlags & 0xFF;
        // The kernel checks every request against the device's size and limits before it reaches us; checked
        // again here, on the sectors before they are shifted (a start_sector of 2^55 + n would wrap to byte n*512,
        // inside the device), so a kernel or ABI mismatch fails that request instead of writing somewhere else.
        boolean data = op == UBLK_IO_OP_READ || op == UBLK_IO_OP_WRITE;
        if ((data || op == UBLK_IO_OP_DISCARD || op == UBLK_IO_OP_WRITE_ZEROES)
                && !inRange(startSector, nrSectors, data ? maxIoBytes : maxDiscardBytes)) {
            refuse(tag, op, startSector, nrSectors, data ? maxIoBytes : maxDiscardBytes);
            return;
        }
        long offset = startSector << 9;
        long length = Integer.toUnsignedLong(nrSectors) << 9;
        Request r = null;
        boolean handedOver = false;
        try {
            switch (op) {
                case UBLK_IO_OP_READ -> {
                    r = frontend.acquireRead(offset, (int) length); // the pwrite copies straight out of the mapping
                }
                case UBLK_IO_OP_WRITE -> {
                    r = frontend.acquireWrite(offset, (int) length);
                    long got = copyFromKernel(r, tag);
                    if (got != length) {
                        fill(r, tag, opFlags);
                        frontend.completeHere(r, got < 0 ? (int) -got : EIO);
                        return;
                    }
                }
                case UBLK_IO_OP_FLUSH -> {
                    r = frontend.acquire(0);
                    r.op = Op.FLUSH;
                }
                case UBLK_IO_OP_DISCARD, UBLK_IO_OP_WRITE_ZEROES -> {
                    r = frontend.acquire(0);
                    r.op = op == UBLK_IO_OP_DISCARD ? Op.TRIM : Op.WRITE_ZEROES;
                    r.offset = offset;
                    r.length = length;
                }
                default -> {
                    done.done(tag, -EOPNOTSUPP); // zone operations: not a zoned device
                    return;
                }
            }
            fill(r, tag, opFlags);
            frontend.add(r);
            handedOver = true; // from here the driver completes it, whatever happens
            if (frontend.full()) {
                frontend.dispatch();
            }
        } catch (Throwable e) {
            // An Error too (out of memory, an InternalError from a fault): it fails this request, not the queue
            // thread, which serves every other tag of the device.
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
            if (handedOver) {
                dispatchThrew(e);
            } else {
                failHere(r, tag, e);
            }
        }
    }

    /**
     * Whether [startSector, startSector + nrSectors) is a non-empty range inside the device of at most
     * {@code maxBytes}: both fields unsigned as in {@code struct ublksrv_io_desc}, compared before any shift.
     */
    private boolean inRange(long startSector, int nrSectors, int maxBytes) {
        long sectors = Integer.toUnsignedLong(nrSectors);
        return sectors != 0 && sectors <= maxBytes >>> 9
                && Long.compareUnsigned(startSector, deviceSectors) < 0 && sectors <= deviceSectors - startSector;
    }

    /**
     * Answers a request {@link #inRange} refused with -EINVAL, as for any request the device cannot take (the
     * kernel fails that one request with it: {@code errno_to_blk_status}), touching neither the device nor the
     * kernel's pages. Logged once per queue: the kernel does not send these, so one means its ublk driver and
     * this server disagree, and every request after it would be another line.
     */
    private void refuse(int tag, int op, long startSector, int nrSectors, int maxBytes) {
        if (!refusalLogged) {
            refusalLogged = true;
            LOG.log(System.Logger.Level.ERROR, name + ": tag " + tag + ": the kernel sent " + opName(op) + " of "
                    + Integer.toUnsignedString(nrSectors) + " sectors at sector " + Long.toUnsignedString(startSector)
                    + "; allowed: 1.." + (maxBytes >>> 9) + " sectors, ending at or before sector " + deviceSectors
                    + " (the device's end). Answered EINVAL without touching the device; the kernel checks this"
                    + " itself, so its ublk driver and this server disagree about the request layout. Later requests"
                    + " like it on this queue are answered the same way without a line here");
        }
        done.done(tag, -EINVAL);
    }

    private static String opName(int op) {
        return switch (op) {
            case UBLK_IO_OP_READ -> "READ";
            case UBLK_IO_OP_WRITE -> "WRITE";
            case UBLK_IO_OP_DISCARD -> "DISCARD";
            case UBLK_IO_OP_WRITE_ZEROES -> "WRITE_ZEROES";
            default -> "op " + op;
        };
    }

    /**
     * Hands the batch to the driver. What the driver throws (it rethrows an Error once it has completed the whole
     * batch: {@link io.pmemblk.queueing.BlockDriver#queueRequests}) is logged here and goes no further: the
     * requests are answered, and the queue thread must go on serving.
     */
    void dispatch() {
        try {
            frontend.dispatch();
        } catch (Throwable e) {
            dispatchThrew(e);
        }
    }

    private void dispatchThrew(Throwable e) {
        LOG.log(System.Logger.Level.ERROR, name + ": the driver threw on a batch (it has answered its requests; the"
                + " queue goes on): " + e, e);
    }

    private void fill(Request r, int tag, int opFlags) {
        r.fua = (opFlags & UBLK_IO_F_FUA) != 0;
        r.cookie = tag;
        r.completion = this;
    }

    /**
     * Answers EIO for a tag whose request never reached the driver (r: acquired and not completed, or null); the
     * tag is committed either way, exactly once.
     */
    private void failHere(Request r, int tag, Throwable e) {
        LOG.log(System.Logger.Level.ERROR, name + ": tag " + tag + " answered EIO: " + e, e);
        if (r != null && !r.isCompleted()) {
            try {
                frontend.completeHere(r, EIO); // completes through completed(), which commits the tag
                return;
            } catch (Throwable again) {
                e.addSuppressed(again);
            }
        }
        done.done(tag, -EIO);
    }

    /** pread of a WRITE's payload from the kernel into the request's data buffers; bytes read or -errno. */
    private long copyFromKernel(Request r, int tag) {
        return copy(r, tag, true);
    }

    /** pwrite of a READ's data to the kernel from wherever the driver left it; bytes written or -errno. */
    private long copyToKernel(Request r, int tag) {
        return copy(r, tag, false);
    }

    /** Moves the request's data buffers' bytes from or to the kernel at the tag's user-copy position, looping on short counts. */
    private long copy(Request r, int tag, boolean fromKernel) {
        int fd = ublkc.enter();
        try {
            if (fd < 0) {
                return -ENODEV; // the device is closed: its number may already be another file's
            }
            ByteBuffer[] bufs = r.dataBuffers();
            long done = 0;
            for (int i = 0, n = r.dataBufferCount(); i < n; i++) {
                MemorySegment buf = MemorySegment.ofBuffer(bufs[i]);
                while (buf.byteSize() > 0) {
                    long pos = userCopyPosition(q, tag, done);
                    long moved = fromKernel ? FileIo.pread(fd, buf, pos) : FileIo.pwrite(fd, buf, pos);
                    if (moved <= 0) {
                        return moved == 0 ? done : moved; // the request ends early (clamped), or -errno
                    }
                    done += moved;
                    buf = buf.asSlice(moved);
                }
            }
            return done;
        } finally {
            ublkc.exit();
        }
    }

    /**
     * The driver completed a request: on the queue's thread (CPU route) or a DMA channel's. Works out the tag's
     * result, sends a READ's data to the kernel, gives the request back, and reports the tag: always, whatever
     * throws on the way (a READ whose hand-back threw, say from a mapping already unmapped, is reported -EIO),
     * since a tag never reported keeps its request hanging in the kernel until STOP_DEV.
     */
    @Override
    public void completed(Request r) {
        int tag = (int) r.cookie;
        int res = -EIO;
        try {
            int status = r.status();
            if (status != Status.OK) {
                res = -status;
            } else if (r.op == Op.READ) {
                long put = copyToKernel(r, tag);
                res = put == r.length ? (int) put : put < 0 ? (int) put : -EIO;
            } else if (r.op == Op.WRITE) {
                res = (int) r.length;
            } else {
                res = 0; // FLUSH, DISCARD, WRITE_ZEROES: success is 0, not a byte count
            }
        } catch (Throwable e) {
            res = -EIO;
            LOG.log(System.Logger.Level.ERROR, name + ": tag " + tag + " (" + r.op + ") answered EIO: handing its"
                    + " result to the kernel threw: " + e, e);
        } finally {
            try {
                r.release();
            } catch (Throwable e) {
                LOG.log(System.Logger.Level.ERROR, name + ": releasing the request of tag " + tag + " threw: " + e, e);
            }
            done.done(tag, res);
        }
    }

    @Override
    public String toString() {
        return name;
    }
}
