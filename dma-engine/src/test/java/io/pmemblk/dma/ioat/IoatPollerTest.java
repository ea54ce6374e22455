package io.pmemblk.dma.ioat;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.vfio.EventfdInterrupt;
import io.pmemblk.posix.EdgeWait;
import io.pmemblk.posix.EventFd;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * A channel whose completions a thread of the caller's reaps ({@link DmaChannel#pollers}), its interrupt an
 * eventfd as on the vfio-user route: the poller sleeps on {@link DmaChannel#completionFd}, wakes when the device
 * signals it and reports the copies on its own thread; the channel's completion thread leaves the interrupt alone
 * then, and picks up only what a poller that never polls leaves behind.
 */
class IoatPollerTest {
    private static final int COPY = 4096;

    /** The device's vector 0 as an eventfd, and the channel started on it. */
    private static final class FdRig implements AutoCloseable {
        final IovaSpace space = new IovaSpace();
        final Arena arena = Arena.ofShared();
        final EventfdInterrupt vector;
        final SoftIoatDevice device;
        final DmaEngine engine;
        final DmaChannel ch;
        final MemorySegment src = arena.allocate(64L * COPY, 4096);
        final MemorySegment dst = arena.allocate(64L * COPY, 4096);
        final long srcIova;
        final long dstIova;
        /** The thread each context was reported on. */
        final Map<Object, String> reportedOn = new ConcurrentHashMap<>();
        final Map<Object, Integer> status = new ConcurrentHashMap<>();

        /** The channel's completion thread: the one of that name this rig started. */
        final Thread completionThread;

        FdRig() throws Exception {
            java.util.Set<Thread> before = Thread.getAllStackTraces().keySet();
            vector = new EventfdInterrupt();
            device = new SoftIoatDevice(space, 1, 20, io.pmemblk.dma.soft.SoftFaults.NONE, n -> vector);
            engine = DmaEngine.ioat(device, space, device::interrupt, 1, 64, device);
            ch = engine.channel(0);
            engine.onCompletion((ctx, st) -> {
                reportedOn.put(ctx, Thread.currentThread().getName());
                status.put(ctx, st);
            });
            for (long i = 0; i < src.byteSize(); i += 8) {
                src.set(ValueLayout.JAVA_LONG, i, i * 0x9E3779B97F4A7C15L + 1);
            }
            srcIova = space.map(src);
            dstIova = space.map(dst);
            completionThread = Thread.getAllStackTraces().keySet().stream()
                    .filter(t -> !before.contains(t) && t.getName().startsWith("ioat-completion"))
                    .findFirst().orElseThrow(() -> new AssertionError("the channel started no ioat-completion thread"));
        }

        /**
         * Waits until the completion thread stands by (parked, not in its read of the eventfd): it leaves its wait
         * for the interrupt at the next interrupt or its idle wake-up, and a read it makes late takes every
         * interrupt counted by then, however many (a CI run on a loaded host saw it take all 32).
         */
        void awaitStandby() throws InterruptedException {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (!parked(completionThread)) {
                assertThat(System.nanoTime() - deadline).as("the completion thread stands by within 10 s: %s",
                        java.util.Arrays.toString(completionThread.getStackTrace())).isNegative();
                Thread.sleep(5); // polls a thread's state: nothing to wait on
            }
        }

        private static boolean parked(Thread t) {
            if (t.getState() != Thread.State.TIMED_WAITING) {
                return false;
            }
            for (StackTraceElement e : t.getStackTrace()) {
                if (e.getMethodName().equals("completionLoop")) {
                    return false; // not reached parkNanos from the loop, or already returned to it
                }
                if (e.getMethodName().equals("parkNanos")) {
                    return true;
                }
            }
            return false;
        }

        void copy(int i) {
            assertThat(ch.place(srcIova + (long) i * COPY, dstIova + (long) i * COPY, COPY, i)).as("room for copy %d", i).isTrue();
            ch.submit();
        }

        @Override
        public void close() throws Exception {
            engine.close();
            vector.close();
            arena.close();
        }
    }

    @Test
    void aPollerSleepsOnTheCompletionFdAndReportsOnItsOwnThreadWhileTheCompletionThreadLeavesTheInterrupt() throws Exception {
        try (FdRig r = new FdRig(); EdgeWait sleep = EdgeWait.create(1)) {
            assertThat(r.ch.completionFd()).as("the channel's interrupt eventfd").isEqualTo(r.vector.fd());
            r.ch.pollers(true);
            r.awaitStandby();
            sleep.add(EventFd.adopt(r.ch.completionFd())); // slept on only; the vector closes it
            int wakes = 0;
            String me = Thread.currentThread().getName();
            for (int i = 0; i < 32; i++) {
                r.copy(i);
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
                while (!r.status.containsKey(i)) {
                    assertThat(System.nanoTime() - deadline).as("copy %d reported within 10 s", i).isNegative();
                    if (sleep.await(1000)) {
                        wakes++;
                    }
                    r.ch.poll();
                }
            }
            assertThat(r.status.values()).as("every copy done").hasSize(32).containsOnly(0);
            assertThat(r.dst.asSlice(0, 32L * COPY).mismatch(r.src.asSlice(0, 32L * COPY))).as("the data copied").isEqualTo(-1);
            assertThat(wakes).as("the device's interrupt woke the poller's sleep").isPositive();
            assertThat(r.reportedOn.values()).as("reported on the poller's thread").contains(me);
            // Nobody read the eventfd: its counter holds every copy's interrupt but the last at most, which may still
            // be on its way when its completion word was seen. A completion thread still taking the interrupts
            // would leave ~0.
            long unread = EventFd.adopt(r.ch.completionFd()).drain(); // non-blocking (EventfdInterrupt's): 0 if none
            assertThat(unread).as("interrupts left unread on the eventfd while the poller reaps").isGreaterThanOrEqualTo(31);

            r.ch.pollers(false);
            r.copy(40);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (!r.status.containsKey(40)) {
                assertThat(System.nanoTime() - deadline).as("copy 40 reported within 10 s without a poller").isNegative();
                Thread.sleep(1); // the completion thread's report, on its own thread
            }
            assertThat(r.reportedOn.get(40)).as("no poller: the completion thread reports").startsWith("ioat-completion");
        }
    }

    @Test
    void whatAPollerThatNeverPollsLeavesIsReportedByTheStandingByCompletionThread() throws Exception {
        try (FdRig r = new FdRig()) {
            r.ch.pollers(true);
            for (int i = 0; i < 8; i++) {
                r.copy(i);
            }
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (r.status.size() < 8) {
                assertThat(System.nanoTime() - deadline).as("8 copies reported within 10 s, got %s", r.status).isNegative();
                Thread.sleep(1); // nobody polls here: the completion thread must
            }
            assertThat(r.status.values()).containsOnly(0);
            assertThat(r.reportedOn.values()).allMatch(t -> t.startsWith("ioat-completion"));
            assertThat(r.dst.asSlice(0, 8L * COPY).mismatch(r.src.asSlice(0, 8L * COPY))).isEqualTo(-1);
            r.ch.pollers(false);
        }
    }
}
