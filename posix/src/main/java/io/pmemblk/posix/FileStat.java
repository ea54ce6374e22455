package io.pmemblk.posix;

import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;

import static java.lang.foreign.MemoryLayout.PathElement.groupElement;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * What {@code stat(2)}, {@code lstat(2)} and {@code fstat(2)} say about a file: the fields ownership and type
 * checks need. Read from {@code struct stat} as glibc lays it out on x86-64 ({@link #LAYOUT}).
 *
 * @param mode  st_mode: file type bits ({@link #S_IFMT}) and permission bits
 * @param uid   st_uid, the owner
 * @param gid   st_gid
 * @param dev   st_dev, the device holding the file
 * @param ino   st_ino
 * @param rdev  st_rdev, the device a character or block special file stands for
 * @param size  st_size in bytes
 */
public record FileStat(int mode, int uid, int gid, long dev, long ino, long rdev, long size) {
    // <sys/stat.h> (Linux, every architecture)
    public static final int S_IFMT = 0170000;
    public static final int S_IFSOCK = 0140000;
    public static final int S_IFLNK = 0120000;
    public static final int S_IFREG = 0100000;
    public static final int S_IFBLK = 0060000;
    public static final int S_IFDIR = 0040000;
    public static final int S_IFCHR = 0020000;
    public static final int S_ISVTX = 01000;
    public static final int S_IWGRP = 020;
    public static final int S_IWOTH = 02;

    /**
     * {@code struct stat} of glibc on x86-64, from glibc's {@code sysdeps/unix/sysv/linux/x86/bits/struct_stat.h}
     * (the {@code __x86_64__} branch; the kernel's {@code struct stat} in
     * {@code arch/x86/include/uapi/asm/stat.h} is the same): 144 bytes. Times and the reserved tail are not read.
     */
    static final StructLayout LAYOUT = MemoryLayout.structLayout(
            JAVA_LONG.withName("st_dev"),
            JAVA_LONG.withName("st_ino"),
            JAVA_LONG.withName("st_nlink"), // nlink before mode on x86-64 (unlike i386 and the generic layout)
            JAVA_INT.withName("st_mode"),
            JAVA_INT.withName("st_uid"),
            JAVA_INT.withName("st_gid"),
            JAVA_INT.withName("__pad0"),
            JAVA_LONG.withName("st_rdev"),
            JAVA_LONG.withName("st_size"),
            JAVA_LONG.withName("st_blksize"),
            JAVA_LONG.withName("st_blocks"),
            MemoryLayout.sequenceLayout(6, JAVA_LONG).withName("st_atim_mtim_ctim"),
            MemoryLayout.sequenceLayout(3, JAVA_LONG).withName("__glibc_reserved"));

    private static final long DEV = LAYOUT.byteOffset(groupElement("st_dev"));
    private static final long INO = LAYOUT.byteOffset(groupElement("st_ino"));
    private static final long MODE = LAYOUT.byteOffset(groupElement("st_mode"));
    private static final long UID = LAYOUT.byteOffset(groupElement("st_uid"));
    private static final long GID = LAYOUT.byteOffset(groupElement("st_gid"));
    private static final long RDEV = LAYOUT.byteOffset(groupElement("st_rdev"));
    private static final long SIZE = LAYOUT.byteOffset(groupElement("st_size"));

    static FileStat read(MemorySegment s) {
        return new FileStat(s.get(JAVA_INT, MODE), s.get(JAVA_INT, UID), s.get(JAVA_INT, GID), s.get(JAVA_LONG, DEV),
                s.get(JAVA_LONG, INO), s.get(JAVA_LONG, RDEV), s.get(JAVA_LONG, SIZE));
    }

    public int type() {
        return mode & S_IFMT;
    }

    public boolean isDirectory() {
        return type() == S_IFDIR;
    }

    public boolean isRegularFile() {
        return type() == S_IFREG;
    }

    public boolean isSymbolicLink() {
        return type() == S_IFLNK;
    }

    public boolean isCharacterDevice() {
        return type() == S_IFCHR;
    }

    public boolean isSocket() {
        return type() == S_IFSOCK;
    }

    /** Writable by the group or by others. */
    public boolean groupOrOtherWritable() {
        return (mode & (S_IWGRP | S_IWOTH)) != 0;
    }

    public boolean sticky() {
        return (mode & S_ISVTX) != 0;
    }

    /** The permission bits as ls shows them in octal, e.g. "1777", "0755". */
    public String permissions() {
        return String.format("%04o", mode & 07777);
    }

    /** A word for the file type, for messages. */
    public String typeName() {
        return switch (type()) {
            case S_IFREG -> "regular file";
            case S_IFDIR -> "directory";
            case S_IFLNK -> "symbolic link";
            case S_IFCHR -> "character device";
            case S_IFBLK -> "block device";
            case S_IFSOCK -> "socket";
            default -> "file of type 0" + Integer.toOctalString(type());
        };
    }
}
