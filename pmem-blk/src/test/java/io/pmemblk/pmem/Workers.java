package io.pmemblk.pmem;

import static org.assertj.core.api.Assertions.assertThat;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The threads of one concurrency test, each running until {@link #stopped} or its own end. What a thread throws is
 * a problem named after it, not an exception lost on that thread, and {@link #stopAndJoin} fails on any problem.
 */
final class Workers {
    /** A worker's body: anything it throws becomes a problem. */
    interface Body {
        void run() throws Exception;
    }

    private final AtomicBoolean stop = new AtomicBoolean();
    private final ConcurrentLinkedQueue<String> problems = new ConcurrentLinkedQueue<>();
    private final List<Thread> threads = new ArrayList<>();

    /** Runs {@code body} on a thread of its own; {@code who} names the thread in the problems. */
    void start(String who, Body body) {
        threads.add(Thread.ofPlatform().start(() -> {
            try {
                body.run();
            } catch (Throwable t) {
                problems.add(who + ": " + t);
            }
        }));
    }

    /** Whether the workers are asked to stop. */
    boolean stopped() {
        return stop.get();
    }

    /** Asks the workers to stop, without waiting for them (a test that fails at once). */
    void stop() {
        stop.set(true);
    }

    /** Something a worker saw go wrong. */
    void problem(String what) {
        problems.add(what);
    }

    /** Whether no worker has seen anything go wrong yet. */
    boolean noProblem() {
        return problems.isEmpty();
    }

    /** Stops the workers, waits for each at most {@code seconds}, and fails on any problem they saw. */
    void stopAndJoin(int seconds) throws InterruptedException {
        stop.set(true);
        for (Thread t : threads) {
            t.join(seconds * 1000L);
            assertThat(t.isAlive()).as("%s ended within %d s", t, seconds).isFalse();
        }
        assertThat(problems).isEmpty();
    }
}
