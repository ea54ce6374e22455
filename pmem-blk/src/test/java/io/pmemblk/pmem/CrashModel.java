package io.pmemblk.pmem;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.BitSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Random;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;

/**
 * A power-failure model under the persistence port: it does the real work, and keeps the image that would
 * survive a crash right now if nothing more were persisted ({@link #durable}). Stores the port cannot see (the
 * kernel receiving a payload in place, a ublk pread, a DMA engine) need no tracking: at a crash every unit whose
 * content differs from its durable image was written since it was last made durable, whoever wrote it.
 *
 * <h2>The x86-64 rules the driver relies on, as modelled</h2>
 * <ol>
 *   <li>Real pmem (ADR; the persistence domain is the memory controller). A unit is a 64-byte cache line.
 *     <ul>
 *       <li>Cached stores reach the persistence domain when their line is written back (CLWB/CLFLUSHOPT,
 *           libpmem's pmem_flush, which works on lines held in any core's cache or stored by a device with
 *           DDIO) and that write-back is fenced by an SFENCE on the thread that issued it (pmem_drain). Before
 *           that, the line may or may not have been evicted: either version may survive.</li>
 *       <li>Non-temporal stores (pmem_memcpy/memset with NODRAIN, from 256 bytes on) wait in the issuing core's
 *           write-combining buffers: durable after an SFENCE on the same thread, not before (libpmem flushes
 *           its small cached copies itself; the model treats every {@link #copy}/{@link #fill} alike).</li>
 *       <li>So: {@link #copy}, {@link #fill} and {@link #writeBack} put their lines on the calling thread's
 *           pending set; {@link #drain} on that thread makes them durable with their content at that moment.
 *           A drain on another thread makes nothing durable (Intel SDM vol. 2, SFENCE).</li>
 *     </ul></li>
 *   <li>Page cache (an ordinary file: the java mapper, or libpmem on a non-pmem file). A unit is a 4 KiB page:
 *       the kernel writes back whole pages, at any time or at msync, and a page write is assumed not to tear
 *       on the disk. {@link #sync} makes every page of its range durable with its content at that moment,
 *       whichever thread dirtied it; copies, fills, write-backs and drains make nothing durable.</li>
 *   <li>At a crash each unit whose content differs from its durable image keeps, independently of every other,
 *       either its durable (old) or its current (new) content ({@link #crashImage}). Intermediate versions a
 *       unit held between two durable points are not produced (a simplification: the checks only need "old
 *       or new").</li>
 * </ol>
 * Content is taken when the durability step runs; a store racing with the step on another thread (two
 * overlapping requests in flight at once, which no block device orders) is not modelled.
 */
public final class CrashModel implements Persistence {
    static final int PMEM_UNIT = 64, PAGE_UNIT = 4096;
    /** The unit of x86's power-fail atomicity: an aligned 8-byte store. */
    public static final int ATOMIC_UNIT = 8;

    private final Persistence real;
    private final int unit;
    private MemorySegment memory;
    private long base;
    private byte[] durable;
    private final Map<Long, BitSet> pending = new HashMap<>();
    private volatile Runnable afterStep = () -> { };
    private volatile Runnable afterWriteBack = () -> { };

    public CrashModel(Persistence real) {
        this(real, PMEM_UNIT);
    }

    /**
     * A model whose pmem unit is {@code pmemUnit} bytes, 64 (a cache line) or 8: x86 promises power-fail
     * atomicity for aligned 8-byte stores only, so a line written back but not yet drained may reach the media
     * in part. A layout that orders two stores within one line (the BTT's flog halves) is checked with 8. The
     * page cache's unit stays the page.
     */
    public CrashModel(Persistence real, int pmemUnit) {
        if (pmemUnit != PMEM_UNIT && pmemUnit != ATOMIC_UNIT) {
            throw new IllegalArgumentException("pmem unit " + pmemUnit + "; allowed: " + PMEM_UNIT + ", " + ATOMIC_UNIT);
        }
        this.real = real;
        this.unit = real.flushesCaches() ? pmemUnit : PAGE_UNIT;
    }

    /** A region and the crash model that is its persistence port, attached. */
    public record Modelled(PmemRegion region, CrashModel model) {}

    /**
     * A new region of {@code size} bytes at {@code file} whose persistence is a crash model attached before any
     * I/O: for the frontends' crash tests in other modules (shipped in pmem's test jar, like
     * {@link PersistenceRecorder}), which drive the real driver under their own protocol and take images.
     */
    public static Modelled open(Path file, long size, PmemRegion.Mapper mapper) throws IOException {
        return open(file, size, mapper, PMEM_UNIT);
    }

    /** As {@link #open(Path, long, PmemRegion.Mapper)} with a pmem unit of {@code pmemUnit} bytes ({@link #CrashModel(Persistence, int)}). */
    public static Modelled open(Path file, long size, PmemRegion.Mapper mapper, int pmemUnit) throws IOException {
        RegionPorts.Opened<CrashModel> o = RegionPorts.open(file, size, mapper, p -> new CrashModel(p, pmemUnit));
        o.port().attach(o.region().memory());
        return new Modelled(o.region(), o.port());
    }

    /** Starts modelling {@code mapping} (before any I/O): what it holds now is durable. */
    public synchronized void attach(MemorySegment mapping) {
        this.memory = mapping;
        this.base = mapping.address();
        this.durable = mapping.toArray(JAVA_BYTE);
    }

    /**
     * Runs {@code hook} after each durability step (drain, msync), on the thread that took it and outside the
     * model's lock: where a crash test takes and judges an image while the other threads go on.
     */
    public void afterEachStep(Runnable hook) {
        afterStep = hook;
    }

    /**
     * Runs {@code hook} after each write-back too (as {@link #afterEachStep}): a crash between a write-back and its
     * drain, where a layout that forgot a drain between two of its steps shows it (nothing is durable there that
     * was not before, but a unit written back and not drained may land or not).
     */
    public void afterEachWriteBack(Runnable hook) {
        afterWriteBack = hook;
    }

    public int unit() {
        return unit;
    }

    private void markPending(MemorySegment range) {
        if (memory == null || range.byteSize() == 0) {
            return;
        }
        BitSet p = pending.computeIfAbsent(Thread.currentThread().threadId(), t -> new BitSet());
        long off = range.address() - base;
        p.set((int) (off / unit), (int) ((off + range.byteSize() - 1) / unit) + 1);
    }

    private void makeDurable(int fromUnit, int toUnit) {
        long from = (long) fromUnit * unit;
        long to = Math.min((long) toUnit * unit, durable.length);
        MemorySegment.copy(memory, JAVA_BYTE, from, durable, (int) from, (int) (to - from));
    }

    @Override
    public boolean flushesCaches() {
        return real.flushesCaches();
    }

    @Override
    public synchronized void copy(MemorySegment src, MemorySegment dst) {
        real.copy(src, dst);
        if (real.flushesCaches()) {
            markPending(dst);
        }
    }

    @Override
    public synchronized void fill(MemorySegment dst, byte value) {
        real.fill(dst, value);
        if (real.flushesCaches()) {
            markPending(dst);
        }
    }

    @Override
    public void writeBack(MemorySegment range) {
        wroteBack(range);
        afterWriteBack.run();
    }

    private synchronized void wroteBack(MemorySegment range) {
        real.writeBack(range);
        markPending(range);
    }

    @Override
    public void drain() {
        drained();
        afterStep.run();
    }

    private synchronized void drained() {
        real.drain();
        BitSet p = pending.remove(Thread.currentThread().threadId());
        if (p != null && memory != null) {
            for (int u = p.nextSetBit(0); u >= 0; u = p.nextSetBit(u + 1)) {
                int end = p.nextClearBit(u);
                makeDurable(u, end);
                u = end;
            }
        }
    }

    @Override
    public void sync(MemorySegment range) throws IOException {
        synced(range);
        afterStep.run();
    }

    private synchronized void synced(MemorySegment range) throws IOException {
        real.sync(range);
        if (memory != null && range.byteSize() > 0) {
            long off = range.address() - base;
            makeDurable((int) (off / unit), (int) ((off + range.byteSize() - 1) / unit) + 1);
        }
    }

    @Override
    public void syncCreated(io.pmemblk.posix.TrustedFile file) throws IOException {
        real.syncCreated(file);
    }

    /**
     * One possible content of the device after a power failure now: every unit that differs from its durable
     * image keeps the old or the new bytes, chosen by {@code rnd}. Call it holding this model's lock (through
     * {@link #atomically}) so that no durability step is half-applied.
     */
    public byte[] crashImage(Random rnd) {
        byte[] now = memory.toArray(JAVA_BYTE);
        byte[] image = durable.clone();
        int n = image.length;
        // Unit by unit in address order, as a loop over every unit would, but skipping equal stretches in one
        // vectorised compare (8-byte units make a loop over every unit slow).
        for (int from = 0; from < n; ) {
            int m = java.util.Arrays.mismatch(now, from, n, image, from, n);
            if (m < 0) {
                break;
            }
            int u = (from + m) / unit * unit;
            int len = Math.min(unit, n - u);
            if (rnd.nextBoolean()) {
                System.arraycopy(now, u, image, u, len);
            }
            from = u + len;
        }
        return image;
    }

    /** Runs {@code r} with no persistence step in progress (the steps are serialised on this model). */
    public synchronized <T> T atomically(java.util.function.Supplier<T> r) {
        return r.get();
    }
}
