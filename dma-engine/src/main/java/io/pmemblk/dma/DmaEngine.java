package io.pmemblk.dma;

import io.pmemblk.dma.ioat.IoatChannel;
import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import java.util.List;
import java.util.Optional;
import java.util.function.IntFunction;
import java.util.function.LongSupplier;

/**
 * A DMA device and its started channels, owned together. {@link #soft} runs the I/OAT driver against the software
 * device; {@link #ioat} runs the same driver against any register window (a VFIO BAR0 mapping on hardware, whose
 * IovaSpace backend also issues the IOMMU mappings and whose vectors are eventfds); {@link #of} takes channels of
 * any driver (QEMU's edu device through VFIO).
 */
public final class DmaEngine implements AutoCloseable {
    private final List<? extends DmaChannel> channels;
    private final SoftIoatDevice softDevice;
    private final AutoCloseable device;
    private final IovaSpace space;
    private volatile DmaCompletionListener listener = (ctx, status) -> { };
    private volatile LongSupplier deviceTransfers = () -> -1;
    private boolean closed;

    private DmaEngine(IovaSpace space, List<? extends DmaChannel> channels, SoftIoatDevice softDevice, AutoCloseable device) {
        this.space = space;
        this.channels = channels;
        this.softDevice = softDevice;
        this.device = device;
        DmaCompletionListener dispatch = new DmaCompletionListener() {
            @Override
            public void completed(Object ctx, int status) {
                listener.completed(ctx, status);
            }

            @Override
            public void completed(Object ctx, int status, int copies) {
                listener.completed(ctx, status, copies); // a run's copies stay one call to a listener that counts them
            }
        };
        for (DmaChannel c : channels) {
            c.listener(dispatch);
        }
    }

    /**
     * An engine over started {@code channels} of any driver, owning them and {@code device} (may be null), which is
     * closed after them.
     */
    public static DmaEngine of(IovaSpace space, List<? extends DmaChannel> channels, AutoCloseable device) {
        return new DmaEngine(space, List.copyOf(channels), null, device);
    }

    /** What the device itself counts of its transfers (e.g. completion interrupts it raised); -1 when unknown. */
    public long deviceTransfers() {
        return deviceTransfers.getAsLong();
    }

    /** Sets where {@link #deviceTransfers} comes from. */
    public void deviceTransfers(LongSupplier counter) {
        this.deviceTransfers = counter;
    }

    /** The software I/OAT device with 1 MiB descriptors (XFERCAP 20), {@code channels} channels of {@code ringSize}. */
    public static DmaEngine soft(IovaSpace space, int channels, int ringSize) {
        return soft(space, channels, ringSize, SOFT_XFERCAP_LOG2);
    }

    /** The software device's largest descriptor, 2^20 = 1 MiB, as on hardware. */
    public static final int SOFT_XFERCAP_LOG2 = 20;

    /** As {@link #soft(IovaSpace, int, int)} with descriptors of at most 2^xfercapLog2 bytes. */
    public static DmaEngine soft(IovaSpace space, int channels, int ringSize, int xfercapLog2) {
        return soft(space, channels, ringSize, xfercapLog2, SoftFaults.NONE);
    }

    /** As {@link #soft(IovaSpace, int, int, int)}, the device's engines asking {@code faults} (tests). */
    public static DmaEngine soft(IovaSpace space, int channels, int ringSize, int xfercapLog2, SoftFaults faults) {
        SoftIoatDevice dev = new SoftIoatDevice(space, channels, xfercapLog2, faults);
        try {
            List<IoatChannel> list = start(dev, space, dev::interrupt, channels, ringSize);
            return new DmaEngine(space, list, dev, dev);
        } catch (RuntimeException e) {
            dev.close();
            throw e;
        }
    }

    /**
     * Starts {@code channels} channels of an I/OAT device reached through {@code bar}; {@code vectors} gives channel
     * n's interrupt. {@code device} (may be null) is closed last, after the channels (e.g. the BAR mapping).
     */
    public static DmaEngine ioat(Mmio bar, IovaSpace space, IntFunction<Interrupt> vectors, int channels, int ringSize,
                                 AutoCloseable device) {
        return new DmaEngine(space, start(bar, space, vectors, channels, ringSize), null, device);
    }

    private static List<IoatChannel> start(Mmio bar, IovaSpace space, IntFunction<Interrupt> vectors, int n, int ringSize) {
        IoatChannel[] started = new IoatChannel[n];
        try {
            for (int i = 0; i < n; i++) {
                started[i] = new IoatChannel(bar, i, space, vectors.apply(i), ringSize);
            }
        } catch (RuntimeException e) {
            for (IoatChannel c : started) {
                if (c != null) {
                    c.close();
                }
            }
            throw e;
        }
        return List.of(started);
    }

    /** Every channel's completions go to {@code listener}; set it before placing copies. */
    public void onCompletion(DmaCompletionListener listener) {
        this.listener = listener == null ? (ctx, status) -> { } : listener;
    }

    public DmaChannel channel(int i) {
        return channels.get(i);
    }

    public List<? extends DmaChannel> channels() {
        return channels;
    }

    public int channelCount() {
        return channels.size();
    }

    public IovaSpace iovaSpace() {
        return space;
    }

    /** The software device, for its engines' CPU time and descriptor counts; empty on hardware. */
    public Optional<SoftIoatDevice> softDevice() {
        return Optional.ofNullable(softDevice);
    }

    /** Closes the channels (draining them, bounded), then the device. Idempotent. */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        for (DmaChannel c : channels) {
            c.close();
        }
        if (device != null) {
            try {
                device.close();
            } catch (Exception e) {
                throw new IllegalStateException("closing the DMA device failed", e);
            }
        }
    }
}
