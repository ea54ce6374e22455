package io.pmemblk.pmem;

/**
 * Which route a request's data copy takes. A DMA engine frees the CPU and wins on large copies but loses on
 * small ones (Linux pmem with ioatdma: 2M reads at QD1 7986 MB/s against 6013 by CPU, 64k reads 2415 against
 * 7631). A data request goes to DMA when its length reaches {@code minBytes} or its segment count reaches
 * {@code minSegments}; {@code Long.MAX_VALUE} / {@code Integer.MAX_VALUE} turn a test off.
 * The thresholds come from the settings, which {@code pmemblk tune} measures on the machine at hand.
 *
 * <p>The engine takes a CPU copy away only where the data already sits in memory it reaches: a caller-memory
 * request (a vhost-user guest's RAM) goes by the thresholds, its pieces being its segments. A request whose
 * data is in the pool buffers (NBD, ublk) already cost a CPU copy into them (the kernel's, from the socket or
 * /dev/ublkcN), which on the CPU route would have landed straight in the mapping; DMA adds a second copy and
 * saves none. So those stay on the CPU unless {@code bounce} (route.dma.bounce) says otherwise.
 */
public record Routing(long minBytes, int minSegments, boolean bounce) {
    public static final Routing CPU_ONLY = new Routing(Long.MAX_VALUE, Integer.MAX_VALUE, false);

    /** The thresholds, with pool-buffer requests on the CPU (route.dma.bounce's default). */
    public Routing(long minBytes, int minSegments) {
        this(minBytes, minSegments, false);
    }

    /**
     * Whether a data request of {@code length} bytes in {@code segments} pieces (pool chunks, or the pieces of
     * caller memory) reaches the card's threshold: the one rule, asked before a pool-buffer request is acquired
     * (whether it needs buffers at all) and again at dispatch.
     */
    public boolean toDma(long length, int segments) {
        return length >= minBytes || segments >= minSegments;
    }
}
