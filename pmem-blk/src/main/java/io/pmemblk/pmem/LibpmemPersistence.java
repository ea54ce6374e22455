package io.pmemblk.pmem;

import io.pmemblk.posix.TrustedFile;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

/**
 * Persistence through libpmem, for a pmem_map_file mapping. On real pmem, copies are pmem_memcpy with NODRAIN
 * (non-temporal from 256 bytes on, PMDK's default) and durability is pmem_flush + pmem_drain; on a file libpmem
 * reports as not pmem, stores are ordinary (MemorySegment, fault-safe) and durability is pmem_msync.
 */
final class LibpmemPersistence implements Persistence {
    private final Libpmem lib;
    private final boolean isPmem;
    private final FaultBarrier.Probe probe;

    /** {@code mapping}: the whole mapping every range given to this port is a slice of. */
    LibpmemPersistence(Libpmem lib, boolean isPmem, MemorySegment mapping) {
        this.lib = lib;
        this.isPmem = isPmem;
        this.probe = new FaultBarrier.Probe(mapping);
    }

    @Override
    public boolean flushesCaches() {
        return isPmem;
    }

    /**
     * On pmem, libpmem's non-temporal copy after a probe (of the mapping's tail while it is there, see
     * {@link FaultBarrier.Probe}): a fault inside pmem_memcpy would kill the JVM, and the probe takes it first, in
     * Java. Only a truncation under way can still reach it (a file on fsdax truncated behind the server; device DAX
     * cannot be). Poisoned lines cannot: stores do not
     * consume poison, only loads do, and pmem_memcpy loads from the buffers, never from pmem.
     */
    @Override
    public void copy(MemorySegment src, MemorySegment dst) {
        if (isPmem) {
            probe.probe(dst);
            lib.memcpy(dst, src, Libpmem.PMEM_F_MEM_NODRAIN);
        } else {
            FaultBarrier.copy(src, 0, dst, 0, dst.byteSize());
        }
    }

    @Override
    public boolean beginRun() {
        return !isPmem || probe.tailIntact();
    }

    @Override
    public void copyInRun(MemorySegment src, MemorySegment dst) {
        if (isPmem) {
            lib.memcpy(dst, src, Libpmem.PMEM_F_MEM_NODRAIN);
        } else {
            FaultBarrier.copyInRun(src, dst);
        }
    }

    @Override
    public void endRun() {
        if (!isPmem) {
            FaultBarrier.endRun();
        }
    }

    @Override
    public void fill(MemorySegment dst, byte value) {
        if (isPmem) {
            probe.probe(dst);
            lib.memset(dst, value, Libpmem.PMEM_F_MEM_NODRAIN);
        } else {
            FaultBarrier.fill(dst, value);
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
