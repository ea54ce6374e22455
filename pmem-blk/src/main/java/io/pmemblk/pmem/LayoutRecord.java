package io.pmemblk.pmem;

import io.pmemblk.posix.TrustedDirectory;
import io.pmemblk.posix.TrustedPath;

import java.io.IOException;
import java.io.InputStream;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;

/**
 * What pmemblk recorded about the layout of one {@code pmem.path}, kept OUTSIDE the device's bytes: a client
 * writes any byte of a raw device (a pool signature at LBA 0 is its data), so no byte of the device may decide
 * whether it is a BTT. Written by {@code pmemblk format} and by {@code serve} when it creates or adopts a BTT;
 * read by {@code serve} (a recorded BTT is never served raw; a BTT is laid out only where a record says pmemblk
 * was formatting) and by {@code info}.
 *
 * <p>Where: a regular file's record is {@code NAME.pmemblk-layout} beside it, reached through the directory the
 * region holds open (checked by {@link TrustedPath} as the image was): it moves and is backed up with the image,
 * and tmpfs holds it as it holds the image. A device-DAX node's record is {@code daxX.Y.pmemblk-layout} in the
 * state directory the caller names (/var/lib/pmemblk as root: the systemd unit's StateDirectory), since /dev is
 * a devtmpfs rebuilt at every boot and not pmemblk's to write. A text file, not an xattr: tmpfs before Linux 6.6
 * has no user xattrs, and {@code cp} and most backup tools drop xattrs silently, where a missing file is seen.
 * See docs/btt.md "Which layout a device has".
 */
public final class LayoutRecord {
    /** Appended to the image's file name (or the DAX node's) to name its record. */
    public static final String SUFFIX = ".pmemblk-layout";
    /** A record is a few lines; a longer file at that name is not one of ours. */
    private static final int MAX_BYTES = 4096;

    /** What the record says pmemblk did to the device. */
    public enum State {
        /** A format began (the device's old bytes were given up by the operator or never existed) and may not have ended. */
        FORMATTING,
        /** A whole BTT was laid out or adopted: pool uuid and size name which one. */
        BTT
    }

    /**
     * One record.
     * @param sectorSize the BTT's sector size
     * @param size       the device's size in bytes when recorded
     * @param pool       the pool header's uuid (null while FORMATTING)
     */
    public record Entry(State state, int sectorSize, long size, UUID pool) {}

    private final Path path;
    /** The directory the record is read in: the image's, through its held descriptor; for DAX the state directory. */
    private final Path reachedIn;
    /** For a regular file's record: the image's directory the region holds open (not owned), written through. */
    private final TrustedDirectory directory;
    /** For a DAX record: the state directory, opened (checked, made if missing) at each write. */
    private final Path stateDirectory;
    private final String name;

    private LayoutRecord(Path path, Path reachedIn, TrustedDirectory directory, Path stateDirectory, String name) {
        this.path = path;
        this.reachedIn = reachedIn;
        this.directory = directory;
        this.stateDirectory = stateDirectory;
        this.name = name;
    }

    /**
     * The record of {@code region}'s device: beside a regular file, or in {@code deviceRecords} for a device-DAX
     * node (null: a DAX node is refused here, naming what is missing).
     */
    public static LayoutRecord of(PmemRegion region, Path deviceRecords) throws IOException {
        var file = region.file();
        String name = file.path().getFileName() + SUFFIX;
        if (file.stat().isCharacterDevice()) {
            if (deviceRecords == null) {
                throw new IOException(region.path() + " is a device-DAX node: its layout record lives in pmemblk's"
                        + " state directory, and none was given");
            }
            Path dir = deviceRecords.toAbsolutePath();
            return new LayoutRecord(dir.resolve(name), dir, null, dir, name);
        }
        return new LayoutRecord(file.path().resolveSibling(name), Path.of(file.directory().procPath()),
                file.directory(), null, name);
    }

    /** Where the record is, as messages name it. */
    public Path path() {
        return path;
    }

    /** The record, or empty when pmemblk recorded nothing for this device. A file there that is no record is an error. */
    public Optional<Entry> read() throws IOException {
        byte[] bytes;
        try (InputStream in = Files.newInputStream(reachedIn.resolve(name), LinkOption.NOFOLLOW_LINKS)) {
            bytes = in.readNBytes(MAX_BYTES + 1);
        } catch (NoSuchFileException e) {
            return Optional.empty();
        }
        try {
            if (bytes.length > MAX_BYTES) {
                throw new IllegalArgumentException("longer than " + MAX_BYTES + " bytes");
            }
            Map<String, String> kv = new LinkedHashMap<>();
            for (String line : new String(bytes, StandardCharsets.UTF_8).split("\n")) {
                int eq = line.indexOf('=');
                if (!line.isBlank() && !line.startsWith("#") && eq > 0) {
                    kv.put(line.substring(0, eq).trim(), line.substring(eq + 1).trim());
                }
            }
            if (!"btt".equals(kv.get("layout"))) {
                throw new IllegalArgumentException("layout is " + kv.get("layout") + ", not btt");
            }
            State state = State.valueOf(require(kv, "state").toUpperCase(Locale.ROOT));
            String pool = kv.get("pool-uuid");
            return Optional.of(new Entry(state, Integer.parseInt(require(kv, "sector-size")),
                    Long.parseLong(require(kv, "size")), pool == null || pool.isEmpty() ? null : UUID.fromString(pool)));
        } catch (IllegalArgumentException e) {
            throw new IOException("the layout record " + path + " cannot be read (" + e.getMessage() + "): it is"
                    + " written by pmemblk only; allowed: the file as pmemblk wrote it, or no file (remove it only"
                    + " if the device holds no BTT pmemblk made)", e);
        }
    }

    private static String require(Map<String, String> kv, String key) {
        String v = kv.get(key);
        if (v == null) {
            throw new IllegalArgumentException("no " + key);
        }
        return v;
    }

    /**
     * Replaces the record with {@code e}, durably, by {@link TrustedDirectory#replaceDurably} (a temporary file
     * synced, renamed over the record, the directory synced): after a crash the old record or the new one is
     * there, never half of one.
     */
    public void write(Entry e) throws IOException {
        StringBuilder text = new StringBuilder()
                .append("# pmemblk's layout record of ").append(path.getFileName().toString(), 0,
                        path.getFileName().toString().length() - SUFFIX.length()).append(" (docs/btt.md).\n")
                .append("# It decides the layout instead of the device's bytes, which a client writes. Remove it only\n")
                .append("# when the device no longer holds this BTT (erased, or replaced by a raw image).\n")
                .append("layout=btt\n")
                .append("state=").append(e.state().name().toLowerCase(Locale.ROOT)).append('\n')
                .append("sector-size=").append(e.sectorSize()).append('\n')
                .append("size=").append(e.size()).append('\n')
                .append("pool-uuid=").append(e.pool() == null ? "" : e.pool().toString()).append('\n');
        TrustedDirectory opened = null;
        try {
            TrustedDirectory dir = directory;
            if (stateDirectory != null) {
                opened = TrustedPath.ofThisProcess().openDirectory(stateDirectory, "the layout records' directory");
                dir = opened;
            }
            dir.replaceDurably(name, text.toString().getBytes(StandardCharsets.UTF_8));
        } catch (IOException x) {
            throw new IOException("writing the layout record " + path + " failed: " + x, x);
        } finally {
            if (opened != null) {
                opened.close();
            }
        }
    }

    /** Removes the record (durably); false when there was none. */
    public boolean remove() throws IOException {
        if (Files.deleteIfExists(reachedIn.resolve(name))) {
            syncDirectory(reachedIn);
            return true;
        }
        return false;
    }

    private static void syncDirectory(Path dir) throws IOException {
        try (FileChannel d = FileChannel.open(dir, StandardOpenOption.READ)) {
            d.force(true);
        }
    }

    @Override
    public String toString() {
        return path.toString();
    }
}
