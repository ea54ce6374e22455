package io.pmemblk.pmem;

import io.pmemblk.pmem.RecordingPersistence.Event;
import io.pmemblk.pmem.RecordingPersistence.Kind;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Judges a record: for every acknowledged FUA write and every acknowledged FLUSH, did persistence steps covering
 * every byte promised happen before the acknowledgement? What "covering" means depends on the path:
 * <ul>
 *   <li>pmem (flushesCaches): the byte was stored by a COPY/FILL or written back by a WRITE_BACK after the
 *       request was submitted, and a DRAIN <em>on the thread that did that step</em> followed before the ack
 *       (a drain orders only its own thread's non-temporal stores and write-backs);</li>
 *   <li>page cache: a SYNC covering the byte followed the request's last store (or, for stores the record
 *       cannot see, a device's or the kernel's, its submission) before the ack; any thread's SYNC counts.</li>
 * </ul>
 * A FLUSH promises every write acknowledged (OK) before the FLUSH was submitted, on any queue.
 */
final class DurabilityCheck {
    private final List<Event> events;
    private final boolean pmem;
    private final Map<Long, long[]> drainsByThread = new HashMap<>();
    private final Map<Long, Event> submits = new HashMap<>();
    private final List<Event> acks = new ArrayList<>();

    DurabilityCheck(List<Event> events, boolean pmem) {
        this.events = events;
        this.pmem = pmem;
        Map<Long, List<Long>> drains = new HashMap<>();
        for (Event e : events) {
            switch (e.kind()) {
                case DRAIN -> drains.computeIfAbsent(e.thread(), t -> new ArrayList<>()).add(e.seq());
                case SUBMIT -> submits.put(e.id(), e);
                case ACK -> acks.add(e);
                default -> { }
            }
        }
        drains.forEach((t, l) -> drainsByThread.put(t, l.stream().mapToLong(Long::longValue).toArray()));
    }

    /** Counts of what was checked, for the test's own sanity assertions. */
    record Checked(int fuaWrites, int flushes, int writesCoveredByFlushes) {}

    /** Throws AssertionError naming the first uncovered byte of the first broken promise. */
    Checked verify() {
        int fua = 0, flushes = 0, covered = 0;
        for (Event ack : acks) {
            if (!ack.what().endsWith("status 0")) {
                continue; // an error promises nothing
            }
            Event submit = submits.get(ack.id());
            if (submit == null) {
                throw new AssertionError("ack without submission: " + ack);
            }
            String op = ack.what();
            if (op.startsWith("FLUSH")) {
                flushes++;
                for (Event w : acks) {
                    if (w.seq() < submit.seq() && isWrite(w.what()) && w.what().endsWith("status 0")) {
                        requireDurable(submits.get(w.id()), w, ack.seq(), "FLUSH acknowledged at #" + ack.seq());
                        covered++;
                    }
                }
            } else if (isWrite(op) && op.contains(" FUA ")) {
                fua++;
                requireDurable(submit, ack, ack.seq(), "its own FUA acknowledgement");
            }
        }
        return new Checked(fua, flushes, covered);
    }

    private static boolean isWrite(String what) {
        return what.startsWith("WRITE") || what.startsWith("TRIM");
    }

    private void requireDurable(Event submit, Event ack, long deadline, String promise) {
        long from = submit.address(), to = submit.end();
        List<long[]> intervals = new ArrayList<>();
        if (pmem) {
            for (Event e : events) {
                if (e.seq() >= deadline) {
                    break;
                }
                if (e.seq() > submit.seq() && (e.kind() == Kind.COPY || e.kind() == Kind.FILL || e.kind() == Kind.WRITE_BACK)
                        && overlaps(e, from, to) && drainedBefore(e, deadline)) {
                    intervals.add(new long[]{Math.max(from, e.address()), Math.min(to, e.end())});
                }
            }
        } else {
            long lastStore = submit.seq();
            for (Event e : events) {
                if (e.seq() > submit.seq() && e.seq() < ack.seq() && (e.kind() == Kind.COPY || e.kind() == Kind.FILL)
                        && overlaps(e, from, to)) {
                    lastStore = Math.max(lastStore, e.seq());
                }
            }
            for (Event e : events) {
                if (e.seq() >= deadline) {
                    break;
                }
                if (e.seq() > lastStore && e.kind() == Kind.SYNC && overlaps(e, from, to)) {
                    intervals.add(new long[]{Math.max(from, e.address()), Math.min(to, e.end())});
                }
            }
        }
        long gap = firstUncovered(intervals, from, to);
        if (gap >= 0) {
            throw new AssertionError("not durable before " + promise + ": " + ack.what() + " (submitted #" + submit.seq()
                    + ", acked #" + ack.seq() + "): byte " + (gap - from) + " of " + (to - from)
                    + " has no " + (pmem ? "store/write-back drained on its own thread" : "msync after its store")
                    + " before #" + deadline);
        }
    }

    private boolean drainedBefore(Event step, long deadline) {
        long[] d = drainsByThread.get(step.thread());
        if (d == null) {
            return false;
        }
        int i = Arrays.binarySearch(d, step.seq() + 1);
        if (i < 0) {
            i = -i - 1;
        }
        return i < d.length && d[i] < deadline;
    }

    private static boolean overlaps(Event e, long from, long to) {
        return e.address() < to && e.end() > from;
    }

    /** The first address of [from, to) no interval covers, or -1. */
    static long firstUncovered(List<long[]> intervals, long from, long to) {
        intervals.sort((a, b) -> Long.compare(a[0], b[0]));
        long reached = from;
        for (long[] iv : intervals) {
            if (iv[0] > reached) {
                return reached;
            }
            reached = Math.max(reached, iv[1]);
            if (reached >= to) {
                return -1;
            }
        }
        return reached >= to ? -1 : reached;
    }
}
