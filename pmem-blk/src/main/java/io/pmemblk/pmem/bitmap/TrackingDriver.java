package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.ForwardingBlockDriver;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Request;

import java.io.IOException;
import java.io.UncheckedIOException;

/**
 * A block device over another that marks every WRITE, WRITE_ZEROES and TRIM in the active dirty bitmaps before
 * passing it on (SPDK's vbdev, nbdkit's filter): the frontends see it as the device, so every one of them (NBD,
 * ublk, vhost-user-blk, NVMe/TCP) is tracked by the same code. Per batch: the bits of all its writes are set,
 * persisted once if any went from 0 to 1, and only then is the batch passed on, since a page-cache mapping may
 * write a request's data back at any time after that. A bit already durable costs a load; nothing is allocated.
 *
 * <p>Marking, and the record of each write in flight that a checkpoint waits for, are the {@link WriteMarker}'s
 * (one set of bitmaps per write, at dispatch, or when a write is received straight into the device). Everything
 * else is the device's, passed through ({@link ForwardingBlockDriver}); closing closes the device, not the bitmaps,
 * which are their owner's.
 */
public final class TrackingDriver extends ForwardingBlockDriver {
    private final DirtyBitmaps bitmaps;
    private final WriteMarker marker;

    public TrackingDriver(BlockDriver device, DirtyBitmaps bitmaps) {
        if (device.size() != bitmaps.deviceSize()) {
            throw new IllegalArgumentException("bitmaps of a " + bitmaps.deviceSize() + "-byte device over one of "
                    + device.size() + " bytes");
        }
        super(device);
        this.bitmaps = bitmaps;
        this.marker = bitmaps.marker();
    }

    public DirtyBitmaps bitmaps() {
        return bitmaps;
    }

    @Override
    public void attachQueue(HardwareQueue queue) {
        marker.attach(queue.index(), queue.depth());
        device.attachQueue(queue);
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        if (!marker.mark(hwq, batch, count)) {
            // The bits could not be made durable: the writes fail without reaching the device, the rest go on.
            queueOrFail(hwq, batch, count, r -> WriteMarker.changes(r.op));
            return;
        }
        device.queueRequests(hwq, batch, count);
    }

    @Override
    public boolean receivesInPlace(long offset, long length) {
        return bitmaps.failure() == null && device.receivesInPlace(offset, length);
    }

    /**
     * The bits first, durably: the payload lands in the device as it is received, once this returns (the device
     * only points the request's buffers at the range). The write is marked here, not again at dispatch.
     */
    @Override
    public void receiveInPlace(Request r) {
        device.receiveInPlace(r);
        String refused = marker.markInPlace(r.queue().index(), r);
        if (refused != null) {
            throw new UncheckedIOException(new IOException(refused));
        }
    }

    /** A write received in place and never dispatched no longer holds a checkpoint back. */
    @Override
    public void releasedInPlace(Request r) {
        marker.abandoned(r);
        device.releasedInPlace(r);
    }
}
