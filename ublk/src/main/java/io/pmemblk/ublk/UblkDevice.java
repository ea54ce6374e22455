package io.pmemblk.ublk;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import static io.pmemblk.posix.Errno.*;
import static io.pmemblk.ublk.UblkAbi.*;

/**
 * The ublk frontend: a {@code /dev/ublkb<id>} block device whose requests the kernel hands to this process, one
 * {@link UblkQueue} thread per ublk queue, each feeding the block layer's hardware queue of the same index.
 *
 * <p>Life ({@code ../shared/notes/ublk.md} section 1.6): ADD_DEV, SET_PARAMS, open {@code /dev/ublkc<id>}, start
 * the queues (each fetches all its tags), START_DEV from this thread (it returns when the disk exists).
 * {@link #close()}: STOP_DEV (the kernel drains the disk through the queues, then aborts their fetches), the
 * queue threads end, {@code /dev/ublkcN} is closed, DEL_DEV. A failure at any step undoes the steps before it,
 * so no half-created device is left behind.
 *
 * <p>Recovery: with {@link UblkConfig#recovery()} a server killed with SIGKILL leaves its device quiesced (I/O
 * waits, a mounted filesystem does not fail), and {@link #open} with the same id takes it over:
 * START_USER_RECOVERY, new queues, END_USER_RECOVERY; requests the dead server held are issued again (REISSUE),
 * which a block device of plain overwrites tolerates. Without recovery the kernel removes the disk of a dead
 * server; its id stays taken until DEL_DEV, which {@link #open} does for a dead device with the id asked for.
 */
public final class UblkDevice implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(UblkDevice.class.getName());
    /** Bound for each step that waits on the kernel or the queue threads. */
    private static final long STEP_MILLIS = 30_000;

    private final UblkControl control;
    private final DeviceInfo info;
    private final int ublkcFd;
    private final List<UblkQueue> queues;
    private final boolean recovered;
    private final CompletableFuture<String> lost = new CompletableFuture<>();
    /** Set before this server stops the device itself: queues ending from then on are expected. */
    private volatile boolean closing;
    private boolean closed;

    private UblkDevice(UblkControl control, DeviceInfo info, int ublkcFd, List<UblkQueue> queues, boolean recovered) {
        this.control = control;
        this.info = info;
        this.ublkcFd = ublkcFd;
        this.queues = queues;
        this.recovered = recovered;
        for (UblkQueue q : queues) {
            q.ended().whenComplete((ignored, failure) -> queueEnded(q, failure));
        }
    }

    /**
     * A queue ended while this server was not stopping the device. Its ring is closed, which the kernel takes as
     * the server gone: it stops the device (or, with recovery, quiesces it) and aborts every other queue's tags.
     * So the device is no longer served; ublksrv's daemon exits then, and so must this frontend, or the device
     * sits stopped or quiesced (a mounted filesystem's I/O waiting for ever) behind a server that says it serves.
     */
    private void queueEnded(UblkQueue q, Throwable failure) {
        if (closing) {
            return;
        }
        lost.complete(failure != null
                ? "ublk queue " + q.index() + " of " + blockDevice() + " failed: " + failure
                : "ublk queue " + q.index() + " of " + blockDevice() + " ended: the kernel aborted its requests"
                        + " (the device was stopped by another process)");
    }

    /**
     * Completes, with what happened, when the device stops being served other than by {@link #close}: a queue
     * thread failed, or another process stopped or deleted the device. Then call {@link #closeLost}.
     */
    public CompletableFuture<String> lost() {
        return lost;
    }

    /**
     * After {@link #lost}: a device the kernel quiesced for recovery is left quiesced, its queues and
     * {@code /dev/ublkcN} released so that the next server with the same {@code ublk.id} resumes it (its waiting
     * I/O then completes); any other is stopped and deleted as {@link #close} does, which also lets another
     * process's waiting DEL_DEV return. Says which.
     */
    public synchronized String closeLost() throws UblkException {
        if (closed) {
            return "already closed";
        }
        DeviceInfo now = control.info(info.id());
        if (now != null && now.state() == UBLK_S_DEV_QUIESCED && now.recoverable()) {
            closing = true;
            closed = true;
            abandon(queues);
            closeUblkc(ublkcFd, queues);
            control.close();
            return blockDevice() + " left quiesced: serve again with ublk.id=" + info.id()
                    + " to resume it (its I/O waits until then)";
        }
        close();
        return blockDevice() + " stopped and deleted";
    }

    /**
     * Fails with the message a user can act on when this machine cannot create ublk devices: no ublk_drv (the
     * modprobe hint), no permission, no io_uring, or a driver without UBLK_F_USER_COPY. Changes nothing.
     */
    public static void checkAvailable() throws UblkException {
        try (UblkControl control = UblkControl.open()) {
            requireUserCopy(control.features());
        }
    }

    private static void requireUserCopy(long features) throws UblkException {
        if ((features & UBLK_F_USER_COPY) == 0) {
            throw new UblkException("this kernel's ublk driver has no UBLK_F_USER_COPY (features 0x"
                    + Long.toHexString(features) + "); pmemblk needs Linux >= 6.4", EOPNOTSUPP);
        }
    }

    /**
     * Creates and starts the device over {@code layer}, whose data is {@code backing}'s (or resumes a quiesced one
     * with {@code config.id()}, when it was serving that same file).
     * @throws UblkException with a message naming what to fix; nothing is left behind
     */
    public static UblkDevice open(BlockLayer layer, UblkConfig config, BackingFile backing) throws UblkException {
        if (config.queues() > layer.queueCount()) {
            throw new UblkException("ublk.queues=" + config.queues() + " but the block layer has " + layer.queueCount()
                    + " hardware queues: ublk queue i is served on hardware queue i (set queues >= ublk.queues)", 0);
        }
        if (config.depth() > layer.queue(0).reservedDepth()) {
            throw new UblkException("ublk.depth=" + config.depth() + " exceeds the " + layer.queue(0).reservedDepth()
                    + " tags the block layer reserves for ublk on each hardware queue: each ublk tag needs one of"
                    + " them (the server reserves ublk.depth tags when ublk.enabled=true)", 0);
        }
        long size = layer.driver().size();
        if (size % config.blockSize() != 0 || size % DeviceParams.PHYSICAL_BLOCK != 0) {
            throw new UblkException("the device size " + size + " is not a multiple of 4096 bytes", 0);
        }
        int maxIo = Math.min(config.maxIoBytes(), layer.maxRequestBytes()) & ~(DeviceParams.PHYSICAL_BLOCK - 1);
        DeviceParams params = new DeviceParams(size, config.blockSize(), Math.min(maxIo, USER_COPY_MAX_BYTES),
                256 << 20);
        UblkControl control = UblkControl.open();
        try {
            requireUserCopy(control.features());
            if (config.id() >= 0) {
                DeviceInfo existing = control.info(config.id());
                if (existing != null) {
                    UblkDevice resumed = takeOver(control, layer, config, existing, params, backing);
                    if (resumed != null) {
                        return resumed;
                    }
                }
            }
            return create(control, layer, config, params, maxIo, backing);
        } catch (UblkException | RuntimeException e) {
            control.close();
            throw e;
        }
    }

    /** An existing device with our id: resume it (quiesced, recoverable), delete it (dead), or refuse (live). */
    private static UblkDevice takeOver(UblkControl control, BlockLayer layer, UblkConfig config, DeviceInfo existing,
            DeviceParams params, BackingFile backing) throws UblkException {
        int id = existing.id();
        // Not this process: in a PID namespace (a container) the server started again often gets the pid the
        // one before had (1, say), and must not take its own /proc entry for the old server alive.
        boolean serverAlive = existing.serverPid() > 0 && existing.serverPid() != Libc.getpid()
                && Files.exists(Path.of("/proc/" + existing.serverPid()));
        if (existing.state() == UBLK_S_DEV_LIVE && serverAlive) {
            throw new UblkException("ublk device " + id + " is in use: served by process " + existing.serverPid()
                    + " (stop it, or choose another ublk.id; -1 lets the kernel pick)", EEXIST);
        }
        if (existing.state() == UBLK_S_DEV_DEAD) {
            // A server without recovery died (or never started the device): the disk is gone, only the id is
            // held. Deleting it frees the id for a fresh device.
            LOG.log(System.Logger.Level.INFO, "ublk device " + id + " is dead (its server is gone): deleting it");
            control.delete(id, STEP_MILLIS);
            return null;
        }
        if (!existing.recoverable()) {
            throw new UblkException("ublk device " + id + " is " + existing.stateName() + " but was created without"
                    + " recovery; it cannot be taken over (its server " + existing.serverPid() + " may still be exiting)", EBUSY);
        }
        if (!config.recovery()) {
            throw new UblkException("ublk device " + id + " is waiting for recovery (" + existing.stateName()
                    + ") but ublk.recovery=false: set ublk.recovery=true to resume it", EBUSY);
        }
        String other = otherBackingFile(existing, backing);
        if (other != null) {
            throw new UblkException(other, EINVAL);
        }
        DeviceParams old = control.params(id);
        if (old.sizeBytes() != params.sizeBytes() || old.logicalBlock() != params.logicalBlock()) {
            throw new UblkException("ublk device " + id + " waiting for recovery has " + old.sizeBytes() + " bytes in "
                    + old.logicalBlock() + "-byte blocks, but this server has " + params.sizeBytes() + " in "
                    + params.logicalBlock() + ": serve the same pmem.size and ublk.block-size to resume it", EINVAL);
        }
        if (existing.queues() > layer.queueCount()
                || existing.depth() > layer.queue(existing.queues() - 1).reservedDepth()) {
            throw new UblkException("ublk device " + id + " has " + existing.queues() + " queues x " + existing.depth()
                    + " tags; this server's block layer reserves " + layer.queue(0).reservedDepth() + " tags for ublk"
                    + " on each of " + layer.queueCount() + " queues (serve the same ublk.queues and ublk.depth)", EINVAL);
        }
        // START_USER_RECOVERY answers EBUSY until the kernel has released the dead server's /dev/ublkcN and
        // quiesced the device (the queue rings' teardown runs as the process exits).
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(STEP_MILLIS);
        int res;
        while ((res = control.startRecovery(id)) == -EBUSY) {
            if (System.nanoTime() - deadline > 0) {
                throw new UblkException("ublk device " + id + ": START_USER_RECOVERY still busy after " + STEP_MILLIS
                        + " ms (the previous server has not released /dev/ublkc" + id + ")", EBUSY);
            }
            pause();
        }
        if (res < 0) {
            throw new UblkException("START_USER_RECOVERY of ublk device " + id + " failed: " + UblkControl.errnoText(res), -res);
        }
        int fd = openCharDevice(id);
        List<UblkQueue> queues = new ArrayList<>();
        try {
            startQueues(layer, existing, old.maxDiscardBytes(), fd, queues);
            control.endRecovery(id, Libc.getpid());
            return new UblkDevice(control, existing, fd, queues, true);
        } catch (UblkException | RuntimeException e) {
            // The device stays quiesced for a later attempt: leave it, stop our queues.
            abandon(queues);
            closeUblkc(fd, queues);
            throw e;
        }
    }

    /**
     * Why {@code existing} must not be resumed on {@code backing} (it recorded another file, or none), naming the
     * file it served and how to go on; null when it served this very file.
     */
    static String otherBackingFile(DeviceInfo existing, BackingFile backing) {
        long recorded = existing.serverFlags();
        long ours = backing.identity();
        if (recorded == ours) {
            return null;
        }
        int id = existing.id();
        String here = "pmem.path=" + backing.path() + " is inode " + backing.ino() + " on device " + backing.deviceName()
                + " (identity 0x" + Long.toHexString(ours) + ")";
        String delete = "or delete the device (the I/O waiting on it then fails) with a ublk tool (ublksrv's `ublk del -n "
                + id + "`) and serve this file with ublk.id=" + id + " again, or with another ublk.id";
        long inode = BackingFile.inodeOf(recorded);
        if (inode < 0) {
            return "ublk device " + id + " is waiting for recovery but records no backing file (ublksrv_flags 0x"
                    + Long.toHexString(recorded) + ": created by an older pmemblk, or by another ublk server), so it"
                    + " cannot be told whether " + here + " is the file it served; resuming it on another file would"
                    + " give the filesystem on /dev/ublkb" + id + " other data. Resume it with the server that created"
                    + " it, " + delete;
        }
        boolean sameInode = inode == (backing.ino() & 0xFFFF_FFFFL);
        return "ublk device " + id + " is waiting for recovery of another backing file: it was serving inode " + inode
                + (sameInode ? " of another filesystem, or a file since deleted and created again with that inode"
                        + " number (its identity 0x" : " (identity 0x") + Long.toHexString(recorded) + "), and " + here
                + "; resuming it here would give the filesystem on /dev/ublkb" + id + " other data. Serve the file it"
                + " was serving with ublk.id=" + id + " to resume it (`find MOUNTPOINT -xdev -inum " + inode
                + "` on its filesystem names it; SIGTERM of that server then deletes the device), " + delete;
    }

    private static UblkDevice create(UblkControl control, BlockLayer layer, UblkConfig config, DeviceParams params,
            int maxIo, BackingFile backing) throws UblkException {
        long flags = UBLK_F_USER_COPY
                | (config.recovery() ? UBLK_F_USER_RECOVERY | UBLK_F_USER_RECOVERY_REISSUE : 0);
        DeviceInfo info = control.add(config.id(), config.queues(), config.depth(), maxIo, flags, backing.identity());
        int fd = -1;
        List<UblkQueue> queues = new ArrayList<>();
        try {
            if (info.queues() != config.queues()) {
                LOG.log(System.Logger.Level.INFO, "ublk device " + info.id() + ": the kernel gave " + info.queues()
                        + " queues for the " + config.queues() + " asked (at most one per CPU)");
            }
            control.setParams(info.id(), params);
            fd = openCharDevice(info.id());
            startQueues(layer, info, params.maxDiscardBytes(), fd, queues);
            control.start(info.id(), Libc.getpid());
            return new UblkDevice(control, info, fd, queues, false);
        } catch (UblkException | RuntimeException e) {
            undo(control, info.id(), fd, queues, e);
            throw e;
        }
    }

    /**
     * Starts a thread per queue and waits until each has fetched all its tags (START_DEV waits for that too).
     * {@code maxDiscardBytes}: the longest DISCARD/WRITE_ZEROES the device's params allow, which the queues hold
     * the kernel's requests to (a resumed device keeps the params it was created with).
     */
    private static void startQueues(BlockLayer layer, DeviceInfo info, int maxDiscardBytes, int fd, List<UblkQueue> queues)
            throws UblkException {
        for (int q = 0; q < info.queues(); q++) {
            UblkQueue queue = new UblkQueue(info.id(), q, info.depth(), fd, FrontendQueue.reserved(layer.queue(q)),
                    info.maxIoBytes(), maxDiscardBytes);
            queues.add(queue);
            queue.start();
        }
        for (UblkQueue queue : queues) {
            try {
                queue.fetched().get(STEP_MILLIS, TimeUnit.MILLISECONDS);
            } catch (ExecutionException e) {
                Throwable cause = e.getCause();
                int errno = cause instanceof NativeException n ? n.errno() : 0;
                throw new UblkException("ublk queue " + queue.index() + " of device " + info.id() + " could not start: "
                        + cause.getMessage(), errno, cause);
            } catch (TimeoutException e) {
                throw new UblkException("ublk queue " + queue.index() + " did not fetch its tags within " + STEP_MILLIS + " ms", 0, e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new UblkException("interrupted while starting ublk queues", EINTR, e);
            }
        }
    }

    /**
     * {@code /dev/ublkc<id>}: devtmpfs creates it with the device; udev may still hold it briefly (the driver
     * allows one opener: EBUSY), so both are waited for, boundedly.
     */
    private static int openCharDevice(int id) throws UblkException {
        String path = "/dev/ublkc" + id;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        for (;;) {
            try {
                return FileCalls.open(path, FileCalls.O_RDWR, 0);
            } catch (NativeException e) {
                boolean transient_ = e.errno() == EBUSY || e.errno() == ENOENT;
                if (!transient_ || System.nanoTime() - deadline > 0) {
                    throw new UblkException("cannot open " + path + ": " + e.getMessage(), e.errno(), e);
                }
            }
            pause();
        }
    }

    private static void pause() throws UblkException {
        try {
            Thread.sleep(20); // polling the kernel for a state change it does not signal; bounded by the callers
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new UblkException("interrupted", EINTR, e);
        }
    }

    /** Undoes a partly created device: its queues, its char device, the device itself. */
    private static void undo(UblkControl control, int id, int fd, List<UblkQueue> queues, Exception cause) {
        LOG.log(System.Logger.Level.WARNING, "ublk device " + id + " could not be started, removing it: " + cause);
        try {
            control.stop(id); // aborts what the ready queues fetched (the device was never started: nothing else)
        } catch (UblkException | RuntimeException e) {
            cause.addSuppressed(e);
        }
        abandon(queues);
        closeUblkc(fd, queues);
        try {
            control.delete(id, STEP_MILLIS);
        } catch (UblkException | RuntimeException e) {
            cause.addSuppressed(e);
        }
    }

    private static void abandon(List<UblkQueue> queues) {
        for (UblkQueue q : queues) {
            q.abandon();
        }
        for (UblkQueue q : queues) {
            try {
                if (!q.join(STEP_MILLIS)) {
                    LOG.log(System.Logger.Level.ERROR, "ublk queue thread " + q + " did not end");
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }

    /**
     * Closes {@code /dev/ublkcN} once no queue can write to it any more: each queue's guard is retired first, so a
     * completion arriving later (an abandoned queue's DMA request) skips its pwrite instead of writing READ data
     * into whatever file gets the number next. A hand-back still inside its pwrite keeps the fd open (leaked).
     */
    private static void closeUblkc(int fd, List<UblkQueue> queues) {
        if (fd < 0) {
            return;
        }
        for (UblkQueue q : queues) {
            if (!q.retireUblkc(STEP_MILLIS)) {
                LOG.log(System.Logger.Level.ERROR, q + ": a READ hand-back is still inside its pwrite after " + STEP_MILLIS
                        + " ms; /dev/ublkc fd " + fd + " is left open rather than closed under it");
                return;
            }
        }
        Libc.closeQuietly(fd);
    }

    public int id() {
        return info.id();
    }

    /** {@code /dev/ublkb<id>}. */
    public Path blockDevice() {
        return Path.of("/dev/ublkb" + info.id());
    }

    public DeviceInfo info() {
        return info;
    }

    /** Whether this server resumed a quiesced device rather than creating one. */
    public boolean recovered() {
        return recovered;
    }

    public int queueCount() {
        return queues.size();
    }

    /** Requests ublk queue {@code q} has taken from the kernel. */
    public long requests(int q) {
        return queues.get(q).requests();
    }

    /**
     * Stops and deletes the device: STOP_DEV drains it through the queues (every fetched request is answered),
     * the queue threads end, then DEL_DEV. {@code /dev/ublkbN} is gone when this returns. Idempotent.
     */
    @Override
    public synchronized void close() throws UblkException {
        if (closed) {
            return;
        }
        closed = true;
        closing = true;
        UblkException failure = null;
        try {
            control.stop(info.id());
        } catch (UblkException e) {
            if (e.errno() != ENODEV) { // deleted by another process already: nothing left to stop
                failure = e;
            }
        }
        for (UblkQueue q : queues) {
            try {
                if (!q.join(STEP_MILLIS)) {
                    LOG.log(System.Logger.Level.WARNING, q + " still running " + STEP_MILLIS + " ms after STOP_DEV: abandoning it");
                    q.abandon();
                    q.join(STEP_MILLIS);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                break;
            }
        }
        closeUblkc(ublkcFd, queues);
        try {
            control.delete(info.id(), STEP_MILLIS);
        } catch (UblkException e) {
            if (e.errno() == ENODEV) {
                // another process deleted it: gone once /dev/ublkcN was closed above
            } else if (failure == null) {
                failure = e;
            } else {
                failure.addSuppressed(e);
            }
        }
        control.close();
        if (failure != null) {
            throw failure;
        }
    }

    @Override
    public String toString() {
        return blockDevice() + " (" + info.queues() + " queues x " + info.depth() + " tags, max I/O " + info.maxIoBytes()
                + " bytes" + ((info.flags() & UBLK_F_USER_RECOVERY) != 0 ? ", recovery" : "") + (recovered ? ", recovered" : "") + ")";
    }
}
