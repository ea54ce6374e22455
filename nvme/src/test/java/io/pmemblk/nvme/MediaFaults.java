package io.pmemblk.nvme;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.ForwardingBlockDriver;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;

/**
 * A test device: the real driver, except that READs and WRITEs touching a bad byte range fail with EIO without
 * reaching it (what the pmem driver answers over a bad block) and, once {@link #failFlushes} is set, every FLUSH
 * fails with EIO (the sticky write-back error of a failed msync). Bad ranges are never received or sent in place,
 * so a failed write leaves the device as it was.
 */
final class MediaFaults extends ForwardingBlockDriver {
    private final long badFrom, badTo;
    volatile boolean failFlushes;

    MediaFaults(BlockDriver d, long badFrom, long badTo) {
        super(d);
        this.badFrom = badFrom;
        this.badTo = badTo;
    }

    private boolean bad(long offset, long length) {
        return offset < badTo && offset + length > badFrom;
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        queueOrFail(hwq, batch, count, r -> {
            boolean data = r.op == Op.READ || r.op == Op.WRITE;
            return (data && bad(r.offset, r.length)) || (r.op == Op.FLUSH && failFlushes);
        });
    }

    @Override
    public boolean receivesInPlace(long offset, long length) {
        return !bad(offset, length) && device.receivesInPlace(offset, length);
    }

    @Override
    public boolean sendsInPlace(long offset, long length) {
        return !bad(offset, length) && device.sendsInPlace(offset, length);
    }
}
