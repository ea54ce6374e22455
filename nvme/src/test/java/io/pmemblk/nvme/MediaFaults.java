package io.pmemblk.nvme;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * A test device: the real driver, except that READs and WRITEs touching a bad byte range fail with EIO without
 * reaching it (what the pmem driver answers over a bad block) and, once {@link #failFlushes} is set, every FLUSH
 * fails with EIO (the sticky write-back error of a failed msync). Bad ranges are never received or sent in place,
 * so a failed write leaves the device as it was.
 */
final class MediaFaults implements BlockDriver {
    private final BlockDriver d;
    private final long badFrom, badTo;
    volatile boolean failFlushes;

    MediaFaults(BlockDriver d, long badFrom, long badTo) {
        this.d = d;
        this.badFrom = badFrom;
        this.badTo = badTo;
    }

    private boolean bad(long offset, long length) {
        return offset < badTo && offset + length > badFrom;
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        Request[] pass = new Request[count];
        int n = 0;
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            boolean data = r.op == Op.READ || r.op == Op.WRITE;
            if ((data && bad(r.offset, r.length)) || (r.op == Op.FLUSH && failFlushes)) {
                r.complete(Status.EIO);
            } else {
                pass[n++] = r;
            }
        }
        if (n > 0) {
            d.queueRequests(hwq, pass, n);
        }
    }

    @Override public long size() { return d.size(); }
    @Override public boolean isPmem() { return d.isPmem(); }
    @Override public boolean isReadOnly() { return d.isReadOnly(); }
    @Override public boolean canFlush() { return d.canFlush(); }
    @Override public boolean canFua() { return d.canFua(); }
    @Override public boolean canTrim() { return d.canTrim(); }
    @Override public boolean canZero() { return d.canZero(); }
    @Override public boolean canFastZero() { return d.canFastZero(); }
    @Override public boolean canCache() { return d.canCache(); }
    @Override public boolean isRotational() { return d.isRotational(); }
    @Override public boolean canMultiConn() { return d.canMultiConn(); }
    @Override public int minimumBlockSize() { return d.minimumBlockSize(); }
    @Override public void attachQueue(HardwareQueue queue) { d.attachQueue(queue); }
    @Override public boolean receivesInPlace(long offset, long length) {
        return !bad(offset, length) && d.receivesInPlace(offset, length);
    }
    @Override public boolean sendsInPlace(long offset, long length) {
        return !bad(offset, length) && d.sendsInPlace(offset, length);
    }
    @Override public void receiveInPlace(Request r) { d.receiveInPlace(r); }
    @Override public long registerMemory(MemorySegment region) { return d.registerMemory(region); }
    @Override public void unregisterMemory(MemorySegment region) { d.unregisterMemory(region); }
    @Override public MemorySegment allocateBuffers(long bytes, Arena owner) { return d.allocateBuffers(bytes, owner); }
    @Override public void persistAll() throws IOException { d.persistAll(); }
    @Override public void close() throws IOException { d.close(); }
}
