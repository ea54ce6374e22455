package io.pmemblk.queueing.testing;

/** Tests' tear-down: what a test opened, closed in the order given, whatever was never opened skipped. */
public final class Closing {
    private Closing() {
    }

    /**
     * Closes every non-null part in order; the first failure is thrown once all were tried, the later ones
     * suppressed in it, so one part failing to close never leaks the others into the next test.
     */
    public static void closeAll(AutoCloseable... parts) throws Exception {
        Exception first = null;
        for (AutoCloseable p : parts) {
            if (p == null) {
                continue;
            }
            try {
                p.close();
            } catch (Exception e) {
                if (first == null) {
                    first = e;
                } else {
                    first.addSuppressed(e);
                }
            }
        }
        if (first != null) {
            throw first;
        }
    }
}
