package io.pmemblk.pmem;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

/**
 * A persistence port that does the real work, except the msyncs a test makes fail with EIO, as Linux reports a
 * failed write-back: once, to one caller. For tests outside this package that need a region whose write-back
 * fails (a dirty bitmap's file), and a hook to hold a sync where a race would put it.
 */
public final class SyncFaults extends ForwardingPersistence {
    /** A region whose persistence is {@code faults}. */
    public record Faulty(PmemRegion region, SyncFaults faults) {}

    private final AtomicInteger failNext = new AtomicInteger();
    private volatile BooleanSupplier beforeSync = () -> false;

    private SyncFaults(Persistence real) {
        super(real);
    }

    /** A new region of {@code size} bytes at {@code file} (locked for this process), its port wrapped. */
    public static Faulty open(Path file, long size, PmemRegion.Mapper mapper) throws IOException {
        RegionPorts.Opened<SyncFaults> o = RegionPorts.open(file, size, mapper, SyncFaults::new);
        return new Faulty(o.region(), o.port());
    }

    /** The next {@code n} msyncs fail with EIO, without writing anything back. */
    public void failNext(int n) {
        failNext.set(n);
    }

    /**
     * Runs {@code hook} at the start of each msync, on the syncing thread, where a test may hold it; when the hook
     * answers true, that msync fails with EIO.
     */
    public void beforeEachSync(BooleanSupplier hook) {
        beforeSync = hook;
    }

    @Override
    public void sync(MemorySegment range) throws IOException {
        if (beforeSync.getAsBoolean() || failNext.getAndUpdate(n -> Math.max(0, n - 1)) > 0) {
            throw new IOException("injected msync failure (EIO)");
        }
        real.sync(range);
    }
}
