package io.pmemblk.vhost;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.TrustedDirectory;
import io.pmemblk.posix.TrustedPath;
import io.pmemblk.posix.UnixSocketFile;
import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.log.AcceptLoop;
import io.pmemblk.queueing.log.RateLimitedLog;
import io.pmemblk.vhost.blk.BlkDevice;
import io.pmemblk.vhost.protocol.VhostUserChannel;
import io.pmemblk.vhost.session.VhostUserSession;

import java.io.IOException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The vhost-user-blk frontend: listens on {@code vhost.socket} (QEMU is the client: {@code -chardev socket,path=P}
 * without {@code server=on}) and serves one front-end at a time, a {@link VhostUserSession} on a thread of its own.
 * A second front-end while one is served is refused with a log line (one guest owns the rings; two would write
 * the same disk through two caches). When the front-end goes, the socket stays: QEMU's {@code reconnect=1}
 * connects again and replays its set-up, and the guest's requests continue.
 *
 * <p>{@link #close} stops accepting, ends the session (its rings drain) and removes the socket. The block layer
 * stays the caller's.
 */
public final class VhostUserBlkServer implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.vhost");
    /**
     * Refused connections and messages, WARNING, limited per server: a front-end that reconnects to send bad
     * messages again cannot flood the log, and another server's refusals do not use this one's lines.
     */
    private final RateLimitedLog refusals = RateLimitedLog.withOwnLimit(LOG, System.Logger.Level.WARNING);
    /** How long {@link #close} waits for the session's rings to drain and its thread to end. */
    static final Duration SHUTDOWN_WAIT = Duration.ofSeconds(10);

    private final VhostUserBlkConfig config;
    private final BlockLayer layer;
    private final BlkDevice device;
    private final AtomicInteger connections = new AtomicInteger();
    private TrustedDirectory socketDirectory;
    /** vhost.socket-group: the group whose members (a non-root QEMU) may connect, or null (the owner only). */
    private java.nio.file.attribute.GroupPrincipal socketGroup;
    private UnixSocketFile socketFile;
    private int listenFd = -1;
    private Thread acceptor;
    private volatile boolean closing;
    /** The front-end served now, or null; guarded by this. */
    private VhostUserSession session;
    private Thread sessionThread;
    /**
     * Makes each session's thread and each of its queue threads, unstarted. Starting one throws OutOfMemoryError
     * where the system makes no more threads (ulimit -u, a cgroup's pids.max, memory), which the listener
     * ({@link #admit}) and the session (the ring's start refused, the connection closed) survive; the tests bring
     * that about through this, as a root test run cannot.
     */
    java.util.concurrent.ThreadFactory threads = r -> Thread.ofPlatform().unstarted(r);
    private int sessionId;
    /** pmem.path, when the write cache mode is to be recorded beside the socket (see {@link #recordWriteCache}). */
    private String recordDevice;
    /** The guest's write cache mode: the server's, shared by every connection in turn (set at start). */
    private volatile WriteCacheMode writeCache = WriteCacheMode.unrecorded();

    public VhostUserBlkServer(VhostUserBlkConfig config, BlockLayer layer) {
        this.config = config;
        this.layer = layer;
        BlockDriver d = layer.driver();
        this.device = BlkDevice.of(d.size(), d.minimumBlockSize(), d.isReadOnly(), d.canTrim(), d.canZero(), "pmemblk");
    }

    /**
     * The socket is made mode 0660 and owned by {@code group} (vhost.socket-group), so a QEMU running as another
     * user in that group can connect; null keeps it 0600. Before {@link #start()}.
     */
    public VhostUserBlkServer socketGroup(java.nio.file.attribute.GroupPrincipal group) {
        this.socketGroup = group;
        return this;
    }

    /**
     * The directory of {@code config.socket()}, already checked and held open ({@link TrustedPath#openParentOf}),
     * as for the NBD socket: the socket is bound in it, whatever its name leads to by then. Taken over (closed by
     * {@link #close()}). Without it, {@link #start()} checks and opens the directory itself. Before {@link #start()}.
     */
    public VhostUserBlkServer socketDirectory(TrustedDirectory dir) {
        this.socketDirectory = java.util.Objects.requireNonNull(dir, "dir");
        return this;
    }

    /**
     * Keeps the guest's write cache mode in a file beside the socket ({@link WriteCacheRecord}) for {@code device}
     * (the pmem.path served), so that a server started after this one serves it as the guest last set it: QEMU
     * does not send it again when it reconnects. Without this call the mode lasts as long as this server.
     * Before {@link #start()}.
     */
    public VhostUserBlkServer recordWriteCache(String device) {
        this.recordDevice = java.util.Objects.requireNonNull(device, "device");
        return this;
    }

    /** The write cache mode served now (whichever front-end set it last, or the record at start). */
    public WriteCacheMode writeCache() {
        return writeCache;
    }

    /** What the guest is told about the disk. */
    BlkDevice device() {
        return device;
    }

    /** Binds the socket (mode 0600, or 0660 for its {@link #socketGroup}) and starts accepting; returns its path. */
    public synchronized Path start() throws IOException {
        if (acceptor != null || closing) {
            throw new IllegalStateException("vhost-user-blk server already started");
        }
        Path path = config.socket().toAbsolutePath();
        try {
            if (socketDirectory == null) {
                socketDirectory = TrustedPath.ofThisProcess().openParentOf(path, "vhost.socket");
            }
            if (recordDevice != null) { // before the socket exists: no front-end sees a mode not yet read
                writeCache = WriteCacheMode.recorded(new WriteCacheRecord(socketDirectory,
                        path.getFileName().toString(), recordDevice));
            }
            int fd = Sockets.unixStreamSocket();
            listenFd = fd;
            socketFile = UnixSocketFile.bind(socketDirectory, path, "vhost.socket", socketGroup,
                    address -> Sockets.listen(fd, address, 4));
        } catch (IOException | RuntimeException e) {
            close();
            throw e;
        }
        acceptor = Thread.ofPlatform().name("vhost-accept").start(this::acceptLoop);
        LOG.log(System.Logger.Level.INFO, "vhost-user-blk: serving {0} bytes on {1} ({2} queues of at most {3}),"
                + " write cache {4}{5}", layer.driver().size(), path, config.queues(), config.maxQueueSize(),
                writeCache.writeback() ? "on (writeback)" : "off (write through)",
                writeCache.recordedAt() == null ? "" : ", recorded in " + writeCache.recordedAt());
        return path;
    }

    private void acceptLoop() {
        AcceptLoop.run(LOG, "vhost-user-blk: socket " + config.socket(), () -> Sockets.accept(listenFd), this::admit,
                () -> closing);
    }

    private synchronized void admit(int fd) {
        int id = connections.incrementAndGet();
        if (closing || session != null) {
            refusals.refused("vhost-user-blk: refusing front-end connection {0}: {1}", id,
                    closing ? "the server is stopping" : "one front-end is served at a time and connection "
                            + sessionId + " is still open; allowed: a new front-end once that one has closed");
            try {
                Libc.close(fd);
            } catch (NativeException ignored) {
                // accepted a moment ago: closing it cannot leave it open
            }
            return;
        }
        VhostUserSession s = new VhostUserSession(new VhostUserChannel(fd), config, layer, device, writeCache,
                "vhost-user connection " + id, refusals, threads);
        session = s;
        sessionId = id;
        LOG.log(System.Logger.Level.INFO, "vhost-user connection {0} opened", id);
        try {
            sessionThread = threads.newThread(() -> {
                try {
                    s.run();
                } finally {
                    ended(s);
                }
            });
            sessionThread.setName("vhost-session-" + id);
            sessionThread.start();
        } catch (OutOfMemoryError e) {
            // No thread for it (ulimit -u, a cgroup's pids.max, memory). Left as it was, the session would hold the
            // one front-end's place for good, and the error would end this accept loop: the export dead for QEMU.
            LOG.log(System.Logger.Level.WARNING, "vhost-user connection {0} closed: no thread could be made for it"
                    + " ({1}); the next front-end is tried afresh", id, e.getMessage());
            s.closeUnstarted();
            ended(s);
        }
    }

    private synchronized void ended(VhostUserSession s) {
        if (session == s) {
            session = null;
            sessionThread = null;
        }
        notifyAll();
    }

    /** Whether a front-end is connected now. */
    public synchronized boolean connected() {
        return session != null;
    }

    /**
     * Waits at most {@code timeout} until no front-end is connected (the session's rings stopped and its memory
     * unmapped); true when none is.
     */
    public synchronized boolean awaitDisconnected(Duration timeout) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (session != null) {
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                return false;
            }
            wait(Math.max(1, left / 1_000_000));
        }
        return true;
    }

    /** Front-end connections accepted or refused so far. */
    public int connectionsSeen() {
        return connections.get();
    }

    /** Stops accepting, ends the session (bounded wait), removes the socket. Idempotent. */
    @Override
    public void close() {
        Thread accepting;
        Thread serving;
        synchronized (this) {
            if (closing && listenFd < 0) {
                return;
            }
            closing = true;
            accepting = acceptor;
            serving = sessionThread;
            if (session != null) {
                session.shutdown();
            }
            if (listenFd >= 0) {
                try {
                    Sockets.shutdown(listenFd, Sockets.SHUT_RDWR); // wakes accept(2)
                } catch (NativeException ignored) {
                    // never listened: nothing to wake
                }
            }
        }
        join(accepting, "vhost-accept");
        join(serving, "the vhost-user session");
        synchronized (this) {
            if (socketFile != null) {
                socketFile.remove();
                socketFile = null;
            }
            if (listenFd >= 0) {
                try {
                    Libc.close(listenFd);
                } catch (NativeException ignored) {
                    // released either way
                }
                listenFd = -1;
            }
            if (socketDirectory != null) {
                try {
                    socketDirectory.close();
                } catch (NativeException ignored) {
                    // released either way
                }
                socketDirectory = null;
            }
        }
    }

    private static void join(Thread t, String what) {
        if (t == null) {
            return;
        }
        try {
            t.join(SHUTDOWN_WAIT);
            if (t.isAlive()) {
                LOG.log(System.Logger.Level.ERROR, "vhost-user-blk: {0} did not end within {1}", what, SHUTDOWN_WAIT);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
