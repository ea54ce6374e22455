package io.pmemblk.pmem;

import io.pmemblk.queueing.BufferPool;

/**
 * Which route a request's data copy takes. A DMA engine frees the CPU and wins on large copies but loses on
 * small ones (Linux pmem with ioatdma: 2M reads at QD1 7986 MB/s against 6013 by CPU, 64k reads 2415 against
 * 7631). A data request goes to DMA when its length reaches {@code minBytes} or its segment count reaches
 * {@code minSegments}; {@code Long.MAX_VALUE} / {@code Integer.MAX_VALUE} turn a test off.
 * The thresholds come from the settings, which {@code pmemblk tune} measures on the machine at hand.
 */
public record Routing(long minBytes, int minSegments) {
    public static final Routing CPU_ONLY = new Routing(Long.MAX_VALUE, Integer.MAX_VALUE);

    /**
     * Whether a data request of {@code length} bytes goes to DMA: the one rule, asked before the request is
     * acquired (whether it needs buffers at all) and again at dispatch. Its segments are the chunks its
     * buffers take, {@link BufferPool#chunksFor}, so the answer needs no buffers yet.
     */
    public boolean toDma(long length) {
        return length >= minBytes || BufferPool.chunksFor(length) >= minSegments;
    }
}
