package io.pmemblk.dma.vfiouser.device;

import static io.pmemblk.dma.vfiouser.device.IoatPci.*;
import static io.pmemblk.dma.vfiouser.device.LibVfioUser.*;

import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.ioat.DoorbellPage;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.Mman;
import io.pmemblk.posix.SharedMemory;
import io.pmemblk.posix.Errno;
import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import java.io.IOException;
import java.lang.System.Logger.Level;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFileAttributeView;
import java.nio.file.attribute.PosixFilePermissions;
import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.IntConsumer;

/**
 * pmemblk's software I/OAT device ({@link SoftIoatDevice}, the one model) served as a PCIe function over vfio-user
 * with libvfio-user: Intel 8086:0c50 (CBDMA of the Atom C2000, I/OAT 3.3, in Linux's {@code ioat_pci_tbl}), class
 * 0880, a PCI Express and an MSI-X capability (one vector per channel; table and PBA in BAR0 at 0x1000/0x1800,
 * which QEMU's vfio-user-pci emulates), BAR0 the model's register file with copies, XOR and PQ ({@link IoatPci}), and the configuration space past the capabilities kept as the driver
 * writes it (ioatdma reads and writes CHANERR_INT at 0x180).
 *
 * <p>Memory: the regions a client maps with an fd (QEMU's guest RAM, a share=on memfd) are mmap'ed by libvfio-user
 * once and placed in an {@link IovaSpace#placedByCaller()} at the client's IOVAs, so the engines copy directly. A
 * region without an fd is recorded but not reachable: a descriptor, ring or completion address there halts the
 * channel with CHANERR (SRC_ADDR, DEST_ADDR, CHAIN_ADDR_VALUE / NEXT_ADDR, COMPLETION_ADDR). Not DMA_READ/DMA_WRITE,
 * because those are messages on the context's socket: an engine thread could not send one (the context is
 * single-threaded) without handing every such copy to the run loop and waiting for the client's reply, and what
 * QEMU maps without an fd is MMIO and ROM (BIOS, device windows), which no copy engine targets; the hardware's
 * answer to an address it cannot reach is the CHANERR above.
 *
 * <p>An unmap (or the client going away) first withdraws the region from the IOVA space, then waits with
 * {@link SoftIoatDevice#fence()} until no engine is inside a descriptor that may still use it; only then does the
 * callback return and libvfio-user unmap the memory. A reset (the client's RESET, an FLR, the client gone) resets
 * the model ({@link SoftIoatDevice#reset()}); the device then serves the next client.
 *
 * <p>One thread, the run loop, owns the libvfio-user context: it polls the socket and an eventfd the engines signal
 * ({@link PendingVectors}), runs one message at a time (the callbacks run there), and raises MSI-X vectors while
 * INTRCTRL's master enable is set. libvfio-user blocks on the client's socket (only its accept is non-blocking),
 * so a watchdog shuts that socket down when one attach or message holds the loop past
 * {@link ClientWatchdog#CALL_LIMIT}, and
 * {@link #close} does so at once: the client is dropped and the next one served.
 */
public final class IoatVfioUserDevice implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(IoatVfioUserDevice.class.getName());
    private static final ValueLayout.OfShort U16 = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfLong U64 = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    /**
     * Regions a client may map at once: QEMU maps a handful (guest RAM in pieces, ROMs), pmemblk's client one per
     * buffer pool and mapping. Bounded (libvfio-user's default is a million) because each map rebuilds the
     * engines' copy-on-write table, so a client mapping without end would cost the device quadratic time.
     */
    static final long MAX_DMA_REGIONS = 1 << 16;
    /** How long the loop sleeps in poll when nothing happens; only bounds how late it sees {@link #close}. */
    private static final int POLL_MILLIS = 1000;

    private final LibVfioUser lib;
    private final Path socket;
    private final int channels;
    private final Arena arena = Arena.ofShared();
    private final IovaSpace space = IovaSpace.placedByCaller();
    private final EventFd wake;
    private final PendingVectors vectors;
    private final SoftIoatDevice model;
    private final long registerEnd;
    private final MemorySegment ctx;
    private final MemorySegment config;
    private final MemorySegment pollfds;
    /** BAR2, the {@link DoorbellPage}: a sealed memfd of one page the client maps, and our mapping of it. */
    private final int doorbellFd;
    private final MemorySegment doorbellPage;
    private final IntConsumer raise = this::raise;
    private final Thread loop;
    /** Drops a client that holds the run loop (libvfio-user blocks on its socket), and any on close. */
    private final ClientWatchdog watchdog;
    private final CountDownLatch stopped = new CountDownLatch(1);
    private volatile boolean closing;
    private volatile boolean attached;
    private volatile int clients;
    private volatile Throwable failure;
    private boolean closed;

    private IoatVfioUserDevice(LibVfioUser lib, Path socket, GroupPrincipal group, int channels, int xfercapLog2,
                               SoftFaults faults) throws IOException {
        this.lib = lib;
        this.socket = socket;
        this.channels = channels;
        this.registerEnd = IoatSpec.channelBase(channels);
        this.wake = EventFd.create(true);
        this.vectors = new PendingVectors(channels, wake);
        this.model = new SoftIoatDevice(space, channels, xfercapLog2, faults, vectors::vector, DMA_CAPABILITY);
        this.pollfds = arena.allocate(Sockets.POLLFD, 2);
        MemorySegment c = null;
        int pageFd = -1;
        try {
            pageFd = SharedMemory.memfd("pmemblk-doorbells", DoorbellPage.SIZE);
            SharedMemory.seal(pageFd); // a client cannot truncate it under the engines (SIGBUS here)
            this.doorbellPage = Mman.map(pageFd, DoorbellPage.SIZE, Mman.PROT_READ | Mman.PROT_WRITE, Mman.MAP_SHARED,
                    0, arena);
            model.useDoorbellPage(doorbellPage);
            removeStaleSocket(socket);
            c = lib.createCtx(socket.toString(), LIBVFIO_USER_FLAG_ATTACH_NB);
            // libvfio-user binds with the process umask (022 leaves others without the write bit a connect needs);
            // the socket is made the owner's alone (or its group's too) before anyone is accepted, which only the
            // run loop does
            Files.setPosixFilePermissions(socket, PosixFilePermissions.fromString("rw-------"));
            if (group != null) {
                Files.getFileAttributeView(socket, PosixFileAttributeView.class, LinkOption.NOFOLLOW_LINKS).setGroup(group);
                Files.setPosixFilePermissions(socket, PosixFilePermissions.fromString("rw-rw----"));
            }
            LibVfioUser.Stubs stubs = lib.stubs(new Callbacks(), arena);
            lib.setupLog(c, stubs, LOG.isLoggable(Level.DEBUG) ? LOG_DEBUG : LOG_INFO);
            lib.pciInit(c, VFU_PCI_TYPE_EXPRESS, PCI_HEADER_TYPE_NORMAL);
            lib.pciSetId(c, VENDOR_INTEL, DEVICE_IOAT_BWD0, VENDOR_INTEL, 0);
            lib.pciSetClass(c, CLASS_BASE, CLASS_SUB, CLASS_PROG_IF);
            addCapabilities(c);
            lib.setupRegion(c, VFU_PCI_DEV_BAR0_REGION_IDX, BAR0_SIZE, stubs, RegionCallback.BAR0,
                    VFU_REGION_FLAG_RW | VFU_REGION_FLAG_MEM);
            lib.setupRegion(c, VFU_PCI_DEV_CFG_REGION_IDX, PCI_CFG_SPACE_EXP_SIZE, stubs, RegionCallback.CONFIG,
                    VFU_REGION_FLAG_RW);
            lib.setupRegion(c, VFU_PCI_DEV_BAR2_REGION_IDX, DoorbellPage.SIZE, stubs, RegionCallback.BAR2,
                    VFU_REGION_FLAG_RW | VFU_REGION_FLAG_MEM, pageFd);
            lib.setupIrqs(c, VFU_DEV_MSIX_IRQ, channels);
            lib.setupDma(c, stubs, MAX_DMA_REGIONS);
            lib.setupReset(c, stubs);
            lib.realize(c);
            this.config = lib.pciConfigSpace(c);
        } catch (IOException | RuntimeException e) {
            if (c != null) {
                lib.destroy(c);
            }
            model.close();
            wake.close();
            arena.close();
            if (pageFd >= 0) {
                Libc.closeQuietly(pageFd);
            }
            throw e;
        }
        this.doorbellFd = pageFd;
        this.ctx = c;
        this.loop = Thread.ofPlatform().name("vfio-user-device").unstarted(this::run);
        this.watchdog = new ClientWatchdog(lib, c, socket, () -> attached); // nobody attached yet
    }

    /**
     * Serves a device of {@code channels} channels (1..{@link IoatPci#MAX_CHANNELS}) with descriptors of at most
     * 2^xfercapLog2 bytes on the unix socket {@code socket} (mode 0600), its run loop on a thread of its own.
     * @throws IllegalStateException when libvfio-user is not there (the message says how to get it)
     */
    public static IoatVfioUserDevice start(Path socket, int channels, int xfercapLog2) throws IOException {
        return start(socket, null, channels, xfercapLog2, SoftFaults.installed());
    }

    /**
     * As {@link #start(Path, int, int)}, the socket given to {@code group} (may be null) and made 0660: a QEMU that
     * runs as another user in that group can connect, as with vhost.socket-group.
     */
    public static IoatVfioUserDevice start(Path socket, GroupPrincipal group, int channels, int xfercapLog2)
            throws IOException {
        return start(socket, group, channels, xfercapLog2, SoftFaults.installed());
    }

    /** As {@link #start(Path, int, int)}, the model's engines asking {@code faults} (tests). */
    public static IoatVfioUserDevice start(Path socket, int channels, int xfercapLog2, SoftFaults faults)
            throws IOException {
        return start(socket, null, channels, xfercapLog2, faults);
    }

    private static IoatVfioUserDevice start(Path socket, GroupPrincipal group, int channels, int xfercapLog2,
                                            SoftFaults faults) throws IOException {
        if (channels < 1 || channels > MAX_CHANNELS) {
            throw new IllegalArgumentException("channels " + channels + " not in 1.." + MAX_CHANNELS
                    + " (their registers must end before the MSI-X table at BAR0 0x" + Integer.toHexString(MSIX_TABLE_OFFSET) + ")");
        }
        IoatVfioUserDevice d = new IoatVfioUserDevice(LibVfioUser.require(), socket, group, channels, xfercapLog2, faults);
        d.loop.start();
        d.watchdog.start();
        LOG.log(Level.INFO, "dma-device: I/OAT {0}:{1} with {2} channels (XFERCAP 2^{3}) on {4}",
                Integer.toHexString(VENDOR_INTEL), Integer.toHexString(DEVICE_IOAT_BWD0), channels, xfercapLog2, socket);
        return d;
    }

    /** A socket file left by a process that died (nobody accepts on it) is removed; a live one or another file is not. */
    private static void removeStaleSocket(Path socket) throws IOException {
        if (!Files.exists(socket, LinkOption.NOFOLLOW_LINKS)) {
            return;
        }
        if (Files.isSymbolicLink(socket) || !"socket".equals(fileType(socket))) {
            throw new IOException(socket + " exists and is not a socket; remove it or choose another --socket");
        }
        try (SocketChannel probe = SocketChannel.open(StandardProtocolFamily.UNIX)) {
            probe.connect(UnixDomainSocketAddress.of(socket));
            throw new IOException(socket + " is served by a running process; stop it or choose another --socket");
        } catch (java.net.ConnectException e) {
            Files.delete(socket); // refused: nobody listens, a stale socket of a process gone
        }
    }

    private static String fileType(Path p) throws IOException {
        Object mode = Files.getAttribute(p, "unix:mode", LinkOption.NOFOLLOW_LINKS);
        return ((Integer) mode & 0xF000) == 0xC000 ? "socket" : "other";
    }

    private void addCapabilities(MemorySegment c) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            // PCI Express v2 endpoint, nothing else advertised: ioatdma reads and writes DEVCTL (relaxed ordering off)
            MemorySegment px = a.allocate(PCI_CAP_EXP_SIZEOF);
            px.set(ValueLayout.JAVA_BYTE, 0, (byte) PCI_CAP_ID_EXP);
            px.set(U16, PCI_EXP_FLAGS, (short) PCI_EXP_FLAGS_VERSION_2);
            lib.pciAddCapability(c, 0, 0, px);
            MemorySegment msix = a.allocate(PCI_CAP_MSIX_SIZEOF);
            msix.set(ValueLayout.JAVA_BYTE, 0, (byte) PCI_CAP_ID_MSIX);
            msix.set(U16, PCI_MSIX_FLAGS, (short) (channels - 1));
            msix.set(U32, PCI_MSIX_TABLE, MSIX_TABLE_OFFSET); // BIR 0
            msix.set(U32, PCI_MSIX_PBA, MSIX_PBA_OFFSET);     // BIR 0
            lib.pciAddCapability(c, 0, 0, msix);
        }
    }

    // ---- observation ----

    /** The device model (its engines' CPU time and counts). */
    public SoftIoatDevice model() {
        return model;
    }

    /** The client's memory as the engines see it. */
    public IovaSpace iovaSpace() {
        return space;
    }

    public Path socket() {
        return socket;
    }

    /** Whether a client is attached now. */
    public boolean attached() {
        return attached;
    }

    /** Clients attached so far (a client that goes and comes back counts twice). */
    public int clients() {
        return clients;
    }

    /** Waits until the run loop ended (close, or a failure: {@link #failure()}); false on timeout. */
    public boolean awaitStopped(Duration timeout) throws InterruptedException {
        return stopped.await(timeout.toNanos(), TimeUnit.NANOSECONDS);
    }

    /** What ended the run loop other than {@link #close}, or null. */
    public Throwable failure() {
        return failure;
    }

    // ---- the run loop: the context's one thread ----

    private void run() {
        try {
            while (!closing) {
                int fd = lib.pollFd(ctx);
                pollfds.set(ValueLayout.JAVA_INT, 0, fd);
                pollfds.set(ValueLayout.JAVA_SHORT, 4, Sockets.POLLIN);
                pollfds.set(ValueLayout.JAVA_SHORT, 6, (short) 0);
                long w = Sockets.POLLFD.byteSize();
                pollfds.set(ValueLayout.JAVA_INT, w, wake.fd());
                pollfds.set(ValueLayout.JAVA_SHORT, w + 4, Sockets.POLLIN);
                pollfds.set(ValueLayout.JAVA_SHORT, w + 6, (short) 0);
                if (Sockets.poll(pollfds, 2, POLL_MILLIS) == 0) {
                    continue;
                }
                if (pollfds.get(ValueLayout.JAVA_SHORT, w + 6) != 0) {
                    vectors.deliver(raise);
                }
                if (pollfds.get(ValueLayout.JAVA_SHORT, 6) != 0 && !closing) {
                    serve();
                }
            }
        } catch (Throwable t) {
            failure = t;
            LOG.log(Level.ERROR, "dma-device: the vfio-user run loop failed; the device stops serving", t);
        } finally {
            stopped.countDown();
        }
    }

    /** The socket is readable: a client to accept, or one message of the attached client. */
    private void serve() {
        if (!watchdog.enterCall()) {
            return;
        }
        int err;
        try {
            err = attached ? lib.runCtx(ctx) : lib.attach(ctx);
        } finally {
            watchdog.leaveCall();
        }
        if (!attached) {
            if (err == 0) {
                attached = true;
                clients++;
                LOG.log(Level.INFO, "dma-device: client {0} attached on {1}", clients, socket);
            } else if (err != Errno.EAGAIN && err != Errno.EINTR) {
                LOG.log(Level.WARNING, "dma-device: a client could not attach: {0} (waiting for the next)", Errno.name(err));
            }
            return;
        }
        if (err == Errno.ENOTCONN) {
            attached = false;
            vectors.clear();
            LOG.log(Level.INFO, "dma-device: client {0} went away; the device was reset and waits for the next", clients);
        } else if (err != 0 && err != Errno.EAGAIN && err != Errno.EINTR && err != Errno.EBUSY) {
            LOG.log(Level.WARNING, "dma-device: handling a client message failed: {0}", Errno.name(err));
        }
    }

    /** Raises channel n's MSI-X vector in the client, if the driver has interrupts on (INTRCTRL MASTER_INT_EN). */
    private void raise(int n) {
        if (!attached || (model.intrctrl() & IoatSpec.INTRCTRL_MASTER_INT_EN) == 0) {
            return; // as the hardware: no message while the master enable is off
        }
        int err = lib.irqTrigger(ctx, n);
        if (err != 0 && LOG.isLoggable(Level.DEBUG)) {
            LOG.log(Level.DEBUG, "dma-device: vector {0} not raised: {1} (no eventfd from the client)", n, Errno.name(err));
        }
    }

    /** Stops serving: the run loop ends, the context is destroyed (the socket removed), the engines stop. Idempotent. */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        closing = true;
        watchdog.closing();
        wake.signal();
        try {
            // the loop leaves a call it was in at once now, and sees closing within one poll
            long bound = ClientWatchdog.CALL_LIMIT.toMillis() + POLL_MILLIS;
            if (!stopped.await(bound, TimeUnit.MILLISECONDS)) {
                throw new IllegalStateException("the vfio-user run loop did not stop in " + bound + " ms");
            }
            watchdog.stop(); // it ends with the loop
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted while stopping the vfio-user run loop", e);
        }
        lib.destroy(ctx); // calls the unregister callbacks (fenced) and removes the socket
        model.close();
        try {
            Libc.close(doorbellFd); // the library handed it out with BAR2's info until now
            wake.close();
        } catch (NativeException e) {
            LOG.log(Level.WARNING, "dma-device: closing its eventfd: {0}", e.getMessage());
        }
        arena.close();
    }

    /**
     * Whether the engines may use a client region mapped with {@code prot} (mmap's PROT_*): only a read-write one.
     * libvfio-user maps a region with the protection the client asked for (QEMU maps option ROMs read-only), and an
     * engine storing into a read-only page would take the device process down with SIGSEGV; a descriptor there
     * halts with CHANERR instead, as one at an address never mapped. Reading a ROM by DMA is nothing a driver needs.
     */
    static boolean engineReachable(int prot) {
        return (prot & (PROT_READ | PROT_WRITE)) == (PROT_READ | PROT_WRITE);
    }

    /** mmap(2) protection bits, as vfu_dma_info_t.prot carries them. */
    private static final int PROT_READ = 0x1, PROT_WRITE = 0x2;

    // ---- what libvfio-user calls, on the run loop ----

    private final class Callbacks implements LibVfioUser.Callbacks {
        @Override
        public void log(int level, String message) {
            Level l = level <= LOG_ERR ? Level.ERROR : level == LOG_WARNING ? Level.WARNING
                    : level <= LOG_INFO ? Level.INFO : Level.DEBUG;
            LOG.log(l, "libvfio-user: {0}", message);
        }

        @Override
        public long bar0(MemorySegment buf, long offset, boolean write) {
            int n = (int) buf.byteSize();
            boolean register = (n == 1 || n == 2 || n == 4 || n == 8) && (offset & (n - 1)) == 0
                    && offset >= 0 && offset + n <= registerEnd;
            if (!register) {
                // past the channels (the MSI-X table and PBA are QEMU's), or a width the registers do not take:
                // reads are 0, writes are dropped, as on a bus that completes what the device does not decode
                if (!write) {
                    buf.fill((byte) 0);
                }
                return n;
            }
            if (write) {
                switch (n) {
                    case 1 -> model.write8(offset, buf.get(ValueLayout.JAVA_BYTE, 0));
                    case 2 -> model.write16(offset, buf.get(U16, 0));
                    case 4 -> model.write32(offset, buf.get(U32, 0));
                    default -> model.write64(offset, buf.get(U64, 0));
                }
            } else {
                switch (n) {
                    case 1 -> buf.set(ValueLayout.JAVA_BYTE, 0, (byte) model.read8(offset));
                    case 2 -> buf.set(U16, 0, (short) model.read16(offset));
                    case 4 -> buf.set(U32, 0, model.read32(offset));
                    default -> buf.set(U64, 0, model.read64(offset));
                }
            }
            return n;
        }

        /**
         * BAR2 by message, for a client that does not map it: reads as mapped; a write lands as a store would (the
         * header, the first line, is the device's and read-only), and every engine looks at its doorbell again, as
         * it would if awake.
         */
        @Override
        public long bar2(MemorySegment buf, long offset, boolean write) {
            long n = buf.byteSize();
            if (offset < 0 || offset + n > DoorbellPage.SIZE) {
                return -1;
            }
            if (!write) {
                MemorySegment.copy(doorbellPage, offset, buf, 0, n);
                return n;
            }
            long from = Math.max(offset, DoorbellPage.channel(0));
            if (from < offset + n) {
                MemorySegment.copy(buf, from - offset, doorbellPage, from, offset + n - from);
                for (int i = 0; i < channels; i++) {
                    model.wake(i);
                }
            }
            return n;
        }

        @Override
        public long config(MemorySegment buf, long offset, boolean write) {
            long n = buf.byteSize();
            if (offset < 0 || offset + n > config.byteSize()) {
                return -1;
            }
            // outside the header and the capabilities, the driver's writes are kept as written (CHANERR_INT at
            // 0x180 is read and written back by ioat_reset_hw; nothing is ever pending there in this model)
            if (write) {
                MemorySegment.copy(buf, 0, config, offset, n);
            } else {
                MemorySegment.copy(config, offset, buf, 0, n);
            }
            return n;
        }

        @Override
        public void dmaRegistered(long iova, long length, MemorySegment memory, int prot, String unreachable) {
            if (memory == null) {
                // a DMA_MAP cannot be refused from here (libvfio-user has answered it by now): the region stays
                // out of the IOVA space, where a descriptor halts with CHANERR as at an address never mapped
                LOG.log(Level.INFO, "dma-device: client region [0x{0}, 0x{1}) ({2} KiB): {3}; not reachable by"
                        + " the engines (a descriptor there halts with CHANERR)", Long.toHexString(iova),
                        Long.toHexString(iova + length), length >> 10, unreachable);
                return;
            }
            if (!engineReachable(prot)) {
                LOG.log(Level.INFO, "dma-device: client region [0x{0}, 0x{1}) ({2} KiB) is mapped with prot {3}, not"
                        + " read-write: not reachable by the engines (a descriptor there halts with CHANERR)",
                        Long.toHexString(iova), Long.toHexString(iova + length), length >> 10, prot);
                return;
            }
            try {
                space.mapAt(iova, memory);
                LOG.log(Level.INFO, "dma-device: client mapped [0x{0}, 0x{1}) ({2}, prot {3}), reachable by the engines",
                        Long.toHexString(iova), Long.toHexString(iova + length),
                        length >= 1 << 20 ? (length >> 20) + " MiB" : (length >> 10) + " KiB", prot);
            } catch (IllegalArgumentException e) {
                LOG.log(Level.WARNING, "dma-device: client region not used: {0}", e.getMessage());
            }
        }

        @Override
        public void dmaUnregistered(long iova, long length) {
            try {
                space.unmap(iova);
            } catch (IllegalArgumentException e) {
                return; // a region without an fd, or one refused: the engines never had it
            }
            model.fence(); // no engine inside a descriptor that may use it: libvfio-user may unmap it now
            LOG.log(Level.INFO, "dma-device: client unmapped [0x{0}, 0x{1})", Long.toHexString(iova),
                    Long.toHexString(iova + length));
        }

        @Override
        public int reset(int type) {
            model.reset();
            vectors.clear();
            LOG.log(Level.INFO, "dma-device: reset ({0})", switch (type) {
                case VFU_RESET_DEVICE -> "the client asked";
                case VFU_RESET_LOST_CONN -> "the client went away";
                case VFU_RESET_PCI_FLR -> "function-level reset";
                default -> "type " + type;
            });
            return 0;
        }
    }
}
