package io.pmemblk.queueing;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.function.Predicate;

/**
 * A layer over a block device that is a device of its own, as SPDK's vbdevs and nbdkit's filters are: every
 * method passes through to {@link #device}, the device below, and a layer overrides only what it changes
 * (Guava's Forwarding* classes). A layer that overrides nothing is indistinguishable from its device.
 *
 * <p>DMA reaping passes through too: a layer that kept {@link #startReaping} to itself would leave every
 * completion of the device below to the engine's own thread. Closing a layer closes its device.
 */
public abstract class ForwardingBlockDriver implements BlockDriver {
    /** The device below this layer. */
    protected final BlockDriver device;

    protected ForwardingBlockDriver(BlockDriver device) {
        if (device == null) {
            throw new IllegalArgumentException("a layer needs a device below it; got null");
        }
        this.device = device;
    }

    /** The device under this layer. */
    public BlockDriver device() {
        return device;
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
    public void attachQueue(HardwareQueue queue) {
        device.attachQueue(queue);
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        device.queueRequests(hwq, batch, count);
    }

    /**
     * Completes with EIO, without the device seeing them, the requests of the batch that {@code fails} picks, and
     * passes the rest on in their order: for a layer that refuses some requests itself (writes it cannot track, a
     * range it knows bad) and lets the others through. The batch passed on is allocated: a failing path's.
     */
    protected final void queueOrFail(int hwq, Request[] batch, int count, Predicate<Request> fails) {
        Request[] rest = new Request[count];
        int n = 0;
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            if (fails.test(r)) {
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
    public boolean receivesInPlace(long offset, long length) {
        return device.receivesInPlace(offset, length);
    }

    @Override
    public boolean sendsInPlace(long offset, long length) {
        return device.sendsInPlace(offset, length);
    }

    @Override
    public void receiveInPlace(Request r) {
        device.receiveInPlace(r);
    }

    @Override
    public void releasedInPlace(Request r) {
        device.releasedInPlace(r);
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

    @Override
    public void close() throws IOException {
        device.close();
    }
}
