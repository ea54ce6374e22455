package io.pmemblk.pmem;

import io.pmemblk.posix.Errno;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.NativeException;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * Whether a region holds anything, over ALL of it: {@code pmemblk format} erases what it finds, and a device's data
 * is wherever its client put it (a filesystem past its first MiB, a guest's partition that starts late), not only
 * where partition tables and superblocks sit. A regular file's holes are skipped without reading them
 * (lseek SEEK_DATA/SEEK_HOLE: a 1 TiB sparse file with nothing in it answers in a few system calls, and blocks
 * reserved but never written, as serve reserves a file it creates, are holes to ext4 and XFS too); what is data is
 * read through the region's fault-checked read, 1 MiB at a time. A device-DAX node has no holes: all of it is read.
 */
public final class DataScan {
    private static final int CHUNK = 1 << 20;

    private DataScan() {
    }

    /** Where the first non-zero byte of {@code region} is, or -1 when every byte reads zero. */
    public static long firstNonZero(PmemRegion region) throws IOException {
        long size = region.size();
        boolean sparse = region.file().stat().isRegularFile();
        int fd = region.file().fd();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(CHUNK, 8);
            long at = 0;
            while (at < size) {
                long start = at, end = size;
                if (sparse) {
                    try {
                        start = FileCalls.lseek(fd, at, FileCalls.SEEK_DATA);
                    } catch (NativeException e) {
                        if (e.errno() == Errno.ENXIO) {
                            return -1; // no data at or after at
                        }
                        throw e;
                    }
                    if (start >= size) {
                        return -1;
                    }
                    end = Math.min(size, FileCalls.lseek(fd, start, FileCalls.SEEK_HOLE));
                }
                for (long p = start; p < end; ) {
                    int n = (int) Math.min(CHUNK, end - p);
                    try {
                        region.read(p, buf, 0, n);
                    } catch (MappingFault f) {
                        throw new IOException(region.path() + " cannot be read at " + p + ".." + (p + n) + " ("
                                + f.getMessage() + "): whether it holds data there is unknown", f);
                    }
                    int i = 0;
                    for (; i + 8 <= n; i += 8) {
                        if (buf.get(ValueLayout.JAVA_LONG_UNALIGNED, i) != 0) {
                            break;
                        }
                    }
                    for (; i < n; i++) {
                        if (buf.get(ValueLayout.JAVA_BYTE, i) != 0) {
                            return p + i;
                        }
                    }
                    p += n;
                }
                at = end;
            }
        }
        return -1;
    }
}
