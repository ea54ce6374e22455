package io.pmemblk.pmem;

import io.pmemblk.queueing.Route;

import java.util.concurrent.atomic.LongAdder;

/**
 * Bytes and operations copied, by route (cpu/dma) and direction (read = out of pmem, write = into pmem).
 * Plain adders on the hot path; the metrics endpoint reads them when scraped.
 */
public final class CopyStats {
    private final LongAdder[] bytes = new LongAdder[4];
    private final LongAdder[] ops = new LongAdder[4];
    private final LongAdder dmaErrors = new LongAdder();
    private final LongAdder dmaFallbacks = new LongAdder();
    private final LongAdder mappingFaults = new LongAdder();

    public CopyStats() {
        for (int i = 0; i < 4; i++) {
            bytes[i] = new LongAdder();
            ops[i] = new LongAdder();
        }
    }

    private static int slot(Route route, boolean write) {
        return route.ordinal() * 2 + (write ? 1 : 0);
    }

    public void count(Route route, boolean write, long length) {
        int s = slot(route, write);
        bytes[s].add(length);
        ops[s].increment();
    }

    public long bytes(Route route, boolean write) {
        return bytes[slot(route, write)].sum();
    }

    public long ops(Route route, boolean write) {
        return ops[slot(route, write)].sum();
    }

    public void dmaError() {
        dmaErrors.increment();
    }

    public void dmaFallback() {
        dmaFallbacks.increment();
    }

    public long dmaErrors() {
        return dmaErrors.sum();
    }

    public long dmaFallbacks() {
        return dmaFallbacks.sum();
    }

    /** A request failed with EIO because the mapping could not be accessed (truncated file, bad block, machine check). */
    public void mappingFault() {
        mappingFaults.increment();
    }

    public long mappingFaults() {
        return mappingFaults.sum();
    }
}
