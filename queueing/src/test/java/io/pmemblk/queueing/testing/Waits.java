package io.pmemblk.queueing.testing;

import static org.junit.jupiter.api.Assertions.fail;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/** Bounded waits for conditions another thread brings about; a timeout fails the test with what was awaited. */
public final class Waits {
    public static final Duration BOUND = Duration.ofSeconds(10);

    private Waits() {}

    public static void await(String what, BooleanSupplier condition) throws InterruptedException {
        long end = System.nanoTime() + BOUND.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > end) {
                fail("timed out after " + BOUND + " waiting for " + what);
            }
            Thread.sleep(1); // polling a condition with a deadline, not sleeping for synchronisation
        }
    }

    /** Waits until {@code t} is parked in a wait (not runnable, not finished). */
    public static void awaitWaiting(String what, Thread t) throws InterruptedException {
        await(what + " (thread " + t.getName() + " blocked)", () -> {
            Thread.State s = t.getState();
            return s == Thread.State.WAITING || s == Thread.State.TIMED_WAITING;
        });
    }

    public static void join(String what, Thread t) throws InterruptedException {
        t.join(BOUND.toMillis());
        if (t.isAlive()) {
            fail("timed out after " + BOUND + " waiting for " + what + "; thread " + t.getName() + " is "
                    + t.getState());
        }
    }

    /**
     * Takes {@code n} elements (completions, statuses) that other threads add to {@code from}, in order, waiting at
     * most {@code each} for every one; a timeout fails the test with which one did not come.
     */
    public static <T> List<T> take(String what, BlockingQueue<T> from, int n, Duration each) throws InterruptedException {
        List<T> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            T t = from.poll(each.toNanos(), TimeUnit.NANOSECONDS);
            if (t == null) {
                fail("timed out after " + each + " waiting for " + what + " " + (i + 1) + " of " + n);
            }
            out.add(t);
        }
        return out;
    }
}
