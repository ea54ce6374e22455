package io.pmemblk.pmem.bitmap;

import java.util.concurrent.locks.LockSupport;

/**
 * How a management thread waits for markers or writes to finish: spins briefly (a marker is done within one
 * batch's marking and one persist), then parks for doubling intervals up to a millisecond, so a wait for a slow
 * device never burns a core the queue threads need.
 */
final class Backoff {
    private static final int SPINS = 1000;
    private static final long MAX_PARK_NANOS = 1_000_000;

    private Backoff() {}

    interface Condition {
        boolean holds();
    }

    /** Whether {@code done} held before {@code deadline} ({@link System#nanoTime}). */
    static boolean until(Condition done, long deadline) {
        long park = 1000;
        for (int i = 0; !done.holds(); i++) {
            if (System.nanoTime() - deadline > 0) {
                return done.holds();
            }
            if (i < SPINS) {
                Thread.onSpinWait();
            } else {
                LockSupport.parkNanos(park);
                park = Math.min(2 * park, MAX_PARK_NANOS);
            }
        }
        return true;
    }
}
