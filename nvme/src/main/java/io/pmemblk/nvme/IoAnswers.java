package io.pmemblk.nvme;

import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The answers of one I/O queue: the driver's completions (any thread) are handed to the queue's sender thread
 * ({@code nvme-q-N-tx}), which drains every completion waiting and writes their PDUs (C2HData with the read's data,
 * CapsuleResp) in one gathering write, then gives the tags back. The errno of a request becomes the NVMe status
 * the specification names for it.
 */
final class IoAnswers {
    private static final System.Logger LOG = System.getLogger(IoAnswers.class.getName());
    private final TcpQueue link;
    private final IoSlot[] slots;
    private final ArrayBlockingQueue<IoSlot> completed;
    /** Tags this queue holds: acquired and not yet released (the sender stops when closed and none are left). */
    final AtomicInteger outstanding = new AtomicInteger();
    final Request.Completion onComplete = this::completed;
    private final Thread sender;

    IoAnswers(TcpQueue link, IoSlot[] slots) {
        this.link = link;
        this.slots = slots;
        this.completed = new ArrayBlockingQueue<>(slots.length);
        this.sender = Thread.ofPlatform().name("nvme-q-" + link.id + "-tx").unstarted(this::senderMain);
    }

    void start() {
        sender.start();
    }

    void join(long millis) throws InterruptedException {
        sender.join(Math.max(1, millis));
    }

    /** Driver side, any thread: hand the slot to the sender (never blocks: one place per tag). */
    private void completed(Request r) {
        IoSlot s = slots[r.tag()];
        IoSlot p = s.parent;
        if (p != null && p != s) {
            // A DSM range other than the first: fold its status into the command's, give its tag back
            short st = status(s, r);
            boolean lastOne;
            synchronized (p) {
                if (p.worst == Nvme.OK) {
                    p.worst = st;
                }
                lastOne = --p.remaining == 0;
            }
            r.release();
            outstanding.decrementAndGet();
            if (lastOne) {
                completed.add(p);
            }
            return;
        }
        if (p == s) {
            boolean lastOne;
            synchronized (p) {
                short st = status(s, r);
                if (p.worst == Nvme.OK) {
                    p.worst = st;
                }
                lastOne = --p.remaining == 0;
            }
            if (!lastOne) {
                return; // the last range to finish sends it
            }
        }
        completed.add(s);
    }

    static short status(IoSlot s, Request r) {
        if (s.override != Nvme.OK) {
            return s.override;
        }
        int errno = r.status();
        return switch (errno) {
            case Status.OK -> Nvme.OK;
            case Status.EOVERFLOW -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_LBA_RANGE, true);
            case Status.EINVAL -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_FIELD, true);
            case Status.ENOTSUP -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INVALID_OPCODE, true);
            case Status.EPERM -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_NS_WRITE_PROTECTED, true);
            case Status.ENOSPC -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_CAPACITY_EXCEEDED, true);
            // The sticky write-back error and media faults: a write or flush that did not reach the media
            case Status.EIO -> s.opcode == Nvme.IO_READ ? Nvme.status(Nvme.SCT_MEDIA, Nvme.SC_READ_ERROR, false)
                    : Nvme.status(Nvme.SCT_MEDIA, Nvme.SC_WRITE_FAULT, false);
            default -> Nvme.status(Nvme.SCT_GENERIC, Nvme.SC_INTERNAL, false);
        };
    }

    private void senderMain() {
        // An answer takes at most: C2HData header, the data's buffers, its digest, CapsuleResp
        int perAnswer = link.server.config.maxTransferBytes() / BufferPool.CHUNK + 6;
        ByteBuffer[] gather = new ByteBuffer[Math.max(256, 2 * perAnswer)];
        IoSlot[] batch = new IoSlot[slots.length];
        boolean broken = false;
        try {
            while (true) {
                IoSlot first = completed.poll(100, TimeUnit.MILLISECONDS);
                if (first == null) {
                    if (link.isClosed() && outstanding.get() == 0) {
                        return;
                    }
                    continue;
                }
                int n = 0;
                batch[n++] = first;
                for (IoSlot s; n < batch.length && (s = completed.poll()) != null; ) {
                    batch[n++] = s; // everything completed meanwhile goes out in the same write
                }
                int g = 0;
                link.writeLock.lock();
                try {
                    for (int i = 0; i < n; i++) {
                        if (g + perAnswer > gather.length || broken) {
                            if (!broken) {
                                broken = !writeAll(gather, g);
                            }
                            g = 0;
                        }
                        g = answer(batch[i], gather, g);
                    }
                    if (!broken && g > 0) {
                        broken = !writeAll(gather, g);
                    }
                } catch (RuntimeException e) {
                    // A bug here must not strand the tags: the connection closes, the batch's tags go back below
                    LOG.log(System.Logger.Level.ERROR, "nvme: queue " + link.id + " from " + link.peer
                            + ": answer failed", e);
                    broken = true;
                    link.close();
                } finally {
                    link.writeLock.unlock();
                }
                for (int i = 0; i < n; i++) {
                    batch[i].request.release();
                    batch[i] = null;
                    outstanding.decrementAndGet();
                }
                Arrays.fill(gather, null); // hold no device views or finished buffers
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Puts slot s's answer PDUs into gather from g; returns the new count. */
    private int answer(IoSlot s, ByteBuffer[] gather, int g) {
        Request r = s.request;
        short st = s.parent == s ? s.worst : status(s, r);
        boolean sqFlowOff = link.sqFlowOff;
        if (s.opcode == Nvme.IO_READ && st == Nvme.OK) {
            int length = (int) r.length;
            boolean success = sqFlowOff; // C2HData SUCCESS replaces the CapsuleResp only without SQ flow control
            boolean ddgst = link.ddgst;
            Wire.c2hData(s.c2h, s.cid, length, true, success, link.hdgst, ddgst, link.c2hPdo, s.crc);
            gather[g++] = s.c2h;
            ByteBuffer[] data = r.dataBuffers();
            int count = r.dataBufferCount();
            if (ddgst) {
                s.crc.reset();
            }
            long left = length;
            for (int i = 0; i < count && left > 0; i++) {
                ByteBuffer b = data[i];
                if (b.remaining() > left) {
                    b.limit(b.position() + (int) left);
                }
                left -= b.remaining();
                if (ddgst) {
                    int p = b.position();
                    s.crc.update(b);
                    b.position(p);
                }
                gather[g++] = b;
            }
            if (ddgst) {
                s.ddgst.clear();
                s.ddgst.putInt(0, (int) s.crc.getValue()).limit(Pdu.DIGEST);
                gather[g++] = s.ddgst;
            }
            if (success) {
                return g;
            }
        }
        Wire.capsuleResp(s.rsp, 0, sqFlowOff ? 0xFFFF : link.sqHead, link.qid, s.cid, st, link.hdgst, s.crc);
        gather[g++] = s.rsp;
        return g;
    }

    private boolean writeAll(ByteBuffer[] gather, int count) {
        try {
            long left = 0;
            for (int i = 0; i < count; i++) {
                left += gather[i].remaining();
            }
            int from = 0;
            while (left > 0) {
                long n = link.channel.write(gather, from, count - from);
                left -= n;
                while (from < count && !gather[from].hasRemaining()) {
                    from++;
                }
            }
            return true;
        } catch (IOException e) {
            link.close(); // the host is gone: the reader stops; completions still release their tags
            return false;
        }
    }
}
