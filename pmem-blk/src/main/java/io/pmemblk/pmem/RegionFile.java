package io.pmemblk.pmem;

import io.pmemblk.posix.FileStat;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.MappedFiles;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.TrustedFile;
import io.pmemblk.posix.TrustedPath;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Optional;
import java.util.function.UnaryOperator;
import java.util.regex.Pattern;

/**
 * The backing file's life before it is a {@link PmemRegion}: opened and checked through held directories, locked,
 * created or resized, and mapped, by libpmem's pmem_map_file when libpmem.so.1 loads (it reports {@code is_pmem}:
 * true on device DAX and on fsdax with MAP_SYNC), otherwise by the JDK's
 * {@link FileChannel#map(FileChannel.MapMode, long, long, Arena)}. A failed open leaves nothing behind: the
 * mapping is gone, and a file this open created is removed.
 */
final class RegionFile {
    private RegionFile() {
    }

    /** A mapping made, not yet a region's: the arena that unmaps it, and the persistence port under it. */
    private record Mapped(Arena arena, MemorySegment memory, Persistence persistence, String mappedBy) {}

    /**
     * As {@link PmemRegion#open(Path, long, boolean, PmemRegion.Mapper, boolean)} without the bad blocks, with the real
     * persistence port wrapped (tests record or fail it).
     */
    static PmemRegion open(Path path, long size, boolean resize, PmemRegion.Mapper mapper, boolean exclusive,
                           UnaryOperator<Persistence> wrap) throws IOException {
        Optional<Libpmem> lib = mapper == PmemRegion.Mapper.JAVA ? Optional.empty() : Libpmem.load();
        if (mapper == PmemRegion.Mapper.LIBPMEM && lib.isEmpty()) {
            throw new IOException("pmem.mapper=libpmem but " + Libpmem.unavailableReason());
        }
        boolean devDaxPath = path.toString().startsWith("/dev/dax"); // never created: a missing node is an error
        if (!devDaxPath && size <= 0) {
            throw new IllegalArgumentException("size must be positive, got " + size);
        }
        // Checked and opened (or created, O_EXCL) in one walk through held directories; from here on only the
        // descriptor is used: to lock, resize, map and sync what was checked, whatever the name leads to by then.
        TrustedFile file = TrustedPath.ofThisProcess().openFile(path, "pmem.path", !devDaxPath);
        Mapped m = null;
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
            m = lib.isPresent() ? mapWithLibpmem(file, lib.get(), wrap) : mapWithJava(file, size, wrap);
            PmemRegion r = new PmemRegion(file, m.arena(), m.memory(), m.persistence(), m.mappedBy(),
                    !file.stat().isCharacterDevice() && inMemoryFileSystem(file.path()));
            if (file.created()) {
                // A crash right after creation must not leave a file without its name or size: whoever maps it
                // after a power cut has to find what we announced. (The directories made on the way were synced
                // into their parents as they were made.)
                m.persistence().syncCreated(file);
            }
            if (exclusive) {
                r.writeBack().syncAtStart();
            }
            return r;
        } catch (IOException | RuntimeException e) {
            if (m != null) {
                m.arena().close();
            }
            if (file.created() && ours) {
                removeCreated(file, e);
            }
            file.close();
            throw e;
        }
    }

    /** Whether {@code path} is on a file system kept in memory only (tmpfs, hugetlbfs, ramfs); false when unknown. */
    static boolean inMemoryFileSystem(Path path) {
        try {
            String type = Files.getFileStore(path).type();
            return type.equals("tmpfs") || type.equals("hugetlbfs") || type.equals("ramfs");
        } catch (IOException | RuntimeException e) {
            return false; // the fault-checked copy: slower, never wrong
        }
    }

    private static final Pattern DEVICE_DAX = Pattern.compile("/dev/dax\\d+\\.\\d+");

    /** A file this open created and could not make a device of: gone again, so the next start does not find it empty. */
    private static void removeCreated(TrustedFile file, Exception cause) {
        String name = file.path().getFileName().toString();
        try {
            FileStat now = FileCalls.fstatat(file.directory().fd(), name, FileCalls.AT_SYMLINK_NOFOLLOW);
            if (now.dev() == file.stat().dev() && now.ino() == file.stat().ino()) {
                FileCalls.unlinkat(file.directory().fd(), name, 0);
            }
        } catch (NativeException e) {
            cause.addSuppressed(e);
        }
    }

    /**
     * An exclusive lock on the open file itself (an OFD lock, {@link FileCalls#lockExclusive}): the mapping libraries
     * open and close their own descriptors of the file, which would silently drop a classic POSIX lock.
     */
    private static void lock(TrustedFile file) throws IOException {
        if (!FileCalls.lockExclusive(file.fd())) {
            throw new IOException(file.path() + " is in use by another process (it holds the file's lock), or already"
                    + " open in this process; stop that server, or give this one another pmem.path");
        }
    }

    private static void resize(TrustedFile file, long size) throws IOException {
        if (size < file.stat().size()) {
            FileCalls.ftruncate(file.fd(), size);
        } else {
            reserve(file, size);
        }
    }

    /** Extends the file to size with its blocks allocated (posix_fallocate). */
    private static void reserve(TrustedFile file, long size) throws IOException {
        FileCalls.fallocate(file.fd(), 0, size, file.path().toString());
    }

    /**
     * libpmem maps by path; given {@code /proc/self/fd/N} it opens the file this process holds, not whatever the
     * name leads to now. Length 0 and no flags: the whole file (sized above) or device-DAX node.
     */
    // reinterpret is restricted: safe here, as both keep the length libpmem mapped, and the arena's cleanup is the
    // only unmap.
    @SuppressWarnings("restricted")
    private static Mapped mapWithLibpmem(TrustedFile file, Libpmem lib, UnaryOperator<Persistence> wrap)
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
                    + " only for x86-64 (see WriteBack.persistAll), not for " + System.getProperty("os.arch")
                    + "; use a file that is not pmem (msync path) or run on x86-64");
        }
        return new Mapped(arena, seg, wrap.apply(new LibpmemPersistence(lib, m.isPmem(), seg)), "libpmem");
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
    private static Mapped mapWithJava(TrustedFile file, long size, UnaryOperator<Persistence> wrap) throws IOException {
        Arena arena = Arena.ofShared();
        try (FileChannel fc = FileChannel.open(Path.of(file.procPath()), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
            MemorySegment seg = fc.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
            registerForDma(seg, file, arena);
            return new Mapped(arena, seg, wrap.apply(new MappedFilePersistence()), "java");
        } catch (IOException | RuntimeException e) {
            arena.close();
            throw e;
        }
    }

}
