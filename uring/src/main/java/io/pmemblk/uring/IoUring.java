package io.pmemblk.uring;

import io.pmemblk.posix.IoUringSyscalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;

import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

import static io.pmemblk.uring.IoUringAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * One io_uring instance: its fd, the three mappings (SQ ring, CQ ring, SQE array) and the two queue views.
 * The ring owns a shared {@link Arena} that owns the mappings, so {@link #close()} unmaps them and any later use
 * of a view fails with IllegalStateException rather than touching unmapped memory. Not thread-safe: one thread
 * submits and reaps (the kernel's model too; see IORING_SETUP_SINGLE_ISSUER).
 *
 * <p>Every ring is created with IORING_SETUP_SUBMIT_ALL (a bad SQE fails in its own CQE instead of stopping the
 * batch behind it) and, when {@code cqEntries} is given, IORING_SETUP_CQSIZE.
 */
public final class IoUring implements AutoCloseable {
    private final int fd;
    private final int setupFlags;
    private final int features;
    private final Arena mappings;
    private final SubmissionQueue sq;
    private final CompletionQueue cq;
    private boolean closed;

    /** A ring of {@code entries} SQEs and the kernel's default CQ size (twice that). */
    public static IoUring open(int entries) throws NativeException {
        return open(entries, 0, 0);
    }

    /**
     * A ring of {@code sqEntries} SQEs (rounded up to a power of two by the kernel) and {@code cqEntries} CQEs
     * (0: the kernel's default, 2 × SQ), with extra IORING_SETUP_* {@code flags} such as
     * {@link IoUringAbi#IORING_SETUP_SQE128} for URING_CMD or COOP_TASKRUN / SINGLE_ISSUER.
     */
    public static IoUring open(int sqEntries, int cqEntries, int flags) throws NativeException {
        if (sqEntries < 1 || sqEntries > IORING_MAX_ENTRIES) {
            throw new IllegalArgumentException("sqEntries " + sqEntries + " outside 1.." + IORING_MAX_ENTRIES);
        }
        if (cqEntries != 0 && (cqEntries < sqEntries || cqEntries > IORING_MAX_CQ_ENTRIES)) {
            throw new IllegalArgumentException("cqEntries " + cqEntries + " outside " + sqEntries + ".."
                    + IORING_MAX_CQ_ENTRIES + " (0 for the default, twice sqEntries)");
        }
        if ((flags & IORING_SETUP_CQE32) != 0) {
            throw new IllegalArgumentException("IORING_SETUP_CQE32 is not supported (16-byte CQEs only)");
        }
        int setupFlags = flags | IORING_SETUP_SUBMIT_ALL | (cqEntries != 0 ? IORING_SETUP_CQSIZE : 0);
        MemorySegment p;
        int fd;
        try (Arena call = Arena.ofConfined()) {
            p = call.allocate(PARAMS_SIZE, 8); // zeroed: resv and sq_thread_* must be 0
            p.set(JAVA_INT, PARAMS_FLAGS, setupFlags);
            p.set(JAVA_INT, PARAMS_CQ_ENTRIES, cqEntries);
            fd = IoUringSyscalls.setup(sqEntries, p);
            p = MemorySegment.ofArray(p.toArray(JAVA_INT)); // the kernel's answer, outliving the call arena
        }
        Arena mappings = Arena.ofShared();
        try {
            return new IoUring(fd, setupFlags, p, mappings);
        } catch (NativeException | RuntimeException e) {
            mappings.close();
            try {
                Libc.close(fd);
            } catch (NativeException suppressed) {
                e.addSuppressed(suppressed);
            }
            throw e;
        }
    }

    private IoUring(int fd, int setupFlags, MemorySegment p, Arena mappings) throws NativeException {
        this.fd = fd;
        this.setupFlags = setupFlags;
        this.mappings = mappings;
        int sqEntries = p.get(JAVA_INT, PARAMS_SQ_ENTRIES);
        int cqEntries = p.get(JAVA_INT, PARAMS_CQ_ENTRIES);
        this.features = p.get(JAVA_INT, PARAMS_FEATURES);
        int sqArray = p.get(JAVA_INT, PARAMS_SQ_OFF + SQ_OFF_ARRAY);
        int cqes = p.get(JAVA_INT, PARAMS_CQ_OFF + CQ_OFF_CQES);
        long sqRingSize = sqArray + 4L * sqEntries;
        long cqRingSize = cqes + (long) CQE_SIZE * cqEntries;
        MemorySegment sqRing;
        MemorySegment cqRing;
        if ((features & IORING_FEAT_SINGLE_MMAP) != 0) { // one mapping holds both rings (5.4+)
            sqRing = IoUringSyscalls.mapRing(fd, Math.max(sqRingSize, cqRingSize), IORING_OFF_SQ_RING, mappings);
            cqRing = sqRing;
        } else {
            sqRing = IoUringSyscalls.mapRing(fd, sqRingSize, IORING_OFF_SQ_RING, mappings);
            cqRing = IoUringSyscalls.mapRing(fd, cqRingSize, IORING_OFF_CQ_RING, mappings);
        }
        int sqeSize = (setupFlags & IORING_SETUP_SQE128) != 0 ? SQE128_SIZE : SQE_SIZE;
        MemorySegment sqes = IoUringSyscalls.mapRing(fd, (long) sqeSize * sqEntries, IORING_OFF_SQES, mappings);
        // The index array maps ring slot i to SQE i for ever, so it is written once here (as netty and liburing do)
        // and each SQE is prepared in place in the slot it will be submitted from.
        for (int i = 0; i < sqEntries; i++) {
            sqRing.set(JAVA_INT, sqArray + 4L * i, i);
        }
        this.sq = new SubmissionQueue(this, sqRing, sqes, p, sqeSize);
        this.cq = new CompletionQueue(this, cqRing, sqRing, p);
    }

    public SubmissionQueue sq() {
        return sq;
    }

    public CompletionQueue cq() {
        return cq;
    }

    /** Publishes every prepared SQE and has the kernel consume them; returns how many it consumed. */
    public int submit() throws NativeException {
        return sq.submit();
    }

    /**
     * Publishes every prepared SQE and waits until at least {@code minComplete} CQEs are ready (already ready ones
     * count); returns how many SQEs the kernel consumed. Reap them with {@link CompletionQueue#drain}.
     */
    public int submitAndWait(int minComplete) throws NativeException {
        return sq.submitAndWait(minComplete);
    }

    /** IORING_REGISTER_FILES: afterwards an SQE flagged IOSQE_FIXED_FILE names {@code fds[i]} by the index i. */
    public void registerFiles(int... fds) throws NativeException {
        ensureOpen();
        try (Arena call = Arena.ofConfined()) {
            MemorySegment array = call.allocateFrom(JAVA_INT, fds);
            IoUringSyscalls.register(fd, IORING_REGISTER_FILES, array, fds.length);
        }
    }

    public void unregisterFiles() throws NativeException {
        ensureOpen();
        IoUringSyscalls.register(fd, IORING_UNREGISTER_FILES, MemorySegment.NULL, 0);
    }

    /**
     * IORING_REGISTER_BUFFERS: the kernel pins {@code buffers} once, and READ_FIXED/WRITE_FIXED name buffer i by
     * its index instead of pinning pages per request. The caller keeps the buffers alive until
     * {@link #unregisterBuffers()} or {@link #close()}; they must be native memory (the kernel needs addresses).
     */
    public void registerBuffers(MemorySegment... buffers) throws NativeException {
        ensureOpen();
        try (Arena call = Arena.ofConfined()) {
            MemorySegment iovecs = call.allocate((long) IOVEC_SIZE * buffers.length, 8);
            for (int i = 0; i < buffers.length; i++) {
                MemorySegment b = buffers[i];
                if (!b.isNative()) {
                    throw new IllegalArgumentException("buffer " + i + " is on the Java heap; registered buffers must be native memory");
                }
                iovecs.set(JAVA_LONG, (long) i * IOVEC_SIZE + IOVEC_BASE, b.address());
                iovecs.set(JAVA_LONG, (long) i * IOVEC_SIZE + IOVEC_LEN, b.byteSize());
            }
            IoUringSyscalls.register(fd, IORING_REGISTER_BUFFERS, iovecs, buffers.length);
        }
    }

    public void unregisterBuffers() throws NativeException {
        ensureOpen();
        IoUringSyscalls.register(fd, IORING_UNREGISTER_BUFFERS, MemorySegment.NULL, 0);
    }

    public int fd() {
        return fd;
    }

    /** IORING_FEAT_* the kernel reported at setup. */
    public int features() {
        return features;
    }

    /** The IORING_SETUP_* flags the ring was created with (including the ones this class adds). */
    public int setupFlags() {
        return setupFlags;
    }

    public boolean isClosed() {
        return closed;
    }

    void ensureOpen() {
        if (closed) {
            throw new IllegalStateException("io_uring (fd " + fd + ") is closed");
        }
    }

    /**
     * Unmaps the rings and closes the fd, which also drops registered files and buffers. Requests still in flight
     * are cancelled by the kernel; their buffers must stay valid until then, so close only an idle ring.
     * Idempotent.
     */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        mappings.close();
        try {
            Libc.close(fd);
        } catch (NativeException e) {
            throw new UncheckedIOException(e);
        }
    }
}
