package io.pmemblk.pmem;

import java.io.IOException;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicReference;

/**
 * For tests outside this package (the BTT's): a region mapped as the server maps it, with the persistence port it
 * chose (libpmem's or the JDK mapper's), which layouts over the region drive directly.
 */
public final class RegionPorts {
    private RegionPorts() {
    }

    /** A region and the real port under it. */
    public record Opened(PmemRegion region, Persistence port) {}

    public static Opened open(Path file, long size, PmemRegion.Mapper mapper) throws IOException {
        AtomicReference<Persistence> port = new AtomicReference<>();
        PmemRegion region = RegionFile.open(file, size, false, mapper, true, p -> {
            port.set(p);
            return p;
        });
        return new Opened(region, port.get());
    }

    /** Whether libpmem.so.1 loads here (the LIBPMEM mapper needs it). */
    public static boolean libpmemLoads() {
        return Libpmem.load().isPresent();
    }
}
