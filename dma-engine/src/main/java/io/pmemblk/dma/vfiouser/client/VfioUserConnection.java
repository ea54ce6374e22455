package io.pmemblk.dma.vfiouser.client;

import static io.pmemblk.dma.vfiouser.client.VfioUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED;

import io.pmemblk.dma.vfio.VfioAbi;
import io.pmemblk.posix.Errno;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.Mman;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.SharedMemory;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.UnixMessages;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One vfio-user connection, client side: the socket, the VERSION handshake, and one request at a time with its
 * reply matched by message id and command ({@code docs/interop/vfio-user.rst}, "Command Concurrency": a client
 * may pipeline; this one does not, except for posted region writes, below).
 *
 * <p>Reading the socket: whoever holds the connection's lock reads it. A requester reads its own reply (no thread
 * hand-off on the register path); a server command that arrives first (DMA_READ/DMA_WRITE, which the spec lets come
 * "in between a client to server request/reply") is answered on the spot. While no request is out, a watcher thread
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
    private static final Pattern NUMBER = Pattern.compile("\"(max_msg_fds|max_data_xfer_size)\"\\s*:\\s*(\\d+)");

    /** Serves the server's DMA_READ/DMA_WRITE: the memory at a DMA address, or an exception when it is not mapped. */
    @FunctionalInterface
    public interface DmaTarget {
        MemorySegment translate(long address, long length);
    }

    private final VfioUserWire wire;
    private final VfioUserWatcher watcher;
    private final String path;
    /** The wire's buffers, which a request owns while it holds the wire's lock. */
    private final MemorySegment out;
    private final MemorySegment in;
    private final int[] fdsIn;
    private int serverMaxFds = 1;
    private int serverMaxXfer = DEFAULT_MAX_DATA_XFER;
    private final int peerPid;
    private long postedWrites;

    private VfioUserConnection(int fd, String path, Duration timeout, DmaTarget target) throws NativeException {
        this.wire = new VfioUserWire(fd, path, timeout, target);
        this.watcher = new VfioUserWatcher(wire);
        this.path = path;
        this.out = wire.out;
        this.in = wire.in;
        this.fdsIn = wire.fdsIn;
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
        return wire.lostByPeer();
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
        return wire.lostReason();
    }

    /** Region writes sent posted (No_reply) so far. */
    public long postedWrites() {
        return postedWrites;
    }

    /** DMA_READ/DMA_WRITE commands the server sent us so far. */
    public long serverCommands() {
        return wire.serverCommands();
    }

    /** Runs {@code listener} once, on the watcher thread, when the connection is lost (not when closed). */
    public void onLoss(Consumer<String> listener) {
        watcher.onLoss(listener);
    }

    /** Starts the watcher thread (see the class comment); {@code name} names it. */
    public void startWatcher(String name) {
        watcher.start(name);
    }

    // ---- commands -------------------------------------------------------------------------------------------

    private void negotiate() throws VfioUserException {
        String json = "{\"capabilities\":{\"max_msg_fds\":" + VfioUserWire.MAX_FDS_IN + ",\"max_data_xfer_size\":" + VfioUserWire.MAX_XFER
                + ",\"pgsizes\":4096}}";
        byte[] bytes = json.getBytes(StandardCharsets.UTF_8);
        try (var _ = wire.request()) {
            out.set(JAVA_SHORT_UNALIGNED, HEADER + V_MAJOR, (short) VERSION_MAJOR);
            out.set(JAVA_SHORT_UNALIGNED, HEADER + V_MINOR, (short) VERSION_MINOR);
            MemorySegment.copy(bytes, 0, out, JAVA_BYTE, HEADER + V_DATA, bytes.length);
            out.set(JAVA_BYTE, HEADER + V_DATA + bytes.length, (byte) 0);
            int n = wire.exchange(VERSION, V_DATA + bytes.length + 1, null, false, true);
            wire.closeReceivedFds(); // twin-socket was not proposed: an fd here is refused by ignoring it
            if (n < V_DATA) {
                throw wire.lose("VERSION reply of " + n + " bytes is shorter than its " + V_DATA + "-byte version");
            }
            int major = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, HEADER + V_MAJOR));
            int minor = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, HEADER + V_MINOR));
            if (major != VERSION_MAJOR || minor > VERSION_MINOR) {
                throw wire.lose("the device answered version " + major + "." + minor + "; allowed: " + VERSION_MAJOR + ".0 to "
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
        }
    }

    /** VFIO_USER_DEVICE_GET_INFO. */
    public record DeviceInfo(int flags, int regions, int irqs) {}

    public DeviceInfo deviceInfo() throws VfioUserException {
        try (var _ = wire.request()) {
            out.fill((byte) 0);
            out.set(JAVA_INT_UNALIGNED, HEADER + INFO_ARGSZ, INFO_BYTES);
            int n = wire.exchange(DEVICE_GET_INFO, INFO_BYTES, null, false, false);
            need(n, INFO_BYTES, "DEVICE_GET_INFO");
            return new DeviceInfo(in.get(JAVA_INT_UNALIGNED, HEADER + INFO_FLAGS), in.get(JAVA_INT_UNALIGNED, HEADER + INFO_NUM_REGIONS),
                    in.get(JAVA_INT_UNALIGNED, HEADER + INFO_NUM_IRQS));
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
        return regionInfo(index, null);
    }

    /**
     * Maps region {@code index} whole, shared and read-write, by the descriptor the server hands out with its info,
     * into {@code owner}; null when it offers no descriptor, or one whose file could be cut short under the mapping
     * (no F_SEAL_SHRINK: a truncate by the device would fault this process with SIGBUS), or one shorter than
     * {@code size}. For a region of plain memory both sides share, as the {@link io.pmemblk.dma.ioat.DoorbellPage}.
     */
    public MemorySegment mapRegion(int index, long size, Arena owner) throws VfioUserException {
        int[] fd = {-1};
        RegionInfo info = regionInfo(index, fd);
        if (fd[0] < 0) {
            return null;
        }
        try {
            int seals = SharedMemory.seals(fd[0]);
            if (!info.readable() || !info.writable() || info.size() < size || info.offset() < 0
                    || seals < 0 || (seals & SharedMemory.F_SEAL_SHRINK) == 0
                    || FileCalls.fstat(fd[0]).size() < info.offset() + size) {
                return null;
            }
            return Mman.map(fd[0], size, Mman.PROT_READ | Mman.PROT_WRITE, Mman.MAP_SHARED, info.offset(), owner);
        } catch (NativeException e) {
            throw new VfioUserException("vfio-user: mapping region " + index + " of the device at " + path() + ": "
                    + e.getMessage(), e);
        } finally {
            Libc.closeQuietly(fd[0]);
        }
    }

    /** The region's info; {@code keepFd}: where the descriptor offered with it goes (else it is closed). */
    private RegionInfo regionInfo(int index, int[] keepFd) throws VfioUserException {
        try (var _ = wire.request()) {
            out.asSlice(HEADER, RI_BYTES).fill((byte) 0);
            out.set(JAVA_INT_UNALIGNED, HEADER + RI_ARGSZ, RI_ARGSZ_ASKED);
            out.set(JAVA_INT_UNALIGNED, HEADER + RI_INDEX, index);
            int n = wire.exchange(DEVICE_GET_REGION_INFO, RI_BYTES, null, false, true);
            boolean fdOffered = fdsIn[0] >= 0;
            if (keepFd != null && fdOffered) {
                keepFd[0] = fdsIn[0];
                fdsIn[0] = -1; // ours now, not the wire's to close
            }
            wire.closeReceivedFds();
            need(n, RI_BYTES, "DEVICE_GET_REGION_INFO");
            int flags = in.get(JAVA_INT_UNALIGNED, HEADER + RI_FLAGS);
            int got = in.get(JAVA_INT_UNALIGNED, HEADER + RI_INDEX);
            if (got != index) {
                throw wire.lose("DEVICE_GET_REGION_INFO for region " + index + " answered for region " + got);
            }
            List<long[]> sparse = new ArrayList<>();
            // Offsets are u32 from the device and summed in long: in int, one near 2^31 wraps to a negative index.
            // 0 is "no capability" (as the kernel sets it when they did not fit); any other offset must lie inside
            // the reply, with room for the 8-byte capability header.
            long cap = (flags & RI_FLAG_CAPS) != 0 ? Integer.toUnsignedLong(in.get(JAVA_INT_UNALIGNED, HEADER + RI_CAP_OFFSET)) : 0;
            for (int hops = 0; cap != 0 && hops < 16; hops++) {
                if (cap < RI_BYTES || cap + 8 > n) {
                    throw wire.lose("DEVICE_GET_REGION_INFO for region " + index + " gave "
                            + (hops == 0 ? "cap_offset" : "a capability's next") + " 0x" + Long.toHexString(cap)
                            + "; allowed: 0 (none) or " + RI_BYTES + " to " + (n - 8) + " (its reply is " + n + " bytes)");
                }
                int id = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, HEADER + cap));
                if (id == CAP_SPARSE_MMAP && cap + 16 <= n) {
                    int areas = in.get(JAVA_INT_UNALIGNED, HEADER + cap + 8);
                    for (int a = 0; a < areas && cap + 16 + 16L * (a + 1) <= n; a++) {
                        sparse.add(new long[]{in.get(JAVA_LONG_UNALIGNED, HEADER + cap + 16 + 16L * a),
                                in.get(JAVA_LONG_UNALIGNED, HEADER + cap + 24 + 16L * a)});
                    }
                }
                long next = Integer.toUnsignedLong(in.get(JAVA_INT_UNALIGNED, HEADER + cap + 4));
                if (next <= cap) {
                    break; // 0 ends the chain; one that points back would loop
                }
                cap = next;
            }
            return new RegionInfo(index, flags, in.get(JAVA_LONG_UNALIGNED, HEADER + RI_SIZE),
                    in.get(JAVA_LONG_UNALIGNED, HEADER + RI_OFFSET), fdOffered, List.copyOf(sparse));
        }
    }

    /** VFIO_USER_DEVICE_GET_IRQ_INFO: how many vectors of type {@code index} (0 when none); flags in the high word. */
    public int irqCount(int index) throws VfioUserException {
        try (var _ = wire.request()) {
            out.asSlice(HEADER, IRQ_BYTES).fill((byte) 0);
            out.set(JAVA_INT_UNALIGNED, HEADER + IRQ_ARGSZ, IRQ_BYTES);
            out.set(JAVA_INT_UNALIGNED, HEADER + IRQ_INDEX, index);
            int n;
            try {
                n = wire.exchange(DEVICE_GET_IRQ_INFO, IRQ_BYTES, null, false, false);
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
        }
    }

    /**
     * VFIO_USER_DEVICE_SET_IRQS with DATA_EVENTFD | ACTION_TRIGGER: vector {@code start + i} signals
     * {@code eventfds[i]}; sent in as many messages as the server's max_msg_fds asks.
     */
    public void setIrqs(int index, int start, int[] eventfds) throws VfioUserException {
        for (int from = 0; from < eventfds.length; from += serverMaxFds) {
            int[] part = Arrays.copyOfRange(eventfds, from, Math.min(eventfds.length, from + serverMaxFds));
            try (var _ = wire.request()) {
                irqSet(index, start + from, part.length, VfioAbi.IRQ_SET_DATA_EVENTFD | VfioAbi.IRQ_SET_ACTION_TRIGGER);
                wire.exchange(DEVICE_SET_IRQS, SET_BYTES, part, false, false);
            }
        }
    }

    /** SET_IRQS DATA_NONE | ACTION_TRIGGER, start 0, count 0: every vector of {@code index} off. */
    public void disableIrqs(int index) throws VfioUserException {
        try (var _ = wire.request()) {
            irqSet(index, 0, 0, VfioAbi.IRQ_SET_DATA_NONE | VfioAbi.IRQ_SET_ACTION_TRIGGER);
            wire.exchange(DEVICE_SET_IRQS, SET_BYTES, null, false, false);
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
        try (var _ = wire.request()) {
            out.set(JAVA_INT_UNALIGNED, HEADER + MAP_ARGSZ, MAP_BYTES);
            out.set(JAVA_INT_UNALIGNED, HEADER + MAP_FLAGS, MAP_READ | MAP_WRITE);
            out.set(JAVA_LONG_UNALIGNED, HEADER + MAP_OFFSET, offset);
            out.set(JAVA_LONG_UNALIGNED, HEADER + MAP_ADDRESS, address);
            out.set(JAVA_LONG_UNALIGNED, HEADER + MAP_SIZE, size);
            wire.exchange(DMA_MAP, MAP_BYTES, new int[]{fd}, false, false);
        }
    }

    /** VFIO_USER_DMA_UNMAP of exactly a mapping made before. */
    public void dmaUnmap(long address, long size) throws VfioUserException {
        try (var _ = wire.request()) {
            out.set(JAVA_INT_UNALIGNED, HEADER + UNMAP_ARGSZ, UNMAP_BYTES);
            out.set(JAVA_INT_UNALIGNED, HEADER + UNMAP_FLAGS, 0);
            out.set(JAVA_LONG_UNALIGNED, HEADER + UNMAP_ADDRESS, address);
            out.set(JAVA_LONG_UNALIGNED, HEADER + UNMAP_SIZE, size);
            wire.exchange(DMA_UNMAP, UNMAP_BYTES, null, false, false);
        }
    }

    /** VFIO_USER_DEVICE_RESET. */
    public void reset() throws VfioUserException {
        try (var _ = wire.request()) {
            wire.exchange(DEVICE_RESET, 0, null, false, false);
        }
    }

    /**
     * VFIO_USER_REGION_READ of {@code count} (1, 2, 4 or 8) bytes at {@code offset} of region {@code region},
     * little-endian, zero-extended. Allocates nothing.
     */
    public long regionRead(int region, long offset, int count) throws VfioUserException {
        try (var _ = wire.request()) {
            out.set(JAVA_LONG_UNALIGNED, HEADER + RW_OFFSET, offset);
            out.set(JAVA_INT_UNALIGNED, HEADER + RW_REGION, region);
            out.set(JAVA_INT_UNALIGNED, HEADER + RW_COUNT, count);
            int n = wire.exchange(REGION_READ, RW_DATA, null, false, false);
            if (n != RW_DATA + count || in.get(JAVA_INT_UNALIGNED, HEADER + RW_COUNT) != count
                    || in.get(JAVA_LONG_UNALIGNED, HEADER + RW_OFFSET) != offset) {
                throw wire.lose("REGION_READ of " + count + " bytes at 0x" + Long.toHexString(offset) + " of region " + region
                        + " answered " + n + " bytes for " + in.get(JAVA_INT_UNALIGNED, HEADER + RW_COUNT) + " at 0x"
                        + Long.toHexString(in.get(JAVA_LONG_UNALIGNED, HEADER + RW_OFFSET)));
            }
            return switch (count) {
                case 1 -> Byte.toUnsignedLong(in.get(JAVA_BYTE, HEADER + RW_DATA));
                case 2 -> Short.toUnsignedLong(in.get(JAVA_SHORT_UNALIGNED, HEADER + RW_DATA));
                case 4 -> Integer.toUnsignedLong(in.get(JAVA_INT_UNALIGNED, HEADER + RW_DATA));
                default -> in.get(JAVA_LONG_UNALIGNED, HEADER + RW_DATA);
            };
        }
    }

    /**
     * VFIO_USER_REGION_WRITE of the low {@code count} (1, 2, 4 or 8) bytes of {@code value}; {@code posted}: sent
     * with No_reply, returning once the socket took it. Allocates nothing.
     */
    public void regionWrite(int region, long offset, int count, long value, boolean posted) throws VfioUserException {
        try (var _ = wire.request()) {
            out.set(JAVA_LONG_UNALIGNED, HEADER + RW_OFFSET, offset);
            out.set(JAVA_INT_UNALIGNED, HEADER + RW_REGION, region);
            out.set(JAVA_INT_UNALIGNED, HEADER + RW_COUNT, count);
            out.set(JAVA_LONG_UNALIGNED, HEADER + RW_DATA, value); // the server takes count bytes of it
            wire.exchange(REGION_WRITE, RW_DATA + count, null, posted, false);
            if (posted) {
                postedWrites++;
            }
        }
    }

    private void need(int got, int want, String what) throws VfioUserException {
        if (got < want) {
            throw wire.lose(what + " reply of " + got + " bytes is shorter than its " + want + "-byte struct");
        }
    }


    /** Closes the socket (the watcher ends without running the loss listener) and frees the buffers. Idempotent. */
    @Override
    public void close() {
        if (!wire.shutdownForClose()) {
            return;
        }
        Thread w = watcher.thread();
        if (w != null && w != Thread.currentThread()) {
            try {
                w.join(TimeUnit.SECONDS.toMillis(2));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        wire.closeSocket();
        if (w == null || !w.isAlive()) {
            wire.freeBuffers();
        }
    }
}
