package io.pmemblk.pmem;

import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.pmem.btt.BttLayout;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.UUID;

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

    private static final System.Logger LOG = System.getLogger(BttRegion.class.getName());

    /**
     * Lays out a fresh BTT over the whole region, as {@code pmempool create -w blk SIZE} would; whatever the region
     * held is gone. The caller has decided that this may happen ({@code format} refuses a device holding data
     * without {@code --force}; serve formats only a file it created, or one whose record says a format was
     * interrupted). The record says FORMATTING before the first byte is written and BTT (with the new pool's uuid)
     * once the pool header is durable, so a crash in between leaves a device serve formats again, never one taken
     * for raw or for a BTT. What the format would refuse (the size, the sector size) is checked before the record.
     */
    public static Btt format(PmemRegion region, LayoutRecord record, int sectorSize) throws IOException {
        try {
            Btt.checkFormat(region.size(), sectorSize); // a refused format must leave no FORMATTING record behind
        } catch (IOException e) {
            throw new IOException(region.path() + ": " + e.getMessage() + "; nothing was written", e);
        }
        record.write(new LayoutRecord.Entry(LayoutRecord.State.FORMATTING, sectorSize, region.size(), null));
        Btt btt = Btt.format(region.memory(), region.persistence(), sectorSize, 1);
        record.write(new LayoutRecord.Entry(LayoutRecord.State.BTT, sectorSize, region.size(),
                Btt.poolUuid(region.memory())));
        return btt;
    }

    /**
     * Flog lanes (each with its free block) per arena that no lane writes through when callers would want them
     * all: a lane whose free block is bad and cannot be cleared moves to one of these, so a bad block costs a
     * spare, not the lane (the BTT's bad-block handling, docs/btt.md). Eight of 256 cost a group 1/32 of its
     * lanes when 8 or more callers share them.
     */
    static final int SPARE_FLOG_LANES = 8;

    /** {@link #format(PmemRegion, LayoutRecord, int)} with the record beside a regular file. */
    public static Btt format(PmemRegion region, int sectorSize) throws IOException {
        return format(region, LayoutRecord.of(region, null), sectorSize);
    }

    /**
     * Opens the region's BTT for serving {@code callers} callers at once, each with the lanes of a whole group
     * ({@link Btt#GROUP_BLOCKS}): {@link #open(PmemRegion, LayoutRecord, int, int, int)}, the record beside a
     * regular file.
     */
    public static Btt open(PmemRegion region, int callers, int sectorSize) throws IOException {
        return open(region, LayoutRecord.of(region, null), callers, sectorSize, Btt.GROUP_BLOCKS);
    }

    /** {@link #open(PmemRegion, LayoutRecord, int, int, int)} with the record beside a regular file. */
    public static Btt open(PmemRegion region, int callers, int sectorSize, int lanesPerCaller) throws IOException {
        return open(region, LayoutRecord.of(region, null), callers, sectorSize, lanesPerCaller);
    }

    /**
     * Opens the region's BTT for serving with {@code callers x lanesPerCaller} lanes, at most the pool's free
     * blocks per arena less {@link #SPARE_FLOG_LANES} (and at least {@code callers}). A lane costs a 64-byte read-tracking slot that every write
     * scans, and a spare flog lane the format has anyway (256 per arena); each block of a grouped write
     * ({@link Btt.Group}) needs a lane of its own, so a caller whose batch is to be written in one group needs
     * a group's worth.
     *
     * <p>The operator said {@code pmem.layout=btt}; what is opened is decided by the {@code record}, never by
     * the device's bytes alone (docs/btt.md "Which layout a device has"):
     * <ul>
     * <li>recorded BTT: opened if the pool header still names the recorded pool and size (else refused: the image
     *     was replaced or overwritten); a damaged info block is restored from its backup, as pmempool check does.
     * <li>recorded FORMATTING (a format that did not finish): formatted again; its bytes were given up already.
     * <li>no record: only a COMPLETE BTT ({@link Btt#incomplete}) is opened, and then recorded: one made by an
     *     older pmemblk or by {@code pmempool create -w blk}. Anything else is refused and nothing is written:
     *     a raw image holding a client-written pool header is a raw image.
     * </ul>
     *
     * @param sectorSize the sector size asked for, or 0 for the pool's own; another than the pool's is refused
     */
    public static Btt open(PmemRegion region, LayoutRecord record, int callers, int sectorSize, int lanesPerCaller)
            throws IOException {
        if (callers < 1 || lanesPerCaller < 1) {
            throw new IllegalArgumentException("callers " + callers + " and lanes per caller " + lanesPerCaller
                    + " must be at least 1");
        }
        LayoutRecord.Entry recorded = record.read().orElse(null);
        if (recorded == null) {
            String why = Btt.incomplete(region.memory());
            if (why != null) {
                throw new IOException(region.path() + " is not recorded as a BTT (no " + record.path() + ") and"
                        + " holds no complete one (" + why + "). A BTT is laid out only on a device pmemblk formats,"
                        + " never over what may be a raw device's data, whatever bytes it holds; nothing was written."
                        + " Allowed: serve it with pmem.layout=raw (its bytes as they are), or erase it and make a"
                        + " BTT with: " + FORMAT_COMMAND + " (refused while it holds data, unless --force)");
            }
        } else if (recorded.state() == LayoutRecord.State.FORMATTING) {
            checkSize(region, record, recorded);
            LOG.log(System.Logger.Level.WARNING, record.path() + " says a format of " + region.path() + " did not"
                    + " finish: formatting it again with " + recorded.sectorSize() + "-byte sectors");
            format(region, record, recorded.sectorSize());
            recorded = record.read().orElseThrow();
        } else {
            checkSize(region, record, recorded);
            UUID now = Btt.poolUuid(region.memory());
            if (now == null || !now.equals(recorded.pool())) {
                throw new IOException(region.path() + " is recorded as the BTT of pool " + recorded.pool() + " ("
                        + record.path() + "), but it now " + (now == null ? "holds no valid pool header"
                        : "holds pool " + now) + ": it was replaced or overwritten since. Nothing was laid out over"
                        + " it. Allowed: put back the image the record belongs to; or, if it now holds a raw"
                        + " image, remove " + record.path() + " and serve it with pmem.layout=raw; or erase it: "
                        + FORMAT_COMMAND.replace("format ", "format --force "));
            }
            Btt.Summary s = Btt.summarize(region.memory());
            if (s.problem() != null || s.arenas() == 0) {
                throw new IOException(region.path() + ": the recorded BTT is damaged (" + (s.problem() != null
                        ? s.problem() : "arena 0's info blocks are zero") + "); nothing was written. `pmempool"
                        + " check -r` may repair it, or format it again (losing its data)");
            }
        }
        int nfree = BttLayout.NFREE;
        Btt.Summary pool = Btt.summarize(region.memory());
        if (pool.arenas() > 0) {
            nfree = pool.freeBlocks() / pool.arenas(); // a foreign pool may have fewer spare blocks than 256
        }
        int lanes = (int) Math.max(callers, Math.min(nfree - SPARE_FLOG_LANES, (long) callers * lanesPerCaller));
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
        if (recorded == null) {
            try {
                record.write(new LayoutRecord.Entry(LayoutRecord.State.BTT, btt.blockSize(), region.size(),
                        Btt.poolUuid(region.memory())));
                LOG.log(System.Logger.Level.INFO, region.path() + " holds a complete BTT no record named (an older"
                        + " pmemblk's or pmempool's): served as the operator said, and recorded in " + record.path());
            } catch (IOException e) {
                LOG.log(System.Logger.Level.WARNING, region.path() + " is served as a BTT but could not be recorded ("
                        + e.getMessage() + "): until it is, pmem.layout=raw on it is not refused");
            }
        }
        return btt;
    }

    private static void checkSize(PmemRegion region, LayoutRecord record, LayoutRecord.Entry recorded) throws IOException {
        if (recorded.size() != region.size()) {
            throw new IOException(region.path() + " has " + region.size() + " bytes, but its layout record "
                    + record.path() + " was written for " + recorded.size() + ": it is not the device recorded."
                    + " Nothing was written. Allowed: put back the device the record belongs to; or remove the"
                    + " record and serve it with pmem.layout=raw; or erase it: "
                    + FORMAT_COMMAND.replace("format ", "format --force "));
        }
    }

    /**
     * Refuses to serve raw a device pmemblk recorded as a BTT (its pool header, map and flog would be device
     * bytes a client could overwrite), by the record alone: a raw device whose bytes look like a pool is served
     * raw. A file this start created has no layout: a record left beside it by an image deleted earlier is removed.
     */
    public static void checkRaw(PmemRegion region, LayoutRecord record) throws IOException {
        if (region.created()) {
            if (record.remove()) {
                LOG.log(System.Logger.Level.INFO, "removed " + record.path() + ": " + region.path() + " was created"
                        + " just now, so the record belonged to a file deleted before");
            }
            return;
        }
        LayoutRecord.Entry e = record.read().orElse(null);
        if (e != null) {
            throw new IOException(region.path() + " is recorded as a BTT" + (e.state() == LayoutRecord.State.FORMATTING
                    ? " whose format did not finish" : " of " + e.sectorSize() + "-byte sectors (pool " + e.pool() + ")")
                    + " in " + record.path() + ": refused with pmem.layout=raw, which would expose its metadata as"
                    + " data. Allowed: serve it with --set pmem.layout=btt; or, if the device no longer holds that"
                    + " BTT (it was erased, or a raw image put in its place), remove " + record.path()
                    + " and serve it raw");
        }
    }
}
