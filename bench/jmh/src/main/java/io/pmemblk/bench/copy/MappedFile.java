package io.pmemblk.bench.copy;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * A shared-mapped file on tmpfs standing in for a pmem region (what {@code pmemblk serve} maps with
 * {@code pmem.path=/dev/shm/...}). Every page is touched once here so no benchmark measures page faults.
 * Owns its arena; the file is deleted on {@link #close()}.
 */
public final class MappedFile implements AutoCloseable {
    /** Where the file goes unless -Dpmemblk.bench.dir says otherwise: tmpfs, so the mapping is DRAM like emulated pmem. */
    public static final String DIR_PROPERTY = "pmemblk.bench.dir";

    private final Path path;
    private final Arena arena = Arena.ofShared();
    private final MemorySegment memory;

    public MappedFile(long size) {
        Path dir = Path.of(System.getProperty(DIR_PROPERTY, "/dev/shm"));
        try {
            path = Files.createTempFile(dir, "pmemblk-bench-", ".img");
            try (FileChannel ch = FileChannel.open(path, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
                memory = ch.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
            }
        } catch (IOException e) {
            arena.close();
            throw new UncheckedIOException("cannot map a " + size + "-byte file in " + dir
                    + " (set -D" + DIR_PROPERTY + "=DIR to use another tmpfs)", e);
        }
        for (long off = 0; off < size; off += 4096) {
            memory.set(ValueLayout.JAVA_BYTE, off, (byte) 1);
        }
    }

    public MemorySegment memory() {
        return memory;
    }

    @Override
    public void close() {
        if (arena.scope().isAlive()) {
            arena.close();
        }
        try {
            Files.deleteIfExists(path);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot delete " + path, e);
        }
    }
}
