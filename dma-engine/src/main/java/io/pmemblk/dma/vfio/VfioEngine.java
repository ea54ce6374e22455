package io.pmemblk.dma.vfio;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.Interrupt;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.edu.EduChannel;
import io.pmemblk.dma.edu.EduDevice;
import io.pmemblk.dma.edu.EduSpec;
import io.pmemblk.dma.ioat.IoatChannel;
import io.pmemblk.dma.ioat.IoatSpec;
import java.nio.file.Files;
import java.nio.file.Path;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.IntFunction;

/**
 * Assembles a {@link DmaEngine} from PCI devices bound to vfio-pci: one container, their groups, each device's
 * BAR0, bus mastering and interrupts, an IOVA space mapped in the IOMMU, and one DMA channel per device channel
 * (I/OAT: CHANCNT channels with the {@link IoatChannel} driver; edu: one {@link EduChannel}). Closing the engine
 * stops the channels, then withdraws every DMA mapping, then closes the devices, groups and container.
 */
public final class VfioEngine {
    private VfioEngine() {}

    private static final System.Logger LOG = System.getLogger("io.pmemblk.dma.vfio");
    /** First IOVA: low, so that a device masking bus addresses (edu: 28 bits) still has 255 MiB above it. */
    public static final long IOVA_BASE = 1 << 20;
    /** Without a narrower device limit: 48-bit IOVAs, what every VT-d/AMD-Vi page table walks. */
    public static final long WIDE_LIMIT = 1L << 48;

    /**
     * Opens {@code addresses} (PCI addresses "dddd:bb:dd.f"; empty: every usable candidate, "auto").
     *
     * @throws VfioException naming what is missing and how to fix it
     */
    public static DmaEngine open(List<String> addresses, int ringSize) throws VfioException {
        return open(addresses, ringSize, PciDevices.scan(), Path.of("/dev/vfio"));
    }

    static DmaEngine open(List<String> addresses, int ringSize, List<PciDevices.Candidate> found, Path devVfio)
            throws VfioException {
        List<PciDevices.Candidate> chosen = choose(addresses, found, devVfio);
        VfioContainer container = VfioContainer.open();
        List<DmaChannel> channels = new ArrayList<>();
        List<EventfdInterrupt> eduVectors = new ArrayList<>();
        try {
            Map<Integer, VfioGroup> groups = new HashMap<>();
            List<VfioDevice> devices = new ArrayList<>();
            boolean edu = false;
            for (PciDevices.Candidate c : chosen) {
                VfioGroup g = groups.get(c.group());
                if (g == null) {
                    g = container.attach(c.group(), c.address());
                    groups.put(c.group(), g);
                }
                devices.add(g.device(c.address()));
                edu |= c.kind() == PciDevices.Kind.EDU;
            }
            VfioIovaSpace space = new VfioIovaSpace(container, IOVA_BASE, edu ? EduSpec.DMA_LIMIT : WIDE_LIMIT);
            for (int i = 0; i < chosen.size(); i++) {
                VfioDevice d = devices.get(i);
                d.reset();
                d.enableBusMaster();
                if (chosen.get(i).kind() == PciDevices.Kind.EDU) {
                    Mmio bar = d.mapBar(0, EduSpec.BAR0_SIZE);
                    EventfdInterrupt msi = d.enableInterrupts(io.pmemblk.dma.vfio.VfioAbi.PCI_MSI_IRQ, 1).getFirst();
                    EduDevice dev;
                    try {
                        dev = new EduDevice(bar, msi);
                    } catch (IllegalStateException e) {
                        throw new VfioException(d.address() + ": " + e.getMessage(), e);
                    }
                    channels.add(new EduChannel(channels.size(), dev, ringSize));
                    eduVectors.add(msi);
                } else {
                    Mmio bar = d.mapBar(0, IoatSpec.CHANNEL_MMIO_SIZE * 2L);
                    int n = bar.read8(IoatSpec.CHANCNT) & 0x1f;
                    int msix = d.vectorCount(VfioAbi.PCI_MSIX_IRQ);
                    List<EventfdInterrupt> vectors = d.enableInterrupts(msix > 0 ? VfioAbi.PCI_MSIX_IRQ : VfioAbi.PCI_MSI_IRQ,
                            Math.max(1, Math.min(n, msix)));
                    channels.addAll(ioatChannels(bar, space, v -> vectors.get(Math.min(v, vectors.size() - 1)), ringSize, channels.size()));
                }
            }
            String names = chosen.stream().map(c -> c.address() + " (" + c.kind() + ")").toList().toString();
            LOG.log(System.Logger.Level.INFO, "vfio: " + channels.size() + " DMA channel(s) on " + names + ", IOVAs 0x"
                    + Long.toHexString(IOVA_BASE) + "..0x" + Long.toHexString(space.limit()));
            DmaEngine engine = DmaEngine.of(space, channels, () -> {
                int unmapped = space.unmapAll();
                container.close();
                LOG.log(System.Logger.Level.INFO, "vfio: unmapped " + unmapped + " DMA region(s), released " + names);
            });
            if (!eduVectors.isEmpty()) {
                engine.deviceTransfers(() -> eduVectors.stream().mapToLong(EventfdInterrupt::deviceInterrupts).sum());
            }
            return engine;
        } catch (VfioException | RuntimeException e) {
            channels.forEach(DmaChannel::close);
            container.close();
            throw e;
        }
    }

    /**
     * Starts every channel of the I/OAT v3 device behind {@code bar} (CHANCNT of them) with interrupts on: the
     * same driver as the software device's, now over a VFIO BAR. Channel i signals {@code vectors(i)}.
     */
    public static List<IoatChannel> ioatChannels(Mmio bar, IovaSpace space, IntFunction<Interrupt> vectors, int ringSize,
                                                 int firstIndex) {
        return ioatChannels(bar, space, vectors, ringSize, firstIndex, null);
    }

    /** As {@link #ioatChannels(Mmio, IovaSpace, IntFunction, int, int)}, ringing in the device's doorbell page when not null. */
    public static List<IoatChannel> ioatChannels(Mmio bar, IovaSpace space, IntFunction<Interrupt> vectors, int ringSize,
                                                 int firstIndex, MemorySegment doorbellPage) {
        int version = bar.read8(IoatSpec.CBVER);
        if (version < IoatSpec.VER_3_0) {
            throw new IllegalStateException("CBVER 0x" + Integer.toHexString(version) + ": not an I/OAT v3 device (needs 0x30 or later)");
        }
        int n = bar.read8(IoatSpec.CHANCNT) & 0x1f;
        if (n == 0 || (bar.read8(IoatSpec.XFERCAP) & IoatSpec.XFERCAP_MASK) == 0) {
            throw new IllegalStateException("I/OAT device reports CHANCNT " + n + ", XFERCAP "
                    + (bar.read8(IoatSpec.XFERCAP) & IoatSpec.XFERCAP_MASK) + ": no usable channel (Linux's ioatdma refuses it too)");
        }
        bar.write8(IoatSpec.INTRCTRL, IoatSpec.INTRCTRL_MASTER_INT_EN);
        List<IoatChannel> out = new ArrayList<>();
        try {
            for (int i = 0; i < n; i++) {
                out.add(new IoatChannel(bar, i, space, vectors.apply(i), ringSize, doorbellPage));
            }
        } catch (RuntimeException e) {
            out.forEach(IoatChannel::close);
            throw e;
        }
        return out;
    }

    /** The candidates to open, or why there are none. */
    static List<PciDevices.Candidate> choose(List<String> addresses, List<PciDevices.Candidate> found, Path devVfio)
            throws VfioException {
        if (addresses.isEmpty()) {
            List<PciDevices.Candidate> usable = found.stream().filter(PciDevices.Candidate::usable).toList();
            if (usable.isEmpty()) {
                StringBuilder b = new StringBuilder("dma.vfio.devices=auto: nothing to use: ")
                        .append(PciDevices.nothingUsable(found, devVfio));
                for (PciDevices.Candidate c : found) {
                    b.append("; ").append(c.address()).append(": ").append(c.problem());
                }
                throw new VfioException(b.toString());
            }
            return usable;
        }
        List<PciDevices.Candidate> out = new ArrayList<>();
        for (String a : addresses) {
            PciDevices.Candidate c = found.stream().filter(x -> x.address().equals(a)).findFirst().orElseThrow(() ->
                    new VfioException("dma.vfio.devices: no I/OAT or edu PCI device at " + a + " ("
                            + (found.isEmpty() ? PciDevices.nothingUsable(found, devVfio)
                            : "candidates: " + found.stream().map(PciDevices.Candidate::address).toList())
                            + "; pmemblk dma list shows them)"));
            if (!c.usable()) {
                throw new VfioException("dma.vfio.devices: " + a + " cannot be used: " + c.problem());
            }
            out.add(c);
        }
        if (!Files.isDirectory(devVfio)) {
            throw new VfioException(devVfio + " does not exist: modprobe vfio-pci");
        }
        return out;
    }
}
