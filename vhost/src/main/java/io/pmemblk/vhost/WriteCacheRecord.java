package io.pmemblk.vhost;

import io.pmemblk.posix.Errno;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.FileIo;
import io.pmemblk.posix.FileStat;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.TrustedDirectory;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;

/**
 * The guest's write cache mode kept where the next server finds it: a small file beside the vhost-user socket
 * (the socket names the disk QEMU reconnects to), in the socket's directory, already checked and held open as
 * {@code TrustedPath} checks it. The file names the device it is for ({@code pmem.path}): a record of another
 * device is not this disk's and is not applied.
 *
 * <p>Written by {@link TrustedDirectory#replaceDurably} (a new file, mode 0600, fsync'd, renamed over the old one,
 * the directory fsync'd): a crash leaves the old record or the new one, never a torn one. A record that cannot be
 * read or is not exactly what this class writes makes the server start write-through, logged: the guest may have
 * turned its cache off, and write-through is the mode that loses nothing in either case.
 */
public final class WriteCacheRecord {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.vhost");
    static final String SUFFIX = ".write-cache";
    private static final String HEADER = "pmemblk vhost-user-blk write cache v1";
    /** Larger than any record this class writes (a device path is at most PATH_MAX): anything larger is not one. */
    private static final int MAX_BYTES = 4096 + 128;

    private final TrustedDirectory dir;
    private final String name;
    private final String device;

    /**
     * @param dir    the socket's directory, checked and open (not owned: the server closes it after its sessions)
     * @param socket the socket's file name; the record is {@code socket + ".write-cache"} beside it
     * @param device what the record is for (the pmem.path served), written into it and compared when it is read
     */
    public WriteCacheRecord(TrustedDirectory dir, String socket, String device) {
        this.dir = java.util.Objects.requireNonNull(dir, "dir");
        this.name = socket + SUFFIX;
        this.device = java.util.Objects.requireNonNull(device, "device");
        if (device.indexOf('\n') >= 0) {
            throw new IllegalArgumentException("a device name with a line break cannot be recorded: " + device);
        }
    }

    private String text(boolean writeback) {
        return HEADER + "\ndevice=" + device + "\nwce=" + (writeback ? 1 : 0) + "\n";
    }

    /**
     * The recorded mode: true (writeback) when there is no record or it is another device's (a fresh disk starts
     * writeback, as virtio-blk's do); false (write-through) when the record says so or cannot be trusted.
     */
    boolean load() {
        String why;
        try {
            String text = read();
            if (text == null) {
                return true;
            }
            String[] lines = text.split("\n", -1);
            if (lines.length == 4 && lines[0].equals(HEADER) && lines[1].startsWith("device=") && lines[3].isEmpty()
                    && (lines[2].equals("wce=0") || lines[2].equals("wce=1"))) {
                String of = lines[1].substring("device=".length());
                boolean writeback = lines[2].equals("wce=1");
                if (!of.equals(device)) {
                    LOG.log(System.Logger.Level.WARNING, "vhost-user-blk: {0} records the write cache of {1}, not of {2}:"
                            + " this disk starts writeback, as a new one does, and the guest''s next change replaces"
                            + " the record", this, of, device);
                    return true;
                }
                LOG.log(System.Logger.Level.INFO, "vhost-user-blk: the guest''s write cache, as recorded in {0}: {1}",
                        this, writeback ? "writeback" : "write through");
                return writeback;
            }
            why = "it is not a record this version writes (" + text.length() + " bytes)";
        } catch (IOException e) {
            why = e.getMessage();
        }
        LOG.log(System.Logger.Level.WARNING, "vhost-user-blk: cannot use the write cache record {0}: {1}; serving"
                + " write through (every write durable before it completes) until the guest sets its cache again;"
                + " remove the file to start writeback", this, why);
        return false;
    }

    /** The record's text, or null when there is none. */
    private String read() throws IOException {
        int fd;
        try {
            fd = FileCalls.openat(dir.fd(), name, FileCalls.O_RDONLY | FileCalls.O_NOFOLLOW | FileCalls.O_NONBLOCK, 0);
        } catch (NativeException e) {
            if (e.errno() == Errno.ENOENT) {
                return null;
            }
            throw e; // ELOOP: a symbolic link where the record belongs
        }
        try (Arena a = Arena.ofConfined()) {
            FileStat st = FileCalls.fstat(fd);
            if (!st.isRegularFile()) {
                throw new IOException("not a regular file");
            }
            if (st.uid() != 0 && st.uid() != Libc.geteuid()) {
                throw new IOException("owned by uid " + st.uid() + ", neither root nor this user");
            }
            if ((st.mode() & (FileStat.S_IWGRP | FileStat.S_IWOTH)) != 0) {
                throw new IOException("writable by group or others (mode 0" + Integer.toOctalString(st.mode() & 07777) + ")");
            }
            if (st.size() > MAX_BYTES) {
                throw new IOException(st.size() + " bytes; a record is at most " + MAX_BYTES);
            }
            MemorySegment buf = a.allocate(MAX_BYTES + 1);
            long n = FileIo.pread(fd, buf, 0);
            if (n < 0) {
                throw NativeException.of("pread", (int) -n, name);
            }
            return new String(buf.asSlice(0, n).toArray(ValueLayout.JAVA_BYTE), StandardCharsets.UTF_8);
        } finally {
            Libc.close(fd);
        }
    }

    /** Records {@code writeback} durably: the file and its name are on stable storage when this returns. */
    void store(boolean writeback) throws IOException {
        try {
            dir.replaceDurably(name, text(writeback).getBytes(StandardCharsets.UTF_8));
        } catch (IOException e) {
            throw new IOException("cannot record the write cache in " + this + ": " + e.getMessage(), e);
        }
    }

    @Override
    public String toString() {
        return dir.path().resolve(name).toString();
    }
}
