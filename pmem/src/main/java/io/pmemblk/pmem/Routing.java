package io.pmemblk.pmem;

import io.pmemblk.block.Request;

/**
 * Which route a request's data copy takes. A DMA engine frees the CPU and wins on large copies but loses on
 * small ones (Linux pmem with ioatdma: 2M reads at QD1 7986 MB/s against 6013 by CPU, 64k reads 2415 against
 * 7631). A data request goes to DMA when its length reaches {@code minBytes} or its segment count reaches
 * {@code minSegments}; {@code Long.MAX_VALUE} / {@code Integer.MAX_VALUE} turn a test off.
 * The thresholds come from the settings, which {@code pmemblk tune} measures on the machine at hand.
 */
public record Routing(long minBytes, int minSegments) {
    public static final Routing CPU_ONLY = new Routing(Long.MAX_VALUE, Integer.MAX_VALUE);

    public boolean toDma(Request r) {
        return r.length >= minBytes || r.segments() >= minSegments;
    }
}
