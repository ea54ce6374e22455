package io.pmemblk.uring;

import io.pmemblk.posix.Errno;
import io.pmemblk.posix.IoUringSyscalls;
import io.pmemblk.posix.NativeException;

import java.lang.foreign.MemorySegment;
import java.lang.invoke.VarHandle;

import static io.pmemblk.uring.IoUringAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

/**
 * The submission side of an {@link IoUring}: SQEs are prepared in place in the mapped SQE array (no object per
 * request), and a whole batch is published with one release store of the tail and handed to the kernel with one
 * io_uring_enter. Every {@code prepare} method returns {@code false} when the SQ is full (nothing written); then
 * {@link #submit()} frees the slots. A view: it owns nothing, the ring does.
 *
 * <p>Ordering (io_uring/io_uring.c, header comment): SQE contents are plain stores; the tail store is a release so
 * the kernel, which loads the tail with acquire, sees them. The kernel's head is read with acquire (it is stored
 * with release once the kernel has read the SQEs, so a slot is only reused after that).
 */
public final class SubmissionQueue {
    /** int at (segment, offset); acquire/release need the 4-byte alignment the kernel's ring fields have. */
    private static final VarHandle INT = JAVA_INT.varHandle();

    private final IoUring ring;
    private final int fd;
    private final MemorySegment sqRing;
    private final MemorySegment sqes;
    private final long headOff;
    private final long tailOff;
    private final long flagsOff;
    private final long droppedOff;
    private final int mask;
    private final int entries;
    private final int sqeSize;
    private final int sqeShift;
    /** Next slot to prepare; slots [published, tail) are prepared but not yet visible to the kernel. */
    private int tail;
    private int published;
    /** Last kernel head seen; refreshed only when the ring looks full. */
    private int head;
    /** Offset in {@link #sqes} of the last SQE prepared, for {@link #setLastFlags}. */
    private long last = -1;

    SubmissionQueue(IoUring ring, MemorySegment sqRing, MemorySegment sqes, MemorySegment params, int sqeSize) {
        this.ring = ring;
        this.fd = ring.fd();
        this.sqRing = sqRing;
        this.sqes = sqes;
        this.headOff = params.get(JAVA_INT, PARAMS_SQ_OFF + SQ_OFF_HEAD);
        this.tailOff = params.get(JAVA_INT, PARAMS_SQ_OFF + SQ_OFF_TAIL);
        this.flagsOff = params.get(JAVA_INT, PARAMS_SQ_OFF + SQ_OFF_FLAGS);
        this.droppedOff = params.get(JAVA_INT, PARAMS_SQ_OFF + SQ_OFF_DROPPED);
        this.mask = sqRing.get(JAVA_INT, params.get(JAVA_INT, PARAMS_SQ_OFF + SQ_OFF_RING_MASK));
        this.entries = sqRing.get(JAVA_INT, params.get(JAVA_INT, PARAMS_SQ_OFF + SQ_OFF_RING_ENTRIES));
        this.sqeSize = sqeSize;
        this.sqeShift = Integer.numberOfTrailingZeros(sqeSize);
        this.head = (int) INT.getAcquire(sqRing, headOff);
        this.tail = (int) INT.getAcquire(sqRing, tailOff);
        this.published = tail;
    }

    /** SQ slots (a power of two). */
    public int entries() {
        return entries;
    }

    /** 64, or 128 on an IORING_SETUP_SQE128 ring. */
    public int sqeSize() {
        return sqeSize;
    }

    /** Slots free for preparing now. */
    public int free() {
        ring.ensureOpen();
        head = (int) INT.getAcquire(sqRing, headOff);
        return entries - (tail - head);
    }

    /** SQEs prepared and not yet consumed by the kernel (published or not). */
    public int pending() {
        ring.ensureOpen();
        head = (int) INT.getAcquire(sqRing, headOff);
        return tail - head;
    }

    /**
     * Claims the next slot and zeroes its SQE; returns the SQE's byte offset in {@link #sqes()}, or -1 when the
     * SQ is full. For opcodes without a {@code prepare} method: fill the fields at the IoUringAbi.SQE_* offsets.
     */
    public long next() {
        ring.ensureOpen();
        if (tail - head == entries) {
            head = (int) INT.getAcquire(sqRing, headOff);
            if (tail - head == entries) {
                return -1;
            }
        }
        long off = (long) (tail & mask) << sqeShift;
        for (long i = 0; i < sqeSize; i += 8) {
            sqes.set(JAVA_LONG, off + i, 0L);
        }
        tail++;
        last = off;
        return off;
    }

    /** The mapped SQE array (a view: valid until the ring is closed). */
    public MemorySegment sqes() {
        return sqes;
    }

    /** ORs IOSQE_* {@code flags} (IOSQE_FIXED_FILE, IOSQE_IO_LINK, ...) into the SQE prepared last. */
    public void setLastFlags(byte flags) {
        if (last < 0) {
            throw new IllegalStateException("no SQE prepared yet");
        }
        sqes.set(JAVA_BYTE, last + SQE_FLAGS, (byte) (sqes.get(JAVA_BYTE, last + SQE_FLAGS) | flags));
    }

    private long rw(byte opcode, int fd, long addr, int len, long offset, long userData) {
        long sqe = next();
        if (sqe >= 0) {
            sqes.set(JAVA_BYTE, sqe + SQE_OPCODE, opcode);
            sqes.set(JAVA_INT, sqe + SQE_FD, fd);
            sqes.set(JAVA_LONG, sqe + SQE_OFF, offset);
            sqes.set(JAVA_LONG, sqe + SQE_ADDR, addr);
            sqes.set(JAVA_INT, sqe + SQE_LEN, len);
            sqes.set(JAVA_LONG, sqe + SQE_USER_DATA, userData);
        }
        return sqe;
    }

    private static int length(MemorySegment buffer) {
        if (buffer.byteSize() > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("buffer of " + buffer.byteSize() + " bytes; one SQE moves at most 2^31-1");
        }
        if (!buffer.isNative()) {
            throw new IllegalArgumentException("buffer is on the Java heap; the kernel needs native memory");
        }
        return (int) buffer.byteSize();
    }

    /** IORING_OP_NOP: completes with res 0 and {@code userData}. */
    public boolean nop(long userData) {
        return rw(IORING_OP_NOP, -1, 0, 0, 0, userData) >= 0;
    }

    /**
     * IORING_OP_READ of {@code buffer.byteSize()} bytes at {@code offset} of {@code fd} into {@code buffer}, which
     * must stay valid until the CQE. {@code offset} -1 reads at the file position.
     */
    public boolean read(int fd, MemorySegment buffer, long offset, long userData) {
        return rw(IORING_OP_READ, fd, buffer.address(), length(buffer), offset, userData) >= 0;
    }

    /** IORING_OP_WRITE of all of {@code buffer} at {@code offset} of {@code fd}. */
    public boolean write(int fd, MemorySegment buffer, long offset, long userData) {
        return rw(IORING_OP_WRITE, fd, buffer.address(), length(buffer), offset, userData) >= 0;
    }

    /**
     * IORING_OP_READ_FIXED into {@code buffer}, which must lie inside registered buffer {@code bufIndex}
     * (the kernel checks: -EFAULT otherwise).
     */
    public boolean readFixed(int fd, MemorySegment buffer, long offset, int bufIndex, long userData) {
        long sqe = rw(IORING_OP_READ_FIXED, fd, buffer.address(), length(buffer), offset, userData);
        if (sqe >= 0) {
            sqes.set(JAVA_SHORT, sqe + SQE_BUF_INDEX, (short) bufIndex);
        }
        return sqe >= 0;
    }

    /** IORING_OP_WRITE_FIXED from {@code buffer}, inside registered buffer {@code bufIndex}. */
    public boolean writeFixed(int fd, MemorySegment buffer, long offset, int bufIndex, long userData) {
        long sqe = rw(IORING_OP_WRITE_FIXED, fd, buffer.address(), length(buffer), offset, userData);
        if (sqe >= 0) {
            sqes.set(JAVA_SHORT, sqe + SQE_BUF_INDEX, (short) bufIndex);
        }
        return sqe >= 0;
    }

    /** IORING_OP_READV into {@code count} struct iovecs at {@code iovecs} (kept valid until the CQE). */
    public boolean readv(int fd, MemorySegment iovecs, int count, long offset, long userData) {
        checkIovecs(iovecs, count);
        return rw(IORING_OP_READV, fd, iovecs.address(), count, offset, userData) >= 0;
    }

    /** IORING_OP_WRITEV from {@code count} struct iovecs at {@code iovecs}. */
    public boolean writev(int fd, MemorySegment iovecs, int count, long offset, long userData) {
        checkIovecs(iovecs, count);
        return rw(IORING_OP_WRITEV, fd, iovecs.address(), count, offset, userData) >= 0;
    }

    private static void checkIovecs(MemorySegment iovecs, int count) {
        if (count < 0 || (long) count * IOVEC_SIZE > iovecs.byteSize() || !iovecs.isNative()) {
            throw new IllegalArgumentException(count + " iovecs asked for in a " + iovecs.byteSize()
                    + "-byte " + (iovecs.isNative() ? "native" : "heap") + " segment; each is " + IOVEC_SIZE + " native bytes");
        }
    }

    /** IORING_OP_FSYNC; {@code fsyncFlags} 0 or {@link IoUringAbi#IORING_FSYNC_DATASYNC}. */
    public boolean fsync(int fd, int fsyncFlags, long userData) {
        long sqe = rw(IORING_OP_FSYNC, fd, 0, 0, 0, userData);
        if (sqe >= 0) {
            sqes.set(JAVA_INT, sqe + SQE_OP_FLAGS, fsyncFlags);
        }
        return sqe >= 0;
    }

    /**
     * IORING_OP_URING_CMD: {@code cmdOp} for the driver behind {@code fd} (ublk's UBLK_U_CMD_*), with {@code cmd}
     * copied into the SQE's cmd area at offset 48: up to 16 bytes, or 80 on an SQE128 ring (ublk needs that).
     */
    public boolean uringCmd(int fd, int cmdOp, MemorySegment cmd, long userData) {
        int room = sqeSize == SQE128_SIZE ? SQE128_CMD_SIZE : SQE_CMD_SIZE;
        if (cmd.byteSize() > room) {
            throw new IllegalArgumentException("URING_CMD payload of " + cmd.byteSize() + " bytes; this ring's "
                    + sqeSize + "-byte SQEs hold " + room + (room == SQE_CMD_SIZE ? " (create it with IORING_SETUP_SQE128)" : ""));
        }
        long sqe = uringCmd(fd, (byte) 0, cmdOp, userData);
        if (sqe < 0) {
            return false;
        }
        MemorySegment.copy(cmd, 0, sqes, sqe + SQE_CMD, cmd.byteSize());
        return true;
    }

    /**
     * IORING_OP_URING_CMD whose cmd area the caller writes in place at {@code sqes().asSlice(returned +
     * IoUringAbi.SQE_CMD)} (zeroed, 16 bytes, 80 on an SQE128 ring): for a hot loop that fills a few fields
     * and should neither build nor copy a payload segment. {@code sqeFlags} are IOSQE_* (IOSQE_FIXED_FILE: fd
     * is a registered file's index).
     * @return the SQE's offset in {@link #sqes()}, or -1 when the queue is full
     */
    public long uringCmd(int fd, byte sqeFlags, int cmdOp, long userData) {
        long sqe = next();
        if (sqe >= 0) {
            sqes.set(JAVA_BYTE, sqe + SQE_OPCODE, IORING_OP_URING_CMD);
            sqes.set(JAVA_BYTE, sqe + SQE_FLAGS, sqeFlags);
            sqes.set(JAVA_INT, sqe + SQE_FD, fd);
            sqes.set(JAVA_INT, sqe + SQE_CMD_OP, cmdOp); // __pad1, addr, len, uring_cmd_flags stay 0
            sqes.set(JAVA_LONG, sqe + SQE_USER_DATA, userData);
        }
        return sqe;
    }

    /** Publishes the prepared SQEs to the kernel (one release store) without entering it. */
    private int publish() {
        if (published != tail) {
            INT.setRelease(sqRing, tailOff, tail);
            published = tail;
        }
        head = (int) INT.getAcquire(sqRing, headOff);
        return tail - head;
    }

    /** Publishes the prepared SQEs and has the kernel consume them: one io_uring_enter for the whole batch. */
    public int submit() throws NativeException {
        ring.ensureOpen();
        int toSubmit = publish();
        return toSubmit == 0 ? 0 : enter(toSubmit, 0, 0);
    }

    /**
     * Like {@link #submit()}, and waits until at least {@code minComplete} CQEs are ready. Returns the number of
     * SQEs consumed; 0 also when the kernel answered EAGAIN/EBUSY (short of memory, or CQ overflow it could not
     * flush): reap the CQ and call again. A signal that interrupts the wait after SQEs were consumed ends it early
     * (the kernel then reports the count, not EINTR), so callers loop on what {@link CompletionQueue#drain} finds.
     */
    public int submitAndWait(int minComplete) throws NativeException {
        ring.ensureOpen();
        int toSubmit = publish();
        return enter(toSubmit, minComplete, minComplete > 0 ? IORING_ENTER_GETEVENTS : 0);
    }

    private int enter(int toSubmit, int minComplete, int flags) throws NativeException {
        int r;
        do {
            r = IoUringSyscalls.enter(fd, toSubmit, minComplete, flags);
            // EINTR (a JVM signal): nothing was consumed and nothing waited for; the same call again is right.
        } while (r == -Errno.EINTR);
        head = (int) INT.getAcquire(sqRing, headOff);
        return Math.max(r, 0);
    }

    /** Kernel flags of the SQ ring (IORING_SQ_CQ_OVERFLOW, IORING_SQ_TASKRUN, ...), read with acquire. */
    int ringFlags() {
        return (int) INT.getAcquire(sqRing, flagsOff);
    }

    /** SQEs the kernel dropped as invalid (sq ring {@code dropped}); stays 0 unless an index in the array is bad. */
    public int dropped() {
        ring.ensureOpen();
        return (int) INT.getAcquire(sqRing, droppedOff);
    }

    /** For the overflow flush: enter with GETEVENTS and nothing to submit or wait for. */
    void flushOverflow() throws NativeException {
        enter(0, 0, IORING_ENTER_GETEVENTS);
    }
}
