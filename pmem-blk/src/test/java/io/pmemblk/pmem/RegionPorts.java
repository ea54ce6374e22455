package io.pmemblk.pmem;

import java.io.IOException;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Function;

/**
 * A region mapped as the server maps it, with the persistence port it chose (libpmem's or the JDK mapper's), which
 * layouts over the region drive directly (the BTT's tests); or with a test port wrapped around that one (a
 * recorder, a fault injector, a crash model), handed back beside the region.
 */
public final class RegionPorts {
    private RegionPorts() {
    }

    /** A region and the port its persistence goes through. */
    public record Opened<P extends Persistence>(PmemRegion region, P port) {}

    /** A new region of {@code size} bytes at {@code file} (locked for this process) and the real port under it. */
    public static Opened<Persistence> open(Path file, long size, PmemRegion.Mapper mapper) throws IOException {
        return open(file, size, mapper, p -> p);
    }

    /** As {@link #open(Path, long, PmemRegion.Mapper)}, its persistence going through {@code wrap}'s port over the real one. */
    public static <P extends Persistence> Opened<P> open(Path file, long size, PmemRegion.Mapper mapper,
                                                         Function<Persistence, P> wrap) throws IOException {
        AtomicReference<P> port = new AtomicReference<>();
        PmemRegion region = RegionFile.open(file, size, false, mapper, true, p -> {
            port.set(wrap.apply(p));
            return port.get();
        });
        return new Opened<>(region, port.get());
    }

    /** Whether libpmem.so.1 loads here (the LIBPMEM mapper needs it). */
    public static boolean libpmemLoads() {
        return Libpmem.load().isPresent();
    }
}
