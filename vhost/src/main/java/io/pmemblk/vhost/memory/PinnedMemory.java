package io.pmemblk.vhost.memory;

import java.util.ArrayList;
import java.util.List;

/**
 * Keeps a session's guest memory (and its inflight region) mapped while a ring that stopped with requests still in
 * flight may touch it, and lets it go once they are all done. A request's data are copied between guest RAM and
 * the device by the driver, possibly on another thread or by a DMA engine through the region's registration, until
 * it completes; unmapping or unregistering under it would fault, or write into whatever is mapped there next. So a
 * ring that could not be drained pins everything released meanwhile ({@link #release}); when the last such ring
 * goes quiet ({@link #unpin}), the releases run, on the thread that completed its last request. Releases that
 * are not held up run at once, on the caller's thread.
 */
public final class PinnedMemory {
    private int pins;
    private final List<Runnable> held = new ArrayList<>();

    /** A ring was detached with requests in flight: nothing is released until its {@link #unpin}. */
    public synchronized void pin() {
        pins++;
    }

    /** That ring is quiet (any thread): the last unpin runs the releases held up. */
    public void unpin() {
        List<Runnable> run;
        synchronized (this) {
            if (pins == 0) {
                throw new IllegalStateException("unpinned more often than pinned");
            }
            if (--pins > 0) {
                return;
            }
            run = new ArrayList<>(held);
            held.clear();
        }
        run.forEach(Runnable::run);
    }

    /** Runs {@code release} now when no ring pins memory, else when the last one is quiet. */
    public void release(Runnable release) {
        synchronized (this) {
            if (pins > 0) {
                held.add(release);
                return;
            }
        }
        release.run();
    }

    /** Rings detached and not yet quiet (for a log line, or a test). */
    synchronized int pins() {
        return pins;
    }

    /** Releases waiting for them. */
    synchronized int held() {
        return held.size();
    }
}
