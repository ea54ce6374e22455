package io.pmemblk.nbd;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.log.AcceptLoop;
import io.pmemblk.nbd.tls.TlsChannel;
import io.pmemblk.nbd.tls.TlsServer;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.TrustedDirectory;
import io.pmemblk.posix.TrustedPath;
import io.pmemblk.posix.UnixSocketFile;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The NBD frontend: serves one export of a {@link BlockLayer} over a unix socket and/or TCP
 * (fixed-newstyle handshake, simple and structured replies, base:allocation). Each connection is bound to one
 * hardware queue (round-robin) and gets a reader and a sender thread; see {@link NbdConnection}.
 *
 * <p>{@link #close()} is graceful: stop accepting, stop reading, let in-flight requests finish and their
 * replies go out (bounded wait), then close whatever is left. The block layer stays the caller's.
 */
public final class NbdServer implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(NbdServer.class.getName());
    /**
     * What {@code nbd.handshake-timeout} defaults to: the whole negotiation, a TLS handshake included, must end
     * within it (qemu's NBD server drops clients that have not finished NBD_OPT_GO after 10 s, CVE-2024-7409):
     * a client that connects and stalls holds a connection slot no longer.
     */
    public static final Duration DEFAULT_HANDSHAKE_TIMEOUT = Duration.ofSeconds(10);
    /**
     * What {@code nbd.max-handshakes-per-peer} defaults to: connections of one TCP peer (an address) still in their
     * handshake at once, once half the connection slots are taken. Without a limit per peer, one client that
     * connects and never finishes its negotiation (a client without a certificate under nbd.tls=require, or one
     * that sends nothing) holds every connection slot for the handshake timeout, again and again. The limit bites
     * only when slots grow scarce, so a burst of connections at once (fio's numjobs, nbd-client -connections)
     * is refused nothing while the server has room; then the stalling peer keeps what it has and the other half
     * of the slots stays for others. Unix socket peers are not limited: the socket is mode 0600, so each is the
     * serving user or root, who could take the server down anyway.
     */
    public static final int DEFAULT_MAX_HANDSHAKES_PER_PEER = 8;
    static final Duration SHUTDOWN_WAIT = Duration.ofSeconds(5);

    private final NbdConfig config;
    private final BlockLayer layer;
    private final Set<NbdConnection> connections = ConcurrentHashMap.newKeySet();
    private final AtomicInteger connectionIds = new AtomicInteger();
    private final AtomicBoolean closing = new AtomicBoolean();
    /**
     * Connection slots taken (at most maxConnections): reserved in one atomic step at accept, as the unix and the
     * TCP acceptor may admit at the same time, and given back before the client can see its connection close.
     */
    private final AtomicInteger slots = new AtomicInteger();
    /** Connections still in their handshake, by peer ({@link #peerKey}); guarded by itself. Accept time only. */
    private final java.util.Map<Object, Integer> handshaking = new java.util.HashMap<>();
    volatile int maxHandshakesPerPeer = DEFAULT_MAX_HANDSHAKES_PER_PEER;
    private final List<ServerSocketChannel> listeners = new ArrayList<>();
    private final List<Thread> acceptors = new ArrayList<>();
    /**
     * Makes each connection's reader and sender thread, unstarted. Starting one throws OutOfMemoryError where the
     * system makes no more threads (ulimit -u, a cgroup's pids.max, memory), which the connection survives
     * ({@link NbdConnection#start}); the tests bring that about through this, as a root test run cannot.
     */
    java.util.concurrent.ThreadFactory connectionThreads = r -> Thread.ofPlatform().unstarted(r);
    /** The stall watchdog's period and each handshake's deadline (read by tests: what it still holds). */
    ScheduledThreadPoolExecutor timer;
    private Path boundSocket;
    /** The unix socket's directory, checked and held open from before the device opened until close. */
    private TrustedDirectory socketDirectory;
    /** The socket bound, so close removes that one and no other that took its name. */
    private UnixSocketFile socketFile;
    private boolean started;
    volatile Duration handshakeTimeout = DEFAULT_HANDSHAKE_TIMEOUT;
    /**
     * A connection whose client stops in the middle of a WRITE payload, or stops reading its replies, holds
     * tags that other connections on its hardware queue need: after this long without progress it is closed
     * (its requests are released). Progress, not age: a slow but moving client is never cut off.
     */
    static final Duration DEFAULT_STALL_TIMEOUT = Duration.ofSeconds(30);
    volatile Duration stallTimeout = DEFAULT_STALL_TIMEOUT;
    /**
     * A connection in transmission with nothing in flight and no new request for this long is closed (zero: never,
     * the default, as nbdkit and qemu-nbd: the kernel's NBD client keeps an unused device's connection idle for as
     * long as the device is attached, and a cut there is an I/O error for whoever uses the device next).
     */
    volatile Duration idleTimeout = Duration.ZERO;
    private volatile TlsServer tls = TlsServer.off();
    /** What {@code nbd.busy-poll} defaults to: measured on a 2-core VM, see {@link BusyPoll}. */
    public static final Duration DEFAULT_BUSY_POLL = Duration.ofNanos(50_000);
    private volatile BusyPoll busyPoll = new BusyPoll(DEFAULT_BUSY_POLL, BusyPoll.defaultMaxPolling());

    private volatile DirtyBitmapContexts dirtyBitmaps = DirtyBitmapContexts.NONE;

    public NbdServer(NbdConfig config, BlockLayer layer) {
        this.config = config;
        this.layer = layer;
        if (config.maxRequestBytes() > layer.maxRequestBytes()) {
            throw new IllegalArgumentException("NBD maxRequestBytes " + config.maxRequestBytes()
                    + " exceeds the block layer's maxRequestBytes " + layer.maxRequestBytes()
                    + " (what its requests' buffers were sized for); it must not be larger");
        }
    }

    /** Offers {@code bitmaps} as qemu:dirty-bitmap contexts to the connections that negotiate from now on. */
    public NbdServer dirtyBitmaps(DirtyBitmapContexts bitmaps) {
        this.dirtyBitmaps = java.util.Objects.requireNonNull(bitmaps, "bitmaps");
        return this;
    }

    DirtyBitmapContexts dirtyBitmaps() {
        return dirtyBitmaps;
    }

    /** How long a connection may stall mid-payload or mid-reply before it is closed (see {@link #stallTimeout}). */
    public NbdServer stallTimeout(Duration timeout) {
        if (timeout.isNegative() || timeout.isZero()) {
            throw new IllegalArgumentException("stall timeout must be positive, got " + timeout);
        }
        this.stallTimeout = timeout;
        return this;
    }

    /** How long the whole negotiation (TLS included) may take before the connection is closed; for connections accepted from now on. */
    public NbdServer handshakeTimeout(Duration timeout) {
        if (timeout.isNegative() || timeout.isZero()) {
            throw new IllegalArgumentException("handshake timeout must be positive, got " + timeout);
        }
        this.handshakeTimeout = timeout;
        return this;
    }

    /**
     * How many connections of one TCP peer (its address) may be in their handshake at once while half the
     * connection slots or more are taken; more are refused at accept (see {@link #DEFAULT_MAX_HANDSHAKES_PER_PEER}).
     * For connections accepted from now on.
     */
    public NbdServer maxHandshakesPerPeer(int max) {
        if (max < 1) {
            throw new IllegalArgumentException("max handshakes per peer must be at least 1, got " + max);
        }
        this.maxHandshakesPerPeer = max;
        return this;
    }

    /** How long a connection may sit idle in transmission before it is closed; zero: never (see {@link #idleTimeout}). */
    public NbdServer idleTimeout(Duration timeout) {
        if (timeout.isNegative()) {
            throw new IllegalArgumentException("idle timeout must not be negative, got " + timeout);
        }
        this.idleTimeout = timeout;
        return this;
    }

    /**
     * How long a connection's reader polls its socket for the next request before it sleeps (zero: never);
     * at most one reader fewer than the CPUs polls at once. Connections opened from now on use it.
     */
    public NbdServer busyPoll(Duration budget) {
        this.busyPoll = new BusyPoll(budget, BusyPoll.defaultMaxPolling());
        return this;
    }

    BusyPoll busyPoll() {
        return busyPoll;
    }

    /** TLS for every listener (STARTTLS); {@link TlsServer#off()} by default. Before {@link #start()}. */
    public NbdServer tls(TlsServer tls) {
        this.tls = java.util.Objects.requireNonNull(tls, "tls");
        return this;
    }

    /**
     * The directory of {@code config.unixSocket()}, already checked and held open ({@link TrustedPath#openParentOf}):
     * the socket is bound in it, whatever its name leads to by then. Taken over (closed by {@link #close()}).
     * Without it, {@link #start()} checks and opens the directory itself. Before {@link #start()}.
     */
    public NbdServer unixSocketDirectory(TrustedDirectory dir) {
        this.socketDirectory = java.util.Objects.requireNonNull(dir, "dir");
        return this;
    }

    /** Binds the listeners and starts accepting. Returns one URI per listener (nbd+unix://, nbd://). */
    public synchronized List<URI> start() throws IOException {
        if (started) {
            throw new IllegalStateException("NBD server already started");
        }
        started = true;
        if (!busyPoll.budget().isZero() && !ChannelFd.available()) {
            LOG.log(System.Logger.Level.WARNING, "nbd.busy-poll is " + busyPoll.budget().toNanos() / 1000 + " us but"
                    + " this JVM does not export sun.nio.ch to io.pmemblk.nbd (the launcher passes --add-exports"
                    + " java.base/sun.nio.ch=io.pmemblk.nbd): connections read without polling");
        }
        timer = new ScheduledThreadPoolExecutor(1, r -> Thread.ofPlatform().daemon().name("nbd-timer").unstarted(r));
        // A handshake's deadline is cancelled when the handshake ends, nearly always long before it is due; kept in
        // the queue until then (the executor's default), each held its connection (ring, encoder: some 150 KiB with
        // the default depth and request size) for the whole handshake timeout: a client connecting and
        // disconnecting in a loop piled up one per connection.
        timer.setRemoveOnCancelPolicy(true);
        long period = Math.max(100, Math.min(1000, stallTimeout.toMillis() / 4));
        timer.scheduleAtFixedRate(this::closeStalled, period, period, TimeUnit.MILLISECONDS);
        List<URI> uris = new ArrayList<>();
        try {
            if (config.unixSocket() != null) {
                ServerSocketChannel unix = bindUnix(config.unixSocket().toAbsolutePath());
                uris.add(uri("nbd+unix", "", -1, "socket=" + boundSocket));
                listen(unix, "nbd-accept-unix", false);
            }
            if (config.tcpPort() != 0) {
                ServerSocketChannel tcp = ServerSocketChannel.open();
                tcp.setOption(StandardSocketOptions.SO_REUSEADDR, true);
                tcp.bind(new InetSocketAddress(config.bindHost(), config.tcpPort()), 128);
                InetSocketAddress a = (InetSocketAddress) tcp.getLocalAddress();
                uris.add(uri("nbd", config.bindHost(), a.getPort(), null));
                listen(tcp, "nbd-accept-tcp", true);
            }
        } catch (IOException | RuntimeException e) {
            close();
            throw e;
        }
        LOG.log(System.Logger.Level.INFO, "nbd: serving export ''{0}'' ({1} bytes) on {2}", config.exportName(),
                layer.driver().size(), uris);
        return uris;
    }

    private URI uri(String scheme, String host, int port, String query) {
        try {
            return port < 0 ? new URI(scheme, host, "/" + config.exportName(), query, null)
                    : new URI(scheme, null, host, port, "/" + config.exportName(), null, null);
        } catch (URISyntaxException e) {
            throw new IllegalArgumentException("export name '" + config.exportName() + "' does not form a URI", e);
        }
    }

    /**
     * Binds the unix socket in the held directory, mode 0600, through {@link UnixSocketFile} (which says how no
     * looser window and no other directory can get it).
     */
    private ServerSocketChannel bindUnix(Path path) throws IOException {
        if (socketDirectory == null) {
            socketDirectory = TrustedPath.ofThisProcess().openParentOf(path, "nbd.socket");
        }
        ServerSocketChannel ch = ServerSocketChannel.open(java.net.StandardProtocolFamily.UNIX);
        try {
            socketFile = UnixSocketFile.bind(socketDirectory, path, "nbd.socket",
                    address -> ch.bind(UnixDomainSocketAddress.of(address), 128));
        } catch (IOException | RuntimeException e) {
            ch.close();
            throw e;
        }
        boundSocket = path;
        return ch;
    }

    /** The socket this server bound, removed from the held directory if its name still holds that socket. */
    private void removeOwnSocket() {
        if (socketFile != null) {
            socketFile.remove();
        }
    }

    private interface NativeStep {
        void run() throws NativeException;
    }

    /** Clean-up that may find nothing to do. */
    private static void quietly(NativeStep step, boolean enabled) {
        if (enabled) {
            try {
                step.run();
            } catch (NativeException ignored) {
                // nothing there (ENOENT) or already gone
            }
        }
    }

    private void listen(ServerSocketChannel listener, String threadName, boolean tcp) {
        listeners.add(listener);
        Thread t = Thread.ofPlatform().name(threadName).start(() -> acceptLoop(listener, tcp));
        acceptors.add(t);
    }

    private void acceptLoop(ServerSocketChannel listener, boolean tcp) {
        AcceptLoop.run(LOG, "nbd: " + (tcp ? "TCP" : "unix socket") + " listener", listener::accept, ch -> {
            try {
                accepted(ch, tcp);
            } catch (IOException | RuntimeException e) {
                LOG.log(System.Logger.Level.WARNING, "nbd: could not set up an accepted connection: {0}", e.toString());
                try {
                    ch.close();
                } catch (IOException ignored) {
                    // already failing
                }
            }
        }, closing::get);
    }

    private void accepted(SocketChannel ch, boolean tcp) throws IOException {
        String peer = tcp ? String.valueOf(ch.getRemoteAddress()) : "unix:" + boundSocket;
        if (closing.get()) {
            ch.close();
            return;
        }
        Object key = peerKey(ch, tcp);
        int limit = maxHandshakesPerPeer;
        boolean scarce = slots.get() >= (config.maxConnections() + 1) / 2;
        if (!handshakeBegins(key, limit, tcp && scarce)) {
            LOG.log(System.Logger.Level.WARNING, "nbd: refusing connection from {0}: {1} connections from {2} are"
                    + " still in their handshake (nbd.max-handshakes-per-peer={1}); other peers are still served",
                    peer, limit, describe(key));
            ch.close();
            return;
        }
        if (slots.incrementAndGet() > config.maxConnections()) {
            slots.decrementAndGet();
            handshakeEnded(key);
            LOG.log(System.Logger.Level.WARNING, "nbd: refusing connection from {0}: {1} connections already"
                    + " (maxConnections)", peer, config.maxConnections());
            ch.close();
            return;
        }
        NbdConnection c;
        try {
            if (tcp) {
                ch.setOption(StandardSocketOptions.TCP_NODELAY, true);
            }
            int id = connectionIds.incrementAndGet();
            c = new NbdConnection(this, id, ch, peer, key, layer.nextQueue(), config.maxRequestBytes(),
                    layer.driver().size());
        } catch (IOException | RuntimeException e) {
            slots.decrementAndGet();
            handshakeEnded(key);
            throw e;
        }
        connections.add(c);
        int id = c.id;
        LOG.log(System.Logger.Level.INFO, "nbd connection {0} from {1} opened", id, peer);
        c.start(); // where no thread can be made, the connection has ended itself, and the listener goes on
    }

    /**
     * Who a connection comes from, for the per-peer handshake limit: a TCP client's address (its port is the
     * client's to choose), a unix client's uid (SO_PEERCRED, as the kernel recorded it at connect); a unix peer
     * whose credentials cannot be read counts as one peer with every other such one.
     */
    private static Object peerKey(SocketChannel ch, boolean tcp) {
        try {
            if (tcp) {
                return ((InetSocketAddress) ch.getRemoteAddress()).getAddress();
            }
            return ch.getOption(jdk.net.ExtendedSocketOptions.SO_PEERCRED).user();
        } catch (IOException | RuntimeException e) {
            return "unix peer of unknown uid";
        }
    }

    private static String describe(Object key) {
        return key instanceof java.net.InetAddress a ? a.getHostAddress()
                : key instanceof java.security.Principal p ? "user " + p.getName() : String.valueOf(key);
    }

    /** Counts a handshake of {@code key}'s, unless it has {@code limit} under way already. */
    /** Counts a handshake of {@code key} begun, unless {@code enforce} and it has {@code limit} under way already. */
    private boolean handshakeBegins(Object key, int limit, boolean enforce) {
        synchronized (handshaking) {
            int n = handshaking.getOrDefault(key, 0);
            if (enforce && n >= limit) {
                return false;
            }
            handshaking.put(key, n + 1);
            return true;
        }
    }

    private void handshakeEnded(Object key) {
        synchronized (handshaking) {
            handshaking.computeIfPresent(key, (k, n) -> n <= 1 ? null : n - 1);
        }
    }

    // ------------------------------------------------------------ called by connections

    /** The handshake of {@code c} is over, however it ended: its peer may start another. Once per connection. */
    void handshakeOver(NbdConnection c) {
        handshakeEnded(c.peerKey);
    }

    Handshake.Negotiated handshake(NbdConnection c, SocketChannel ch) throws IOException {
        ScheduledFuture<?> deadline = timer.schedule(c::handshakeTimedOut, handshakeTimeout.toMillis(),
                TimeUnit.MILLISECONDS);
        try {
            Handshake.Negotiated n = new Handshake(ch, tls, config, layer.driver(), closing::get, dirtyBitmaps).run();
            // Only with TLS configured: with nbd.tls=off the TlsChannel class is never loaded, so the JIT still
            // sees the JDK's one SocketChannel class behind the readers' and senders' calls, as before TLS existed.
            if (n != null && tls.offered() && n.channel() instanceof TlsChannel t) {
                String client = TlsServer.clientSubject(t);
                LOG.log(System.Logger.Level.INFO, "nbd connection {0} from {1}: {2} {3}, {4}", c.id, c.peer,
                        t.session().getProtocol(), t.session().getCipherSuite(),
                        client == null ? "no client certificate" : "client certificate " + client);
            }
            return n;
        } finally {
            deadline.cancel(false);
        }
    }

    boolean closing() {
        return closing.get();
    }

    /**
     * The watchdog: closes connections stuck mid-payload or mid-reply for longer than the stall timeout, and
     * idle ones past the idle timeout.
     */
    private void closeStalled() {
        long now = System.nanoTime();
        long limit = stallTimeout.toNanos();
        long idle = idleTimeout.toNanos();
        for (NbdConnection c : connections) {
            try {
                c.closeIfStalled(now, limit);
                if (idle > 0) {
                    c.closeIfIdle(now, idle);
                }
            } catch (RuntimeException e) {
                LOG.log(System.Logger.Level.ERROR, "nbd: stall check of connection " + c.id + " failed", e);
            }
        }
    }

    /** A connection's slot is free: its client may see it closed from now on. Once per admitted connection. */
    void slotFreed() {
        slots.decrementAndGet();
    }

    void connectionClosed(NbdConnection c) {
        connections.remove(c);
    }

    /** Connections open right now (handshaking or transmitting). */
    public int connectionCount() {
        return connections.size();
    }

    /** Stop accepting; let in-flight requests finish and reply (bounded wait); close everything. Idempotent. */
    @Override
    public void close() {
        if (!closing.compareAndSet(false, true)) {
            return;
        }
        synchronized (this) {
            for (ServerSocketChannel l : listeners) {
                try {
                    l.close();
                } catch (IOException e) {
                    LOG.log(System.Logger.Level.WARNING, "nbd: closing listener: {0}", e.toString());
                }
            }
            for (Thread t : acceptors) {
                try {
                    t.join(SHUTDOWN_WAIT.toMillis());
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
        }
        // Not accepting any more: the socket goes now, so a restarted server can bind it at once.
        removeOwnSocket();
        if (socketDirectory != null) {
            quietly(socketDirectory::close, true);
        }
        List<NbdConnection> open = new ArrayList<>(connections);
        for (NbdConnection c : open) {
            c.shutdownInput();
        }
        long deadline = System.nanoTime() + SHUTDOWN_WAIT.toNanos();
        try {
            for (NbdConnection c : open) {
                c.join(deadline);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        List<NbdConnection> forced = new ArrayList<>();
        for (NbdConnection c : open) {
            if (c.isAlive()) {
                LOG.log(System.Logger.Level.WARNING, "nbd connection {0} from {1} did not finish within {2}; forcing it closed",
                        c.id, c.peer, SHUTDOWN_WAIT);
                c.forceClose();
                forced.add(c);
            }
        }
        // Forced threads end at once (their socket is closed, they are interrupted), but they must have ended
        // before close() returns: the caller closes the block layer next, and a reader still running would
        // then find its hardware queue closed under it.
        long forcedDeadline = System.nanoTime() + SHUTDOWN_WAIT.toNanos();
        try {
            for (NbdConnection c : forced) {
                c.join(forcedDeadline);
                if (c.isAlive()) {
                    LOG.log(System.Logger.Level.ERROR, "nbd connection {0} from {1}: its threads did not end after being"
                            + " forced closed", c.id, c.peer);
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (timer != null) {
            timer.shutdownNow();
        }
    }
}
