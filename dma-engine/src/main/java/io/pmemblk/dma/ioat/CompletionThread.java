package io.pmemblk.dma.ioat;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.Interrupt;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;

/**
 * The thread that reaps an {@link IoatChannel} when nobody else does: it waits on the channel's interrupt and polls
 * when it fires, or stands by while other threads reap on their own ({@link DmaChannel#pollers}). Apart from the
 * channel because it decides who reaps and when; the channel's ring, registers and locks do not depend on it.
 */
final class CompletionThread {
    /** Wake-up when no interrupt comes: a lost-interrupt safety net, not a poll loop. */
    private static final long IDLE_WAKE_MILLIS = 200;
    /**
     * The period while pollers reap ({@link #pollers}): the longest a completion waits when every poller is blocked
     * elsewhere, a safety net (a vhost queue thread never blocks with copies in flight). Measured on the vfio-user
     * route (bench-vhost, jstack and /proc): at 5 ms the two channels' standby wake-ups cost about 11 ms of CPU a
     * second, some 0.007 s per GiB moved; at 50 ms a tenth of that.
     */
    private static final long STANDBY_NANOS = TimeUnit.MILLISECONDS.toNanos(50);

    private final DmaChannel channel;
    private final Interrupt vector;
    /** Threads reaping on their own; while above 0 this thread stands by. */
    private final AtomicInteger pollers = new AtomicInteger();
    private final Thread thread;
    private volatile boolean stopped;

    /** Starts reaping {@code channel}, woken by {@code vector}. */
    CompletionThread(DmaChannel channel, Interrupt vector) {
        this.channel = channel;
        this.vector = vector;
        this.thread = Thread.ofPlatform().daemon().name("ioat-completion-ch" + channel.index()).start(this::completionLoop);
    }

    /** {@link DmaChannel#pollers}: counted; ignored when the vector has no eventfd to sleep on. */
    void pollers(boolean start) {
        if (vector.fd() < 0) {
            return;
        }
        if (start) {
            pollers.incrementAndGet();
        } else if (pollers.getAndUpdate(n -> Math.max(0, n - 1)) == 1) {
            LockSupport.unpark(thread); // back to the interrupt now, not after a standby period
        }
    }

    /** Whether the caller is this thread (a listener closing the channel, which must not wait for itself). */
    boolean isCurrent() {
        return Thread.currentThread() == thread;
    }

    /** Ends the loop at its next wake-up; the channel, closing, polls on its own meanwhile. */
    void stop() {
        stopped = true;
    }

    /** After {@link #stop}: wakes the thread wherever it waits and waits for it to end, at most {@code millis}. */
    void join(long millis) {
        vector.signal();
        LockSupport.unpark(thread); // standing by: parked, not waiting for the vector
        try {
            thread.join(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private void completionLoop() {
        while (!stopped) {
            if (pollers.get() > 0) {
                // Stands by: the pollers sleep on the interrupt's eventfd (edge-triggered, its counter unread)
                // and reap when it fires; this thread only picks up what a poller blocked elsewhere leaves.
                LockSupport.parkNanos(STANDBY_NANOS);
                if (!stopped) {
                    channel.poll();
                }
                continue;
            }
            try {
                vector.await(IDLE_WAKE_MILLIS, TimeUnit.MILLISECONDS);
            } catch (InterruptedException e) {
                if (stopped) {
                    return;
                }
            }
            if (stopped) {
                return;
            }
            channel.poll();
        }
    }
}
