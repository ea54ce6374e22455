package io.pmemblk.queueing.testing;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A system that makes no more threads (ulimit -u, a cgroup's pids.max), which a test run as root cannot bring
 * about: a frontend's thread factory whose chosen threads fail to start as HotSpot's do when pthread_create fails.
 * Threads are counted from 1 in the order the factory makes them.
 */
public final class ThreadShortage implements ThreadFactory {
    private final Set<Integer> refused = ConcurrentHashMap.newKeySet();
    private final AtomicInteger made = new AtomicInteger();

    /** The threads, counted from 1 as made, that fail to start. */
    public ThreadShortage refuse(int... which) {
        for (int n : which) {
            refused.add(n);
        }
        return this;
    }

    /** The first {@code n} threads made fail to start. */
    public ThreadShortage refuseFirst(int n) {
        for (int i = 1; i <= n; i++) {
            refused.add(i);
        }
        return this;
    }

    @Override
    public Thread newThread(Runnable r) {
        if (!refused.contains(made.incrementAndGet())) {
            return Thread.ofPlatform().unstarted(r);
        }
        return new Thread(r) {
            @Override
            public void start() {
                throw new OutOfMemoryError("unable to create native thread: possibly out of memory or process/resource limits reached");
            }
        };
    }
}
