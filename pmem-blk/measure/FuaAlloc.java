import io.pmemblk.queueing.*;
import io.pmemblk.pmem.*;
import java.lang.foreign.*;
import java.lang.management.ManagementFactory;
import java.nio.file.*;

public class FuaAlloc {
    public static void main(String[] args) throws Exception {
        PmemRegion.Mapper mapper = PmemRegion.Mapper.valueOf(args[0]);
        int n = Integer.parseInt(args[1]);
        Path p = Path.of("/dev/shm/fua-alloc-" + ProcessHandle.current().pid() + ".img");
        var mx = (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
        try (PmemRegion r = PmemRegion.open(p, 64 << 20, false, mapper); Arena a = Arena.ofShared()) {
            System.out.println(r);
            MemorySegment src = a.allocate(1 << 20, 4096);
            for (int round = 0; round < 6; round++) {
                long b0 = mx.getCurrentThreadAllocatedBytes(), t0 = System.nanoTime();
                for (int i = 0; i < n; i++) {
                    long off = ((long) i * 4096) % (60 << 20);
                    r.write(src, 0, off, 4096);
                    r.persistWritten(off, 4096);
                }
                long t1 = System.nanoTime(), b1 = mx.getCurrentThreadAllocatedBytes();
                System.out.printf("region FUA 4k write: round %d: %.2f bytes/op, %.0f ns/op%n", round, (b1 - b0) / (double) n, (t1 - t0) / (double) n);
            }
            // through the driver, as a frontend does it
            PmemBlockDriver d = new PmemBlockDriver(r, new CopyStats());
            try (BlockLayer layer = new BlockLayer(d, 1, 4, 4 << 20, 1 << 20)) {
                HardwareQueue q = layer.queue(0);
                Request[] batch = new Request[1];
                int[] st = new int[1];
                Request.Completion c = req -> st[0] = req.status();
                for (int round = 0; round < 6; round++) {
                    long b0 = mx.getCurrentThreadAllocatedBytes(), t0 = System.nanoTime();
                    for (int i = 0; i < n; i++) {
                        Request req = q.acquire(4096);
                        req.op = Op.WRITE;
                        req.offset = ((long) i * 4096) % (60 << 20);
                        req.fua = true;
                        req.completion = c;
                        batch[0] = req;
                        q.dispatch(batch, 1);
                        req.release();
                    }
                    long t1 = System.nanoTime(), b1 = mx.getCurrentThreadAllocatedBytes();
                    System.out.printf("driver FUA 4k WRITE: round %d: %.2f bytes/op, %.0f ns/op, status %d%n", round, (b1 - b0) / (double) n, (t1 - t0) / (double) n, st[0]);
                }
            }
        } finally {
            Files.deleteIfExists(p);
        }
    }
}
