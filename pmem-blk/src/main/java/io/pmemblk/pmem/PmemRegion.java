package io.pmemblk.pmem;

import io.pmemblk.posix.FileStat;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.MappedFiles;
import io.pmemblk.posix.MemoryFaults;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.TrustedFile;
import io.pmemblk.posix.TrustedPath;

import java.io.IOException;
import java.lang.foreign.Arena;
import io.pmemblk.queueing.Request;

import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
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
    /**
     * Set by every store; cleared (under flushLock) by the flush that makes those stores persistent. False means
     * every page of the mapping is durable, including what an earlier process left: {@link #open} syncs the whole
     * mapping before handing the region out (see {@link #syncAtStart}).
     */
    private volatile boolean dirty;
    private final Object flushLock = new Object();
    /**
     * The first write-back failure of this process, or null. Once set it stays: Linux reports a failed write-back
     * once and marks the pages clean, so nothing later can make those bytes durable, and no later FLUSH may say so.
     */
    private volatile String writeBackFailure;
    /** Requests the driver answered EIO because of {@link #writeBackFailure} (counted only on that path). */
    private final java.util.concurrent.atomic.LongAdder refused = new java.util.concurrent.atomic.LongAdder();
    /**
     * The backing file as opened and checked, held until {@link #close()}; with {@code exclusive} it carries the
     * lock on the file, which closing it releases.
     */
    private TrustedFile file;
    /**
     * Whether reads may copy with libc's memcpy: the file lives in memory (tmpfs, hugetlbfs, ramfs), where the one
     * load that can fault is one past a truncation, which the tail probe covers as it does for libpmem's writes.
     * Persistent memory (a poisoned line) and a disk file's page cache (a failed read-in) can fault anywhere, and a
     * fault inside memcpy kills the JVM, so those keep the JDK's fault-checked copy: 10-17% slower on 64 KiB and
     * 2 MiB reads in process (glibc copies long ranges with rep movsb, the JDK with vector loads and stores).
     * Set once in {@link #open}, before the region is handed out.
     */
    private boolean memcpyReads;

    private PmemRegion(Path path, Arena arena, MemorySegment memory, Persistence persistence, String mappedBy) {
        this.path = path;
        this.arena = arena;
        this.memory = memory;
        this.isPmem = persistence.flushesCaches();
        this.persistence = persistence;
        this.mappedBy = mappedBy;
        this.kernelCopyProbe = new FaultBarrier.Probe(memory);
        // Callers hold by thread id or by BTT lane (32 apart a caller): 64 stripes or more keep them on lines of
        // their own, 4 KiB of counters.
        this.hold = new MappingHold(memory, Math.max(64, Runtime.getRuntime().availableProcessors() * 4));
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
        boolean devDaxPath = path.toString().startsWith("/dev/dax"); // never created: a missing node is an error
        if (!devDaxPath && size <= 0) {
            throw new IllegalArgumentException("size must be positive, got " + size);
        }
        // Checked and opened (or created, O_EXCL) in one walk through held directories; from here on only the
        // descriptor is used: to lock, resize, map and sync what was checked, whatever the name leads to by then.
        TrustedFile file = TrustedPath.ofThisProcess().openFile(path, "pmem.path", !devDaxPath);
        PmemRegion r = null;
        boolean ours = !exclusive; // may remove what it created: not when another process locked it first
        try {
            if (exclusive) {
                lock(file);
                ours = true;
            }
            if (file.stat().isCharacterDevice()) {
                if (!DEVICE_DAX.matcher(file.path().toString()).matches()) {
                    throw new IOException(path + " is neither a regular file nor a device-DAX node (/dev/daxX.Y)");
                }
                if (lib.isEmpty()) {
                    throw new IOException("device DAX " + path + " needs libpmem: " + Libpmem.unavailableReason());
                }
            } else if (file.created()) {
                reserve(file, size);
            } else if (file.stat().size() != size) {
                if (!resize) {
                    throw new IOException(path + " holds " + file.stat().size() + " bytes but pmem.size is " + size
                            + "; set pmem.size=" + file.stat().size() + " to use it as it is, or pmem.resize=true to"
                            + " resize it (shrinking discards the data past the new end)");
                }
                resize(file, size);
            }
            r = lib.isPresent() ? mapWithLibpmem(file, lib.get(), wrap) : mapWithJava(file, size, wrap);
            r.file = file;
            r.memcpyReads = !file.stat().isCharacterDevice() && inMemoryFileSystem(file.path());
            if (file.created()) {
                // A crash right after creation must not leave a file without its name or size: whoever maps it
                // after a power cut has to find what we announced. (The directories made on the way were synced
                // into their parents as they were made.)
                r.persistence.syncCreated(file);
            }
            if (exclusive) {
                r.syncAtStart();
            }
            return r;
        } catch (IOException | RuntimeException e) {
            if (r != null) {
                r.arena.close();
            }
            if (file.created() && ours) {
                removeCreated(file, e);
            }
            file.close();
            throw e;
        }
    }

    /** Whether reads copy with memcpy ({@link #memcpyReads}). */
    boolean readsWithMemcpy() {
        return memcpyReads;
    }

    /** Whether {@code path} is on a file system kept in memory only (tmpfs, hugetlbfs, ramfs); false when unknown. */
    static boolean inMemoryFileSystem(Path path) {
        try {
            String type = java.nio.file.Files.getFileStore(path).type();
            return type.equals("tmpfs") || type.equals("hugetlbfs") || type.equals("ramfs");
        } catch (IOException | RuntimeException e) {
            return false; // the fault-checked copy: slower, never wrong
        }
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
    private void syncAtStart() {
        if (path.toString().startsWith("/dev/dax")) {
            return;
        }
        try {
            persistence.sync(memory);
        } catch (IOException e) {
            failWriteBack("at start-up, of what an earlier process left in", 0, memory.byteSize(), e);
        }
    }

    private static final java.util.regex.Pattern DEVICE_DAX = java.util.regex.Pattern.compile("/dev/dax\\d+\\.\\d+");

    /** A file this open created and could not make a device of: gone again, so the next start does not find it empty. */
    private static void removeCreated(TrustedFile file, Exception cause) {
        String name = file.path().getFileName().toString();
        try {
            FileStat now = Libc.fstatat(file.directory().fd(), name, Libc.AT_SYMLINK_NOFOLLOW);
            if (now.dev() == file.stat().dev() && now.ino() == file.stat().ino()) {
                Libc.unlinkat(file.directory().fd(), name, 0);
            }
        } catch (NativeException e) {
            cause.addSuppressed(e);
        }
    }

    /**
     * An exclusive lock on the open file itself (an OFD lock, {@link Libc#lockExclusive}): the mapping libraries
     * open and close their own descriptors of the file, which would silently drop a classic POSIX lock.
     */
    private static void lock(TrustedFile file) throws IOException {
        if (!Libc.lockExclusive(file.fd())) {
            throw new IOException(file.path() + " is in use by another process (it holds the file's lock), or already"
                    + " open in this process; stop that server, or give this one another pmem.path");
        }
    }

    private static void resize(TrustedFile file, long size) throws IOException {
        if (size < file.stat().size()) {
            Libc.ftruncate(file.fd(), size);
        } else {
            reserve(file, size);
        }
    }

    /** Extends the file to size with its blocks allocated (posix_fallocate). */
    private static void reserve(TrustedFile file, long size) throws IOException {
        Libc.fallocate(file.fd(), 0, size, file.path().toString());
    }

    /**
     * libpmem maps by path; given {@code /proc/self/fd/N} it opens the file this process holds, not whatever the
     * name leads to now. Length 0 and no flags: the whole file (sized above) or device-DAX node.
     */
    private static PmemRegion mapWithLibpmem(TrustedFile file, Libpmem lib, UnaryOperator<Persistence> wrap)
            throws IOException {
        Path path = file.path();
        Libpmem.Mapping m = lib.mapFile(file.procPath(), 0, 0, 0);
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
        try {
            registerForDma(seg, file, arena);
        } catch (IOException e) {
            arena.close();
            throw e;
        }
        if (m.isPmem() && !drainCoversOwnStores(System.getProperty("os.arch"))) {
            arena.close();
            throw new IOException(path + " is pmem (is_pmem=1) but pmemblk's flush/drain reasoning is established"
                    + " only for x86-64 (see PmemRegion.persistAll), not for " + System.getProperty("os.arch")
                    + "; use a file that is not pmem (msync path) or run on x86-64");
        }
        return new PmemRegion(path, arena, seg, wrap.apply(new LibpmemPersistence(lib, m.isPmem(), seg)), "libpmem");
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

    /**
     * Records that the mapping shows the file from offset 0 ({@link MappedFiles}), so that a DMA engine in another
     * process (a vfio-user device) can be given the file by descriptor; the registry holds a new open file
     * description, so the file's lock stays this region's alone.
     */
    private static void registerForDma(MemorySegment seg, TrustedFile file, Arena arena) throws IOException {
        MappedFiles.register(seg, file.fd(), 0, arena);
    }

    /** The JDK maps a channel; one opened on {@code /proc/self/fd/N} is the file this process holds. */
    private static PmemRegion mapWithJava(TrustedFile file, long size, UnaryOperator<Persistence> wrap) throws IOException {
        Arena arena = Arena.ofShared();
        try (FileChannel fc = FileChannel.open(Path.of(file.procPath()), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
            MemorySegment seg = fc.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
            registerForDma(seg, file, arena);
            return new PmemRegion(file.path(), arena, seg, wrap.apply(new MappedFilePersistence()), "java");
        } catch (IOException | RuntimeException e) {
            arena.close();
            throw e;
        }
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
     * On real pmem the copy is non-temporal and drained before this returns (see {@link #persistAll()} for why
     * the writer drains, not the FLUSH); elsewhere the pages are dirty until msync.
     */
    public void write(MemorySegment src, long srcOffset, long offset, long length) {
        MemorySegment dst = memory.asSlice(offset, length);
        beforeStore(offset, length);
        try {
            persistence.copy(src.asSlice(srcOffset, length), dst);
        } catch (InternalError e) {
            throw copyFault("write", offset, length, e, src.asSlice(srcOffset, length));
        }
        stored();
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
            stored(); // after a failed piece too: those before it are stores like any other
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
                    Libc.memcpy(dst, src);
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

    /** After this thread's stores: on pmem drain them (they are ours), elsewhere mark the pages for the next FLUSH. */
    private void stored() {
        if (isPmem) {
            persistence.drain();
        } else {
            dirty = true; // after the stores: a FLUSH that finds it set syncs pages that already hold them
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
                Libc.memcpy(dst.asSlice(dstOffset, length), src);
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
                sync(offset, length);
            }
        }
    }

    /**
     * Makes what this thread stored with {@link #write}/{@link #zero} at [offset, offset+length) persistent
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
     * stores before its request completes ({@link #write}, {@link #zero}, {@link #deviceWrote}), and a write
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
            persistAll();
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
