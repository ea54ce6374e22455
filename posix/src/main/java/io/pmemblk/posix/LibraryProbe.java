package io.pmemblk.posix;

import java.util.Optional;
import java.util.function.Supplier;

/**
 * A native library bound outside libc (libpmem, libvfio-user), probed once on first use: the first caller loads
 * it, every later one gets the same answer from a volatile read, without a lock. An empty answer is kept (the
 * binding class records why); a probe that throws keeps nothing, so the next caller probes again.
 */
public final class LibraryProbe<T> {
    private final Supplier<Optional<T>> probe;
    private volatile Optional<T> result;

    public LibraryProbe(Supplier<Optional<T>> probe) {
        this.probe = probe;
    }

    /** The library, or empty when it does not load; probes on the first call only. */
    public Optional<T> get() {
        Optional<T> r = result;
        if (r == null) {
            synchronized (this) {
                r = result;
                if (r == null) {
                    r = probe.get();
                    result = r;
                }
            }
        }
        return r;
    }
}
