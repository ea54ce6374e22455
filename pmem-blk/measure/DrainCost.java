import io.pmemblk.pmem.*;
import java.lang.foreign.*;
import java.nio.file.*;
public class DrainCost {
    public static void main(String[] a) throws Exception {
        Libpmem lib = Libpmem.load().orElseThrow();
        Path p = Path.of("/dev/shm/drain-" + ProcessHandle.current().pid());
        try (PmemRegion r = PmemRegion.open(p, 64 << 20, false, PmemRegion.Mapper.LIBPMEM); Arena ar = Arena.ofShared()) {
            System.out.println(r);
            MemorySegment m = r.memory(), src = ar.allocate(1 << 20, 4096);
            for (int len : new int[]{4096, 65536}) {
                for (int round = 0; round < 5; round++) {
                    int n = 200_000;
                    long t0 = System.nanoTime();
                    for (int i = 0; i < n; i++) lib.memcpy(m.asSlice(((long) i * len) % (60 << 20), len), src.asSlice(0, len), Libpmem.PMEM_F_MEM_NODRAIN);
                    lib.drain();
                    long t1 = System.nanoTime();
                    for (int i = 0; i < n; i++) { lib.memcpy(m.asSlice(((long) i * len) % (60 << 20), len), src.asSlice(0, len), Libpmem.PMEM_F_MEM_NODRAIN); lib.drain(); }
                    long t2 = System.nanoTime();
                    System.out.printf("%d B: NT copy %.0f ns/op, NT copy + drain %.0f ns/op%n", len, (t1 - t0) / (double) n, (t2 - t1) / (double) n);
                }
            }
        } finally { Files.deleteIfExists(p); }
    }
}
