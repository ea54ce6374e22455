package io.pmemblk.dma;

import static org.assertj.core.api.Assertions.assertThat;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/** Records every completion; waits are bounded and fail with a message saying what never happened. */
public final class Recorder implements DmaCompletionListener {
    public final Map<Object, Integer> statuses = new ConcurrentHashMap<>();
    private int count;
    private int duplicates;

    @Override
    public synchronized void completed(Object ctx, int status) {
        if (statuses.putIfAbsent(ctx, status) != null) {
            duplicates++;
        }
        count++;
        notifyAll();
    }

    public synchronized int count() {
        return count;
    }

    public synchronized int duplicates() {
        return duplicates;
    }

    public Integer status(Object ctx) {
        return statuses.get(ctx);
    }

    /** Waits until {@code n} completions were reported (10 s at most), then checks none was reported twice. */
    public void awaitCount(int n) {
        awaitCondition(() -> count() >= n, () -> n + " completions, got " + count());
        assertThat(duplicates()).as("contexts reported more than once").isZero();
    }

    /**
     * Waits (10 s at most) until {@code condition} holds; re-checked on every completion and every 10 ms. The
     * condition runs outside this recorder's monitor: it may poll the channel, whose reaper calls {@link
     * #completed} while holding the channel's reap lock, so evaluating it under the monitor deadlocks.
     */
    public void awaitCondition(BooleanSupplier condition, java.util.function.Supplier<String> what) {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (true) {
            int seen = count();
            if (condition.getAsBoolean()) {
                return;
            }
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                throw new AssertionError("timed out after 10 s waiting for " + what.get());
            }
            synchronized (this) {
                if (count != seen) {
                    continue;
                }
                try {
                    wait(Math.max(1, Math.min(10, TimeUnit.NANOSECONDS.toMillis(left))));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new AssertionError("interrupted waiting for " + what.get());
                }
            }
        }
    }
}
