package io.pmemblk.dma.vfiouser.client;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.ioat.IoatChannel;
import io.pmemblk.dma.ioat.IoatSpec;

/**
 * One DMA channel of a vfio-user device, as the engine's users hold it across the device's comings and goings:
 * the {@link IoatChannel} of the device attached now, or none while it is gone. Without one, the channel has no
 * room ({@link #place} and {@link #placeAll} return false, as a full ring does), so the driver takes the CPU
 * route for new copies without an error; copies the lost device held were reported by
 * {@link IoatChannel#deviceLost} with {@link DmaCompletionListener#STATUS_DEVICE_LOST}, and the driver redid them.
 */
final class VfioUserChannel implements DmaChannel {
    private final int index;
    private volatile IoatChannel current;
    private volatile DmaCompletionListener listener = (ctx, status) -> { };
    private volatile long maxTransfer;
    private volatile boolean closed;
    /** The interrupt's eventfd: the engine keeps its vectors across devices, so every channel put behind has it. */
    private final int completionFd;
    /** Threads reaping on their own ({@link #pollers}), handed on to every channel put behind this one. */
    private int pollers;

    VfioUserChannel(int index, IoatChannel first) {
        this.index = index;
        this.completionFd = first.completionFd();
        attach(first);
    }

    /** Puts {@code channel} (started on the device just attached) behind this one. */
    synchronized void attach(IoatChannel channel) {
        channel.listener(listener);
        maxTransfer = channel.maxTransfer();
        for (int i = 0; i < pollers; i++) {
            channel.pollers(true);
        }
        current = channel;
    }

    /** Takes the channel away (the device is gone); returns it for the caller to fail and close. */
    IoatChannel detach() {
        IoatChannel c = current;
        current = null;
        return c;
    }

    @Override
    public int index() {
        return index;
    }

    @Override
    public void listener(DmaCompletionListener listener) {
        this.listener = listener == null ? (ctx, status) -> { } : listener;
        IoatChannel c = current;
        if (c != null) {
            c.listener(this.listener);
        }
    }

    @Override
    public int freeSlots() {
        IoatChannel c = current;
        return c == null ? 0 : c.freeSlots();
    }

    @Override
    public int slotsFor(long length) {
        return IoatSpec.descriptorsFor(length, maxTransfer);
    }

    @Override
    public boolean place(long srcIova, long dstIova, long length, Object ctx) {
        IoatChannel c = live();
        if (c == null) {
            return false;
        }
        try {
            return c.place(srcIova, dstIova, length, ctx);
        } catch (IllegalStateException e) {
            // the device went between the look and the place, or the channel found it gone before the engine
            // did (a halt whose CHANERR read as all ones) and the engine has not detached it yet: nothing was
            // placed, and the CPU route takes the copy as when the ring is full
            if ((current != c || c.deviceGone()) && !closed) {
                return false;
            }
            throw e;
        }
    }

    @Override
    public boolean placeAll(Copies copies, Object ctx) {
        IoatChannel c = live();
        if (c == null) {
            return false;
        }
        try {
            return c.placeAll(copies, ctx);
        } catch (IllegalStateException e) {
            if ((current != c || c.deviceGone()) && !closed) {
                return false; // as in place
            }
            throw e;
        }
    }

    private IoatChannel live() {
        if (closed) {
            throw new IllegalStateException("DMA channel " + index + " is closed");
        }
        return current;
    }

    @Override
    public void submit() {
        IoatChannel c = current;
        if (c != null) {
            c.submit();
        }
    }

    @Override
    public int poll() {
        IoatChannel c = current;
        return c == null ? 0 : c.poll();
    }

    @Override
    public int completionFd() {
        return completionFd;
    }

    @Override
    public synchronized void pollers(boolean start) {
        if (!start && pollers == 0) {
            return;
        }
        pollers += start ? 1 : -1;
        IoatChannel c = current;
        if (c != null) {
            c.pollers(start);
        }
    }

    @Override
    public void close() {
        closed = true;
        IoatChannel c = detach();
        if (c != null) {
            c.close();
        }
    }

    @Override
    public String toString() {
        IoatChannel c = current;
        return "VfioUserChannel[" + index + ", " + (c == null ? "device gone" : c) + "]";
    }
}
