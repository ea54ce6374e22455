package io.pmemblk.pmem;

import io.pmemblk.posix.MemoryFaults;
import io.pmemblk.posix.Mman;
import io.pmemblk.posix.TrustedFile;

import java.io.IOException;
import java.lang.foreign.Arena;
import io.pmemblk.queueing.Request;

import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import java.util.function.UnaryOperator;

/**
 * The persistent-memory region: the backing file (or device-DAX node) mapped into this process, opened and mapped
 * by {@link RegionFile} (libpmem's pmem_map_file when libpmem.so.1 loads, else the JDK's FileChannel map). How
 * stores become persistent follows: on real pmem, non-temporal copies (pmem_memcpy) or cache-line write-backs
 * (pmem_flush), drained by the thread that issued them before its request completes; elsewhere msync of the
 * touched pages ({@link WriteBack}). Every one of those steps goes through the {@link Persistence} port, so tests
 * can record them.
 *
 * <p>This object owns the mapping: its shared arena unmaps on {@link #close()}, and every view handed out
 * is a slice that owns nothing. Hot-path methods take offsets and pass slices of the mapping to every native
 * call: out of range is an IndexOutOfBoundsException, after close an IllegalStateException, never a fault.
 * The slices do not reach the heap on the FUA path: 0 bytes per FUA 4k write on every mapper, measured with
 * per-thread allocation counters (numbers in docs/durability.md; bench/jmh RegionCopyBenchmark.fuaWrite with -prof gc).
 *
 * <p>A page that cannot be loaded (the file truncated behind the server, a poisoned line, a known bad block:
 * {@link BadBlocks}) makes the accessor throw a {@link MappingFault} and leaves the rest of the mapping usable:
 * the CPU touches the mapping only through JVM-protected accesses ({@link FaultBarrier}), and native copies
 * (libpmem's; libc's memcpy for reads of a file kept in memory, where only truncation faults) and the kernel's
 * (socket I/O on views) get a range only after a probe of its pages.
 */
public final class PmemRegion implements AutoCloseable {
    /** How to map: {@code auto} (libpmem when it loads), {@code libpmem} (required), {@code java} (never libpmem). */
    public enum Mapper { AUTO, LIBPMEM, JAVA }

    private final Path path;
    private final Arena arena;
    private final MemorySegment memory;
    private final boolean isPmem;
    private final Persistence persistence;
    private final String mappedBy;
    /** Before the kernel copies from or into the mapping: {@link #probe(long, long)}. */
    private final FaultBarrier.Probe kernelCopyProbe;
    /** For runs of native calls on the mapping that take the arena's acquire once a run ({@link #hold()}). */
    private final MappingHold hold;
    /** The dirty flag, the write-back failure, and how stores become durable. */
    private final WriteBack writeBack;
    /**
     * The backing file as opened and checked, held until {@link #close()}; with {@code exclusive} it carries the
     * lock on the file, which closing it releases.
     */
    private final TrustedFile file;
    /**
     * Whether reads may copy with libc's memcpy: the file lives in memory (tmpfs, hugetlbfs, ramfs), where the one
     * load that can fault is one past a truncation, which the tail probe covers as it does for libpmem's writes.
     * Persistent memory (a poisoned line) and a disk file's page cache (a failed read-in) can fault anywhere, and a
     * fault inside memcpy kills the JVM, so those keep the JDK's fault-checked copy: 10-17% slower on 64 KiB and
     * 2 MiB reads in process (glibc copies long ranges with rep movsb, the JDK with vector loads and stores).
     * Decided by {@link RegionFile} before the region is handed out.
     */
    private final boolean memcpyReads;

    /** The region over {@code file}'s mapping {@code memory}, which closing {@code arena} unmaps ({@link RegionFile}). */
    PmemRegion(TrustedFile file, Arena arena, MemorySegment memory, Persistence persistence, String mappedBy,
               boolean memcpyReads) {
        this.path = file.path();
        this.file = file;
        this.memcpyReads = memcpyReads;
        this.arena = arena;
        this.memory = memory;
        this.isPmem = persistence.flushesCaches();
        this.persistence = persistence;
        this.mappedBy = mappedBy;
        this.kernelCopyProbe = new FaultBarrier.Probe(memory);
        // Callers hold by thread id or by BTT lane (32 apart a caller): 64 stripes or more keep them on lines of
        // their own, 4 KiB of counters.
        this.hold = new MappingHold(memory, Math.max(64, Runtime.getRuntime().availableProcessors() * 4));
        this.writeBack = new WriteBack(path, memory, persistence);
    }

    /**
     * Maps {@code path}, creating it with {@code size} bytes (blocks reserved) when it does not exist.
     * An existing file of another size is refused unless {@code resize}. A device-DAX node
     * ({@code /dev/daxX.Y}) is mapped whole through libpmem and its size is the device's.
     */
    public static PmemRegion open(Path path, long size, boolean resize, Mapper mapper) throws IOException {
        return open(path, size, resize, mapper, true);
    }

    /**
     * As {@link #open(Path, long, boolean, Mapper)}; {@code exclusive} takes an exclusive lock on the file for the
     * region's lifetime, so a second server on the same file is refused instead of corrupting it (or truncating
     * it under the first, which would kill that one with SIGBUS).
     */
    public static PmemRegion open(Path path, long size, boolean resize, Mapper mapper, boolean exclusive) throws IOException {
        PmemRegion r = RegionFile.open(path, size, resize, mapper, exclusive, UnaryOperator.identity());
        try {
            r.badBlocks(BadBlocks.of(path, path.toString().startsWith("/dev/dax"), Path.of("/sys"), r.size()));
        } catch (IOException | RuntimeException e) {
            r.close();
            throw new IOException("reading the bad blocks behind " + path + " failed: " + e.getMessage(), e);
        }
        if (r.badBlocks != null) {
            System.getLogger(PmemRegion.class.getName()).log(System.Logger.Level.WARNING, path + " has "
                    + r.badBlocks + ": reads there answer EIO" + (r.badBlocks.clearable()
                            ? " until a write covering them clears them (punched and reallocated)"
                            : ", writes too: device DAX cannot clear them here (`ndctl clear-errors`, then restore the data)"));
        }
        return r;
    }

    /** Whether reads copy with memcpy ({@link #memcpyReads}). */
    boolean readsWithMemcpy() {
        return memcpyReads;
    }

    public Path path() {
        return path;
    }

    /**
     * The descriptor of the file this region mapped, owned by the region (never close it: that would drop its
     * lock) and valid until {@link #close()}: for what must be asked of the very file mapped (fstat, statx),
     * whatever {@link #path()} names by then.
     */
    public int fd() {
        return file.fd();
    }

    public long size() {
        return memory.byteSize();
    }

    /** Whether this open created the file (it held nothing: no client ever wrote it, no layout was recorded for it). */
    public boolean created() {
        return file.created();
    }

    /** The file as opened and checked: its descriptor and held directory ({@link LayoutRecord}, {@link DataScan}). */
    TrustedFile file() {
        return file;
    }

    /** True when stores are made persistent by cache flushes (device DAX, fsdax with MAP_SYNC, or forced). */
    public boolean isPmem() {
        return isPmem;
    }

    /** "libpmem" or "java": which mapper made this mapping. */
    public String mappedBy() {
        return mappedBy;
    }

    /** The persistence port under the mapping, for a layout over it that persists its own steps (the BTT). */
    Persistence persistence() {
        return persistence;
    }

    /**
     * The hold for a run of native calls on the mapping (a BTT group's copies and write-backs): {@link #close()}
     * waits for holds to end, up to a second, before it unmaps, and fails as for a copy still running after that.
     */
    MappingHold hold() {
        return hold;
    }

    /** The whole mapping; for copies by offset and for registration in an IOVA space. Owns nothing. */
    public MemorySegment memory() {
        return memory;
    }

    /**
     * Stores {@code length} bytes from {@code src} at {@code srcOffset} into the region at {@code offset}.
     * On real pmem the copy is non-temporal and drained before this returns (see {@link WriteBack#persistAll()} for
     * why the writer drains, not the FLUSH); elsewhere the pages are dirty until msync.
     */
    public void write(MemorySegment src, long srcOffset, long offset, long length) {
        MemorySegment dst = memory.asSlice(offset, length);
        beforeStore(offset, length);
        try {
            persistence.copy(src.asSlice(srcOffset, length), dst);
        } catch (InternalError e) {
            throw copyFault("write", offset, length, e, src.asSlice(srcOffset, length));
        }
        writeBack.stored();
    }

    /**
     * Stores each piece of {@code r}'s caller memory at its place ({@code r.offset + iovOffset(i)}), as {@link #write}
     * does for one, as one run ({@link Persistence#beginRun}) under one hold of the mapping ({@link MappingHold})
     * with one drain. Per piece, the linker's acquire and release of the mapping, the check's native round trip and
     * the drain each waited for the stores of the pieces before to complete, and a guest's request arrives as a
     * piece per 4 KiB page (a 2 MiB write as hundreds). A fault fails the request as a whole. The caller has
     * checked that the pieces cover its length.
     */
    void writePieces(Request r) {
        int n = r.iovCount();
        if (n == 1) {
            write(r.iovMapping(0), r.iovStart(0), r.offset + r.iovOffset(0), r.iovLength(0));
            return;
        }
        int stripe = (int) Thread.currentThread().threadId();
        MemorySegment view = hold.enter(stripe);
        try {
            boolean run = persistence.beginRun();
            for (int i = 0; i < n; i++) {
                long at = r.offset + r.iovOffset(i), len = r.iovLength(i);
                MemorySegment dst = view.asSlice(at, len);
                beforeStore(at, len);
                MemorySegment src = r.iovMapping(i).asSlice(r.iovStart(i), len);
                if (run) {
                    persistence.copyInRun(src, dst);
                } else {
                    persistence.copy(src, dst);
                }
            }
            if (run) {
                persistence.endRun();
            }
        } catch (InternalError e) {
            throw copyFault("write", r, e);
        } finally {
            hold.exit(stripe);
            writeBack.stored(); // after a failed piece too: those before it are stores like any other
        }
    }

    /**
     * Loads each piece of {@code r}'s caller memory from its place, as {@link #read} does for one, under one hold of
     * the mapping; the JDK's copies (all but long pieces of a file in memory, which take memcpy as in read) share
     * one native round trip at the end. A fault or a known bad block fails the request.
     */
    void readPieces(Request r) {
        int n = r.iovCount();
        if (n == 1) {
            read(r.offset + r.iovOffset(0), r.iovMapping(0), r.iovStart(0), r.iovLength(0));
            return;
        }
        BadBlocks b = badBlocks;
        int stripe = (int) Thread.currentThread().threadId();
        MemorySegment view = hold.enter(stripe);
        try {
            for (int i = 0; i < n; i++) {
                long at = r.offset + r.iovOffset(i), len = r.iovLength(i);
                if (b != null && b.overlaps(at, len)) {
                    throw b.fault("read", at, len);
                }
                MemorySegment src = view.asSlice(at, len), dst = r.iovMapping(i).asSlice(r.iovStart(i), len);
                if (memcpyReads && len >= MEMCPY_READ_MIN && dst.isNative()) {
                    kernelCopyProbe.probe(src);
                    Mman.memcpy(dst, src);
                } else {
                    FaultBarrier.copyInRun(src, dst);
                }
            }
            FaultBarrier.endRun();
        } catch (InternalError e) {
            throw copyFault("read", r, e);
        } finally {
            hold.exit(stripe);
        }
    }

    /**
     * Before a store into [offset, offset+length) made by a layout over the region through the persistence port
     * (the BTT's data blocks): the bad-block check {@link #write} makes (clears what the store covers whole where
     * it can, else a {@link MappingFault}).
     */
    void beforeStore(long offset, long length) {
        BadBlocks b = badBlocks;
        if (b != null) {
            b.beforeWrite(offset, length);
        }
    }

    /**
     * The fault HotSpot reported inside a copy between [offset, offset+length) and {@code caller}: a
     * {@link CallerMemoryFault} when the caller's memory no longer loads (the mapping may well be intact; a
     * truncation takes a file's tail, so its first and last byte answer for it), else the mapping's, as
     * {@link #fault}. Only on the failure path: the probe costs nothing otherwise.
     */
    private static RuntimeException copyFault(String what, long offset, long length, InternalError e, MemorySegment caller) {
        if (!FaultBarrier.isFault(e)) {
            throw e;
        }
        return MemoryFaults.loads(caller) ? new MappingFault(what, offset, length, e)
                : new CallerMemoryFault(what, offset, length, caller, e);
    }

    /** {@link #copyFault(String, long, long, InternalError, MemorySegment)} for the pieces of {@code r}. */
    private static RuntimeException copyFault(String what, Request r, InternalError e) {
        if (!FaultBarrier.isFault(e)) {
            throw e;
        }
        for (int i = 0, n = r.iovCount(); i < n; i++) {
            MemorySegment piece = r.iovMapping(i).asSlice(r.iovStart(i), r.iovLength(i));
            if (!MemoryFaults.loads(piece)) {
                return new CallerMemoryFault(what, r.offset, r.length, piece, e);
            }
        }
        return new MappingFault(what, r.offset, r.length, e);
    }

    /** The fault HotSpot reported inside an access to [offset, offset+length), as a MappingFault; other errors as they are. */
    private static MappingFault fault(String what, long offset, long length, InternalError e) {
        if (!FaultBarrier.isFault(e)) {
            throw e;
        }
        return new MappingFault(what, offset, length, e);
    }

    /**
     * Known bad ranges of the namespace behind this mapping (device DAX, fsdax), null when there are none:
     * then the hot path pays one field load. Set before the region serves, and only ever shrinks.
     */
    private BadBlocks badBlocks;

    /** Installs the bad-block list read at start ({@link BadBlocks#of}); null or empty: none. Before serving. */
    void badBlocks(BadBlocks b) {
        badBlocks = b == null || b.isEmpty() ? null : b;
    }

    /** The known bad ranges still not cleared, for the log and the tests; empty when none. */
    public BadBlocks badBlocks() {
        BadBlocks b = badBlocks;
        return b == null ? BadBlocks.NONE : b;
    }

    /**
     * Throws a {@link MappingFault} unless every page of [offset, offset+length) can be loaded now, bad blocks
     * included: before the kernel copies from or into the range (a socket write out of it, a read into it), which
     * would fail the connection mid-request with EFAULT instead of failing the one request with EIO.
     */
    void probe(long offset, long length) {
        BadBlocks b = badBlocks;
        if (b != null && b.overlaps(offset, length)) {
            throw b.fault("access", offset, length);
        }
        try {
            kernelCopyProbe.probe(memory.asSlice(offset, length));
        } catch (InternalError e) {
            throw fault("access", offset, length, e);
        }
    }

    /**
     * Loads {@code length} bytes at {@code offset} into {@code dst} at {@code dstOffset}. A fault on the mapping
     * (or a known bad block) is a {@link MappingFault}. The JDK's fault-checked copy, or libc's memcpy behind the
     * tail probe where the file lives in memory ({@link #memcpyReads}).
     */
    public void read(long offset, MemorySegment dst, long dstOffset, long length) {
        BadBlocks b = badBlocks;
        if (b != null && b.overlaps(offset, length)) {
            throw b.fault("read", offset, length);
        }
        try {
            if (memcpyReads && length >= MEMCPY_READ_MIN && dst.isNative()) {
                MemorySegment src = memory.asSlice(offset, length);
                kernelCopyProbe.probe(src);
                Mman.memcpy(dst.asSlice(dstOffset, length), src);
                return;
            }
            FaultBarrier.copy(memory, offset, dst, dstOffset, length);
        } catch (InternalError e) {
            throw copyFault("read", offset, length, e, dst.asSlice(dstOffset, length));
        }
    }

    /**
     * From this length on, reads of an in-memory file copy with memcpy. Below it the JDK's copy is as fast or faster
     * (no downcall, no probe): in-process 4 KiB randread QD32 against 5f64efa, which used memcpy from 4 KiB, paired
     * 0.95-0.99 with memcpy and 0.99-1.07 with the JDK's copy; at 64 KiB and 2 MiB memcpy is the faster.
     */
    private static final long MEMCPY_READ_MIN = 64 << 10;

    /** Zeroes a range (TRIM and WRITE_ZEROES); on pmem drained before this returns, as {@link #write}. */
    public void zero(long offset, long length) {
        MemorySegment dst = memory.asSlice(offset, length);
        beforeStore(offset, length);
        try {
            persistence.fill(dst, (byte) 0);
        } catch (InternalError e) {
            throw fault("zero", offset, length, e);
        }
        writeBack.stored();
    }

    /**
     * How the region's stores become durable and whether they still can ({@link WriteBack}): FUA and FLUSH, a
     * range a device stored into, the write-back failure and the requests refused for it. Its owner's, one per
     * region.
     */
    public WriteBack writeBack() {
        return writeBack;
    }

    /**
     * Persists everything and unmaps. Idempotent. Callers should have stopped all I/O first; a request still
     * copying makes this fail with an IOException (and leaves the region open) instead of unmapping under it.
     * After a failed write-back (now or earlier) it unmaps and throws {@link WriteBackFailedException}: the
     * caller must not report the data as persisted.
     */
    @Override
    public void close() throws IOException {
        if (!arena.scope().isAlive()) {
            return;
        }
        try {
            writeBack.persistAll();
        } finally {
            hold.close(TimeUnit.SECONDS.toNanos(1)); // a run holding it past that: kept mapped, as below
            try {
                arena.close();
            } catch (IllegalStateException e) {
                hold.reopen();
                // A native copy still holds the mapping (the linker keeps its arena open for the call): the
                // unmap is refused rather than pulled from under it. The file stays locked, as it is still
                // mapped; close() may be called again once that request has finished.
                throw new IOException(path + " was not unmapped: a copy into it is still running (" + e.getMessage()
                        + "); close again after the in-flight requests have finished", e);
            }
            file.close();
        }
    }

    @Override
    public String toString() {
        return "PmemRegion[" + path + ", " + size() + " bytes, is_pmem=" + isPmem + ", mapped by " + mappedBy
                + (memcpyReads ? ", reads by memcpy" : ", reads by checked copy") + "]";
    }
}
