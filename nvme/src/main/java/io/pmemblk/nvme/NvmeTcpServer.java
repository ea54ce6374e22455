package io.pmemblk.nvme;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.log.AcceptLoop;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.time.Duration;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The NVMe/TCP target: one TCP listener serving one NVM subsystem with one namespace (the whole device) and the
 * discovery subsystem, on the block layer. Each accepted connection is a {@link TcpQueue}; Connect makes it a
 * controller's admin queue or attaches it as an I/O queue. A timer tears down controllers whose keep-alive
 * timeout passed without a command (NVMe base 1.3 7.12), which closes their queues and so frees their tags, and
 * closes connections that have no controller after the handshake timeout (no ICReq, no Connect, or a PDU cut
 * short before it): a peer that opens sockets and sends nothing holds no connection for long.
 */
public final class NvmeTcpServer implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(NvmeTcpServer.class.getName());
    /** Controller IDs run 1..0xFFEF; 0xFFF0 and up are reserved (NVMe-oF 1.1 section 3.3). */
    static final int MAX_CNTLID = 0xFFEF;

    final NvmeTcpConfig config;
    final BlockLayer layer;
    final Namespace namespace;
    /** The admin pages, their text encoded once for this subsystem and listener. */
    final IdentifyPages pages;
    /** The subsystem NQN and the allowed host NQNs, encoded once: a Connect compares them in place. */
    final byte[] subsystemNqn;
    private final byte[][] allowedHosts;
    private final ServerSocketChannel listener;
    private final Map<Integer, Controller> controllers = new ConcurrentHashMap<>();
    private final Set<TcpQueue> queues = ConcurrentHashMap.newKeySet();
    private final AtomicInteger nextQueueId = new AtomicInteger();
    /**
     * Makes each connection's reader thread, unstarted. Starting it throws OutOfMemoryError where the system makes
     * no more threads (ulimit -u, a cgroup's pids.max, memory), which the listener survives ({@link #accepted}); the
     * tests bring that about through this, as a root test run cannot.
     */
    java.util.concurrent.ThreadFactory queueThreads = r -> Thread.ofPlatform().unstarted(r);
    private int nextCntlid = 1;
    private Thread acceptor;
    private Thread keepAlive;
    private volatile boolean closed;
    /** How long a connection may take from accept to a Connect that made it a controller's queue. */
    private volatile long handshakeNanos = DEFAULT_HANDSHAKE_TIMEOUT.toNanos();

    /** As NBD's handshake timeout: ICReq and Connect take one round trip each; a live host needs milliseconds. */
    public static final Duration DEFAULT_HANDSHAKE_TIMEOUT = Duration.ofSeconds(10);

    /**
     * @param volatileCache whether a completed write may still be lost at power failure (the page-cache mapping);
     *                      false only where each write is persistent when it completes (real pmem): Identify VWC
     */
    public NvmeTcpServer(NvmeTcpConfig config, BlockLayer layer, boolean volatileCache) throws IOException {
        this.config = config;
        this.layer = layer;
        if (config.maxTransferBytes() > layer.maxRequestBytes()) {
            throw new IllegalArgumentException("nvme max transfer " + config.maxTransferBytes() + " bytes exceeds the"
                    + " block layer's " + layer.maxRequestBytes());
        }
        this.namespace = Namespace.of(layer.driver().size(), layer.driver().minimumBlockSize(), volatileCache,
                config.serial());
        this.listener = ServerSocketChannel.open();
        try {
            listener.bind(new InetSocketAddress(config.bind(), config.port()), 128);
        } catch (IOException e) {
            listener.close();
            throw new IOException("nvme: cannot listen on " + config.bind() + ":" + config.port() + ": " + e.getMessage(), e);
        }
        this.pages = new IdentifyPages(config, namespace, (InetSocketAddress) listener.getLocalAddress());
        this.subsystemNqn = Nqn.encode(config.subsystemNqn());
        this.allowedHosts = config.allowedHosts().stream().map(Nqn::encode).toArray(byte[][]::new);
    }

    /** Starts accepting; returns the address it listens on. */
    public InetSocketAddress start() throws IOException {
        InetSocketAddress at = (InetSocketAddress) listener.getLocalAddress();
        acceptor = Thread.ofPlatform().name("nvme-accept").start(this::acceptLoop);
        keepAlive = Thread.ofPlatform().daemon().name("nvme-keep-alive").start(this::keepAliveLoop);
        LOG.log(System.Logger.Level.INFO, "nvme: subsystem {0} on tcp {1}", config.subsystemNqn(), at);
        return at;
    }

    public InetSocketAddress address() throws IOException {
        return (InetSocketAddress) listener.getLocalAddress();
    }

    public String subsystemNqn() {
        return config.subsystemNqn();
    }

    /**
     * Sets the handshake timeout (default {@link #DEFAULT_HANDSHAKE_TIMEOUT}); checked by the keep-alive timer,
     * so it is honoured within 200 ms.
     */
    public NvmeTcpServer handshakeTimeout(Duration timeout) {
        if (timeout.isNegative() || timeout.isZero()) {
            throw new IllegalArgumentException("nvme handshake timeout " + timeout + ": allowed a positive duration");
        }
        this.handshakeNanos = timeout.toNanos();
        return this;
    }

    /** Connections open now, with or without a controller (for tests and metrics). */
    public int connectionCount() {
        return queues.size();
    }

    /** Controllers alive now (for tests and metrics). */
    public int controllerCount() {
        return controllers.size();
    }

    private void acceptLoop() {
        // A failed accept (out of descriptors, say) pauses and retries: it used to end this loop, and the target
        // never served another host.
        AcceptLoop.run(LOG, "nvme: TCP listener", listener::accept, this::accepted, () -> closed);
    }

    private void accepted(SocketChannel ch) {
        try {
            ch.setOption(java.net.StandardSocketOptions.TCP_NODELAY, true);
            TcpQueue q = new TcpQueue(this, ch, nextQueueId.incrementAndGet(), String.valueOf(ch.getRemoteAddress()));
            queues.add(q);
            if (closed) {
                q.close();
            }
            try {
                q.start();
            } catch (OutOfMemoryError e) {
                // No thread for it (ulimit -u, a cgroup's pids.max, memory): the queue ends here, the host sees the
                // close, and the accept loop, which the error would have ended, takes the next connection.
                LOG.log(System.Logger.Level.WARNING, "nvme: connection from {0} closed: no thread could be made"
                        + " for it ({1})", q.peer, e.getMessage());
                removed(q);
                q.close();
            }
        } catch (IOException e) {
            try {
                ch.close();
            } catch (IOException ignored) {
                // it never started
            }
        }
    }

    private void keepAliveLoop() {
        while (!closed) {
            try {
                Thread.sleep(200); // a timer's period, not synchronisation: KATO is in seconds
            } catch (InterruptedException e) {
                return;
            }
            long now = System.nanoTime();
            for (Controller c : controllers.values()) {
                if (c.expired(now)) {
                    c.teardown("keep-alive timeout " + c.katoMillis + " ms expired");
                }
            }
            long handshake = handshakeNanos;
            for (TcpQueue q : queues) {
                if (!q.connected() && now - q.acceptedNanos > handshake) {
                    LOG.log(System.Logger.Level.WARNING, "nvme: queue {0} from {1}: no Connect within the handshake"
                            + " timeout of {2} ms: closed", q.id, q.peer, TimeUnit.NANOSECONDS.toMillis(handshake));
                    q.close();
                }
            }
        }
    }

    /** Whether the host NQN in {@code field} (a Connect's, copied whole) is in nvme.allowed-hosts (empty: any). */
    boolean hostAllowed(byte[] field) {
        if (allowedHosts.length == 0) {
            return true;
        }
        for (byte[] h : allowedHosts) {
            if (Nqn.holds(field, h)) {
                return true;
            }
        }
        return false;
    }

    /** A new controller with the next free ID, or null when all 65519 are in use (Connect: Controller Busy). */
    synchronized Controller newController(boolean discovery, byte[] hostNqn, byte[] hostId, TcpQueue admin, long kato) {
        if (controllers.size() >= MAX_CNTLID) {
            return null;
        }
        int id;
        do {
            id = nextCntlid;
            nextCntlid = nextCntlid >= MAX_CNTLID ? 1 : nextCntlid + 1; // 0xFFF0.. are reserved (NVMe-oF 1.1 3.3)
        } while (controllers.containsKey(id));
        Controller c = new Controller(this, id, discovery, hostNqn, hostId, admin, kato);
        controllers.put(id, c);
        LOG.log(System.Logger.Level.INFO, "nvme: controller {0} for {1} from {2}{3}", id, Nqn.text(hostNqn),
                admin.peer, discovery ? " (discovery)" : "");
        return c;
    }

    Controller controller(int cntlid) {
        return controllers.get(cntlid);
    }

    void remove(Controller c) {
        controllers.remove(c.cntlid, c);
    }

    void removed(TcpQueue q) {
        queues.remove(q);
    }

    void persistQuietly() {
        try {
            layer.driver().persistAll();
        } catch (IOException e) {
            LOG.log(System.Logger.Level.ERROR, "nvme: shutdown notification: data not persisted: " + e.getMessage());
        }
    }

    /** Stops listening and closes every connection; in-flight requests complete and release their tags. */
    @Override
    public void close() {
        closed = true;
        try {
            listener.close();
        } catch (IOException e) {
            // closing
        }
        for (Controller c : controllers.values()) {
            c.teardown("server stopping");
        }
        for (TcpQueue q : queues) {
            q.close();
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        try {
            if (acceptor != null) {
                acceptor.join(1000);
            }
            for (TcpQueue q : Set.copyOf(queues)) {
                q.join(TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime()));
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (keepAlive != null) {
            keepAlive.interrupt();
        }
    }
}
