package io.pmemblk.pmem.bitmap;

import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.posix.Errno;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.TrustedDirectory;
import io.pmemblk.posix.TrustedPath;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;

/**
 * The directory that holds a device's bitmap files, pmemblk's alone: reached and held open through
 * {@link TrustedPath} (as the image's own directory is), every rename, removal and directory sync done by
 * descriptor; each file created and mapped as a {@link PmemRegion} (mode 0600, locked for this process). Knows
 * files, not bitmaps: which name means what is {@link DirtyBitmaps}'.
 */
public final class BitmapDirectory implements AutoCloseable {
    /** Maps a bitmap file as a region: {@link PmemRegion#open} with the device's mapper, locked for this process. */
    @FunctionalInterface
    public interface Regions {
        /** The file {@code path} mapped, created with {@code size} bytes when missing (then {@link PmemRegion#created()}). */
        PmemRegion open(Path path, long size) throws IOException;
    }

    private final TrustedDirectory dir;
    private final Regions regions;

    private BitmapDirectory(TrustedDirectory dir, Regions regions) {
        this.dir = dir;
        this.regions = regions;
    }

    /**
     * Opens (making it, and the directories above it, when missing) {@code path}; {@code setting} names it in
     * refusals. The files are mapped as the device is, with {@code mapper}.
     */
    public static BitmapDirectory open(Path path, String setting, PmemRegion.Mapper mapper) throws IOException {
        return open(path, setting, (file, size) -> PmemRegion.open(file, size, false, mapper, true));
    }

    /** As {@link #open(Path, String, PmemRegion.Mapper)}, the files mapped by {@code regions}. */
    public static BitmapDirectory open(Path path, String setting, Regions regions) throws IOException {
        return new BitmapDirectory(TrustedPath.ofThisProcess().openDirectory(path, setting), regions);
    }

    public Path path() {
        return dir.path();
    }

    /** The directory as held (its descriptor), for a unix socket bound in it. */
    public TrustedDirectory held() {
        return dir;
    }

    /** Names of the entries that end with {@code suffix}, read through the held descriptor. */
    List<String> list(String suffix) throws IOException {
        List<String> names = new ArrayList<>();
        try (Stream<Path> s = Files.list(Path.of(dir.procPath()))) {
            s.map(p -> p.getFileName().toString()).filter(n -> n.endsWith(suffix)).sorted().forEach(names::add);
        }
        return names;
    }

    boolean exists(String name) throws IOException {
        try {
            FileCalls.fstatat(dir.fd(), name, FileCalls.AT_SYMLINK_NOFOLLOW);
            return true;
        } catch (NativeException e) {
            if (e.errno() == Errno.ENOENT) {
                return false;
            }
            throw e;
        }
    }

    /** A new bitmap file {@code name} with {@code header}, durable (its name too) before this returns. */
    BitmapFile create(String name, BitmapHeader header) throws IOException {
        if (exists(name)) {
            throw new IOException(path().resolve(name) + " exists already");
        }
        PmemRegion region = regions.open(path().resolve(name), header.fileBytes());
        try {
            if (!region.created()) { // someone else made it between the check and the open
                throw new IOException(path().resolve(name) + " appeared while it was being created");
            }
            return BitmapFile.create(region, header);
        } catch (IOException | RuntimeException e) {
            region.close();
            throw e;
        }
    }

    /** The bitmap file {@code name}, its header checked; refused naming the file when it is not one of ours. */
    BitmapFile open(String name) throws IOException {
        long size = FileCalls.fstatat(dir.fd(), name, FileCalls.AT_SYMLINK_NOFOLLOW).size();
        if (size <= 0) {
            throw new IOException(path().resolve(name) + " is empty: not a pmemblk bitmap; remove it");
        }
        PmemRegion region = regions.open(path().resolve(name), size);
        try {
            return BitmapFile.open(region, path().resolve(name).toString());
        } catch (RuntimeException e) {
            region.close();
            throw e;
        }
    }

    /** Renames {@code from} to {@code to} (replacing it) in this directory; durable after {@link #sync()}. */
    void rename(String from, String to) throws IOException {
        FileCalls.renameat(dir.fd(), from, dir.fd(), to);
    }

    void remove(String name) throws IOException {
        FileCalls.unlinkat(dir.fd(), name, 0);
    }

    /** fsync of the directory: its renames, creations and removals survive a crash. */
    void sync() throws IOException {
        dir.sync();
    }

    @Override
    public void close() throws IOException {
        dir.close();
    }
}
