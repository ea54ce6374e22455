package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.ForwardingBlockDriver;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Arrays;

/**
 * A block device over another that marks every WRITE, WRITE_ZEROES and TRIM in the active dirty bitmaps before
 * passing it on (SPDK's vbdev, nbdkit's filter): the frontends see it as the device, so every one of them (NBD,
 * ublk, vhost-user-blk, NVMe/TCP) is tracked by the same code. Per batch: the bits of all its writes are set,
 * persisted once if any went from 0 to 1, and only then is the batch passed on, since a page-cache mapping may
 * write a request's data back at any time after that. A bit already durable costs a load; nothing is allocated.
 *
 * <p>Each write is counted in flight from its marking to its completion ({@link DirtyBitmaps#mark}), through a
 * completion of this layer's own per tag (made at {@link #attachQueue}) that hands the request back to the
 * frontend's: a checkpoint waits for those, so a frozen bitmap's writes have all reached the device when a
 * backup reads it. Everything else is the device's, passed through ({@link ForwardingBlockDriver}); closing closes
 * the device, not the bitmaps, which are their owner's.
 */
public final class TrackingDriver extends ForwardingBlockDriver {
    private final DirtyBitmaps bitmaps;
    /** Per hardware queue, per tag: the completion that ends the write's count and calls the frontend's. */
    private InFlight[][] inFlight = new InFlight[0][];

    public TrackingDriver(BlockDriver device, DirtyBitmaps bitmaps) {
        if (device.size() != bitmaps.deviceSize()) {
            throw new IllegalArgumentException("bitmaps of a " + bitmaps.deviceSize() + "-byte device over one of "
                    + device.size() + " bytes");
        }
        super(device);
        this.bitmaps = bitmaps;
    }

    public DirtyBitmaps bitmaps() {
        return bitmaps;
    }

    /** The frontend's completion of one tag, restored on the request before it runs. */
    private final class InFlight implements Request.Completion {
        Request.Completion frontend;
        int token;

        @Override
        public void completed(Request r) {
            Request.Completion c = frontend;
            frontend = null;
            r.completion = c;
            // the write has reached the device: a checkpoint waiting for it may go on before the reply is sent
            bitmaps.completed(token);
            c.completed(r);
        }
    }

    @Override
    public void attachQueue(HardwareQueue queue) {
        int q = queue.index();
        if (q >= inFlight.length) {
            inFlight = Arrays.copyOf(inFlight, q + 1);
        }
        InFlight[] perTag = new InFlight[queue.depth()];
        for (int t = 0; t < perTag.length; t++) {
            perTag[t] = new InFlight();
        }
        inFlight[q] = perTag;
        device.attachQueue(queue);
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        int token = bitmaps.mark(hwq, batch, count);
        if (token < 0) {
            refuseWrites(hwq, batch, count);
            return;
        }
        InFlight[] perTag = inFlight[hwq];
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            if (DirtyBitmaps.changes(r.op)) {
                InFlight f = perTag[r.tag()];
                f.frontend = r.completion;
                f.token = token;
                r.completion = f;
            }
        }
        device.queueRequests(hwq, batch, count);
    }

    /** The bits could not be made durable: the writes fail (EIO) without reaching the device, the rest go on. */
    private void refuseWrites(int hwq, Request[] batch, int count) {
        Request[] rest = new Request[count]; // a failed storage's path: allocates
        int n = 0;
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            if (DirtyBitmaps.changes(r.op)) {
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

    /** The bits first, durably: the payload lands in the device as it is received. */
    @Override
    public void receiveInPlace(Request r) {
        String refused = bitmaps.markInPlace(r.queue().index(), r.offset, r.length);
        if (refused != null) {
            throw new UncheckedIOException(new IOException(refused));
        }
        device.receiveInPlace(r);
    }
}
