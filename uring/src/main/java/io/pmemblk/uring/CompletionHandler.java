package io.pmemblk.uring;

/**
 * Receives one CQE's fields as primitives, so reaping allocates nothing. {@code res} is the operation's result:
 * bytes moved, 0, or {@code -errno}. Called on the reaping thread; it may prepare and submit new SQEs but must not
 * reap from the same ring (the CQ head is published when the reap returns).
 */
@FunctionalInterface
public interface CompletionHandler {
    void onCompletion(long userData, int res, int flags);
}
