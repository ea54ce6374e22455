package io.pmemblk.pmem;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;

import java.io.IOException;
import java.lang.foreign.Arena;
import io.pmemblk.block.Request;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.function.UnaryOperator;

/**
 * The persistent-memory region: the backing file (or device-DAX node) mapped into this process.
 *
 * <p>Two ways to map, chosen once: libpmem's pmem_map_file when libpmem.so.1 loads (it reports
 * {@code is_pmem}: true on device DAX and on fsdax with MAP_SYNC), otherwise the JDK's
 * {@link FileChannel#map(FileChannel.MapMode, long, long, Arena)}. How stores become persistent follows:
 * on real pmem, non-temporal copies (pmem_memcpy) or cache-line write-backs (pmem_flush), drained by the
 * thread that issued them before its request completes; elsewhere msync of the touched pages. Every one of
 * those steps goes through the {@link Persistence} port, so tests can record them.
 *
 * <p>This object owns the mapping: its shared arena unmaps on {@link #close()}, and every view handed out
 * is a slice that owns nothing. Hot-path methods take offsets and pass slices of the mapping to every native
 * call: out of range is an IndexOutOfBoundsException, after close an IllegalStateException, never a fault.
 * The slices do not reach the heap on the FUA path: 0 bytes per FUA 4k write on every mapper, measured with
 * per-thread allocation counters (pmem/measure/FuaAlloc.java, numbers in pmem/DURABILITY.md).
 *
 * <p>A page that cannot be loaded (the file truncated behind the server, a poisoned line, a known bad block:
 * {@link BadBlocks}) makes the accessor throw a {@link MappingFault} and leaves the rest of the mapping usable:
 * the CPU touches the mapping only through JVM-protected accesses ({@link FaultBarrier}), and native copies
 * (libpmem's) and the kernel's (socket I/O on views) get a range only after a probe of its pages.
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
    /** Set by every store; cleared (under flushLock) by the flush that makes those stores persistent. */
    private volatile boolean dirty;
    private final Object flushLock = new Object();
    /** Holds an exclusive lock on the backing file while a server uses it (null when opened to inspect). */
    private FileChannel lock;

    private PmemRegion(Path path, Arena arena, MemorySegment memory, Persistence persistence, String mappedBy) {
        this.path = path;
        this.arena = arena;
        this.memory = memory;
        this.isPmem = persistence.flushesCaches();
        this.persistence = persistence;
        this.mappedBy = mappedBy;
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
        PmemRegion r = open(path, size, resize, mapper, exclusive, UnaryOperator.identity());
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

    /** As {@link #open(Path, long, boolean, Mapper, boolean)}, with the real persistence port wrapped (tests record or fail it). */
    static PmemRegion open(Path path, long size, boolean resize, Mapper mapper, boolean exclusive,
                           UnaryOperator<Persistence> wrap) throws IOException {
        Optional<Libpmem> lib = mapper == Mapper.JAVA ? Optional.empty() : Libpmem.load();
        if (mapper == Mapper.LIBPMEM && lib.isEmpty()) {
            throw new IOException("pmem.mapper=libpmem but " + Libpmem.unavailableReason());
        }
        boolean devDax = path.toString().startsWith("/dev/dax");
        if (devDax) {
            if (lib.isEmpty()) {
                throw new IOException("device DAX " + path + " needs libpmem: " + Libpmem.unavailableReason());
            }
            FileChannel lock = exclusive ? lock(path) : null;
            return withLock(lock, () -> mapWithLibpmem(path, lib.get(), 0, 0, wrap));
        }
        if (size <= 0) {
            throw new IllegalArgumentException("size must be positive, got " + size);
        }
        boolean exists = Files.exists(path);
        List<Path> createdDirs = new ArrayList<>();
        FileChannel lock = null;
        if (exists) {
            if (!Files.isRegularFile(path)) {
                throw new IOException(path + " is neither a regular file nor a device-DAX node (/dev/daxX.Y)");
            }
            lock = exclusive ? lock(path) : null;
            long actual = Files.size(path);
            if (actual != size) {
                if (!resize) {
                    unlock(lock);
                    throw new IOException(path + " holds " + actual + " bytes but pmem.size is " + size
                            + "; set pmem.size=" + actual + " to use it as it is, or pmem.resize=true to resize it"
                            + " (shrinking discards the data past the new end)");
                }
                try {
                    resize(path, size);
                } catch (IOException | RuntimeException e) {
                    unlock(lock);
                    throw e;
                }
            }
        } else {
            Path parent = path.toAbsolutePath().getParent();
            for (Path d = parent; d != null && !Files.exists(d); d = d.getParent()) {
                createdDirs.add(d);
            }
            if (parent != null) {
                Files.createDirectories(parent);
            }
        }
        PmemRegion r = withLock(lock, () -> lib.isPresent()
                ? mapWithLibpmem(path, lib.get(), exists ? 0 : size, exists ? 0 : Libpmem.PMEM_FILE_CREATE | Libpmem.PMEM_FILE_EXCL, wrap)
                : mapWithJava(path, size, exists, wrap));
        if (!exists) {
            // A crash right after creation must not leave a file without its name or size: whoever maps it
            // after a power cut has to find what we announced.
            try {
                r.persistence.syncCreated(path);
                for (Path d : createdDirs) { // deepest first: each one's entry lives in its parent
                    r.persistence.syncCreated(d);
                }
            } catch (IOException | RuntimeException e) {
                r.arena.close();
                unlock(r.lock);
                throw e;
            }
        }
        if (exclusive && r.lock == null) {
            // created just now (creation itself is exclusive: O_EXCL); lock it before anyone can use it
            try {
                r.lock = lock(path);
            } catch (IOException e) {
                r.arena.close();
                throw e;
            }
        }
        return r;
    }

    private interface Mapping {
        PmemRegion map() throws IOException;
    }

    private static PmemRegion withLock(FileChannel lock, Mapping m) throws IOException {
        try {
            PmemRegion r = m.map();
            r.lock = lock;
            return r;
        } catch (IOException | RuntimeException e) {
            unlock(lock);
            throw e;
        }
    }

    private static FileChannel lock(Path path) throws IOException {
        // No final symlink is followed anywhere here (O_NOFOLLOW): the caller checked the file itself.
        FileChannel ch = FileChannel.open(path, StandardOpenOption.READ, StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS);
        try {
            if (ch.tryLock() == null) {
                throw new IOException(path + " is in use by another process (it holds the file's lock);"
                        + " stop that server, or give this one another pmem.path");
            }
        } catch (java.nio.channels.OverlappingFileLockException e) {
            ch.close();
            throw new IOException(path + " is already open in this process");
        } catch (IOException | RuntimeException e) {
            ch.close();
            throw e;
        }
        return ch;
    }

    private static void unlock(FileChannel lock) throws IOException {
        if (lock != null) {
            lock.close();
        }
    }

    private static void resize(Path path, long size) throws IOException {
        try (FileChannel fc = FileChannel.open(path, StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS)) {
            long old = fc.size();
            if (size < old) {
                fc.truncate(size);
            }
        }
        if (size > Files.size(path)) {
            reserve(path, size);
        }
    }

    /** Extends the file to size with its blocks allocated (posix_fallocate). */
    private static void reserve(Path path, long size) throws IOException {
        int fd = Libc.open(path.toString(), Libc.O_RDWR | Libc.O_CREAT | Libc.O_NOFOLLOW, 0600);
        try {
            Libc.fallocate(fd, 0, size, path.toString());
        } finally {
            Libc.close(fd);
        }
    }

    private static PmemRegion mapWithLibpmem(Path path, Libpmem lib, long size, int flags, UnaryOperator<Persistence> wrap)
            throws IOException {
        Libpmem.Mapping m;
        try {
            m = lib.mapFile(path.toString(), size, flags, 0600);
        } catch (NativeException e) {
            if (!Files.exists(path.toAbsolutePath().getParent())) {
                throw new NoSuchFileException(path.toString(), null, "directory does not exist");
            }
            throw e;
        }
        Arena arena = Arena.ofShared();
        long len = m.segment().byteSize();
        // The arena's cleanup unmaps: once closed, any access through a view fails cleanly instead of faulting.
        MemorySegment seg = m.segment().reinterpret(len, arena, s -> {
            try {
                lib.unmap(s.reinterpret(len));
            } catch (NativeException e) {
                System.getLogger(PmemRegion.class.getName()).log(System.Logger.Level.WARNING, e.getMessage());
            }
        });
        if (m.isPmem() && !drainCoversOwnStores(System.getProperty("os.arch"))) {
            arena.close();
            throw new IOException(path + " is pmem (is_pmem=1) but pmemblk's flush/drain reasoning is established"
                    + " only for x86-64 (see PmemRegion.persistAll), not for " + System.getProperty("os.arch")
                    + "; use a file that is not pmem (msync path) or run on x86-64");
        }
        return new PmemRegion(path, arena, seg, wrap.apply(new LibpmemPersistence(lib, m.isPmem())), "libpmem");
    }

    /**
     * Whether this design's persistence argument holds on {@code osArch}: each writer drains its own
     * non-temporal stores and cache-line write-backs (x86-64: SFENCE orders the CLWB/CLFLUSHOPT and MOVNT of the
     * issuing logical processor, Intel SDM vol. 2 "SFENCE"; CLWB writes back a line from any cache of the
     * coherence domain, SDM "CLWB"). Not checked for other architectures, so refused there.
     */
    static boolean drainCoversOwnStores(String osArch) {
        return "amd64".equals(osArch) || "x86_64".equals(osArch);
    }

    private static PmemRegion mapWithJava(Path path, long size, boolean exists, UnaryOperator<Persistence> wrap) throws IOException {
        if (!exists) {
            reserve(path, size);
        }
        Arena arena = Arena.ofShared();
        try (FileChannel fc = FileChannel.open(path, StandardOpenOption.READ, StandardOpenOption.WRITE,
                LinkOption.NOFOLLOW_LINKS)) {
            MemorySegment seg = fc.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
            return new PmemRegion(path, arena, seg, wrap.apply(new MappedFilePersistence()), "java");
        } catch (IOException | RuntimeException e) {
            arena.close();
            throw e;
        }
    }

    public Path path() {
        return path;
    }

    public long size() {
        return memory.byteSize();
    }

    /** True when stores are made persistent by cache flushes (device DAX, fsdax with MAP_SYNC, or forced). */
    public boolean isPmem() {
        return isPmem;
    }

    /** "libpmem" or "java": which mapper made this mapping. */
    public String mappedBy() {
        return mappedBy;
    }

    /** The whole mapping; for copies by offset and for registration in an IOVA space. Owns nothing. */
    public MemorySegment memory() {
        return memory;
    }

    /**
     * Stores {@code length} bytes from {@code src} at {@code srcOffset} into the region at {@code offset}.
     * On real pmem the copy is non-temporal and drained before this returns (see {@link #persistAll()} for why
     * the writer drains, not the FLUSH); elsewhere the pages are dirty until msync.
     */
    public void write(MemorySegment src, long srcOffset, long offset, long length) {
        MemorySegment dst = memory.asSlice(offset, length);
        BadBlocks b = badBlocks;
        if (b != null) {
            b.beforeWrite(offset, length);
        }
        try {
            persistence.copy(src.asSlice(srcOffset, length), dst);
        } catch (InternalError e) {
            throw fault("write", offset, length, e);
        }
        stored();
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
            FaultBarrier.probe(memory.asSlice(offset, length));
        } catch (InternalError e) {
            throw fault("access", offset, length, e);
        }
    }

    /** After this thread's stores: on pmem drain them (they are ours), elsewhere mark the pages for the next FLUSH. */
    private void stored() {
        if (isPmem) {
            persistence.drain();
        } else {
            dirty = true; // after the stores: a FLUSH that finds it set syncs pages that already hold them
        }
    }

    /** NIO views of the mapping are made per 1 GiB window (a ByteBuffer holds at most 2 GiB); tests shrink it. */
    private int windowShift = 30;

    void windowShiftForTests(int shift) {
        windowShift = shift;
    }

    /**
     * Points {@code r}'s data at [offset, offset+length) of the mapping ({@link Request#dataFromDevice}), for a
     * frontend that sends it itself. {@code windows} is the caller's per-request cache of NIO views, one per
     * window, made on first use ({@link #newWindowCache()}): in steady state nothing is allocated.
     */
    void views(Request r, ByteBuffer[] windows, long offset, int length) {
        int w = (int) (offset >>> windowShift);
        long inWindow = offset - ((long) w << windowShift);
        ByteBuffer a = window(windows, w);
        int first = (int) Math.min(length, a.capacity() - inWindow);
        a.limit((int) inWindow + first).position((int) inWindow);
        ByteBuffer b = null;
        if (first < length) { // crosses into the next window (at most one: requests are far below a window)
            b = window(windows, w + 1);
            b.limit(length - first).position(0);
        }
        r.dataFromDevice(a, b);
    }

    /** An empty per-request cache of window views for {@link #views}. */
    ByteBuffer[] newWindowCache() {
        return new ByteBuffer[(int) ((memory.byteSize() + (1L << windowShift) - 1) >>> windowShift)];
    }

    private ByteBuffer window(ByteBuffer[] windows, int w) {
        ByteBuffer b = windows[w];
        if (b == null) {
            long start = (long) w << windowShift;
            b = memory.asSlice(start, Math.min(1L << windowShift, memory.byteSize() - start)).asByteBuffer();
            windows[w] = b;
        }
        return b;
    }

    /**
     * Loads {@code length} bytes at {@code offset} into {@code dst} at {@code dstOffset}. A fault on the mapping
     * (or a known bad block) is a {@link MappingFault}. Always MemorySegment.copy, never libc's memcpy (faster on
     * long copies, but a fault inside it kills the JVM).
     */
    public void read(long offset, MemorySegment dst, long dstOffset, long length) {
        BadBlocks b = badBlocks;
        if (b != null && b.overlaps(offset, length)) {
            throw b.fault("read", offset, length);
        }
        try {
            FaultBarrier.copy(memory, offset, dst, dstOffset, length);
        } catch (InternalError e) {
            throw fault("read", offset, length, e);
        }
    }

    /** Zeroes a range (TRIM and WRITE_ZEROES); on pmem drained before this returns, as {@link #write}. */
    public void zero(long offset, long length) {
        MemorySegment dst = memory.asSlice(offset, length);
        BadBlocks b = badBlocks;
        if (b != null) {
            b.beforeWrite(offset, length);
        }
        try {
            persistence.fill(dst, (byte) 0);
        } catch (InternalError e) {
            throw fault("zero", offset, length, e);
        }
        stored();
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
                persistence.sync(range);
            }
        }
    }

    /**
     * Makes what this thread stored with {@link #write}/{@link #zero} at [offset, offset+length) persistent
     * (FUA). On real pmem those already drained; elsewhere msync of the range.
     */
    public void persistWritten(long offset, long length) throws IOException {
        if (!isPmem) {
            persistence.sync(memory.asSlice(offset, length));
        }
    }

    /**
     * Makes a range persistent whoever wrote it, a DMA engine included: cache-line write-backs and a drain on
     * real pmem (with DDIO a device's writes can sit in the CPU cache), msync otherwise.
     */
    public void persistRange(long offset, long length) throws IOException {
        MemorySegment range = memory.asSlice(offset, length);
        if (isPmem) {
            persistence.writeBack(range);
            persistence.drain();
        } else {
            persistence.sync(range);
        }
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
     * stores before its request completes ({@link #write}, {@link #zero}, {@link #deviceWrote}), and a write
     * that has completed is therefore already in the persistence domain (ADR). FLUSH has nothing left to do
     * but its own drain. Cost: one SFENCE per write, which a FUA write paid anyway (measured in the note).
     * Where this argument is not established (not x86-64), is_pmem is refused at open.
     *
     * <p>Page cache. msync writes back every dirty page of the range, whichever thread dirtied it: the pages
     * belong to the kernel, not to a core. Concurrent callers serialise on one lock, so a caller that finds
     * nothing dirty knows any flush that cleared the flag has finished. The flag is cleared before the msync
     * (stores racing with it set it again) and set again when the msync fails, so the next FLUSH retries and
     * fails again until the kernel accepts. (Linux may mark pages clean after a failed write-back and report
     * the error once per file; the retry then cannot know — a kernel limit, not ours to hide.)
     */
    public void persistAll() throws IOException {
        if (isPmem) {
            persistence.drain();
            return;
        }
        synchronized (flushLock) {
            if (!dirty) {
                return;
            }
            dirty = false;
            try {
                persistence.sync(memory);
            } catch (IOException | RuntimeException e) {
                dirty = true;
                throw e;
            }
        }
    }

    /**
     * Persists everything and unmaps. Idempotent. Callers should have stopped all I/O first; a request still
     * copying makes this fail with an IOException (and leaves the region open) instead of unmapping under it.
     */
    @Override
    public void close() throws IOException {
        if (!arena.scope().isAlive()) {
            return;
        }
        try {
            persistAll();
        } finally {
            try {
                arena.close();
            } catch (IllegalStateException e) {
                // A native copy still holds the mapping (the linker keeps its arena open for the call): the
                // unmap is refused rather than pulled from under it. The file stays locked, as it is still
                // mapped; close() may be called again once that request has finished.
                throw new IOException(path + " was not unmapped: a copy into it is still running (" + e.getMessage()
                        + "); close again after the in-flight requests have finished", e);
            }
            unlock(lock);
        }
    }

    @Override
    public String toString() {
        return "PmemRegion[" + path + ", " + size() + " bytes, is_pmem=" + isPmem + ", mapped by " + mappedBy + "]";
    }
}
