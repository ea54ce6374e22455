package io.pmemblk.pmem;

import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.pmem.btt.BttLayout;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

/**
 * A {@link Btt} over a mapped {@link PmemRegion} ({@code pmem.layout=btt}): formatted by {@code pmemblk format},
 * opened by {@code serve} with its data blocks read through the region's guarded read (known bad blocks, and a
 * fault on the mapping, answer one request EIO, as on the raw layout) and stored after the region's bad-block
 * check (a bad range a whole block covers is cleared first, where the region can). The region's file is the PMDK pmemblk
 * pool, so {@code pmempool check} and libpmemblk read it as it is.
 */
public final class BttRegion {
    /** The command that makes a BTT: named by every refusal to serve something else as one. */
    public static final String FORMAT_COMMAND = "pmemblk format --layout btt [--sector-size 512|4096] FILE";

    private BttRegion() {
    }

    /**
     * Lays out a fresh BTT over the whole region, as {@code pmempool create -w blk SIZE} would; whatever the region
     * held is gone. The caller has decided that this may happen ({@code format} refuses a non-empty device without
     * {@code --force}).
     */
    public static Btt format(PmemRegion region, int sectorSize) throws IOException {
        return Btt.format(region.memory(), region.persistence(), sectorSize, 1);
    }

    /**
     * Opens the region's BTT for serving {@code callers} callers at once, each with the lanes of a whole group
     * ({@link Btt#GROUP_BLOCKS}): {@link #open(PmemRegion, int, int, int)}.
     */
    public static Btt open(PmemRegion region, int callers, int sectorSize) throws IOException {
        return open(region, callers, sectorSize, Btt.GROUP_BLOCKS);
    }

    /**
     * Opens the region's BTT for serving with {@code callers x lanesPerCaller} lanes, at most the pool's free
     * blocks per arena (and at least {@code callers}). A lane costs a 64-byte read-tracking slot that every write
     * scans, and a spare flog lane the format has anyway (256 per arena); each block of a grouped write
     * ({@link Btt.Group}) needs a lane of its own, so a caller whose batch is to be written in one group needs
     * a group's worth. A region that holds no pmemblk pool (a raw image, or a file never formatted) is refused
     * with the format command: its bytes are never reinterpreted.
     *
     * @param sectorSize the sector size asked for, or 0 for the pool's own; another than the pool's is refused
     */
    public static Btt open(PmemRegion region, int callers, int sectorSize, int lanesPerCaller) throws IOException {
        if (callers < 1 || lanesPerCaller < 1) {
            throw new IllegalArgumentException("callers " + callers + " and lanes per caller " + lanesPerCaller
                    + " must be at least 1");
        }
        int nfree = BttLayout.NFREE;
        Btt.Summary pool = Btt.summarize(region.memory());
        if (pool.arenas() > 0) {
            nfree = pool.freeBlocks() / pool.arenas(); // a foreign pool may have fewer spare blocks than 256
        }
        int lanes = (int) Math.max(callers, Math.min(nfree, (long) callers * lanesPerCaller));
        if (!Btt.isPool(region.memory())) {
            throw new IOException(region.path() + " holds no BTT (no PMDK pmemblk pool header at its start): it is"
                    + " refused rather than reinterpreted, which would lose a raw image's data. Serve it with"
                    + " pmem.layout=raw, or make a BTT of it (erasing it) with: " + FORMAT_COMMAND);
        }
        Btt btt;
        try {
            btt = Btt.open(region.memory(), region.persistence(), lanes, new Btt.Media() {
                @Override
                public void read(long poolOffset, MemorySegment dst, long dstOffset, long length) {
                    region.read(poolOffset, dst, dstOffset, length);
                }

                @Override
                public void beforeStore(long poolOffset, long length) {
                    region.beforeStore(poolOffset, length);
                }
            }, region.hold());
        } catch (IOException e) {
            throw new IOException(region.path() + ": " + e.getMessage(), e);
        }
        if (sectorSize != 0 && sectorSize != btt.blockSize()) {
            throw new IOException(region.path() + " is a BTT of " + btt.blockSize() + "-byte sectors, but"
                    + " pmem.sector-size is " + sectorSize + "; allowed: pmem.sector-size=" + btt.blockSize()
                    + " (the size it was formatted with), or format it again with --sector-size " + sectorSize
                    + " (erasing it)");
        }
        return btt;
    }

    /** Whether the region starts with a pmemblk pool header (a BTT image, which the raw layout must not serve). */
    public static boolean holdsBtt(PmemRegion region) {
        return Btt.isPool(region.memory());
    }
}
