package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.Persistence;
import io.pmemblk.posix.TrustedFile;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/** Pool files mapped for the BTT tests, and the persistence ports they run under. */
final class Pools {
    /** 8 KiB of pool header + one 16 MiB arena: PMEMBLK_MIN_POOL on x86-64, what `pmempool create blk` makes. */
    static final long MIN_POOL = BttLayout.BTT_OFFSET + BttLayout.ARENA_MIN_SIZE;

    private Pools() {
    }

    /** A file mapping that owns its arena: closing unmaps. */
    record Mapped(Arena arena, MemorySegment memory) implements AutoCloseable {
        @Override
        public void close() {
            arena.close();
        }
    }

    /** Maps {@code file} read-write, creating it with {@code size} bytes (zeros) when it does not exist. */
    static Mapped map(Path file, long size) throws IOException {
        Arena arena = Arena.ofShared();
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.READ,
                StandardOpenOption.WRITE)) {
            if (ch.size() < size) {
                ch.write(java.nio.ByteBuffer.allocate(1), size - 1); // grows it, sparse: reads as zeros
            }
            return new Mapped(arena, ch.map(FileChannel.MapMode.READ_WRITE, 0, ch.size(), arena));
        } catch (IOException | RuntimeException e) {
            arena.close();
            throw e;
        }
    }

    /** An off-heap, page-aligned copy of {@code image} (a crash image), owned by {@code arena}. */
    static MemorySegment offHeap(Arena arena, byte[] image) {
        MemorySegment s = arena.allocate(image.length, 4096);
        s.copyFrom(MemorySegment.ofArray(image));
        return s;
    }

    /**
     * The page-cache port, as the JDK mapper's (stores are plain, msync makes them durable). With
     * {@code cacheFlushing} it claims to be pmem instead (write-back + drain per thread, no msync), which is what
     * {@link io.pmemblk.pmem.CrashModel} needs to model cache lines; nothing is really flushed then, so use it only
     * under the model.
     */
    static Persistence pageCache() {
        return new Port(false, true);
    }

    static Persistence modelledPmem() {
        return new Port(true, false);
    }

    /** Does nothing to make stores durable: for images checked in memory and for speed where durability is not tested. */
    static Persistence none() {
        return new Port(false, false);
    }

    private record Port(boolean flushesCaches, boolean msync) implements Persistence {
        @Override
        public void copy(MemorySegment src, MemorySegment dst) {
            MemorySegment.copy(src, 0, dst, 0, dst.byteSize());
        }

        @Override
        public void fill(MemorySegment dst, byte value) {
            dst.fill(value);
        }

        @Override
        public void writeBack(MemorySegment range) {
            if (!flushesCaches) {
                throw new UnsupportedOperationException("not pmem: sync() instead");
            }
        }

        @Override
        public void drain() {
            if (!flushesCaches) {
                throw new UnsupportedOperationException("not pmem: sync() instead");
            }
        }

        @Override
        public void sync(MemorySegment range) throws IOException {
            if (msync) {
                try {
                    range.force();
                } catch (UncheckedIOException e) {
                    throw e.getCause();
                }
            }
        }

        @Override
        public void syncCreated(TrustedFile file) {
            throw new UnsupportedOperationException("the BTT tests create no files through the port");
        }
    }
}
