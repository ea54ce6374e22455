package io.pmemblk.queueing;

import static org.junit.jupiter.api.Assertions.*;

import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.LongStream;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * Random sequences of tryAcquire / release against a model of free tags and chunks: tryAcquire succeeds exactly
 * when a tag and every chunk it needs are free, takes exactly that, and a null takes nothing. Each case is one
 * seed (its name on failure); the same seed replays the same sequence.
 */
class TryAcquireModelTest {
    static final int DEPTH = 6;
    static final int POOL_CHUNKS = 10;
    static final int MAX = 4 * BufferPool.CHUNK;

    static LongStream seeds() {
        return LongStream.range(0, 200).map(i -> 0x5EED_0000L + i);
    }

    /** Each step: a value < 0 releases the oldest held request; otherwise it is the data length to try. */
    static List<Integer> steps(long seed) {
        SplittableRandom rnd = new SplittableRandom(seed);
        List<Integer> steps = new ArrayList<>();
        for (int i = rnd.nextInt(61); i > 0; i--) {
            steps.add(rnd.nextInt(-MAX / 2, MAX + 1));
        }
        return steps;
    }

    @ParameterizedTest(name = "seed {0}")
    @MethodSource("seeds")
    void tryAcquireMatchesTheModel(long seed) {
        List<Integer> steps = steps(seed);
        MemoryBlockDriver driver = new MemoryBlockDriver(1 << 20);
        try (BlockLayer layer = new BlockLayer(driver, 1, DEPTH, (long) POOL_CHUNKS * BufferPool.CHUNK, MAX)) {
            HardwareQueue q = layer.queue(0);
            List<Request> held = new ArrayList<>();
            int freeChunks = POOL_CHUNKS;
            for (int step : steps) {
                if (step < 0) {
                    if (!held.isEmpty()) {
                        Request r = held.remove(0);
                        freeChunks += r.segments();
                        r.release();
                    }
                } else {
                    int need = step == 0 ? 0 : BufferPool.chunksFor(step);
                    boolean fits = held.size() < DEPTH && need <= freeChunks;
                    Request r = q.tryAcquire(step);
                    assertEquals(fits, r != null, "tryAcquire(" + step + ") with " + (DEPTH - held.size())
                            + " tags and " + freeChunks + " chunks free");
                    if (r != null) {
                        assertEquals(need, r.segments());
                        assertEquals(step, r.length);
                        freeChunks -= need;
                        held.add(r);
                    }
                }
                assertEquals(freeChunks, q.pool().freeChunks(), "pool free chunks");
                assertEquals(held.size(), q.inflight(), "tags in use");
            }
        } finally {
            driver.close();
        }
    }
}
