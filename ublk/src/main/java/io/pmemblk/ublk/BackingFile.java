package io.pmemblk.ublk;

import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.FileStat;
import io.pmemblk.posix.NativeException;

import java.io.IOException;
import java.nio.file.Path;

/**
 * The file a ublk device serves, as the device records it. Recovery hands a quiesced device (and the filesystem
 * mounted on it) to whichever server comes with its id; one pointed at another file would resume it on the
 * wrong data. So the device carries its file's {@link #identity()} in {@code ublksrv_flags} of its device info,
 * the field the driver keeps for the server and never reads, from ADD_DEV until DEL_DEV, across the server's
 * death; a server resumes the device only when its own file has the same identity.
 *
 * <p>The identity is made of what names the file while it exists, and changes when it is replaced: the inode
 * number and the filesystem's device (st_ino, st_dev; st_rdev for a device-DAX node) and the inode's birth time
 * (statx), which a file deleted and created again gets anew even where the filesystem gives it the same inode
 * number (ext4 does). Taken from the descriptor that was mapped (fstat and statx of it), never by the name: a
 * file renamed or replaced at the path after the server opened it would otherwise be recorded as the one served,
 * and a later recovery would resume the device on it. Nothing is opened: closing any other descriptor of the
 * backing file would drop the server's POSIX lock on it.
 *
 * @param path       as configured, for messages
 * @param birthNanos the inode's birth time, -1 where the filesystem records none
 */
public record BackingFile(String path, long dev, long ino, long rdev, long birthNanos) {
    /** Top byte of every identity: "pmemblk backing-file identity, version 1"; other values are not ours. */
    static final long MAGIC = 0xB1L;

    /**
     * The file open as {@code fd}: the descriptor the server mapped (it stays open while the device is served), so
     * the identity is that of the bytes served, whatever {@code path} names now.
     * @param path as configured, for messages only
     */
    public static BackingFile of(int fd, Path path) throws IOException {
        try {
            FileStat st = FileCalls.fstat(fd);
            return new BackingFile(path.toString(), st.dev(), st.ino(), st.rdev(), FileCalls.birthTime(fd));
        } catch (NativeException e) {
            throw new IOException("cannot identify the backing file " + path + " (fd " + fd + ") for ublk recovery: "
                    + e.getMessage(), e);
        }
    }

    /**
     * 64 bits: {@link #MAGIC} (8), the low 32 bits of the inode number in clear (so that a refusal can say which
     * file the device served), and 24 bits of a hash over all of dev, ino, rdev and the birth time. Never 0.
     */
    public long identity() {
        long h = mix(dev);
        h = mix(h ^ ino);
        h = mix(h ^ rdev);
        h = mix(h ^ birthNanos);
        return MAGIC << 56 | (ino & 0xFFFF_FFFFL) << 24 | (h & 0xFF_FFFFL);
    }

    /** The inode number (low 32 bits) an identity names, or -1 when the value is not one of ours. */
    static long inodeOf(long identity) {
        return identity >>> 56 == MAGIC ? identity >>> 24 & 0xFFFF_FFFFL : -1;
    }

    /** st_dev as ls and /proc/self/mountinfo show it (glibc's major/minor split). */
    String deviceName() {
        long major = (dev >>> 32 & 0xFFFF_F000L) | (dev >>> 8 & 0xFFFL);
        long minor = (dev >>> 12 & 0xFFFF_FF00L) | (dev & 0xFFL);
        return major + ":" + minor;
    }

    /** A 64-bit finaliser (SplitMix64's): every input bit moves about half the output bits. */
    private static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58_476D_1CE4_E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D0_49BB_1331_11EBL;
        return z ^ (z >>> 31);
    }
}
