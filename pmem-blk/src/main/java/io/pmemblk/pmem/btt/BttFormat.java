package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.Persistence;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.UUID;

import static io.pmemblk.pmem.btt.BttLayout.*;
import static io.pmemblk.pmem.btt.BttOpen.checkLanes;

/** Lays out a PMDK pmemblk pool with its BTT, as {@code pmempool create -w blk} does ({@link Btt#format}). */
final class BttFormat {
    private BttFormat() {
    }

    /** {@link Btt#checkFormat}: what {@link #format} refuses before it writes anything, with {@code lanes}. */
    static void check(long size, int sectorSize, int lanes) throws IOException {
        if (!SECTOR_SIZES.contains(sectorSize)) {
            throw new IllegalArgumentException("pmem.sector-size " + sectorSize + " is not supported; allowed: "
                    + SECTOR_SIZES);
        }
        checkLanes(lanes, NFREE);
        String arch = System.getProperty("os.arch");
        if (!"amd64".equals(arch) && !"x86_64".equals(arch)) {
            throw new IOException("a PMDK pool is laid out here only for x86-64 (PMEM_PAGESIZE 4096, the arch_flags"
                    + " of PMDK 1.12 on x86-64), not for " + arch);
        }
        if (size < BTT_OFFSET + ARENA_MIN_SIZE || (size - BTT_OFFSET) % ALIGNMENT != 0) {
            throw new IOException("a pmemblk pool of " + size + " bytes cannot hold a BTT: the size must be at least "
                    + (BTT_OFFSET + ARENA_MIN_SIZE) + " (8 KiB of pool header + a 16 MiB arena) and a multiple of "
                    + ALIGNMENT);
        }
    }

    /** {@link Btt#format}. */
    static Btt format(MemorySegment pool, Persistence persistence, int sectorSize, int lanes) throws IOException {
        check(pool.byteSize(), sectorSize, lanes);
        UUID poolset = UUID.randomUUID(), uuid = UUID.randomUUID();
        MemorySegment hdr = pool.asSlice(0, POOL_HDR_SIZE);
        // First the old header goes, durably: from here until the new one is written nothing is a pool.
        hdr.fill((byte) 0);
        persistRange(persistence, hdr);
        writeLayout(pool, persistence, sectorSize, poolset);

        MemorySegment blk = pool.asSlice(POOL_HDR_SIZE, BTT_OFFSET - POOL_HDR_SIZE);
        blk.fill((byte) 0); // is_zeroed 0: the data area was not zeroed, which only PMDK's lazy layout would use
        blk.set(U32, BLK_BSIZE - POOL_HDR_SIZE, sectorSize);
        persistRange(persistence, blk);

        hdr.asSlice(HDR_SIGNATURE).copyFrom(MemorySegment.ofArray(HDR_SIGNATURE_BYTES));
        hdr.set(U32, HDR_MAJOR, BLK_FORMAT_MAJOR);
        // PMDK 1.12's defaults on x86-64 (pool_hdr.h POOL_FEAT_*_DEFAULT), as pmempool create writes them.
        hdr.set(U32, HDR_COMPAT, FEAT_CHECK_BAD_BLOCKS);
        hdr.set(U32, HDR_INCOMPAT, FEAT_CKSUM_2K | FEAT_SDS);
        hdr.set(U32, HDR_RO_COMPAT, 0);
        putUuid(hdr, HDR_POOLSET_UUID, poolset);
        // One part, one replica: every link points to the part itself (set.c util_header_create).
        for (int at : new int[]{HDR_UUID, HDR_PREV_PART_UUID, HDR_NEXT_PART_UUID, HDR_PREV_REPL_UUID, HDR_NEXT_REPL_UUID}) {
            putUuid(hdr, at, uuid);
        }
        hdr.set(U64, HDR_CRTIME, System.currentTimeMillis() / 1000);
        hdr.set(U64, HDR_ARCH_FLAGS, ARCH_ALIGNMENT_DESC);
        hdr.set(ValueLayout.JAVA_BYTE, HDR_ARCH_FLAGS + ARCH_CLASS_AT, (byte) ARCH_MACHINE_CLASS);
        hdr.set(ValueLayout.JAVA_BYTE, HDR_ARCH_FLAGS + ARCH_DATA_AT, (byte) ARCH_DATA_LE);
        hdr.set(U16, HDR_ARCH_FLAGS + ARCH_MACHINE_AT, (short) ARCH_MACHINE_X86_64);
        // sds stays zero: PMDK reads a zeroed shutdown state as "clean, initialise" (shutdown_state_check).
        hdr.set(U64, HDR_CHECKSUM, checksum(hdr, 0, POOL_HDR_SIZE, HDR_CHECKSUM, HDR_UNUSED2));
        persistRange(persistence, hdr);
        return Btt.open(pool, persistence, lanes);
    }

    /**
     * The BTT layout PMDK write_layout writes: per arena a zeroed map (every entry initial), the initial flog
     * (lane i holds block external_nlba+i, with the ZERO flag as PMDK writes it), then the info block and its backup.
     */
    static void writeLayout(MemorySegment pool, Persistence persistence, int sectorSize, UUID poolset)
            throws IOException {
        UUID uuid = UUID.randomUUID();
        long at = BTT_OFFSET;
        for (BttLayout.Arena g : arenas(pool.byteSize() - BTT_OFFSET, sectorSize)) {
            MemorySegment map = pool.asSlice(at + g.mapOff(), mapSize(g.externalNlba()));
            map.fill((byte) 0);
            persistRange(persistence, map);
            MemorySegment flog = pool.asSlice(at + g.flogOff(), flogSize(g.nfree()));
            flog.fill((byte) 0);
            for (int i = 0; i < g.nfree(); i++) {
                long p = (long) i * FLOG_PAIR_SIZE;
                flog.set(U32, p + FLOG_LBA, i);
                flog.set(U32, p + FLOG_OLD_MAP, (g.externalNlba() + i) | MAP_ZERO);
                flog.set(U32, p + FLOG_NEW_MAP, (g.externalNlba() + i) | MAP_ZERO);
                flog.set(U32, p + FLOG_SEQ, 1);
            }
            persistRange(persistence, flog);
            MemorySegment info = pool.asSlice(at, INFO_SIZE);
            info.fill((byte) 0);
            info.asSlice(INFO_SIG).copyFrom(MemorySegment.ofArray(INFO_SIGNATURE));
            putUuid(info, INFO_UUID, uuid);
            putUuid(info, INFO_PARENT_UUID, poolset);
            info.set(U16, INFO_MAJOR, (short) MAJOR);
            info.set(U16, INFO_MINOR, (short) MINOR);
            info.set(U32, INFO_EXTERNAL_LBASIZE, g.externalLbaSize());
            info.set(U32, INFO_EXTERNAL_NLBA, g.externalNlba());
            info.set(U32, INFO_INTERNAL_LBASIZE, g.internalLbaSize());
            info.set(U32, INFO_INTERNAL_NLBA, g.internalNlba());
            info.set(U32, INFO_NFREE, g.nfree());
            info.set(U32, INFO_INFOSIZE, INFO_SIZE);
            info.set(U64, INFO_NEXTOFF, g.nextOff());
            info.set(U64, INFO_DATAOFF, g.dataOff());
            info.set(U64, INFO_MAPOFF, g.mapOff());
            info.set(U64, INFO_FLOGOFF, g.flogOff());
            info.set(U64, INFO_INFOOFF, g.infoOff());
            info.set(U64, INFO_CHECKSUM, checksum(info, 0, INFO_SIZE, INFO_CHECKSUM, INFO_SIZE));
            // PMDK writes the primary first; either order works, as a reader needs only one valid copy.
            persistRange(persistence, info);
            MemorySegment backup = pool.asSlice(at + g.infoOff(), INFO_SIZE);
            backup.copyFrom(info);
            persistRange(persistence, backup);
            at += g.size();
        }
    }

    /** Makes {@code r} durable: write-back and drain on pmem, msync of its pages elsewhere. */
    static void persistRange(Persistence persistence, MemorySegment r) throws IOException {
        if (persistence.flushesCaches()) {
            persistence.writeBack(r);
            persistence.drain();
        } else {
            persistence.sync(r);
        }
    }
}
