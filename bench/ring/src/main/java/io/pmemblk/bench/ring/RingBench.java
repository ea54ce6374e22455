package io.pmemblk.bench.ring;

import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.uring.CompletionHandler;
import io.pmemblk.uring.CompletionQueue;
import io.pmemblk.uring.IoUring;
import io.pmemblk.uring.IoUringAbi;
import io.pmemblk.uring.SubmissionQueue;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * The ring alone, doing what {@code fio --ioengine=io_uring --rw=randread --bs=4k --iodepth=32} does: 4 KiB reads
 * at random 4 KiB-aligned offsets of one file, {@code qd} in flight, buffered (tmpfs has no O_DIRECT). Each loop
 * refills every free slot, submits the batch and waits for at least one completion in one io_uring_enter, then reaps.
 * Registered file and buffers (READ_FIXED), as the ublk data path will use them. Prints one line:
 * {@code ring: <iops> IOPS ...}. Run by scripts/bench-uring:
 * <pre>java --enable-native-access=ALL-UNNAMED -cp posix/target/classes:uring/target/classes:bench/ring/target/classes \
 *     io.pmemblk.bench.ring.RingBench /dev/shm/FILE SECONDS [QD] [WARMUP_SECONDS]</pre>
 */
public final class RingBench implements CompletionHandler {
    private static final int BLOCK = 4096;

    private final int[] freeSlots;
    private int freeCount;
    private long completed;
    private long errors;
    private int lastError;

    private RingBench(int qd) {
        freeSlots = new int[qd];
        for (int i = 0; i < qd; i++) {
            freeSlots[freeCount++] = qd - 1 - i;
        }
    }

    @Override
    public void onCompletion(long userData, int res, int flags) {
        if (res != BLOCK) {
            errors++;
            lastError = res;
        }
        completed++;
        freeSlots[freeCount++] = (int) userData;
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: RingBench FILE SECONDS [QD=32] [WARMUP_SECONDS=2]");
            System.exit(2);
        }
        Path file = Path.of(args[0]);
        long seconds = Long.parseLong(args[1]);
        int qd = args.length > 2 ? Integer.parseInt(args[2]) : 32;
        long warmup = args.length > 3 ? Long.parseLong(args[3]) : 2;
        long blocks = Files.size(file) / BLOCK;
        if (blocks == 0) {
            throw new IllegalArgumentException(file + " is smaller than one block");
        }
        int fd = FileCalls.open(file.toString(), FileCalls.O_RDONLY, 0);
        try (Arena arena = Arena.ofConfined();
             IoUring ring = IoUring.open(qd, 0, IoUringAbi.IORING_SETUP_COOP_TASKRUN | IoUringAbi.IORING_SETUP_SINGLE_ISSUER)) {
            MemorySegment all = arena.allocate((long) qd * BLOCK, BLOCK);
            MemorySegment[] buffers = new MemorySegment[qd];
            for (int i = 0; i < qd; i++) {
                buffers[i] = all.asSlice((long) i * BLOCK, BLOCK);
            }
            ring.registerFiles(fd);
            ring.registerBuffers(buffers);
            RingBench bench = new RingBench(qd);
            run(bench, ring, buffers, blocks, warmup * 1_000_000_000L, 0x9E3779B97F4A7C15L);
            long errorsBefore = bench.errors;
            long before = bench.completed;
            long t0 = System.nanoTime();
            long loops = run(bench, ring, buffers, blocks, seconds * 1_000_000_000L, 0xD1B54A32D192ED03L);
            double elapsed = (System.nanoTime() - t0) / 1e9;
            long ios = bench.completed - before;
            System.out.printf("ring: %.0f IOPS (%d reads in %.2f s, %.1f per io_uring_enter, qd %d, %d errors%s, %d MiB file)%n",
                    ios / elapsed, ios, elapsed, (double) ios / loops, qd, bench.errors - errorsBefore,
                    bench.errors > 0 ? ", last res " + bench.lastError : "", blocks * BLOCK >> 20);
            // Let the reads in flight finish before their buffers go.
            while (bench.freeCount < qd) {
                ring.submitAndWait(1);
                ring.cq().drain(bench);
            }
        } finally {
            Libc.close(fd);
        }
    }

    /** Returns the number of io_uring_enter calls. */
    private static long run(RingBench b, IoUring ring, MemorySegment[] buffers, long blocks, long nanos, long seed)
            throws Exception {
        SubmissionQueue sq = ring.sq();
        CompletionQueue cq = ring.cq();
        long x = seed;
        long loops = 0;
        long end = System.nanoTime() + nanos;
        while (System.nanoTime() < end) {
            while (b.freeCount > 0) {
                int slot = b.freeSlots[--b.freeCount];
                x ^= x << 13; // xorshift64
                x ^= x >>> 7;
                x ^= x << 17;
                long offset = Long.remainderUnsigned(x, blocks) * BLOCK;
                if (!sq.readFixed(0, buffers[slot], offset, slot, slot)) {
                    b.freeCount++;
                    break;
                }
                sq.setLastFlags(IoUringAbi.IOSQE_FIXED_FILE);
            }
            ring.submitAndWait(1);
            cq.drain(b);
            loops++;
        }
        return loops;
    }
}
