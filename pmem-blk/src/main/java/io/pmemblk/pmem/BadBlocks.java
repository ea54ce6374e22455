package io.pmemblk.pmem;

import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The bad blocks the kernel reports for the persistent memory behind the mapping, as byte ranges of the mapping.
 * A read of one answers EIO instead of consuming the poison (a machine check); a write covering one clears it
 * where the platform lets us, as the Linux pmem driver clears poison on write.
 *
 * <p>Where the kernel reports them (Documentation/driver-api/nvdimm/nvdimm.rst, "badblocks"; PMDK's libpmem2
 * badblocks_ndctl.c reads the same files):
 * <ul>
 *   <li>device DAX ({@code /dev/daxR.N}): the region's {@code badblocks}, 512-byte sectors from the region's start;
 *       the device's data starts at its nd device's {@code resource} (after the info block), so a sector s is at
 *       {@code s*512 - (dax resource - region resource)} of the mapping. Clearing needs the platform's clear-error
 *       command ({@code ndctl clear-errors}), not available here: those ranges keep answering EIO, to writes too
 *       (a store there cannot be read back).</li>
 *   <li>a file on fsdax: the block device's {@code /sys/block/pmemN/badblocks}, sectors from the device's start
 *       (a partition's {@code start} subtracted), mapped to file offsets through the file's extents (FIEMAP).
 *       A write that covers whole filesystem blocks of a bad range punches them
 *       (FALLOC_FL_PUNCH_HOLE|KEEP_SIZE) and allocates them again: the filesystem zeroes fresh blocks on DAX
 *       through the pmem driver, which clears their poison, then the write stores its data.</li>
 * </ul>
 *
 * <p>Lookups are on the hot path and lock-free: {@link #ranges} is replaced whole when a clear shrinks it. A region
 * with none holds no BadBlocks at all (one null check per request).
 */
public final class BadBlocks {
    private static final System.Logger LOG = System.getLogger(BadBlocks.class.getName());
    static final int SECTOR = 512;
    /** Nothing bad (a plain file, or a namespace without errors). */
    public static final BadBlocks NONE = new BadBlocks(new long[0], "no bad blocks", null, 1);

    /** Frees and allocates again [offset, offset+length) of the backing file (whole filesystem blocks). */
    @FunctionalInterface
    interface Clearer {
        void reallocate(long offset, long length) throws IOException;
    }

    /** Sorted, disjoint, non-adjacent [start, end) byte pairs of the mapping. */
    private volatile long[] ranges;
    private final String source;
    private final Clearer clearer;
    private final long clearUnit;

    BadBlocks(long[] ranges, String source, Clearer clearer, long clearUnit) {
        this.ranges = normalize(ranges);
        this.source = source;
        this.clearer = clearer;
        this.clearUnit = clearUnit;
    }

    /** What reported them (a sysfs file), for messages. */
    public String source() {
        return source;
    }

    public boolean isEmpty() {
        return ranges.length == 0;
    }

    /** Whether a write can clear them here (fsdax: punch and reallocate); false on device DAX. */
    public boolean clearable() {
        return clearer != null;
    }

    /** The ranges not yet cleared, as [start, end) pairs. */
    public long[] ranges() {
        return ranges.clone();
    }

    /** Bytes still bad. */
    public long bytes() {
        long[] r = ranges;
        long n = 0;
        for (int i = 0; i < r.length; i += 2) {
            n += r[i + 1] - r[i];
        }
        return n;
    }

    /** Whether [offset, offset+length) touches a bad range. */
    public boolean overlaps(long offset, long length) {
        return overlaps(ranges, offset, offset + length);
    }

    private static boolean overlaps(long[] r, long from, long to) {
        if (r.length == 0 || from >= to) {
            return false;
        }
        // the first range ending after `from`: it overlaps when it starts before `to`
        int lo = 0, hi = r.length / 2;
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (r[2 * mid + 1] <= from) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo < r.length / 2 && r[2 * lo] < to;
    }

    MappingFault fault(String what, long offset, long length) {
        return new MappingFault(what, offset, length, new IOException("it overlaps a bad block reported by " + source
                + (clearer != null ? "; a write covering the bad range whole clears it"
                                   : "; device DAX cannot clear it here: restore the data after `ndctl clear-errors`")));
    }

    /**
     * Before a store into [offset, offset+length): clears the bad ranges it covers whole (in filesystem blocks),
     * then throws a {@link MappingFault} when the range still touches one (device DAX, or a bad block sharing a
     * filesystem block with bytes this write does not cover, which punching would destroy).
     */
    void beforeWrite(long offset, long length) {
        long end = offset + length;
        if (!overlaps(ranges, offset, end)) {
            return;
        }
        if (clearer != null) {
            long from = ceil(offset, clearUnit), to = Math.floorDiv(end, clearUnit) * clearUnit;
            if (from < to) {
                clear(from, to);
            }
        }
        if (overlaps(ranges, offset, end)) {
            throw fault("write", offset, length);
        }
    }

    /** Reallocates the blocks of each bad range within the aligned [from, to) and forgets them. */
    private synchronized void clear(long from, long to) {
        long[] r = ranges;
        for (int i = 0; i < r.length; i += 2) {
            long s = Math.max(from, Math.floorDiv(r[i], clearUnit) * clearUnit);
            long e = Math.min(to, ceil(r[i + 1], clearUnit));
            if (s >= e) {
                continue;
            }
            try {
                clearer.reallocate(s, e - s);
            } catch (IOException | RuntimeException ex) {
                LOG.log(System.Logger.Level.ERROR, "clearing bad range [" + s + ", " + e + ") of " + source + " failed: " + ex
                        + "; it keeps answering EIO");
                continue;
            }
            ranges = subtract(ranges, s, e);
            LOG.log(System.Logger.Level.INFO, "bad range [" + s + ", " + e + ") reported by " + source
                    + " cleared (reallocated) by a write; " + (ranges.length / 2) + " bad ranges left");
        }
    }

    private static long ceil(long v, long unit) {
        return Math.floorDiv(v + unit - 1, unit) * unit;
    }

    static long[] subtract(long[] r, long s, long e) {
        List<Long> out = new ArrayList<>(r.length + 2);
        for (int i = 0; i < r.length; i += 2) {
            long a = r[i], b = r[i + 1];
            if (b <= s || a >= e) {
                out.add(a);
                out.add(b);
                continue;
            }
            if (a < s) {
                out.add(a);
                out.add(s);
            }
            if (b > e) {
                out.add(e);
                out.add(b);
            }
        }
        return out.stream().mapToLong(Long::longValue).toArray();
    }

    /** Sorts and merges [start, end) pairs; drops empty ones. */
    static long[] normalize(long[] pairs) {
        if (pairs.length % 2 != 0) {
            throw new IllegalArgumentException("ranges come in [start, end) pairs, got " + pairs.length + " numbers");
        }
        long[][] rs = new long[pairs.length / 2][];
        for (int i = 0; i < rs.length; i++) {
            rs[i] = new long[]{pairs[2 * i], pairs[2 * i + 1]};
        }
        Arrays.sort(rs, (x, y) -> Long.compare(x[0], y[0]));
        List<Long> out = new ArrayList<>();
        for (long[] x : rs) {
            if (x[1] <= x[0]) {
                continue;
            }
            int n = out.size();
            if (n > 0 && x[0] <= out.get(n - 1)) {
                out.set(n - 1, Math.max(out.get(n - 1), x[1]));
            } else {
                out.add(x[0]);
                out.add(x[1]);
            }
        }
        return out.stream().mapToLong(Long::longValue).toArray();
    }

    /**
     * Parses a sysfs {@code badblocks} file: one "sector count" line per range, in 512-byte sectors (the format of
     * block/badblocks.c badblocks_show). Returns [start, end) byte pairs.
     */
    static long[] parse(String text, String source) throws IOException {
        List<Long> out = new ArrayList<>();
        String[] lines = text.split("\n", -1);
        for (int i = 0; i < lines.length; i++) {
            String line = lines[i].strip();
            if (line.isEmpty()) {
                continue;
            }
            String[] f = line.split("\\s+");
            long sector, count;
            try {
                if (f.length != 2) {
                    throw new NumberFormatException();
                }
                sector = Long.parseLong(f[0]);
                count = Long.parseLong(f[1]);
            } catch (NumberFormatException e) {
                throw new IOException(source + " line " + (i + 1) + ": '" + line + "' is not 'sector count' (two"
                        + " decimal numbers, in 512-byte sectors)");
            }
            if (sector < 0 || count <= 0 || sector > (Long.MAX_VALUE / SECTOR) - count) {
                throw new IOException(source + " line " + (i + 1) + ": '" + line + "': the sector must be >= 0 and the"
                        + " count > 0, within 2^63 bytes");
            }
            out.add(sector * SECTOR);
            out.add((sector + count) * SECTOR);
        }
        return out.stream().mapToLong(Long::longValue).toArray();
    }

    /** Shifts byte ranges by -{@code base} and clips them to [0, size). */
    static long[] rebase(long[] r, long base, long size) {
        List<Long> out = new ArrayList<>();
        for (int i = 0; i < r.length; i += 2) {
            long s = Math.max(0, r[i] - base), e = Math.min(size, r[i + 1] - base);
            if (s < e) {
                out.add(s);
                out.add(e);
            }
        }
        return out.stream().mapToLong(Long::longValue).toArray();
    }

    /** One FIEMAP extent: file bytes [logical, logical+length) at device bytes [physical, physical+length). */
    record Extent(long logical, long physical, long length) {
    }

    /** Device byte ranges → file byte ranges, through the file's extents (those with a known physical place). */
    static long[] toFile(long[] device, List<Extent> extents) {
        List<Long> out = new ArrayList<>();
        for (int i = 0; i < device.length; i += 2) {
            for (Extent x : extents) {
                long s = Math.max(device[i], x.physical()), e = Math.min(device[i + 1], x.physical() + x.length());
                if (s < e) {
                    out.add(x.logical() + (s - x.physical()));
                    out.add(x.logical() + (e - x.physical()));
                }
            }
        }
        return out.stream().mapToLong(Long::longValue).toArray();
    }

    /**
     * The bad blocks behind {@code path}, read from the sysfs tree at {@code sysfs} ({@code /sys}; tests pass a
     * fake tree), for a mapping of {@code size} bytes. {@link #NONE} when the path is not backed by a device that
     * reports bad blocks (tmpfs, a disk without any). A device DAX region whose list cannot be read (it may need
     * root) is logged and treated as none: a poisoned line read then still fails its request only
     * ({@link FaultBarrier}), it is just not known in advance.
     */
    static BadBlocks of(Path path, boolean devDax, Path sysfs, long size) throws IOException {
        return devDax ? ofDevDax(path, sysfs, size) : ofFile(path, sysfs, size);
    }

    private static BadBlocks ofDevDax(Path path, Path sysfs, long size) throws IOException {
        Path dev = sysfs.resolve("bus/dax/devices").resolve(path.getFileName().toString());
        if (!Files.exists(dev)) {
            LOG.log(System.Logger.Level.WARNING, dev + " does not exist: the bad blocks of " + path + " are unknown;"
                    + " a poisoned line read still fails only its request");
            return NONE;
        }
        Path nd = dev.toRealPath().getParent();   // regionR/daxR.N: the data area's start ("resource")
        Path region = nd.getParent();              // regionR: "resource" and "badblocks"
        Path list = region.resolve("badblocks");
        String text;
        try {
            text = Files.readString(list);
        } catch (NoSuchFileException e) {
            LOG.log(System.Logger.Level.WARNING, "no " + list + ": the bad blocks of " + path + " are unknown");
            return NONE;
        } catch (IOException e) {
            LOG.log(System.Logger.Level.WARNING, "cannot read " + list + " (" + e + "; reading it may need root):"
                    + " the bad blocks of " + path + " are unknown; a poisoned line read still fails only its request");
            return NONE;
        }
        long[] inRegion = parse(text, list.toString());
        if (inRegion.length == 0) {
            return NONE;
        }
        long base = hex(nd.resolve("resource")) - hex(region.resolve("resource"));
        return new BadBlocks(rebase(inRegion, base, size), list.toString(), null, 1);
    }

    private static long hex(Path file) throws IOException {
        String s = Files.readString(file).strip();
        try {
            return Long.parseUnsignedLong(s.startsWith("0x") ? s.substring(2) : s, 16);
        } catch (NumberFormatException e) {
            throw new IOException(file + " holds '" + s + "', not a hexadecimal address (0x...)");
        }
    }

    private static BadBlocks ofFile(Path path, Path sysfs, long size) throws IOException {
        long dev = ((Number) Files.getAttribute(path, "unix:dev")).longValue();
        // glibc's gnu_dev_major / gnu_dev_minor
        long major = ((dev >>> 8) & 0xfff) | ((dev >>> 32) & ~0xfffL);
        long minor = (dev & 0xff) | ((dev >>> 12) & ~0xffL);
        Path link = sysfs.resolve("dev/block/" + major + ":" + minor);
        if (!Files.exists(link)) {
            return NONE; // not on a block device (tmpfs, overlay): nothing reports bad blocks
        }
        Path blockDev = link.toRealPath();
        long start = 0;
        Path list = blockDev.resolve("badblocks");
        if (Files.exists(blockDev.resolve("partition"))) {
            start = Long.parseLong(Files.readString(blockDev.resolve("start")).strip()) * SECTOR;
            list = blockDev.getParent().resolve("badblocks");
        }
        if (!Files.isReadable(list)) {
            return NONE;
        }
        long[] onDisk = parse(Files.readString(list), list.toString());
        if (onDisk.length == 0) {
            return NONE;
        }
        long[] inFile = toFile(rebase(onDisk, start, Long.MAX_VALUE), extents(path));
        long unit = Files.getFileStore(path).getBlockSize();
        BadBlocks b = new BadBlocks(rebase(inFile, 0, size), list + " (" + path + ")", (off, len) -> reallocate(path, off, len), unit);
        return b.isEmpty() ? NONE : b;
    }

    /** Punches [offset, offset+length) of the file and allocates it again (see the class comment). */
    private static void reallocate(Path path, long offset, long length) throws NativeException {
        int fd = FileCalls.open(path.toString(), FileCalls.O_RDWR | FileCalls.O_NOFOLLOW | FileCalls.O_CLOEXEC, 0);
        try {
            FileCalls.fallocate(fd, FileCalls.FALLOC_FL_PUNCH_HOLE | FileCalls.FALLOC_FL_KEEP_SIZE, offset, length, path + " (clearing a bad block)");
            FileCalls.fallocate(fd, 0, offset, length, path + " (reallocating a cleared bad block)");
        } finally {
            Libc.close(fd);
        }
    }

    // <linux/fiemap.h>, <linux/fs.h>: FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap), struct fiemap 32 bytes,
    // struct fiemap_extent 56 bytes (fe_logical, fe_physical, fe_length, 2 reserved u64, fe_flags, 3 reserved u32).
    static final long FS_IOC_FIEMAP = 0xC020660BL;
    private static final int FIEMAP_FLAG_SYNC = 0x1;
    private static final int FIEMAP_EXTENT_LAST = 0x1, FIEMAP_EXTENT_UNKNOWN = 0x2;
    private static final int FIEMAP_HEADER = 32, FIEMAP_EXTENT = 56, EXTENTS_PER_CALL = 256;

    /** The file's extents, by FIEMAP (with FIEMAP_FLAG_SYNC: delayed allocations get their place first). */
    static List<Extent> extents(Path path) throws IOException {
        List<Extent> out = new ArrayList<>();
        int fd = FileCalls.open(path.toString(), FileCalls.O_RDONLY | FileCalls.O_NOFOLLOW | FileCalls.O_CLOEXEC, 0);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment m = a.allocate(FIEMAP_HEADER + (long) FIEMAP_EXTENT * EXTENTS_PER_CALL, 8);
            long next = 0;
            while (true) {
                m.fill((byte) 0);
                m.set(ValueLayout.JAVA_LONG, 0, next);                  // fm_start
                m.set(ValueLayout.JAVA_LONG, 8, Long.MAX_VALUE - next); // fm_length (~0 in the kernel's terms)
                m.set(ValueLayout.JAVA_INT, 16, FIEMAP_FLAG_SYNC);      // fm_flags
                m.set(ValueLayout.JAVA_INT, 24, EXTENTS_PER_CALL);      // fm_extent_count
                Libc.ioctl(fd, FS_IOC_FIEMAP, m);
                int mapped = m.get(ValueLayout.JAVA_INT, 20);           // fm_mapped_extents
                boolean last = mapped == 0;
                for (int i = 0; i < mapped; i++) {
                    long e = FIEMAP_HEADER + (long) i * FIEMAP_EXTENT;
                    long logical = m.get(ValueLayout.JAVA_LONG, e), physical = m.get(ValueLayout.JAVA_LONG, e + 8);
                    long length = m.get(ValueLayout.JAVA_LONG, e + 16);
                    int flags = m.get(ValueLayout.JAVA_INT, e + 40);
                    if ((flags & FIEMAP_EXTENT_UNKNOWN) == 0) {
                        out.add(new Extent(logical, physical, length));
                    }
                    next = logical + length;
                    last |= (flags & FIEMAP_EXTENT_LAST) != 0;
                }
                if (last) {
                    return out;
                }
            }
        } finally {
            Libc.close(fd);
        }
    }

    @Override
    public String toString() {
        return ranges.length / 2 + " bad ranges (" + bytes() + " bytes) from " + source;
    }
}
