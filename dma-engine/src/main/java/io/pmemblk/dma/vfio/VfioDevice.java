package io.pmemblk.dma.vfio;

import static io.pmemblk.dma.vfio.VfioAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.SegmentMmio;
import io.pmemblk.posix.FileIo;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.Mman;
import io.pmemblk.posix.NativeException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;

/**
 * A PCI device opened through VFIO: its regions (BARs, config space), its interrupts as eventfds, and reset.
 * Owns its BAR mappings and eventfds; {@link #close} disables the interrupts, unmaps the BARs and closes the fd,
 * in that order (the device stops signalling before its eventfds go).
 */
public final class VfioDevice {
    /** One region as VFIO_DEVICE_GET_REGION_INFO reports it. */
    public record Region(int index, int flags, long size, long offset) {
        public boolean mappable() {
            return (flags & REGION_INFO_FLAG_MMAP) != 0;
        }
    }

    private final String address;
    private final int fd;
    private final int flags;
    private final int regions;
    private final int irqs;
    private final Arena bars = Arena.ofShared();
    private final List<EventfdInterrupt> vectors = new ArrayList<>();
    private int irqIndex = -1;
    private boolean closed;

    VfioDevice(String address, int fd) throws VfioException {
        this.address = address;
        this.fd = fd;
        try (Arena a = Arena.ofConfined()) {
            MemorySegment info = a.allocate(DEVICE_INFO);
            info.set(JAVA_INT, 0, (int) DEVICE_INFO.byteSize());
            Libc.ioctl(fd, DEVICE_GET_INFO, info, "VFIO_DEVICE_GET_INFO");
            this.flags = info.get(JAVA_INT, offset(DEVICE_INFO, "flags"));
            this.regions = info.get(JAVA_INT, offset(DEVICE_INFO, "num_regions"));
            this.irqs = info.get(JAVA_INT, offset(DEVICE_INFO, "num_irqs"));
        } catch (NativeException e) {
            throw new VfioException(address + ": VFIO_DEVICE_GET_INFO failed: " + e.getMessage(), e);
        }
        if ((flags & DEVICE_FLAGS_PCI) == 0) {
            throw new VfioException(address + " is not a PCI device (VFIO device flags 0x" + Integer.toHexString(flags) + ")");
        }
    }

    public String address() {
        return address;
    }

    public boolean canReset() {
        return (flags & DEVICE_FLAGS_RESET) != 0;
    }

    public Region region(int index) throws VfioException {
        if (index < 0 || index >= regions) {
            throw new VfioException(address + " has regions 0.." + (regions - 1) + ", not " + index);
        }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment r = a.allocate(REGION_INFO);
            r.set(JAVA_INT, offset(REGION_INFO, "argsz"), (int) REGION_INFO.byteSize());
            r.set(JAVA_INT, offset(REGION_INFO, "index"), index);
            Libc.ioctl(fd, DEVICE_GET_REGION_INFO, r, "VFIO_DEVICE_GET_REGION_INFO");
            return new Region(index, r.get(JAVA_INT, offset(REGION_INFO, "flags")),
                    r.get(JAVA_LONG, offset(REGION_INFO, "size")), r.get(JAVA_LONG, offset(REGION_INFO, "offset")));
        } catch (NativeException e) {
            throw new VfioException(address + ": region " + index + " info failed: " + e.getMessage(), e);
        }
    }

    /**
     * BAR {@code index} mapped (mmap of the device fd at the region's offset) as an {@link Mmio}: volatile accesses
     * of their exact width on an uncached mapping, the ordering {@link Mmio} promises. Unmapped by {@link #close}.
     */
    public Mmio mapBar(int index, long minimumSize) throws VfioException {
        Region r = region(index);
        if (!r.mappable() || r.size() < minimumSize) {
            throw new VfioException(address + ": BAR" + index + " is " + r.size() + " bytes, flags 0x"
                    + Integer.toHexString(r.flags()) + "; need at least " + minimumSize + " bytes, mappable");
        }
        try {
            MemorySegment window = Mman.map(fd, r.size(), Mman.PROT_READ | Mman.PROT_WRITE, Mman.MAP_SHARED, r.offset(), bars);
            return new SegmentMmio(window);
        } catch (NativeException e) {
            throw new VfioException(address + ": mmap of BAR" + index + " failed: " + e.getMessage(), e);
        }
    }

    /** Reads a 16-bit register of the PCI config space (the config region, by pread on the device fd). */
    public int readConfig16(int offset) throws VfioException {
        Region cfg = region(PCI_CONFIG_REGION);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment b = a.allocate(2);
            if (FileIo.pread(fd, b, cfg.offset() + offset) != 2) {
                throw new VfioException(address + ": reading config space at 0x" + Integer.toHexString(offset) + " failed");
            }
            return Short.toUnsignedInt(b.get(JAVA_SHORT, 0));
        }
    }

    public void writeConfig16(int offset, int value) throws VfioException {
        Region cfg = region(PCI_CONFIG_REGION);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment b = a.allocate(2);
            b.set(JAVA_SHORT, 0, (short) value);
            if (FileIo.pwrite(fd, b, cfg.offset() + offset) != 2) {
                throw new VfioException(address + ": writing config space at 0x" + Integer.toHexString(offset) + " failed");
            }
        }
    }

    /** Sets memory-space and bus-master in the command register: vfio-pci leaves bus mastering off (SPDK ioat_attach). */
    public void enableBusMaster() throws VfioException {
        int cmd = readConfig16(PCI_COMMAND);
        writeConfig16(PCI_COMMAND, cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    }

    /** Vectors the device offers for IRQ index {@code index} (MSI 1, MSI-X 2); 0 when it has none with eventfds. */
    public int vectorCount(int index) throws VfioException {
        if (index >= irqs) {
            return 0;
        }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment i = a.allocate(IRQ_INFO);
            i.set(JAVA_INT, offset(IRQ_INFO, "argsz"), (int) IRQ_INFO.byteSize());
            i.set(JAVA_INT, offset(IRQ_INFO, "index"), index);
            Libc.ioctl(fd, DEVICE_GET_IRQ_INFO, i, "VFIO_DEVICE_GET_IRQ_INFO");
            return (i.get(JAVA_INT, offset(IRQ_INFO, "flags")) & IRQ_INFO_EVENTFD) == 0 ? 0 : i.get(JAVA_INT, offset(IRQ_INFO, "count"));
        } catch (NativeException e) {
            throw new VfioException(address + ": IRQ info " + index + " failed: " + e.getMessage(), e);
        }
    }

    /**
     * Routes {@code count} vectors of IRQ index {@code index} (MSI or MSI-X) to new eventfds (VFIO_DEVICE_SET_IRQS,
     * DATA_EVENTFD|ACTION_TRIGGER); {@link #close} disables them.
     */
    public List<EventfdInterrupt> enableInterrupts(int index, int count) throws VfioException {
        if (irqIndex >= 0) {
            throw new IllegalStateException(address + ": interrupts already enabled");
        }
        int offered = vectorCount(index);
        if (count < 1 || count > offered) {
            throw new VfioException(address + ": wants " + count + " vectors of IRQ index " + index + ", the device offers " + offered);
        }
        List<EventfdInterrupt> made = new ArrayList<>();
        try (Arena a = Arena.ofConfined()) {
            for (int i = 0; i < count; i++) {
                made.add(new EventfdInterrupt());
            }
            long head = IRQ_SET.byteSize();
            MemorySegment s = a.allocate(head + 4L * count, 4);
            s.set(JAVA_INT, offset(IRQ_SET, "argsz"), (int) s.byteSize());
            s.set(JAVA_INT, offset(IRQ_SET, "flags"), IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER);
            s.set(JAVA_INT, offset(IRQ_SET, "index"), index);
            s.set(JAVA_INT, offset(IRQ_SET, "start"), 0);
            s.set(JAVA_INT, offset(IRQ_SET, "count"), count);
            for (int i = 0; i < count; i++) {
                s.set(JAVA_INT, head + 4L * i, made.get(i).fd());
            }
            Libc.ioctl(fd, DEVICE_SET_IRQS, s, "VFIO_DEVICE_SET_IRQS");
        } catch (NativeException | RuntimeException e) {
            made.forEach(EventfdInterrupt::close);
            throw new VfioException(address + ": enabling " + count + " interrupts failed: " + e.getMessage(), e);
        }
        irqIndex = index;
        vectors.addAll(made);
        return List.copyOf(made);
    }

    /** VFIO_DEVICE_RESET, when the device offers it (edu does not: no FLR). */
    public void reset() throws VfioException {
        if (!canReset()) {
            return;
        }
        try {
            Libc.ioctl(fd, DEVICE_RESET, 0L, "VFIO_DEVICE_RESET");
        } catch (NativeException e) {
            throw new VfioException(address + ": reset failed: " + e.getMessage(), e);
        }
    }

    /** Interrupts off (then their eventfds closed), BARs unmapped, fd closed. Idempotent. */
    synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        Teardown t = new Teardown();
        if (irqIndex >= 0) {
            t.step(() -> {
                try (Arena a = Arena.ofConfined()) {
                    MemorySegment s = a.allocate(IRQ_SET);
                    s.set(JAVA_INT, offset(IRQ_SET, "argsz"), (int) IRQ_SET.byteSize());
                    s.set(JAVA_INT, offset(IRQ_SET, "flags"), IRQ_SET_DATA_NONE | IRQ_SET_ACTION_TRIGGER);
                    s.set(JAVA_INT, offset(IRQ_SET, "index"), irqIndex);
                    s.set(JAVA_INT, offset(IRQ_SET, "count"), 0);
                    Libc.ioctl(fd, DEVICE_SET_IRQS, s, "VFIO_DEVICE_SET_IRQS(off)");
                }
            });
        }
        t.each(vectors, EventfdInterrupt::close);
        t.step(bars::close);
        t.closeFd(fd);
        t.finish();
    }
}
