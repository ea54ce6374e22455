package io.pmemblk.ublk;

import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.uring.IoUring;
import io.pmemblk.uring.IoUringAbi;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

import static io.pmemblk.posix.Errno.*;
import static io.pmemblk.ublk.UblkAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

/**
 * {@code /dev/ublk-control}: the commands that create, start, stop, recover and delete ublk devices. Each is an
 * IORING_OP_URING_CMD on a small ring of 128-byte SQEs (the 32-byte {@code ublksrv_ctrl_cmd} does not fit a
 * 64-byte one; the kernel answers -EINVAL on such a ring). Commands run one at a time and wait for their CQE:
 * the kernel runs them on an io-wq worker where they may block (START_DEV waits until every queue has fetched
 * its tags, STOP_DEV until the disk is drained), and their argument buffers must live until then.
 *
 * <p>Thread-safe (one command at a time). Not on any I/O path.
 */
public final class UblkControl implements AutoCloseable {
    private final int fd;
    private final IoUring ring;
    private final Arena arena = Arena.ofShared();
    private final MemorySegment cmd = arena.allocate(CTRL_CMD_SIZE, 8);
    private final MemorySegment buffer = arena.allocate(PARAMS_SIZE, 8);
    private boolean closed;

    private UblkControl(int fd, IoUring ring) {
        this.fd = fd;
        this.ring = ring;
    }

    /**
     * Opens the control device.
     * @throws UblkException when it is missing (the module is not loaded: says to {@code modprobe ublk_drv}), not
     *         permitted, or the kernel refuses io_uring
     */
    public static UblkControl open() throws UblkException {
        int fd;
        try {
            fd = FileCalls.open(CONTROL_DEVICE, FileCalls.O_RDWR, 0);
        } catch (NativeException e) {
            throw switch (e.errno()) {
                case ENOENT, ENXIO, ENODEV -> new UblkException(CONTROL_DEVICE + " does not exist: the ublk driver is not loaded"
                        + " (run `modprobe ublk_drv` as root; it needs Linux >= 6.4 with CONFIG_BLK_DEV_UBLK), or set"
                        + " ublk.enabled=false", e.errno(), e);
                case EPERM, EACCES -> new UblkException("cannot open " + CONTROL_DEVICE + ": " + e.getMessage()
                        + "; creating ublk devices needs root (CAP_SYS_ADMIN)", e.errno(), e);
                default -> new UblkException("cannot open " + CONTROL_DEVICE + ": " + e.getMessage(), e.errno(), e);
            };
        }
        try {
            return new UblkControl(fd, IoUring.open(4, 0, IoUringAbi.IORING_SETUP_SQE128));
        } catch (NativeException | RuntimeException e) {
            try {
                Libc.close(fd);
            } catch (NativeException suppressed) {
                e.addSuppressed(suppressed);
            }
            int errno = e instanceof NativeException n ? n.errno() : 0;
            throw new UblkException("cannot create the io_uring for " + CONTROL_DEVICE + ": " + e.getMessage()
                    + (errno == EPERM || errno == EACCES ? " (is io_uring disabled? sysctl kernel.io_uring_disabled must be 0)" : ""),
                    errno, e);
        }
    }

    /** GET_FEATURES: the UBLK_F_* flags this kernel supports. */
    public synchronized long features() throws UblkException {
        buffer.asSlice(0, 8).fill((byte) 0);
        int res = run(UBLK_U_CMD_GET_FEATURES, NEW_DEV_ID, NO_QUEUE, buffer, 8, 0);
        if (res < 0) {
            throw new UblkException("GET_FEATURES failed: " + errnoText(res) + " (the ublk driver predates Linux 6.5?)", -res);
        }
        return buffer.get(JAVA_LONG, 0);
    }

    /**
     * ADD_DEV: creates device {@code id} (-1: the kernel picks) with {@code queues} x {@code depth} tags,
     * requests of at most {@code maxIoBytes}, and {@code flags} (UBLK_F_*); {@code serverFlags} goes into
     * {@code ublksrv_flags}, which the kernel keeps with the device for us. Returns what the kernel made of it.
     */
    public synchronized DeviceInfo add(int id, int queues, int depth, int maxIoBytes, long flags, long serverFlags)
            throws UblkException {
        MemorySegment info = buffer.asSlice(0, DEV_INFO_SIZE);
        info.fill((byte) 0);
        info.set(JAVA_SHORT, DEV_INFO_NR_HW_QUEUES, (short) queues);
        info.set(JAVA_SHORT, DEV_INFO_QUEUE_DEPTH, (short) depth);
        info.set(JAVA_INT, DEV_INFO_MAX_IO_BUF_BYTES, maxIoBytes);
        info.set(JAVA_INT, DEV_INFO_DEV_ID, id);
        info.set(JAVA_INT, DEV_INFO_SRV_PID, -1);
        info.set(JAVA_LONG, DEV_INFO_FLAGS, flags);
        info.set(JAVA_LONG, DEV_INFO_SRV_FLAGS, serverFlags);
        int res = run(UBLK_U_CMD_ADD_DEV, id, NO_QUEUE, info, DEV_INFO_SIZE, 0);
        if (res < 0) {
            String what = id < 0 ? "a new ublk device" : "ublk device " + id;
            throw new UblkException(switch (-res) {
                case EEXIST -> "cannot add " + what + ": the id is in use (another pmemblk or ublk server, or a stale device:"
                        + " `ublk list`, or set ublk.id=-1)";
                case EACCES -> "cannot add " + what + ": the kernel has no free ublk device (module parameter ublks_max, default 64)";
                case EPERM -> "cannot add " + what + ": not permitted (needs root: CAP_SYS_ADMIN)";
                default -> "cannot add " + what + " (" + queues + " queues x " + depth + " tags, max I/O " + maxIoBytes
                        + " bytes, flags 0x" + Long.toHexString(flags) + "): " + errnoText(res);
            }, -res);
        }
        return DeviceInfo.read(info);
    }

    /** GET_DEV_INFO of device {@code id}, or null when there is no such device. */
    public synchronized DeviceInfo info(int id) throws UblkException {
        MemorySegment info = buffer.asSlice(0, DEV_INFO_SIZE);
        info.fill((byte) 0);
        int res = run(UBLK_U_CMD_GET_DEV_INFO, id, NO_QUEUE, info, DEV_INFO_SIZE, 0);
        if (res == -ENODEV) {
            return null;
        }
        check(res, "GET_DEV_INFO", id);
        return DeviceInfo.read(info);
    }

    /** SET_PARAMS: before START_DEV (or during recovery) only. */
    public synchronized void setParams(int id, DeviceParams params) throws UblkException {
        MemorySegment p = buffer.asSlice(0, PARAMS_SIZE);
        params.write(p);
        check(run(UBLK_U_CMD_SET_PARAMS, id, NO_QUEUE, p, PARAMS_SIZE, 0), "SET_PARAMS " + params, id);
    }

    /** GET_PARAMS: the device's size and block size as the kernel has them. */
    public synchronized DeviceParams params(int id) throws UblkException {
        MemorySegment p = buffer.asSlice(0, PARAMS_SIZE);
        p.fill((byte) 0);
        p.set(JAVA_INT, PARAMS_LEN, PARAMS_SIZE);
        check(run(UBLK_U_CMD_GET_PARAMS, id, NO_QUEUE, p, PARAMS_SIZE, 0), "GET_PARAMS", id);
        return DeviceParams.read(p);
    }

    /**
     * START_DEV: waits until every queue has fetched all its tags, then adds {@code /dev/ublkb<id>} (and scans its
     * partitions, through the queues: they must be serving already). Never call it from a queue thread.
     */
    public void start(int id, int serverPid) throws UblkException {
        check(runUnlocked(UBLK_U_CMD_START_DEV, id, serverPid), "START_DEV", id);
    }

    /** STOP_DEV: removes the disk, draining its I/O through the queues, then aborts every fetched tag (-ENODEV). */
    public void stop(int id) throws UblkException {
        check(runUnlocked(UBLK_U_CMD_STOP_DEV, id, 0), "STOP_DEV", id);
    }

    /**
     * Deletes the device and waits, at most {@code millis}, until the kernel has let go of it. DEL_DEV itself would
     * wait for ever while anyone still holds {@code /dev/ublkcN} (an open fd, a mapping, a ring's registered
     * file: ublksrv issue 52), so the asynchronous form is sent and the id is polled instead; a kernel before
     * 6.9 gets the waiting form.
     * @throws UblkException when the kernel refuses, or the device is still there at the deadline
     */
    public void delete(int id, long millis) throws UblkException {
        int res = runUnlocked(UBLK_U_CMD_DEL_DEV_ASYNC, id, 0);
        if (res == -EOPNOTSUPP || res == -EINVAL) { // no DEL_DEV_ASYNC before 6.9
            check(runUnlocked(UBLK_U_CMD_DEL_DEV, id, 0), "DEL_DEV", id);
            return;
        }
        check(res, "DEL_DEV_ASYNC", id);
        long deadline = System.nanoTime() + java.util.concurrent.TimeUnit.MILLISECONDS.toNanos(millis);
        while (info(id) != null) {
            if (System.nanoTime() - deadline > 0) {
                throw new UblkException("ublk device " + id + " was deleted but is still held after " + millis
                        + " ms (a process has /dev/ublkc" + id + " open or mapped); it goes away when that is closed", EBUSY);
            }
            try {
                Thread.sleep(20); // the kernel signals nothing here: bounded polling
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new UblkException("interrupted while deleting ublk device " + id, EINTR, e);
            }
        }
    }

    /** START_USER_RECOVERY of a quiesced device; -EBUSY while the dead server's /dev/ublkcN is still held. */
    public synchronized int startRecovery(int id) throws UblkException {
        return run(UBLK_U_CMD_START_USER_RECOVERY, id, NO_QUEUE, MemorySegment.NULL, 0, 0);
    }

    /** END_USER_RECOVERY: waits until every queue has fetched its tags again, then the device is live. */
    public void endRecovery(int id, int serverPid) throws UblkException {
        check(runUnlocked(UBLK_U_CMD_END_USER_RECOVERY, id, serverPid), "END_USER_RECOVERY", id);
    }

    /**
     * The blocking commands take the ring only to submit and reap, so a STOP_DEV can be sent while a START_DEV
     * waits (a queue failed to start): they use their own command buffer and a ring each.
     */
    private int runUnlocked(int op, int id, long data) throws UblkException {
        try (Arena a = Arena.ofConfined(); IoUring own = IoUring.open(2, 0, IoUringAbi.IORING_SETUP_SQE128)) {
            MemorySegment c = a.allocate(CTRL_CMD_SIZE, 8);
            return submit(own, c, op, id, NO_QUEUE, MemorySegment.NULL, 0, data);
        } catch (NativeException e) {
            throw new UblkException("ublk control command 0x" + Integer.toHexString(op) + " for device " + id
                    + " could not be submitted: " + e.getMessage(), e.errno(), e);
        }
    }

    private int run(int op, int id, short queue, MemorySegment buf, int len, long data) throws UblkException {
        ensureOpen();
        try {
            return submit(ring, cmd, op, id, queue, buf, len, data);
        } catch (NativeException e) {
            throw new UblkException("ublk control command 0x" + Integer.toHexString(op) + " for device " + id
                    + " could not be submitted: " + e.getMessage(), e.errno(), e);
        }
    }

    private int submit(IoUring r, MemorySegment c, int op, int id, short queue, MemorySegment buf, int len, long data)
            throws NativeException {
        fill(c, id, queue, buf, len, data);
        return await(r, fd, op, c, TOKENS.incrementAndGet());
    }

    /** Every command's user data, unique in this process, so a completion is matched to the command it answers. */
    private static final java.util.concurrent.atomic.AtomicLong TOKENS = new java.util.concurrent.atomic.AtomicLong();

    /**
     * Submits {@code cmd} as a URING_CMD {@code op} on {@code fd} with user data {@code token}, waits for its CQE
     * and returns its result. One command is in flight on a control ring at a time, so any other completion means
     * the ring is not what this class thinks (a command was left behind, or the ring is shared): that fails here,
     * naming both user data values, rather than answer one command with another's result.
     */
    static int await(IoUring r, int fd, int op, MemorySegment cmd, long token) throws NativeException {
        if (!r.sq().uringCmd(fd, op, cmd, token)) {
            throw new IllegalStateException("control ring full: a previous command never completed");
        }
        int[] res = {Integer.MIN_VALUE};
        long[] stray = {0};
        boolean[] strayed = {false};
        while (res[0] == Integer.MIN_VALUE && !strayed[0]) {
            r.submitAndWait(1);
            r.cq().drain((userData, result, flags) -> {
                if (userData == token) {
                    res[0] = result;
                } else {
                    stray[0] = userData;
                    strayed[0] = true;
                }
            });
        }
        if (strayed[0]) {
            throw new IllegalStateException("ublk control command 0x" + Integer.toHexString(op) + " (user data "
                    + token + ") got a completion for user data " + stray[0] + ": only one command may be in flight"
                    + " on a control ring");
        }
        return res[0];
    }

    private static void fill(MemorySegment c, int id, short queue, MemorySegment buf, int len, long data) {
        c.fill((byte) 0);
        c.set(JAVA_INT, CTRL_CMD_DEV_ID, id);
        c.set(JAVA_SHORT, CTRL_CMD_QUEUE_ID, queue);
        c.set(JAVA_SHORT, CTRL_CMD_LEN, (short) len);
        c.set(JAVA_LONG, CTRL_CMD_ADDR, buf.address());
        c.set(JAVA_LONG, CTRL_CMD_DATA, data);
    }

    private static void check(int res, String what, int id) throws UblkException {
        if (res < 0) {
            throw new UblkException(what + " for ublk device " + id + " failed: " + errnoText(res), -res);
        }
    }

    static String errnoText(int negatedErrno) {
        return Libc.strerror(-negatedErrno) + " (errno " + -negatedErrno + ")";
    }

    private synchronized void ensureOpen() {
        if (closed) {
            throw new IllegalStateException("ublk control is closed");
        }
    }

    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        ring.close();
        arena.close();
        try {
            Libc.close(fd);
        } catch (NativeException ignored) {
            // nothing was pending: every command waited for its CQE
        }
    }
}
