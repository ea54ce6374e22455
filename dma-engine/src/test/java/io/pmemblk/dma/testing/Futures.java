package io.pmemblk.dma.testing;

import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/** Tests' look at work that must still be waiting: whether it finished within a short bound. */
public final class Futures {
    private Futures() {
    }

    /**
     * Whether {@code f} finished within {@code millis} (false: still waiting when the bound passed). A failure of
     * {@code f} is thrown: it finished, but not as the caller meant.
     */
    public static boolean doneWithin(Future<?> f, long millis) throws InterruptedException, ExecutionException {
        try {
            f.get(millis, TimeUnit.MILLISECONDS);
            return true;
        } catch (TimeoutException e) {
            return false;
        }
    }
}
