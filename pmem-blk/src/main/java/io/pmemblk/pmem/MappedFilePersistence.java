package io.pmemblk.pmem;

import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.TrustedFile;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.foreign.MemorySegment;

/**
 * Persistence of a JDK file mapping ({@code FileChannel.map}): ordinary stores into the page cache, made durable
 * by {@link MemorySegment#force()}, which on Linux is msync(MS_SYNC) of exactly the pages under the segment
 * (JDK MappedMemoryUtils.force0: the start rounded down to its page, the length grown to match). No cache
 * flushes: a file mapping is never treated as pmem here.
 */
final class MappedFilePersistence implements Persistence {
    @Override
    public boolean flushesCaches() {
        return false;
    }

    @Override
    public void copy(MemorySegment src, MemorySegment dst) {
        FaultBarrier.copy(src, 0, dst, 0, dst.byteSize());
    }

    @Override
    public boolean beginRun() {
        return true;
    }

    @Override
    public void copyInRun(MemorySegment src, MemorySegment dst) {
        FaultBarrier.copyInRun(src, dst);
    }

    @Override
    public void endRun() {
        FaultBarrier.endRun();
    }

    /**
     * In 64 KiB pieces (FaultBarrier.fill): a 4 GiB WRITE_ZEROES in one MemorySegment.fill would be one VM call
     * that every safepoint waits for; libc's memset would not, but a fault inside it kills the JVM.
     */
    @Override
    public void fill(MemorySegment dst, byte value) {
        FaultBarrier.fill(dst, value);
    }

    @Override
    public void writeBack(MemorySegment range) {
        throw new UnsupportedOperationException("a JDK file mapping is not pmem: sync() its pages instead");
    }

    @Override
    public void drain() {
        throw new UnsupportedOperationException("a JDK file mapping is not pmem: sync() its pages instead");
    }

    @Override
    public void sync(MemorySegment range) throws IOException {
        try {
            range.force();
        } catch (UncheckedIOException e) {
            throw new IOException("msync of " + range.byteSize() + " bytes at 0x" + Long.toHexString(range.address())
                    + " failed: " + e.getCause().getMessage(), e.getCause());
        }
    }

    @Override
    public void syncCreated(TrustedFile file) throws IOException {
        syncCreatedFile(file);
    }

    /**
     * fsync of the new file (its size and allocation), of its directory (the entry naming it), and of the parent
     * of each directory made for it, deepest first: fsync(2) says each entry needs its directory synced. Through
     * the descriptors held since they were created, never by name.
     */
    static void syncCreatedFile(TrustedFile file) throws IOException {
        FileCalls.fsync(file.fd(), file.path().toString());
        file.directory().sync();
        file.directory().syncMadeDirectories();
    }
}
