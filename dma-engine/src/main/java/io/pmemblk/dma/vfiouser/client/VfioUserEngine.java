package io.pmemblk.dma.vfiouser.client;

import static io.pmemblk.dma.vfiouser.client.VfioUserSpec.PCI_CLASS_PROG;
import static io.pmemblk.dma.vfiouser.client.VfioUserSpec.PCI_DEVICE_ID;
import static io.pmemblk.dma.vfiouser.client.VfioUserSpec.PCI_VENDOR_ID;

import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.ioat.DoorbellPage;
import io.pmemblk.dma.ioat.IoatChannel;
import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.vfio.EventfdInterrupt;
import io.pmemblk.dma.vfio.VfioAbi;
import io.pmemblk.dma.vfio.VfioEngine;
import io.pmemblk.posix.NativeException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A {@link DmaEngine} over an I/OAT device served by another process over vfio-user ({@code pmemblk dma-device}):
 * the very {@link IoatChannel} driver, its registers reached by REGION_READ/WRITE of BAR0 ({@link VfioUserMmio}),
 * its interrupts eventfds given with SET_IRQS, the memory it copies given with DMA_MAP ({@link VfioUserIovaSpace}).
 *
 * <p>Assembly, as a PCI driver probes: VERSION, DEVICE_GET_INFO, region info of configuration space and BAR0,
 * vendor and class checked in configuration space, DEVICE_RESET, bus mastering on in the COMMAND register,
 * MSI-X (else MSI, else INTx) vectors to eventfds, every DMA region mapped, then
 * {@link VfioEngine#ioatChannels} starts CHANCNT channels.
 *
 * <p>The device may go away (its process killed, its socket closed, a reply not coming in time): every channel
 * reports the copies it held as failed ({@link DmaCompletionListener#STATUS_DEVICE_LOST}; the driver redoes them
 * by the CPU), new copies find no room and go to the CPU, and a reconnect thread tries the socket again with
 * backoff (0.1 s doubling to 5 s); when the device answers, the regions are mapped again and the channels start
 * again behind the same {@link io.pmemblk.dma.DmaChannel}s. Each transition is logged once.
 */
public final class VfioUserEngine implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.dma.vfiouser");
    /** First IOVA, as VfioEngine's: low, and the same on every device generation (the driver keeps its IOVAs). */
    public static final long IOVA_BASE = VfioEngine.IOVA_BASE;
    public static final Duration DEFAULT_TIMEOUT = Duration.ofSeconds(5);
    private static final long BACKOFF_FIRST_MILLIS = 100, BACKOFF_MAX_MILLIS = 5_000;
    /** Intel's vendor ID and the class code I/OAT functions carry (base 0x08 system peripheral, sub 0x80 other). */
    static final int VENDOR_INTEL = 0x8086, CLASS_DMA_OTHER = 0x0880;

    private final String socket;
    private final int ringSize;
    private final Duration timeout;
    private final VfioUserIovaSpace space = new VfioUserIovaSpace(IOVA_BASE, VfioEngine.WIDE_LIMIT);
    private final List<VfioUserChannel> channels = new ArrayList<>();
    private final List<EventfdInterrupt> vectors = new ArrayList<>();
    private VfioUserConnection connection;
    private volatile boolean closed;
    private Thread reconnector;
    /** Channels of a device we gave up on while its process {@link #heldPid} still ran: their copies wait. */
    private final List<IoatChannel> held = new ArrayList<>();
    private int heldPid;
    /**
     * The devices' doorbell pages, mapped: kept until the engine closes, not only until their device goes, since a
     * submitter that looked at a channel as its device went may still ring there (a page, 4 KiB, per device attached).
     */
    private final Arena pages = Arena.ofShared();
    /** The interrupt type wired (VfioAbi.PCI_*_IRQ), to switch off at close. */
    private int irqIndex = VfioAbi.PCI_MSIX_IRQ;

    private VfioUserEngine(String socket, int ringSize, Duration timeout) {
        this.socket = socket;
        this.ringSize = ringSize;
        this.timeout = timeout;
    }

    /**
     * Connects to the I/OAT device at {@code socket} and starts its channels.
     * @throws VfioUserException naming what is missing or wrong (no device process, not an I/OAT device, ...)
     */
    public static DmaEngine open(String socket, int ringSize) throws VfioUserException {
        return open(socket, ringSize, DEFAULT_TIMEOUT);
    }

    /** As {@link #open(String, int)}, replies awaited at most {@code timeout}. */
    public static DmaEngine open(String socket, int ringSize, Duration timeout) throws VfioUserException {
        VfioUserEngine e = new VfioUserEngine(socket, ringSize, timeout);
        try {
            synchronized (e) {
                e.attach();
            }
        } catch (VfioUserException | RuntimeException ex) {
            e.close();
            throw ex;
        }
        DmaEngine engine = DmaEngine.of(e.space, e.channels, e);
        engine.deviceTransfers(() -> e.vectors.stream().mapToLong(EventfdInterrupt::deviceInterrupts).sum());
        LOG.log(System.Logger.Level.INFO, "vfio-user: " + e.channels.size() + " DMA channel(s) on the I/OAT device at "
                + socket + ", IOVAs from 0x" + Long.toHexString(IOVA_BASE));
        return engine;
    }

    /** Connects and starts the channels (first time: makes them; later: puts new device channels behind them). */
    private void attach() throws VfioUserException {
        VfioUserConnection c = VfioUserConnection.connect(socket, timeout, space::translate);
        List<IoatChannel> started = List.of();
        try {
            VfioUserConnection.DeviceInfo info = c.deviceInfo();
            if ((info.flags() & VfioAbi.DEVICE_FLAGS_PCI) == 0 || info.regions() <= VfioAbi.PCI_CONFIG_REGION) {
                throw refuse("is not a PCI device (flags 0x" + Integer.toHexString(info.flags()) + ", " + info.regions()
                        + " regions)");
            }
            VfioUserConnection.RegionInfo cfgInfo = c.regionInfo(VfioAbi.PCI_CONFIG_REGION);
            VfioUserMmio config = new VfioUserMmio(c, VfioAbi.PCI_CONFIG_REGION, cfgInfo.size(), false);
            int vendor = config.read16(PCI_VENDOR_ID), device = config.read16(PCI_DEVICE_ID);
            int classCode = config.read32(PCI_CLASS_PROG - 1) >>> 8; // class code: the 3 bytes at 0x09..0x0b
            if (vendor != VENDOR_INTEL || classCode >>> 8 != CLASS_DMA_OTHER) {
                throw refuse("is PCI " + hex4(vendor) + ":" + hex4(device) + " class " + String.format("%06x", classCode)
                        + ", not an I/OAT DMA engine (vendor 8086, class 0880xx); dma.engine=vfio-user drives the"
                        + " device `pmemblk dma-device` serves");
            }
            VfioUserConnection.RegionInfo barInfo = c.regionInfo(VfioAbi.PCI_BAR0_REGION);
            if (barInfo.size() < 2L * IoatSpec.CHANNEL_MMIO_SIZE || !barInfo.readable() || !barInfo.writable()) {
                throw refuse("offers a BAR0 of " + barInfo.size() + " bytes (flags 0x" + Integer.toHexString(barInfo.flags())
                        + "); an I/OAT device needs at least " + 2 * IoatSpec.CHANNEL_MMIO_SIZE + ", readable and writable");
            }
            if ((info.flags() & VfioAbi.DEVICE_FLAGS_RESET) != 0) {
                c.reset();
            }
            if (!held.isEmpty() && c.peerPid() == heldPid) {
                // the process we gave up on answers again: it took our disconnect (a vfio-user server unmaps a
                // client's memory when it goes) and was reset, so what it held will not be copied any more
                releaseHeld("the device process " + heldPid + " answered again and was reset");
            }
            config.write16(VfioAbi.PCI_COMMAND, config.read16(VfioAbi.PCI_COMMAND) | VfioAbi.PCI_COMMAND_MEMORY
                    | VfioAbi.PCI_COMMAND_MASTER);
            VfioUserMmio bar = new VfioUserMmio(c, VfioAbi.PCI_BAR0_REGION, barInfo.size(), true);
            int n = bar.read8(IoatSpec.CHANCNT) & 0x1f;
            wireInterrupts(c, Math.max(1, n));
            space.attach(c);
            MemorySegment doorbells = info.regions() > VfioAbi.PCI_BAR2_REGION ? doorbellPage(c, Math.max(1, n)) : null;
            started = VfioEngine.ioatChannels(bar, space, v -> vectors.get(Math.min(v, vectors.size() - 1)), ringSize, 0,
                    doorbells);
            if (channels.isEmpty()) {
                for (IoatChannel ch : started) {
                    channels.add(new VfioUserChannel(ch.index(), ch));
                }
            } else {
                for (int i = 0; i < started.size(); i++) {
                    if (i < channels.size()) {
                        channels.get(i).attach(started.get(i));
                    } else {
                        started.get(i).close(); // more than at first: the users hold only the first ones
                    }
                }
            }
            connection = c;
            c.onLoss(reason -> lost(c, reason));
            c.startWatcher("vfio-user-watch " + socket);
        } catch (VfioUserException | RuntimeException e) {
            space.detach();
            for (IoatChannel ch : started) {
                ch.close();
            }
            c.close();
            throw e;
        }
    }

    /**
     * The device's {@link DoorbellPage} (BAR2 of {@code pmemblk dma-device}), mapped; null when it offers none that
     * holds {@code channels} channels (another device, or one whose BAR2 cannot be mapped safely): the channels then
     * ring DMACOUNT's register, a message a batch.
     */
    private MemorySegment doorbellPage(VfioUserConnection c, int channels) throws VfioUserException {
        MemorySegment page = c.mapRegion(VfioAbi.PCI_BAR2_REGION, DoorbellPage.SIZE, pages);
        if (page == null) {
            return null;
        }
        String wrong = DoorbellPage.refusal(page, channels - 1);
        if (wrong != null) {
            LOG.log(System.Logger.Level.INFO, "vfio-user: the device at " + socket + " maps a BAR2 that is not a doorbell"
                    + " page (" + wrong + "): doorbells go by register");
            return null;
        }
        return page;
    }

    /** MSI-X with one vector a channel, else MSI, else INTx, as Linux's ioatdma falls back. */
    private void wireInterrupts(VfioUserConnection c, int wanted) throws VfioUserException {
        int index = VfioAbi.PCI_MSIX_IRQ;
        int count = c.irqCount(index);
        if (count == 0) {
            index = VfioAbi.PCI_MSI_IRQ;
            count = c.irqCount(index);
        }
        if (count == 0) {
            index = VfioAbi.PCI_INTX_IRQ;
            count = c.irqCount(index);
        }
        if (count == 0) {
            throw refuse("offers no interrupt that signals an eventfd (MSI-X, MSI or INTx)");
        }
        int use = Math.min(count, wanted);
        try {
            while (vectors.size() < use) {
                vectors.add(new EventfdInterrupt());
            }
        } catch (NativeException e) {
            throw new VfioUserException("vfio-user: cannot make an eventfd: " + e.getMessage(), e);
        }
        int[] fds = new int[use];
        for (int i = 0; i < use; i++) {
            fds[i] = vectors.get(i).fd();
        }
        c.setIrqs(index, 0, fds);
        irqIndex = index;
    }

    private VfioUserException refuse(String what) {
        return new VfioUserException("vfio-user device at " + socket + " " + what, 0, false);
    }

    private static String hex4(int v) {
        return String.format("%04x", v);
    }

    /**
     * The connection {@code c} was lost (on its watcher thread): the channels take no new copy; the copies they
     * held are failed (the driver redoes them by the CPU) once the device can no longer touch our memory: at once
     * when the socket closed from the device's side or its process is gone; when we gave up on a process that
     * still runs (no reply in time, a protocol violation), only once it exits or answers again and has been reset
     * ({@link #releaseHeld}): a stopped device that resumed could otherwise finish a copy over data the CPU wrote
     * since. Then reconnect.
     */
    private void lost(VfioUserConnection c, String reason) {
        int failed = 0;
        boolean held;
        synchronized (this) {
            if (closed || connection != c) {
                return;
            }
            connection = null;
            space.detach(); // what the channels unmap now is bookkeeping: the device is gone
            List<IoatChannel> gone = new ArrayList<>();
            for (VfioUserChannel ch : channels) {
                IoatChannel g = ch.detach();
                if (g != null) {
                    gone.add(g);
                }
            }
            held = !c.lostByPeer() && running(c.peerPid());
            c.close();
            if (held) {
                heldPid = c.peerPid();
                this.held.addAll(gone);
                for (IoatChannel g : gone) {
                    failed += (int) Math.min(Integer.MAX_VALUE, g.outstanding());
                }
            } else {
                failed = fail(gone, reason);
            }
            reconnector = Thread.ofPlatform().daemon().name("vfio-user-reconnect " + socket).start(this::reconnect);
        }
        if (held) {
            LOG.log(System.Logger.Level.WARNING, "vfio-user: the DMA device at " + socket + " stopped answering ("
                    + reason + "), but its process " + c.peerPid() + " still runs and may still copy: the " + failed
                    + " descriptor(s) it holds wait until it exits or answers again (then the CPU redoes them);"
                    + " new copies go to the CPU. Restart it (kill " + c.peerPid() + "; pmemblk dma-device --socket "
                    + socket + ") to release them now");
        } else {
            LOG.log(System.Logger.Level.WARNING, "vfio-user: the DMA device at " + socket + " is gone (" + reason + "); "
                    + failed + " copies it held are redone by the CPU and new copies go to the CPU until it is back;"
                    + " reconnecting with backoff up to " + BACKOFF_MAX_MILLIS / 1000 + " s. Restart the device process"
                    + " (pmemblk dma-device --socket " + socket + ") to get the DMA route back");
        }
    }

    /** Reports every copy {@code channels} hold as lost (the driver redoes them) and closes them; returns how many. */
    private int fail(List<IoatChannel> channels, String reason) {
        int failed = 0;
        for (IoatChannel g : channels) {
            failed += g.deviceLost(DmaCompletionListener.STATUS_DEVICE_LOST, "the vfio-user device at " + socket
                    + " is gone: " + reason);
            g.closeTimeout(Duration.ZERO);
            g.close();
        }
        return failed;
    }

    /** Fails the copies held since a loss by timeout, now that {@code why} says the device cannot touch them. Caller holds this. */
    private void releaseHeld(String why) {
        if (held.isEmpty()) {
            return;
        }
        int failed = fail(held, why);
        held.clear();
        LOG.log(System.Logger.Level.WARNING, "vfio-user: " + why + ": the " + failed + " copies it held are redone by the CPU");
    }

    /** Whether process {@code pid} runs (exists and is not a zombie): /proc/PID/stat's state after the command name. */
    static boolean running(int pid) {
        if (pid <= 0) {
            return false;
        }
        try {
            String stat = java.nio.file.Files.readString(java.nio.file.Path.of("/proc", Integer.toString(pid), "stat"));
            int close = stat.lastIndexOf(')');
            char state = close >= 0 && close + 2 < stat.length() ? stat.charAt(close + 2) : 'X';
            return state != 'Z' && state != 'X';
        } catch (java.io.IOException e) {
            return false; // gone
        }
    }

    private void reconnect() {
        long wait = BACKOFF_FIRST_MILLIS;
        int attempts = 0;
        String last = null;
        while (!closed) {
            try {
                Thread.sleep(wait); // backoff between attempts, not synchronisation
            } catch (InterruptedException e) {
                return;
            }
            attempts++;
            synchronized (this) {
                if (closed) {
                    return;
                }
                if (!held.isEmpty() && !running(heldPid)) {
                    releaseHeld("the device process " + heldPid + " exited");
                }
                try {
                    attach();
                    LOG.log(System.Logger.Level.INFO, "vfio-user: the DMA device at " + socket + " is back after "
                            + attempts + " attempt(s): " + channels.size() + " channel(s) restarted, "
                            + space.mappedRegions() + " DMA region(s) mapped again");
                    return;
                } catch (VfioUserException | RuntimeException e) {
                    last = e.getMessage();
                }
            }
            if (attempts == 1 || wait < BACKOFF_MAX_MILLIS && wait * 2 >= BACKOFF_MAX_MILLIS) {
                String why = last;
                LOG.log(System.Logger.Level.DEBUG, () -> "vfio-user: reconnecting to " + socket + ": " + why);
            }
            wait = Math.min(BACKOFF_MAX_MILLIS, wait * 2);
        }
    }

    /**
     * After the engine closed the channels: interrupts off, the connection closed, the regions' descriptors
     * closed, the eventfds closed. Stops reconnecting.
     */
    @Override
    public void close() {
        closed = true;
        Thread r;
        VfioUserConnection c;
        synchronized (this) {
            r = reconnector;
            c = connection;
            connection = null;
        }
        if (r != null) {
            r.interrupt();
            try {
                r.join(TimeUnit.SECONDS.toMillis(timeout.toSeconds() + 2));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        synchronized (this) {
            for (VfioUserChannel ch : channels) {
                ch.close(); // closed already by the engine; here when open failed half-way
            }
            releaseHeld("the engine is closing with copies a device that stopped answering still holds");
        }
        if (c != null) { // outside the monitor: its watcher may be waiting for it in lost(), which now returns
            try {
                c.disableIrqs(irqIndex);
            } catch (VfioUserException ignored) {
                // the device is going anyway
            }
            c.close();
        }
        synchronized (this) {
            space.release();
            for (EventfdInterrupt v : vectors) {
                v.close();
            }
            vectors.clear();
            if (pages.scope().isAlive()) {
                pages.close(); // the channels are closed: nothing rings any more
            }
        }
    }
}
