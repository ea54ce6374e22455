package io.pmemblk.pmem;

import io.pmemblk.posix.TrustedFile;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

/**
 * A test port over the real one: every step passes through to {@link #real}, and a subclass overrides only the
 * steps it records or makes fail. Runs are not passed through: {@link #beginRun} keeps its default (no run), so
 * every copy of a run reaches {@link #copy}, where a subclass sees it.
 */
public abstract class ForwardingPersistence implements Persistence {
    /** The port below, which does the work. */
    protected final Persistence real;

    protected ForwardingPersistence(Persistence real) {
        this.real = real;
    }

    @Override
    public boolean flushesCaches() {
        return real.flushesCaches();
    }

    @Override
    public void copy(MemorySegment src, MemorySegment dst) {
        real.copy(src, dst);
    }

    @Override
    public void fill(MemorySegment dst, byte value) {
        real.fill(dst, value);
    }

    @Override
    public void writeBack(MemorySegment range) {
        real.writeBack(range);
    }

    @Override
    public void drain() {
        real.drain();
    }

    @Override
    public void sync(MemorySegment range) throws IOException {
        real.sync(range);
    }

    @Override
    public void syncCreated(TrustedFile file) throws IOException {
        real.syncCreated(file);
    }
}
