package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * A block device over another that marks every WRITE, WRITE_ZEROES and TRIM in the active dirty bitmaps before
 * passing it on (SPDK's vbdev, nbdkit's filter): the frontends see it as the device, so every one of them (NBD,
 * ublk, vhost-user-blk, NVMe/TCP) is tracked by the same code. Per batch: the bits of all its writes are set,
 * persisted once if any went from 0 to 1, and only then is the batch passed on, since a page-cache mapping may
 * write a request's data back at any time after that. A bit already durable costs a load; nothing is allocated.
 *
 * <p>Marking, and the record of each write in flight that a checkpoint waits for, are the {@link WriteMarker}'s
 * (one set of bitmaps per write, at dispatch, or when a write is received straight into the device). Everything
 * else is the device's, passed through.
 */
public final class TrackingDriver implements BlockDriver {
    private final BlockDriver device;
    private final DirtyBitmaps bitmaps;
    private final WriteMarker marker;

    public TrackingDriver(BlockDriver device, DirtyBitmaps bitmaps) {
        if (device.size() != bitmaps.deviceSize()) {
            throw new IllegalArgumentException("bitmaps of a " + bitmaps.deviceSize() + "-byte device over one of "
                    + device.size() + " bytes");
        }
        this.device = device;
        this.bitmaps = bitmaps;
        this.marker = bitmaps.marker();
    }

    /** The device under this layer. */
    public BlockDriver device() {
        return device;
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
            refuseWrites(hwq, batch, count);
            return;
        }
        device.queueRequests(hwq, batch, count);
    }

    /** The bits could not be made durable: the writes fail (EIO) without reaching the device, the rest go on. */
    private void refuseWrites(int hwq, Request[] batch, int count) {
        Request[] rest = new Request[count]; // a failed storage's path: allocates
        int n = 0;
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            if (WriteMarker.changes(r.op)) {
                r.complete(Status.EIO);
            } else {
                rest[n++] = r;
            }
        }
        if (n > 0) {
            device.queueRequests(hwq, rest, n);
        }
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
    }

    /**
     * The device's DMA completions, reaped on the queue thread that asks: a layer that kept these to itself would
     * leave every completion to the engine's own thread. What is reaped still completes through this layer's own.
     */
    @Override
    public int startReaping(int hwq) {
        return device.startReaping(hwq);
    }

    @Override
    public int reapCompletions(int hwq) {
        return device.reapCompletions(hwq);
    }

    @Override
    public void stopReaping(int hwq) {
        device.stopReaping(hwq);
    }

    @Override
    public long size() {
        return device.size();
    }

    @Override
    public boolean isPmem() {
        return device.isPmem();
    }

    @Override
    public boolean isReadOnly() {
        return device.isReadOnly();
    }

    @Override
    public boolean canFlush() {
        return device.canFlush();
    }

    @Override
    public boolean canFua() {
        return device.canFua();
    }

    @Override
    public boolean canTrim() {
        return device.canTrim();
    }

    @Override
    public boolean canZero() {
        return device.canZero();
    }

    @Override
    public boolean canFastZero() {
        return device.canFastZero();
    }

    @Override
    public boolean canCache() {
        return device.canCache();
    }

    @Override
    public boolean isRotational() {
        return device.isRotational();
    }

    @Override
    public boolean canMultiConn() {
        return device.canMultiConn();
    }

    @Override
    public int minimumBlockSize() {
        return device.minimumBlockSize();
    }

    @Override
    public boolean sendsInPlace(long offset, long length) {
        return device.sendsInPlace(offset, length);
    }

    @Override
    public long registerMemory(MemorySegment region) {
        return device.registerMemory(region);
    }

    @Override
    public void unregisterMemory(MemorySegment region) {
        device.unregisterMemory(region);
    }

    @Override
    public MemorySegment allocateBuffers(long bytes, Arena owner) {
        return device.allocateBuffers(bytes, owner);
    }

    @Override
    public void persistAll() throws IOException {
        device.persistAll();
    }

    /** Closes the device; the bitmaps are their owner's. */
    @Override
    public void close() throws IOException {
        device.close();
    }
}
