package io.pmemblk.pmem;

import io.pmemblk.queueing.Request;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A persistence port that does the real work and records it: every step, with a global sequence number taken
 * after the step returned, the thread that did it and the range it covered. The test frontend records its
 * submissions and acknowledgements into the same sequence, so "persisted before acknowledged" is a comparison
 * of numbers: an ack's number is taken when its completion starts, before any reply could leave.
 */
final class RecordingPersistence extends ForwardingPersistence {
    enum Kind { COPY, FILL, WRITE_BACK, DRAIN, SYNC, SYNC_FAILED, SYNC_CREATED, SUBMIT, ACK }

    /** One recorded step. For SUBMIT/ACK, {@code id} is the request's id and address the absolute start of its range. */
    record Event(long seq, long thread, Kind kind, long address, long length, long id, String what) {
        long end() {
            return address + length;
        }
    }

    private final AtomicLong seq = new AtomicLong();
    private final ConcurrentLinkedQueue<Event> events = new ConcurrentLinkedQueue<>();
    /** The next this-many syncs fail (fault injection), after doing nothing. */
    final AtomicInteger failSyncs = new AtomicInteger();

    RecordingPersistence(Persistence real) {
        super(real);
    }

    private void record(Kind kind, long address, long length, long id, String what) {
        events.add(new Event(seq.incrementAndGet(), Thread.currentThread().threadId(), kind, address, length, id, what));
    }

    /** The frontend is about to dispatch {@code r} (its data already in place); r.cookie is its id. */
    void submitted(Request r, long base) {
        record(Kind.SUBMIT, base + r.offset, r.length, r.cookie, describe(r));
    }

    /** {@code r}'s completion has started: from here on its reply may be sent. */
    void acknowledged(Request r, long base) {
        record(Kind.ACK, base + r.offset, r.length, r.cookie, describe(r) + " status " + r.status());
    }

    /** As {@link #submitted(Request, long)}, for a frontend that has no Request at hand (PersistenceRecorder). */
    void submitted(long id, String what, long address, long length) {
        record(Kind.SUBMIT, address, length, id, what);
    }

    /** As {@link #acknowledged(Request, long)}; {@code what} ends with " status N". */
    void acknowledged(long id, String what, long address, long length) {
        record(Kind.ACK, address, length, id, what);
    }

    private static String describe(Request r) {
        return r.op + (r.fua ? " FUA" : "") + " off " + r.offset + " len " + r.length
                + (r.dataInPlace ? " in-place" : "") + (r.route != null ? " by " + r.route : "");
    }

    List<Event> events() {
        List<Event> l = new ArrayList<>(events);
        l.sort(Comparator.comparingLong(Event::seq));
        return l;
    }

    @Override
    public void copy(MemorySegment src, MemorySegment dst) {
        real.copy(src, dst);
        record(Kind.COPY, dst.address(), dst.byteSize(), 0, null);
    }

    @Override
    public void fill(MemorySegment dst, byte value) {
        real.fill(dst, value);
        record(Kind.FILL, dst.address(), dst.byteSize(), 0, null);
    }

    @Override
    public void writeBack(MemorySegment range) {
        real.writeBack(range);
        record(Kind.WRITE_BACK, range.address(), range.byteSize(), 0, null);
    }

    @Override
    public void drain() {
        real.drain();
        record(Kind.DRAIN, 0, 0, 0, null);
    }

    @Override
    public void sync(MemorySegment range) throws IOException {
        if (failSyncs.getAndUpdate(n -> Math.max(0, n - 1)) > 0) {
            record(Kind.SYNC_FAILED, range.address(), range.byteSize(), 0, null);
            throw new IOException("injected msync failure (EIO)");
        }
        real.sync(range);
        record(Kind.SYNC, range.address(), range.byteSize(), 0, null);
    }

    @Override
    public void syncCreated(io.pmemblk.posix.TrustedFile file) throws IOException {
        real.syncCreated(file);
        record(Kind.SYNC_CREATED, 0, 0, 0, file.path().toString());
        for (java.nio.file.Path d : file.directory().madeDirectories()) {
            record(Kind.SYNC_CREATED, 0, 0, 0, d.toString());
        }
    }
}
