package io.pmemblk.dma.vfiouser.client;

import static io.pmemblk.dma.vfiouser.client.VfioUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED;

import io.pmemblk.dma.vfio.VfioAbi;
import io.pmemblk.posix.Errno;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.UnixMessages;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Consumer;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One vfio-user connection, client side: the socket, the VERSION handshake, and one request at a time with its
 * reply matched by message id and command ({@code docs/interop/vfio-user.rst}, "Command Concurrency": a client
 * may pipeline; this one does not, except for posted region writes, below).
 *
 * <p>Reading the socket: whoever holds {@link #lock} reads it. A requester reads its own reply (no thread hand-off
 * on the register path); a server command that arrives first (DMA_READ/DMA_WRITE, which the spec lets come "in
 * between a client to server request/reply") is answered on the spot. While no request is out, a watcher thread
 * polls the socket: it answers server commands and sees the socket close (a device process that died while our
 * copies were in its hands sends nothing more, and only the watcher would notice).
 *
 * <p>Region writes are posted, as PCI memory writes are: sent with No_reply, no round trip (the doorbell of a
 * batch costs one sendmsg). The server handles commands in order ("Command Concurrency"), so a later read or
 * non-posted command sees them done. Configuration-space writes wait for the reply, as PCI config writes do.
 *
 * <p>Bounded: every wait for a reply ends after the timeout; any I/O error, end of stream, timeout or protocol
 * violation (a short, oversized or unexpected message) loses the connection: the socket is shut down, every
 * later request fails at once with {@link VfioUserException#connectionLost}, and the loss listener runs once on
 * the watcher thread. A command the server refuses (an error reply) fails only that command.
 *
 * <p>Buffers are allocated once per connection; a posted region write and a region read allocate nothing.
 *
 * <p>Limit: while a sender waits for room in a full socket it holds the lock, so a DMA_READ/DMA_WRITE the server
 * sent meanwhile is answered only once the send is through; a server that stops reading until its own command is
 * answered stalls both sides until the timeout loses the connection. pmemblk's device never sends those commands
 * (every region it is given has a descriptor), and the socket holds thousands of posted writes.
 */
public final class VfioUserConnection implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.dma.vfiouser");
    /** The most descriptors we accept in one message from the server (a region's mmap fd, a twin socket). */
    static final int MAX_FDS_IN = 8;
    /** What we take in one DMA_READ/DMA_WRITE from the server: the spec's default. */
    static final int MAX_XFER = DEFAULT_MAX_DATA_XFER;
    /** Socket receive/send timeout slice: how often a blocked reader checks its deadline and the lost flag. */
    private static final int SLICE_MILLIS = 100;
    private static final Pattern NUMBER = Pattern.compile("\"(max_msg_fds|max_data_xfer_size)\"\\s*:\\s*(\\d+)");

    /** Serves the server's DMA_READ/DMA_WRITE: the memory at a DMA address, or an exception when it is not mapped. */
    @FunctionalInterface
    public interface DmaTarget {
        MemorySegment translate(long address, long length);
    }

    private final int fd;
    private final String path;
    private final long timeoutNanos;
    private final DmaTarget target;
    private final ReentrantLock lock = new ReentrantLock();
    private final Arena arena = Arena.ofShared();
    /** Outgoing message: header, then our largest payload (a DMA_READ reply of {@link #MAX_XFER}). */
    private final MemorySegment out;
    /** Incoming message: header, then the largest payload we accept (a DMA_WRITE of {@link #MAX_XFER}). */
    private final MemorySegment in;
    private final MemorySegment inHeader;
    /** in[16, 16 + n) for the short payloads of the register path, made once. */
    private final MemorySegment[] inPayload = new MemorySegment[40];
    private final MemorySegment iov;
    private final MemorySegment msghdr;
    private final MemorySegment pollfd;
    private final int[] fdsIn = new int[MAX_FDS_IN + 1];
    private int nextId = 1;
    private int serverMaxFds = 1;
    private int serverMaxXfer = DEFAULT_MAX_DATA_XFER;
    private volatile String lostReason;
    /** Whether the loss came from the peer's side (end of stream, reset, broken pipe) rather than ours (a timeout, a protocol error). */
    private volatile boolean peerClosed;
    private final int peerPid;
    private volatile boolean closed;
    private volatile Consumer<String> onLoss = reason -> { };
    private Thread watcher;
    private long postedWrites;
    private long serverCommands;

    private VfioUserConnection(int fd, String path, Duration timeout, DmaTarget target) throws NativeException {
        this.fd = fd;
        this.path = path;
        this.timeoutNanos = timeout.toNanos();
        this.target = target;
        this.out = arena.allocate(HEADER + DMA_DATA + MAX_XFER, 8);
        this.in = arena.allocate(HEADER + DMA_DATA + MAX_XFER, 8);
        this.inHeader = in.asSlice(0, HEADER);
        for (int n = 1; n < inPayload.length; n++) {
            inPayload[n] = in.asSlice(HEADER, n);
        }
        this.iov = arena.allocate(Sockets.IOVEC);
        this.msghdr = arena.allocate(Sockets.MSGHDR);
        msghdr.set(ValueLayout.ADDRESS, Sockets.MSGHDR_IOV, iov);
        msghdr.set(ValueLayout.JAVA_LONG, Sockets.MSGHDR_IOVLEN, 1L);
        this.pollfd = arena.allocate(Sockets.POLLFD);
        pollfd.set(ValueLayout.JAVA_INT, 0, fd);
        pollfd.set(ValueLayout.JAVA_SHORT, 4, Sockets.POLLIN);
        Sockets.receiveTimeout(fd, SLICE_MILLIS);
        Sockets.sendTimeout(fd, SLICE_MILLIS);
        this.peerPid = Sockets.peerPid(fd);
    }

    /** The device process (SO_PEERCRED at connect). */
    public int peerPid() {
        return peerPid;
    }

    /**
     * Whether the connection was lost from the device's side: the socket reached end of stream, was reset or broke
     * (the process died, or closed the connection itself, which a vfio-user server does after resetting the
     * device). False for a loss this client declared (a reply that did not come, a protocol violation): the
     * device process may then still run, and still hold our memory mapped.
     */
    public boolean lostByPeer() {
        return peerClosed;
    }

    /**
     * Connects to the device's socket at {@code path} and negotiates the version; replies must come within
     * {@code timeout}. {@code target} answers the server's DMA_READ/DMA_WRITE (null: they are refused, EFAULT).
     * The watcher starts with {@link #startWatcher}.
     */
    public static VfioUserConnection connect(String path, Duration timeout, DmaTarget target) throws VfioUserException {
        int fd;
        try {
            fd = Sockets.unixStreamSocket();
        } catch (NativeException e) {
            throw new VfioUserException("vfio-user: cannot make a socket: " + e.getMessage(), e);
        }
        VfioUserConnection c = null;
        try {
            Sockets.connect(fd, path);
            c = new VfioUserConnection(fd, path, timeout, target);
            c.negotiate();
            return c;
        } catch (NativeException e) {
            closeQuietly(fd, c);
            throw new VfioUserException("vfio-user: cannot connect to the device at " + path + ": " + e.getMessage()
                    + (e.errno() == Errno.ENOENT || e.errno() == 111 /* ECONNREFUSED */
                    ? "; is the device process running (pmemblk dma-device --socket " + path + ")?" : ""), e);
        } catch (VfioUserException | RuntimeException e) {
            closeQuietly(fd, c);
            throw e;
        }
    }

    private static void closeQuietly(int fd, VfioUserConnection c) {
        if (c != null) {
            c.close();
            return;
        }
        Libc.closeQuietly(fd);
    }

    public String path() {
        return path;
    }

    /** The most descriptors the server takes in one message ("max_msg_fds", 1 when it named none). */
    public int serverMaxFds() {
        return serverMaxFds;
    }

    /** Whether the connection is gone (and why), or null while it works. */
    public String lostReason() {
        return lostReason;
    }

    /** Region writes sent posted (No_reply) so far. */
    public long postedWrites() {
        return postedWrites;
    }

    /** DMA_READ/DMA_WRITE commands the server sent us so far. */
    public long serverCommands() {
        return serverCommands;
    }

    /** Runs {@code listener} once, on the watcher thread, when the connection is lost (not when closed). */
    public void onLoss(Consumer<String> listener) {
        this.onLoss = listener;
    }

    /** Starts the watcher thread (see the class comment); {@code name} names it. */
    public synchronized void startWatcher(String name) {
        if (watcher == null) {
            watcher = Thread.ofPlatform().daemon().name(name).start(this::watch);
        }
    }

    // ---- commands -------------------------------------------------------------------------------------------

    private void negotiate() throws VfioUserException {
        String json = "{\"capabilities\":{\"max_msg_fds\":" + MAX_FDS_IN + ",\"max_data_xfer_size\":" + MAX_XFER
                + ",\"pgsizes\":4096}}";
        byte[] bytes = json.getBytes(StandardCharsets.UTF_8);
        lock.lock();
        try {
            ensureOpen();
            out.set(JAVA_SHORT_UNALIGNED, HEADER + V_MAJOR, (short) VERSION_MAJOR);
            out.set(JAVA_SHORT_UNALIGNED, HEADER + V_MINOR, (short) VERSION_MINOR);
            MemorySegment.copy(bytes, 0, out, JAVA_BYTE, HEADER + V_DATA, bytes.length);
            out.set(JAVA_BYTE, HEADER + V_DATA + bytes.length, (byte) 0);
            int n = exchange(VERSION, V_DATA + bytes.length + 1, null, false, true);
            closeReceivedFds(); // twin-socket was not proposed: an fd here is refused by ignoring it
            if (n < V_DATA) {
                throw lose("VERSION reply of " + n + " bytes is shorter than its " + V_DATA + "-byte version");
            }
            int major = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, HEADER + V_MAJOR));
            int minor = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, HEADER + V_MINOR));
            if (major != VERSION_MAJOR || minor > VERSION_MINOR) {
                throw lose("the device answered version " + major + "." + minor + "; allowed: " + VERSION_MAJOR + ".0 to "
                        + VERSION_MAJOR + "." + VERSION_MINOR);
            }
            if (n > V_DATA) {
                byte[] caps = new byte[n - V_DATA];
                MemorySegment.copy(in, JAVA_BYTE, HEADER + V_DATA, caps, 0, caps.length);
                int end = 0;
                while (end < caps.length && caps[end] != 0) {
                    end++;
                }
                Matcher m = NUMBER.matcher(new String(caps, 0, end, StandardCharsets.UTF_8));
                while (m.find()) {
                    long v = Long.parseLong(m.group(2).length() > 12 ? "0" : m.group(2));
                    if (m.group(1).equals("max_msg_fds")) {
                        serverMaxFds = (int) Math.max(1, Math.min(v, UnixMessages.SCM_MAX_FD));
                    } else {
                        serverMaxXfer = (int) Math.max(8, Math.min(v, Integer.MAX_VALUE));
                    }
                }
            }
            LOG.log(System.Logger.Level.DEBUG, () -> "vfio-user " + path + ": version " + major + "." + minor
                    + ", max_msg_fds " + serverMaxFds + ", max_data_xfer_size " + serverMaxXfer);
        } finally {
            lock.unlock();
        }
    }

    /** VFIO_USER_DEVICE_GET_INFO. */
    public record DeviceInfo(int flags, int regions, int irqs) {}

    public DeviceInfo deviceInfo() throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
            out.fill((byte) 0);
            out.set(JAVA_INT_UNALIGNED, HEADER + INFO_ARGSZ, INFO_BYTES);
            int n = exchange(DEVICE_GET_INFO, INFO_BYTES, null, false, false);
            need(n, INFO_BYTES, "DEVICE_GET_INFO");
            return new DeviceInfo(in.get(JAVA_INT_UNALIGNED, HEADER + INFO_FLAGS), in.get(JAVA_INT_UNALIGNED, HEADER + INFO_NUM_REGIONS),
                    in.get(JAVA_INT_UNALIGNED, HEADER + INFO_NUM_IRQS));
        } finally {
            lock.unlock();
        }
    }

    /** VFIO_USER_DEVICE_GET_REGION_INFO; {@code sparseMmap}: the areas the server lets us map, if it said. */
    public record RegionInfo(int index, int flags, long size, long offset, boolean mmapFdOffered, List<long[]> sparseMmap) {
        public boolean readable() {
            return (flags & VfioAbi.REGION_INFO_FLAG_READ) != 0;
        }

        public boolean writable() {
            return (flags & VfioAbi.REGION_INFO_FLAG_WRITE) != 0;
        }
    }

    /**
     * The region's info. An mmap descriptor the server offers is closed: every register of BAR0 has effects the
     * device model must see, so the registers are reached by REGION_READ/WRITE (see docs/design.md).
     */
    public RegionInfo regionInfo(int index) throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
            out.asSlice(HEADER, RI_BYTES).fill((byte) 0);
            out.set(JAVA_INT_UNALIGNED, HEADER + RI_ARGSZ, RI_ARGSZ_ASKED);
            out.set(JAVA_INT_UNALIGNED, HEADER + RI_INDEX, index);
            int n = exchange(DEVICE_GET_REGION_INFO, RI_BYTES, null, false, true);
            boolean fdOffered = fdsIn[0] >= 0;
            closeReceivedFds();
            need(n, RI_BYTES, "DEVICE_GET_REGION_INFO");
            int flags = in.get(JAVA_INT_UNALIGNED, HEADER + RI_FLAGS);
            int got = in.get(JAVA_INT_UNALIGNED, HEADER + RI_INDEX);
            if (got != index) {
                throw lose("DEVICE_GET_REGION_INFO for region " + index + " answered for region " + got);
            }
            List<long[]> sparse = new ArrayList<>();
            int cap = (flags & RI_FLAG_CAPS) != 0 ? in.get(JAVA_INT_UNALIGNED, HEADER + RI_CAP_OFFSET) : 0;
            for (int hops = 0; cap >= RI_BYTES && cap + 8 <= n && hops < 16; hops++) {
                int id = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, HEADER + cap));
                if (id == CAP_SPARSE_MMAP && cap + 16 <= n) {
                    int areas = in.get(JAVA_INT_UNALIGNED, HEADER + cap + 8);
                    for (int a = 0; a < areas && cap + 16 + 16L * (a + 1) <= n; a++) {
                        sparse.add(new long[]{in.get(JAVA_LONG_UNALIGNED, HEADER + cap + 16 + 16L * a),
                                in.get(JAVA_LONG_UNALIGNED, HEADER + cap + 24 + 16L * a)});
                    }
                }
                int next = in.get(JAVA_INT_UNALIGNED, HEADER + cap + 4);
                if (next <= cap) {
                    break;
                }
                cap = next;
            }
            return new RegionInfo(index, flags, in.get(JAVA_LONG_UNALIGNED, HEADER + RI_SIZE),
                    in.get(JAVA_LONG_UNALIGNED, HEADER + RI_OFFSET), fdOffered, List.copyOf(sparse));
        } finally {
            lock.unlock();
        }
    }

    /** VFIO_USER_DEVICE_GET_IRQ_INFO: how many vectors of type {@code index} (0 when none); flags in the high word. */
    public int irqCount(int index) throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
            out.asSlice(HEADER, IRQ_BYTES).fill((byte) 0);
            out.set(JAVA_INT_UNALIGNED, HEADER + IRQ_ARGSZ, IRQ_BYTES);
            out.set(JAVA_INT_UNALIGNED, HEADER + IRQ_INDEX, index);
            int n;
            try {
                n = exchange(DEVICE_GET_IRQ_INFO, IRQ_BYTES, null, false, false);
            } catch (VfioUserException e) {
                if (e.connectionLost()) {
                    throw e;
                }
                return 0; // an index the device does not have
            }
            need(n, IRQ_BYTES, "DEVICE_GET_IRQ_INFO");
            if ((in.get(JAVA_INT_UNALIGNED, HEADER + IRQ_FLAGS) & VfioAbi.IRQ_INFO_EVENTFD) == 0) {
                return 0; // no eventfd signalling: of no use to us
            }
            return in.get(JAVA_INT_UNALIGNED, HEADER + IRQ_COUNT);
        } finally {
            lock.unlock();
        }
    }

    /**
     * VFIO_USER_DEVICE_SET_IRQS with DATA_EVENTFD | ACTION_TRIGGER: vector {@code start + i} signals
     * {@code eventfds[i]}; sent in as many messages as the server's max_msg_fds asks.
     */
    public void setIrqs(int index, int start, int[] eventfds) throws VfioUserException {
        for (int from = 0; from < eventfds.length; from += serverMaxFds) {
            int[] part = Arrays.copyOfRange(eventfds, from, Math.min(eventfds.length, from + serverMaxFds));
            lock.lock();
            try {
                ensureOpen();
                irqSet(index, start + from, part.length, VfioAbi.IRQ_SET_DATA_EVENTFD | VfioAbi.IRQ_SET_ACTION_TRIGGER);
                exchange(DEVICE_SET_IRQS, SET_BYTES, part, false, false);
            } finally {
                lock.unlock();
            }
        }
    }

    /** SET_IRQS DATA_NONE | ACTION_TRIGGER, start 0, count 0: every vector of {@code index} off. */
    public void disableIrqs(int index) throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
            irqSet(index, 0, 0, VfioAbi.IRQ_SET_DATA_NONE | VfioAbi.IRQ_SET_ACTION_TRIGGER);
            exchange(DEVICE_SET_IRQS, SET_BYTES, null, false, false);
        } finally {
            lock.unlock();
        }
    }

    private void irqSet(int index, int start, int count, int flags) {
        out.set(JAVA_INT_UNALIGNED, HEADER + SET_ARGSZ, SET_BYTES);
        out.set(JAVA_INT_UNALIGNED, HEADER + SET_FLAGS, flags);
        out.set(JAVA_INT_UNALIGNED, HEADER + SET_INDEX, index);
        out.set(JAVA_INT_UNALIGNED, HEADER + SET_START, start);
        out.set(JAVA_INT_UNALIGNED, HEADER + SET_COUNT, count);
    }

    /** VFIO_USER_DMA_MAP of {@code size} bytes at DMA address {@code address}: {@code fd} from {@code offset}. */
    public void dmaMap(long address, long size, int fd, long offset) throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
            out.set(JAVA_INT_UNALIGNED, HEADER + MAP_ARGSZ, MAP_BYTES);
            out.set(JAVA_INT_UNALIGNED, HEADER + MAP_FLAGS, MAP_READ | MAP_WRITE);
            out.set(JAVA_LONG_UNALIGNED, HEADER + MAP_OFFSET, offset);
            out.set(JAVA_LONG_UNALIGNED, HEADER + MAP_ADDRESS, address);
            out.set(JAVA_LONG_UNALIGNED, HEADER + MAP_SIZE, size);
            exchange(DMA_MAP, MAP_BYTES, new int[]{fd}, false, false);
        } finally {
            lock.unlock();
        }
    }

    /** VFIO_USER_DMA_UNMAP of exactly a mapping made before. */
    public void dmaUnmap(long address, long size) throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
            out.set(JAVA_INT_UNALIGNED, HEADER + UNMAP_ARGSZ, UNMAP_BYTES);
            out.set(JAVA_INT_UNALIGNED, HEADER + UNMAP_FLAGS, 0);
            out.set(JAVA_LONG_UNALIGNED, HEADER + UNMAP_ADDRESS, address);
            out.set(JAVA_LONG_UNALIGNED, HEADER + UNMAP_SIZE, size);
            exchange(DMA_UNMAP, UNMAP_BYTES, null, false, false);
        } finally {
            lock.unlock();
        }
    }

    /** VFIO_USER_DEVICE_RESET. */
    public void reset() throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
            exchange(DEVICE_RESET, 0, null, false, false);
        } finally {
            lock.unlock();
        }
    }

    /**
     * VFIO_USER_REGION_READ of {@code count} (1, 2, 4 or 8) bytes at {@code offset} of region {@code region},
     * little-endian, zero-extended. Allocates nothing.
     */
    public long regionRead(int region, long offset, int count) throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
            out.set(JAVA_LONG_UNALIGNED, HEADER + RW_OFFSET, offset);
            out.set(JAVA_INT_UNALIGNED, HEADER + RW_REGION, region);
            out.set(JAVA_INT_UNALIGNED, HEADER + RW_COUNT, count);
            int n = exchange(REGION_READ, RW_DATA, null, false, false);
            if (n != RW_DATA + count || in.get(JAVA_INT_UNALIGNED, HEADER + RW_COUNT) != count
                    || in.get(JAVA_LONG_UNALIGNED, HEADER + RW_OFFSET) != offset) {
                throw lose("REGION_READ of " + count + " bytes at 0x" + Long.toHexString(offset) + " of region " + region
                        + " answered " + n + " bytes for " + in.get(JAVA_INT_UNALIGNED, HEADER + RW_COUNT) + " at 0x"
                        + Long.toHexString(in.get(JAVA_LONG_UNALIGNED, HEADER + RW_OFFSET)));
            }
            return switch (count) {
                case 1 -> Byte.toUnsignedLong(in.get(JAVA_BYTE, HEADER + RW_DATA));
                case 2 -> Short.toUnsignedLong(in.get(JAVA_SHORT_UNALIGNED, HEADER + RW_DATA));
                case 4 -> Integer.toUnsignedLong(in.get(JAVA_INT_UNALIGNED, HEADER + RW_DATA));
                default -> in.get(JAVA_LONG_UNALIGNED, HEADER + RW_DATA);
            };
        } finally {
            lock.unlock();
        }
    }

    /**
     * VFIO_USER_REGION_WRITE of the low {@code count} (1, 2, 4 or 8) bytes of {@code value}; {@code posted}: sent
     * with No_reply, returning once the socket took it. Allocates nothing.
     */
    public void regionWrite(int region, long offset, int count, long value, boolean posted) throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
            out.set(JAVA_LONG_UNALIGNED, HEADER + RW_OFFSET, offset);
            out.set(JAVA_INT_UNALIGNED, HEADER + RW_REGION, region);
            out.set(JAVA_INT_UNALIGNED, HEADER + RW_COUNT, count);
            out.set(JAVA_LONG_UNALIGNED, HEADER + RW_DATA, value); // the server takes count bytes of it
            exchange(REGION_WRITE, RW_DATA + count, null, posted, false);
            if (posted) {
                postedWrites++;
            }
        } finally {
            lock.unlock();
        }
    }

    // ---- the exchange ------------------------------------------------------------------------------------------

    /**
     * Sends the command whose payload ({@code length} bytes) is in {@link #out} after the header, with {@code fds},
     * and, unless {@code posted}, reads until its reply (answering server commands meanwhile). Returns the reply's
     * payload length, the payload in {@link #in}; descriptors that came with it in {@link #fdsIn} when
     * {@code replyFds}. Caller holds {@link #lock}.
     * @throws VfioUserException the server's error reply (the connection stays), or the connection lost
     */
    private int exchange(int command, int length, int[] fds, boolean posted, boolean replyFds) throws VfioUserException {
        String lost = lostReason;
        if (lost != null || closed) {
            throw new VfioUserException("vfio-user device at " + path + " is gone: " + (lost != null ? lost : "closed"), 0, true);
        }
        int id = nextId++ & 0xffff;
        int size = HEADER + length;
        out.set(JAVA_SHORT_UNALIGNED, H_MSG_ID, (short) id);
        out.set(JAVA_SHORT_UNALIGNED, H_COMMAND, (short) command);
        out.set(JAVA_INT_UNALIGNED, H_SIZE, size);
        out.set(JAVA_INT_UNALIGNED, H_FLAGS, TYPE_COMMAND | (posted ? FLAG_NO_REPLY : 0));
        out.set(JAVA_INT_UNALIGNED, H_ERROR, 0);
        long deadline = System.nanoTime() + timeoutNanos;
        send(size, fds, deadline, commandName(command));
        if (posted) {
            return 0;
        }
        while (true) {
            int payload = receive(deadline, replyFds, commandName(command));
            int flags = in.get(JAVA_INT_UNALIGNED, H_FLAGS);
            int type = flags & FLAG_TYPE_MASK;
            int gotCommand = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_COMMAND));
            int gotId = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_MSG_ID));
            if (type == TYPE_COMMAND) {
                closeReceivedFds();
                serve(gotId, gotCommand, payload, deadline);
                continue;
            }
            if (type != TYPE_REPLY || gotId != id || gotCommand != command) {
                closeReceivedFds();
                throw lose("while waiting for the reply to " + commandName(command) + " (msg_id " + id + ") the device sent "
                        + (type == TYPE_REPLY ? "a reply" : "a message of type " + type) + " to " + commandName(gotCommand)
                        + " (msg_id " + gotId + ")");
            }
            if ((flags & FLAG_ERROR) != 0) {
                closeReceivedFds();
                int errno = in.get(JAVA_INT_UNALIGNED, H_ERROR);
                throw new VfioUserException("vfio-user device at " + path + " refused " + commandName(command) + ": "
                        + (errno != 0 ? Libc.strerror(errno) + " (errno " + errno + ", " + Errno.name(errno) + ")" : "no errno given"),
                        errno, false);
            }
            return payload;
        }
    }

    /** Sends out[0, size) with {@code fds}; waits for socket room until the deadline. */
    private void send(int size, int[] fds, long deadline, String what) throws VfioUserException {
        try {
            if (fds != null && fds.length > 0) {
                UnixMessages.send(fd, out.asSlice(0, size), fds); // control path: allocates its msghdr
                return;
            }
            long sent = 0;
            while (sent < size) {
                iov.set(ValueLayout.JAVA_LONG, 0, out.address() + sent);
                iov.set(ValueLayout.JAVA_LONG, 8, size - sent);
                long n = Sockets.sendWaiting(fd, msghdr);
                sent += n;
                if (n == 0 && System.nanoTime() - deadline > 0) {
                    throw lose(what + ": the device took no data for " + TimeUnit.NANOSECONDS.toMillis(timeoutNanos)
                            + " ms (its socket is full: the device is not reading)");
                }
                if (n == 0 && (lostReason != null || closed)) {
                    throw lose(what + ": connection closed while sending");
                }
            }
        } catch (NativeException e) {
            markPeerClosed(e.errno());
            throw lose(what + ": sending failed: " + e.getMessage());
        }
    }

    /**
     * Reads one whole message into {@link #in} by the deadline; returns its payload length. {@code withFds}: the
     * descriptors that came with it go to {@link #fdsIn} (beyond {@link #MAX_FDS_IN}: closed).
     */
    private int receive(long deadline, boolean withFds, String what) throws VfioUserException {
        Arrays.fill(fdsIn, -1);
        readFully(0, HEADER, deadline, withFds, what);
        int size = in.get(JAVA_INT_UNALIGNED, H_SIZE);
        if (size < HEADER || size > in.byteSize()) {
            throw lose("the device sent a message of size " + Integer.toUnsignedString(size) + " (command "
                    + Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_COMMAND)) + "); allowed: " + HEADER + " to "
                    + in.byteSize() + " bytes");
        }
        if (size > HEADER) {
            readFully(HEADER, size - HEADER, deadline, false, what);
        }
        return size - HEADER;
    }

    private void readFully(int from, int length, long deadline, boolean withFds, String what) throws VfioUserException {
        int got = 0;
        while (got < length) {
            MemorySegment into = got == 0 && from == 0 && length == HEADER ? inHeader
                    : got == 0 && from == HEADER && length < inPayload.length ? inPayload[length]
                    : in.asSlice(from + got, length - got); // a partial read: rare
            int n;
            try {
                if (withFds && got == 0) {
                    n = UnixMessages.receive(fd, into, fdsIn); // descriptors travel with the first byte
                } else {
                    n = Sockets.recv(fd, into, MSG_WAITALL);
                }
            } catch (NativeException e) {
                if (e.errno() == Errno.EAGAIN || e.errno() == Errno.EINTR) {
                    checkWait(deadline, what, from + got);
                    continue;
                }
                markPeerClosed(e.errno());
                throw lose(what + ": receiving failed: " + e.getMessage());
            } catch (java.io.IOException e) {
                throw lose(what + ": receiving failed: " + e.getMessage());
            }
            if (n == 0) {
                if (lostReason == null && !closed) {
                    peerClosed = true;
                }
                throw lose("the device closed the connection" + (from + got > 0 ? " in the middle of a message ("
                        + (from + got) + " bytes of it read)" : "") + " (while waiting for " + what + ")");
            }
            got += n;
        }
    }

    private void checkWait(long deadline, String what, int bytesIn) throws VfioUserException {
        if (lostReason != null || closed) {
            throw lose(what + ": connection closed while waiting");
        }
        if (System.nanoTime() - deadline > 0) {
            throw lose("no " + (bytesIn > 0 ? "rest of the " : "") + "reply to " + what + " within "
                    + TimeUnit.NANOSECONDS.toMillis(timeoutNanos) + " ms" + (bytesIn > 0 ? " (" + bytesIn + " bytes came)" : ""));
        }
    }

    /** How long the watcher waits before it looks again at a socket a requester is reading (not synchronisation). */
    private static final long WATCH_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(1);

    /** {@code <sys/socket.h>} MSG_WAITALL: recv waits for the whole buffer (or the timeout slice, or an error). */
    private static final int MSG_WAITALL = 0x100;

    /** Answers a command the server sent (DMA_READ/DMA_WRITE); others get EINVAL. Caller holds the lock. */
    private void serve(int id, int command, int payload, long deadline) throws VfioUserException {
        serverCommands++;
        int flags = in.get(JAVA_INT_UNALIGNED, H_FLAGS);
        boolean noReply = (flags & FLAG_NO_REPLY) != 0;
        int replyLength = 0;
        int errno = 0;
        if ((command == DMA_READ || command == DMA_WRITE) && payload >= DMA_DATA) {
            long address = in.get(JAVA_LONG_UNALIGNED, HEADER + DMA_ADDRESS);
            long count = in.get(JAVA_LONG_UNALIGNED, HEADER + DMA_COUNT);
            if (count < 0 || count > MAX_XFER || (command == DMA_WRITE && payload != DMA_DATA + count)) {
                errno = Errno.EINVAL;
            } else {
                try {
                    if (target == null) {
                        throw new IllegalStateException("no DMA memory");
                    }
                    MemorySegment mem = target.translate(address, count);
                    if (command == DMA_READ) {
                        MemorySegment.copy(mem, 0, out, HEADER + DMA_DATA, count);
                        replyLength = DMA_DATA + (int) count;
                    } else {
                        MemorySegment.copy(in, HEADER + DMA_DATA, mem, 0, count);
                        replyLength = DMA_WRITE_REPLY_BYTES;
                    }
                    out.set(JAVA_LONG_UNALIGNED, HEADER + DMA_ADDRESS, address);
                    if (command == DMA_READ) {
                        out.set(JAVA_LONG_UNALIGNED, HEADER + DMA_COUNT, count);
                    } else {
                        out.set(JAVA_INT_UNALIGNED, HEADER + DMA_COUNT, (int) count);
                    }
                } catch (RuntimeException e) { // IovaFault, or memory released under us
                    errno = Errno.EFAULT;
                    LOG.log(System.Logger.Level.WARNING, "vfio-user " + path + ": the device's " + commandName(command)
                            + " of " + count + " bytes at DMA address 0x" + Long.toHexString(address)
                            + " refused (EFAULT): " + e.getMessage());
                }
            }
        } else {
            errno = Errno.EINVAL;
            LOG.log(System.Logger.Level.WARNING, "vfio-user " + path + ": the device sent " + commandName(command)
                    + " (" + payload + " bytes), which a client does not serve; answered EINVAL");
        }
        if (noReply) {
            return;
        }
        int size = HEADER + (errno != 0 ? 0 : replyLength);
        out.set(JAVA_SHORT_UNALIGNED, H_MSG_ID, (short) id);
        out.set(JAVA_SHORT_UNALIGNED, H_COMMAND, (short) command);
        out.set(JAVA_INT_UNALIGNED, H_SIZE, size);
        out.set(JAVA_INT_UNALIGNED, H_FLAGS, TYPE_REPLY | (errno != 0 ? FLAG_ERROR : 0));
        out.set(JAVA_INT_UNALIGNED, H_ERROR, errno);
        send(size, null, deadline, "the reply to the device's " + commandName(command));
    }

    // ---- loss, watcher, close ----------------------------------------------------------------------------------

    /** A reset or broken pipe is the peer's doing (it died, or closed), when nothing was lost before. */
    private void markPeerClosed(int errno) {
        if ((errno == Errno.ECONNRESET || errno == Errno.EPIPE) && lostReason == null && !closed) {
            peerClosed = true;
        }
    }

    /** Fails fast once lost or closed, before a buffer is touched (a closed connection has freed them). */
    private void ensureOpen() throws VfioUserException {
        if (lostReason != null || closed) {
            throw new VfioUserException("vfio-user device at " + path + " is gone: "
                    + (lostReason != null ? lostReason : "closed"), 0, true);
        }
    }

    /** Marks the connection lost (first reason kept), shuts the socket so every waiter wakes; returns the error. */
    private VfioUserException lose(String why) {
        String reason;
        synchronized (this) {
            if (lostReason == null && !closed) {
                lostReason = why;
                try {
                    Sockets.shutdown(fd, Sockets.SHUT_RDWR);
                } catch (NativeException ignored) {
                    // the socket is broken already
                }
            }
            reason = lostReason != null ? lostReason : "closed";
        }
        return new VfioUserException("vfio-user device at " + path + " is gone: " + reason, 0, true);
    }

    private void need(int got, int want, String what) throws VfioUserException {
        if (got < want) {
            throw lose(what + " reply of " + got + " bytes is shorter than its " + want + "-byte struct");
        }
    }

    private void closeReceivedFds() {
        for (int i = 0; i < fdsIn.length; i++) {
            if (fdsIn[i] >= 0) {
                try {
                    Libc.close(fdsIn[i]);
                } catch (NativeException ignored) {
                    // just received: cannot be bad
                }
                fdsIn[i] = -1;
            }
        }
    }

    /**
     * The watcher: while no request is out, reads what the server sends on its own (DMA_READ/WRITE) and sees the
     * socket close. Ends when the connection is lost (then runs the loss listener) or closed.
     */
    private void watch() {
        while (!closed && lostReason == null) {
            int revents;
            try {
                revents = Sockets.pollOne(pollfd, SLICE_MILLIS);
            } catch (NativeException e) {
                lose("polling the socket failed: " + e.getMessage());
                break;
            }
            if (revents == 0) {
                continue;
            }
            // Never queue for the lock: a requester holding it reads what came (its reply, most often), and one
            // that found the watcher queued behind it would pay a wait-queue node per request (an allocation on
            // the register path) and a hand-off. So try, and if it is held, look again a little later.
            if (!lock.tryLock()) {
                LockSupport.parkNanos(WATCH_BACKOFF_NANOS);
                continue;
            }
            try {
                if (closed || lostReason != null) {
                    break;
                }
                if (Sockets.pollOne(pollfd, 0) == 0) {
                    continue; // a requester read it meanwhile
                }
                int payload = receive(System.nanoTime() + timeoutNanos, false, "the device's next message");
                int flags = in.get(JAVA_INT_UNALIGNED, H_FLAGS);
                int command = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_COMMAND));
                int id = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_MSG_ID));
                if ((flags & FLAG_TYPE_MASK) != TYPE_COMMAND) {
                    throw lose("the device sent a reply to " + commandName(command) + " (msg_id " + id
                            + ") while no request was outstanding");
                }
                serve(id, command, payload, System.nanoTime() + timeoutNanos);
            } catch (VfioUserException | NativeException e) {
                if (lostReason == null && !closed) {
                    lose(e.getMessage());
                }
            } finally {
                lock.unlock();
            }
        }
        if (closed) {
            freeBuffers(); // close() ran on this thread (from the loss listener) or could not wait for it
        }
        String reason = lostReason;
        if (reason != null && !closed) {
            LOG.log(System.Logger.Level.DEBUG, () -> "vfio-user " + path + ": connection lost: " + reason);
            try {
                onLoss.accept(reason);
            } catch (RuntimeException e) {
                Thread me = Thread.currentThread();
                me.getUncaughtExceptionHandler().uncaughtException(me, e);
            }
        }
    }

    /** Closes the socket (the watcher ends without running the loss listener) and frees the buffers. Idempotent. */
    @Override
    public void close() {
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
            try {
                Sockets.shutdown(fd, Sockets.SHUT_RDWR);
            } catch (NativeException ignored) {
                // not connected any more
            }
        }
        Thread w = watcher;
        if (w != null && w != Thread.currentThread()) {
            try {
                w.join(TimeUnit.SECONDS.toMillis(2));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        lock.lock(); // no requester is inside any more: they fail at once now that closed is set
        try {
            Libc.close(fd);
        } catch (NativeException ignored) {
            // shut down already
        } finally {
            lock.unlock();
        }
        if (w == null || !w.isAlive()) {
            freeBuffers();
        }
    }

    private boolean freed;

    private void freeBuffers() {
        lock.lock();
        try {
            if (!freed) {
                freed = true;
                arena.close();
            }
        } finally {
            lock.unlock();
        }
    }
}
