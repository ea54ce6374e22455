package io.pmemblk.pmem;

import io.pmemblk.posix.TrustedFile;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

/**
 * Persistence through libpmem, for a pmem_map_file mapping. On real pmem, copies are pmem_memcpy with NODRAIN
 * (non-temporal from 256 bytes on, PMDK's default) and durability is pmem_flush + pmem_drain; on a file libpmem
 * reports as not pmem, stores are ordinary and durability is pmem_msync.
 */
final class LibpmemPersistence implements Persistence {
    private final Libpmem lib;
    private final boolean isPmem;

    LibpmemPersistence(Libpmem lib, boolean isPmem) {
        this.lib = lib;
        this.isPmem = isPmem;
    }

    @Override
    public boolean flushesCaches() {
        return isPmem;
    }

    @Override
    public void copy(MemorySegment src, MemorySegment dst) {
        if (isPmem) {
            lib.memcpy(dst, src, Libpmem.PMEM_F_MEM_NODRAIN);
        } else {
            MemorySegment.copy(src, 0, dst, 0, dst.byteSize());
        }
    }

    @Override
    public void fill(MemorySegment dst, byte value) {
        if (isPmem) {
            lib.memset(dst, value, Libpmem.PMEM_F_MEM_NODRAIN);
        } else {
            MappedFilePersistence.fillOutsideSafepoints(dst, value);
        }
    }

    @Override
    public void writeBack(MemorySegment range) {
        lib.flush(range);
    }

    @Override
    public void drain() {
        lib.drain();
    }

    @Override
    public void sync(MemorySegment range) throws IOException {
        lib.msync(range);
    }

    @Override
    public void syncCreated(TrustedFile file) throws IOException {
        MappedFilePersistence.syncCreatedFile(file);
    }
}
