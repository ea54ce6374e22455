package io.pmemblk.pmem;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.concurrent.atomic.LongAdder;

/**
 * How the region's stores become durable, and the state that says whether they still can: the dirty flag a FLUSH
 * tests, and the first write-back failure, after which every FLUSH, FUA and write is refused. On real pmem each
 * writer drains its own stores; elsewhere msync of the touched pages. Every step goes through the
 * {@link Persistence} port.
 */
public final class WriteBack {
    private final Path path;
    private final MemorySegment memory;
    private final boolean isPmem;
    private final Persistence persistence;
    /**
     * Set by every store; cleared (under flushLock) by the flush that makes those stores persistent. False means
     * every page of the mapping is durable, including what an earlier process left: the region's open syncs the
     * whole mapping before handing the region out (see {@link #syncAtStart}).
     */
    private volatile boolean dirty;
    private final Object flushLock = new Object();
    /**
     * The first write-back failure of this process, or null. Once set it stays: Linux reports a failed write-back
     * once and marks the pages clean, so nothing later can make those bytes durable, and no later FLUSH may say so.
     */
    private volatile String writeBackFailure;
    /** Requests the driver answered EIO because of {@link #writeBackFailure} (counted only on that path). */
    private final LongAdder refused = new LongAdder();

    /** The write-back of {@code memory}, the mapping of {@code path}, through {@code persistence}. */
    WriteBack(Path path, MemorySegment memory, Persistence persistence) {
        this.path = path;
        this.memory = memory;
        this.isPmem = persistence.flushesCaches();
        this.persistence = persistence;
    }

    /**
     * Makes durable whatever an earlier process left in the page cache: its acknowledged writes that no FLUSH
     * covered (it was killed, or a client reconnects and FLUSHes here, or ublk recovery reissues a FLUSH), which
     * {@code dirty == false} would otherwise let the first FLUSH skip. Done here rather than by starting dirty:
     * the server says {@code ready} only once what it serves is durable, and a write-back error the earlier
     * process never saw (Linux reports an unseen one to the next file opened) is found before any client is
     * answered OK. Cheap when the pages are clean: msync only walks the file's dirty pages (measured in
     * docs/durability.md). The same on fsdax, mapped with MAP_SYNC (is_pmem) or not: msync writes back the CPU
     * cache lines of every DAX entry still tagged dirty, which an earlier process that did not flush them (one
     * on the page-cache path, or without MAP_SYNC) left. Only device DAX is not synced: it has neither page cache
     * nor msync (EINVAL), and every writer of ours drained its stores before acknowledging them. A failure does
     * not stop the start: the region starts failed (reads work, writes and FLUSH answer EIO), and says so.
     */
    void syncAtStart() {
        if (path.toString().startsWith("/dev/dax")) {
            return;
        }
        try {
            persistence.sync(memory);
        } catch (IOException e) {
            failWriteBack("at start-up, of what an earlier process left in", 0, memory.byteSize(), e);
        }
    }

    /** After this thread's stores: on pmem drain them (they are ours), elsewhere mark the pages for the next FLUSH. */
    void stored() {
        if (isPmem) {
            persistence.drain();
        } else {
            dirty = true; // after the stores: a FLUSH that finds it set syncs pages that already hold them
        }
    }

    /**
     * Accounts for a range someone else has just stored into with ordinary stores: a DMA engine, or the kernel
     * receiving a payload in place. With Intel DDIO a device's writes land in the CPU's last-level cache, not in
     * the persistence domain: on real pmem the range's cache lines are written back and drained here, on this
     * thread (CLWB works on lines held by any cache, so it covers stores made elsewhere once they are visible);
     * on an ordinary file the pages are dirty until msync, done here for FUA.
     */
    public void deviceWrote(long offset, long length, boolean fua) throws IOException {
        MemorySegment range = memory.asSlice(offset, length);
        if (isPmem) {
            persistence.writeBack(range);
            persistence.drain();
        } else {
            dirty = true;
            if (fua) {
                sync(offset, length);
            }
        }
    }

    /**
     * Makes what this thread stored with {@link PmemRegion#write}/{@link PmemRegion#zero} at [offset, offset+length) persistent
     * (FUA). On real pmem those already drained; elsewhere msync of the range.
     */
    public void persistWritten(long offset, long length) throws IOException {
        if (!isPmem) {
            sync(offset, length);
        }
    }

    /**
     * Makes a range persistent whoever wrote it, a DMA engine included: cache-line write-backs and a drain on
     * real pmem (with DDIO a device's writes can sit in the CPU cache), msync otherwise.
     */
    public void persistRange(long offset, long length) throws IOException {
        if (isPmem) {
            MemorySegment range = memory.asSlice(offset, length);
            persistence.writeBack(range);
            persistence.drain();
            refuseIfFailed();
        } else {
            sync(offset, length);
        }
    }

    /**
     * msync of [offset, offset+length): a failure is kept for good ({@link #failWriteBack}); after one, even a
     * sync that succeeds is refused. That check after the call also catches most of a race the kernel allows:
     * two concurrent msyncs whose pages both failed get the error reported to one of them only.
     */
    private void sync(long offset, long length) throws IOException {
        refuseIfFailed();
        try {
            persistence.sync(memory.asSlice(offset, length));
        } catch (IOException e) {
            throw failWriteBack("of", offset, length, e);
        }
        refuseIfFailed();
    }

    private void refuseIfFailed() throws WriteBackFailedException {
        String f = writeBackFailure;
        if (f != null) {
            throw new WriteBackFailedException(f, null);
        }
    }

    /**
     * Enters the failed state (once; later failures only add to the count) and says so once, with what failed
     * and what to do: restart after fixing the storage. Returns what the failing caller throws.
     */
    private WriteBackFailedException failWriteBack(String what, long offset, long length, IOException cause) {
        String first;
        boolean now = false;
        synchronized (flushLock) {
            if (writeBackFailure == null) {
                writeBackFailure = "write-back " + what + " " + path + " failed (msync of bytes " + offset + " to "
                        + (offset + length) + "): " + cause.getMessage() + "; data acknowledged as written may not be"
                        + " on the storage. Linux reports a failed write-back only once and marks the pages clean,"
                        + " so it cannot be retried: every FLUSH, FUA write and write now fails with EIO, reads still"
                        + " work. Fix the storage (see the kernel log), check the data, then restart the server";
                now = true;
            }
            first = writeBackFailure;
        }
        if (now) {
            System.getLogger(PmemRegion.class.getName()).log(System.Logger.Level.ERROR, first);
        }
        return new WriteBackFailedException(first, cause);
    }

    /** Why write-back failed, if it has in this process (then writes, FUA and FLUSH fail); null while it has not. */
    public String writeBackFailure() {
        return writeBackFailure;
    }

    /** True once a write-back has failed: the driver refuses writes, FUA and FLUSH with EIO. */
    public boolean writeBackFailed() {
        return writeBackFailure != null;
    }

    /** Counts a request the driver refused because write-back has failed ({@link #refusedRequests()}). */
    void countRefused() {
        refused.increment();
    }

    /** Requests (FLUSH, FUA and plain writes) answered EIO because write-back has failed, the failing ones included. */
    public long refusedRequests() {
        return refused.sum();
    }

    /** Waits for this thread's earlier non-temporal stores and write-backs to reach persistence (real pmem); no-op elsewhere. */
    public void drain() {
        if (isPmem) {
            persistence.drain();
        }
    }

    /**
     * FLUSH: makes every store completed before this call persistent, whichever thread or connection made it.
     *
     * <p>Real pmem. A drain on this thread would NOT cover other threads' stores: on x86-64 non-temporal stores
     * wait in the write-combining buffers of the core that issued them, and CLWB/CLFLUSHOPT are ordered only
     * by a fence on the issuing logical processor (Intel SDM vol. 2, SFENCE: "serializes all store operations
     * that occurred prior to the SFENCE instruction in the program instruction stream"; pmem_drain(3) waits for
     * "any PM stores" of the calling thread). So the design does not depend on it: every writer drains its own
     * stores before its request completes ({@link PmemRegion#write}, {@link PmemRegion#zero},
     * {@link #deviceWrote}), and a write
     * that has completed is therefore already in the persistence domain (ADR). FLUSH has nothing left to do
     * but its own drain. Cost: one SFENCE per write, which a FUA write paid anyway (measured in the note).
     * Where this argument is not established (not x86-64), is_pmem is refused at open.
     *
     * <p>Page cache. msync writes back every dirty page of the range, whichever thread dirtied it: the pages
     * belong to the kernel, not to a core. Concurrent callers serialise on one lock, so a caller that finds
     * nothing dirty knows any flush that cleared the flag has finished. The flag is cleared before the msync
     * (stores racing with it set it again). A failed msync is final ({@link #writeBackFailure()}): Linux reports
     * a write-back error once and leaves the pages clean, so a second msync would find nothing to write and
     * answer OK for data that never reached the storage. This FLUSH and every later one fail instead.
     */
    public void persistAll() throws IOException {
        if (isPmem) {
            persistence.drain();
            refuseIfFailed();
            return;
        }
        synchronized (flushLock) {
            refuseIfFailed();
            if (!dirty) {
                return;
            }
            dirty = false;
            sync(0, memory.byteSize());
        }
    }

}
