import io.pmemblk.pmem.*;
import io.pmemblk.posix.Libc;
import java.lang.foreign.*;
import java.nio.file.*;
import java.util.Arrays;

/**
 * What the fault-safe copies cost against the native ones they replaced, in one JVM, alternating per round
 * (medians of 9 rounds): reads (MemorySegment.copy in 64 KiB pieces + a native round trip, was libc memcpy from
 * 4 KiB), pmem writes (a probe of the destination's pages before pmem_memcpy, + drain as before), zeroing on the
 * page-cache path (MemorySegment.fill in pieces, was libc memset).
 *   PMEM_IS_PMEM_FORCE=1 java --enable-native-access=ALL-UNNAMED -cp pmem-blk/target/classes:posix/target/classes:queueing/target/classes pmem-blk/measure/FaultSafeCopyCost.java
 */
public class FaultSafeCopyCost {
    interface Op { void run(long off, int len); }

    public static void main(String[] a) throws Exception {
        Libpmem lib = Libpmem.load().orElseThrow();
        Path pp = Path.of("/dev/shm/fscc-pmem-" + ProcessHandle.current().pid());
        Path pj = Path.of("/dev/shm/fscc-java-" + ProcessHandle.current().pid());
        long span = 256L << 20;
        try (PmemRegion pm = PmemRegion.open(pp, span, false, PmemRegion.Mapper.LIBPMEM);
             PmemRegion jv = PmemRegion.open(pj, span, false, PmemRegion.Mapper.JAVA);
             Arena ar = Arena.ofShared()) {
            System.out.println(pm + "\n" + jv);
            MemorySegment buf = ar.allocate(2 << 20, 4096);
            MemorySegment pmm = pm.memory(), jvm = jv.memory();
            pmm.fill((byte) 1); jvm.fill((byte) 1);
            for (int len : new int[]{4096, 65536, 2 << 20}) {
                compare("read " + len + " (pmem map)", len, span,
                        (off, n) -> Libc.memcpy(buf.asSlice(0, n), pmm.asSlice(off, n)),
                        (off, n) -> pm.read(off, buf, 0, n));
                compare("write " + len + " (pmem, NT)", len, span,
                        (off, n) -> { lib.memcpy(pmm.asSlice(off, n), buf.asSlice(0, n), Libpmem.PMEM_F_MEM_NODRAIN); lib.drain(); },
                        (off, n) -> pm.write(buf, 0, off, n));
                compare("write " + len + " (page cache)", len, span,
                        (off, n) -> MemorySegment.copy(buf, 0, jvm, off, n),
                        (off, n) -> jv.write(buf, 0, off, n));
                compare("zero " + len + " (page cache)", len, span,
                        (off, n) -> Libc.memset(jvm.asSlice(off, n), 0),
                        (off, n) -> jv.zero(off, n));
            }
        } finally {
            Files.deleteIfExists(pp);
            Files.deleteIfExists(pj);
        }
    }

    static void compare(String what, int len, long span, Op old, Op now) {
        int n = (int) Math.max(200, Math.min(200_000, (256L << 20) / len));
        int rounds = 9;
        double[] o = new double[rounds], w = new double[rounds];
        for (int r = -2; r < rounds; r++) { // two warm-up rounds
            double to = time(old, n, len, span), tw = time(now, n, len, span);
            if (r >= 0) { o[r] = to; w[r] = tw; }
        }
        Arrays.sort(o); Arrays.sort(w);
        System.out.printf("%-28s old %9.0f ns/op  new %9.0f ns/op  new/old time %.2f%n", what, o[rounds / 2], w[rounds / 2], w[rounds / 2] / o[rounds / 2]);
    }

    static double time(Op op, int n, int len, long span) {
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) op.run(((long) i * len) % (span - len), len);
        return (System.nanoTime() - t0) / (double) n;
    }
}
