package io.pmemblk.vhost.memory;

import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.FileStat;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.SharedMemory;
import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.vhost.protocol.Refusal;
import io.pmemblk.vhost.protocol.VhostUserChannel;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;

/**
 * One connection's guest memory (SET_MEM_TABLE, ADD_MEM_REG, REM_MEM_REG): the regions the front-end shares, each
 * checked (overflow, overlap, its file's size and seals, the slot count), mapped, registered with the driver (a
 * DMA engine reaches it by the iova the registration gives) and published to the rings as one {@link GuestMemory},
 * replaced whole. A region withdrawn is unregistered and unmapped once no ring may touch it ({@link PinnedMemory}).
 */
public final class MemoryTable {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.vhost");

    /** The rings that read guest memory: stopped, drained, while it is replaced or removed, then started again. */
    public interface Rings {
        /** Stops every running ring (draining its requests); their indexes, to start again. */
        int[] pause();

        /** Starts the rings {@link #pause} stopped again, from where they stopped. */
        void resume(int[] paused);
    }

    private final VhostUserChannel channel;
    private final BlockDriver driver;
    private final PinnedMemory pinned;
    private final String name;
    private final int maxSlots;
    private final List<Mapped> regions = new ArrayList<>();
    /** What the rings read, per batch: replaced whole, published by this volatile write. */
    private volatile GuestMemory memory = GuestMemory.EMPTY;

    /** One guest memory region: what the rings see, and the arena that unmaps it. */
    private record Mapped(GuestRegion region, Arena arena) {}

    /**
     * @param channel  the connection whose messages carry the regions and their file descriptors
     * @param driver   where regions are registered (and unregistered)
     * @param pinned   holds a release back while a ring stopped undrained may still touch the region
     * @param name     the connection's name, for the log
     * @param maxSlots regions ADD_MEM_REG may fill (GET_MAX_MEM_SLOTS)
     */
    public MemoryTable(VhostUserChannel channel, BlockDriver driver, PinnedMemory pinned, String name, int maxSlots) {
        this.channel = channel;
        this.driver = driver;
        this.pinned = pinned;
        this.name = name;
        this.maxSlots = maxSlots;
    }

    /** What the rings read: the memory table now. */
    public GuestMemory memory() {
        return memory;
    }

    /** Regions mapped now (for a refusal's message). */
    public int regionCount() {
        return regions.size();
    }

    /** SET_MEM_TABLE: the whole table replaced, the running rings stopped meanwhile. */
    public void setMemTable(MemorySegment p, Rings rings) throws IOException, Refusal {
        if (channel.size() < MEMORY_REGIONS) { // its size varies, so the channel could not check it
            throw new Refusal("payload of " + channel.size() + " bytes; allowed: 8 + 32 per region (nregions,"
                    + " padding, then the regions)");
        }
        int n = p.get(JAVA_INT_UNALIGNED, MEMORY_NREGIONS);
        if (n < 1 || n > MAX_TABLE_REGIONS) {
            throw new Refusal("nregions " + Integer.toUnsignedString(n) + "; allowed: 1.." + MAX_TABLE_REGIONS);
        }
        if (channel.size() != MEMORY_REGIONS + n * REGION_SIZE) {
            throw new Refusal("payload of " + channel.size() + " bytes for " + n + " regions; allowed: exactly "
                    + (MEMORY_REGIONS + n * REGION_SIZE) + " (8 + 32 per region)");
        }
        if (channel.fdCount() != n) {
            throw new Refusal(channel.fdCount() + " file descriptors for " + n + " regions; allowed: one per region");
        }
        long[][] table = new long[n][];
        for (int i = 0; i < n; i++) {
            table[i] = region(p, MEMORY_REGIONS + i * REGION_SIZE, "region " + i);
            for (int j = 0; j < i; j++) {
                checkDisjoint(table[i], table[j], "region " + i, "region " + j);
            }
        }
        // Every file is checked before anything changes: a table refused for one of them leaves the memory and
        // the running rings as they were (the front-end hears only that its new table failed), not the rings
        // stopped over a table half gone.
        for (int i = 0; i < n; i++) {
            try {
                checkFile(table[i], channel.peekFd(i), "region " + i);
            } catch (NativeException e) {
                throw new Refusal("region " + i + ": cannot map it: " + e.getMessage());
            }
        }
        int[] paused = rings.pause();
        dropAll();
        for (int i = 0; i < n; i++) {
            addRegion(table[i], channel.takeFd(i), "region " + i);
        }
        rings.resume(paused);
    }

    /** ADD_MEM_REG: one region more, in a free slot. */
    public void addMemReg(MemorySegment p) throws IOException, Refusal {
        if (channel.fdCount() != 1) {
            throw new Refusal(channel.fdCount() + " file descriptors; allowed: exactly 1, the region's");
        }
        long[] r = region(p, MEM_REG_REGION, "region");
        if (regions.size() >= maxSlots) {
            throw new Refusal("all " + maxSlots + " memory slots are used (GET_MAX_MEM_SLOTS); remove one first");
        }
        for (Mapped m : regions) {
            checkDisjoint(r, fields(m.region()), "the new region", "a region already added");
        }
        addRegion(r, channel.takeFd(0), "region");
    }

    /** REM_MEM_REG: the region added with exactly these fields withdrawn, the running rings stopped meanwhile. */
    public void remMemReg(MemorySegment p, Rings rings) throws Refusal {
        long gpa = p.get(JAVA_LONG_UNALIGNED, MEM_REG_REGION + REGION_GPA);
        long size = p.get(JAVA_LONG_UNALIGNED, MEM_REG_REGION + REGION_SIZE_FIELD);
        long uaddr = p.get(JAVA_LONG_UNALIGNED, MEM_REG_REGION + REGION_UADDR);
        Mapped found = null;
        for (Mapped m : regions) {
            GuestRegion g = m.region();
            if (g.guestPhys() == gpa && g.userAddr() == uaddr && g.size() == size) {
                found = m;
            }
        }
        if (found == null) {
            throw new Refusal("no region at guest 0x" + Long.toHexString(gpa) + ", user 0x" + Long.toHexString(uaddr)
                    + ", size 0x" + Long.toHexString(size) + "; allowed: a region added before (" + regions.size()
                    + " are)");
        }
        int[] paused = rings.pause();
        memory = memory.without(gpa, uaddr, size);
        regions.remove(found);
        release(found);
        rings.resume(paused);
    }

    /** guest_phys_addr, memory_size, userspace_addr, mmap_offset of the region at {@code at}, checked. */
    private static long[] region(MemorySegment p, long at, String what) throws Refusal {
        long gpa = p.get(JAVA_LONG_UNALIGNED, at + REGION_GPA);
        long size = p.get(JAVA_LONG_UNALIGNED, at + REGION_SIZE_FIELD);
        long uaddr = p.get(JAVA_LONG_UNALIGNED, at + REGION_UADDR);
        long offset = p.get(JAVA_LONG_UNALIGNED, at + REGION_MMAP_OFFSET);
        if (size <= 0) {
            throw new Refusal(what + ": memory_size 0x" + Long.toHexString(size) + "; allowed: 1..2^63-1");
        }
        checkEnd(what, "guest_phys_addr", gpa, size);
        checkEnd(what, "userspace_addr", uaddr, size);
        checkEnd(what, "mmap_offset", offset, size);
        return new long[]{gpa, size, uaddr, offset};
    }

    private static void checkEnd(String what, String field, long start, long size) throws Refusal {
        if (start < 0 || start > Long.MAX_VALUE - size) {
            throw new Refusal(what + ": " + field + " 0x" + Long.toHexString(start) + " + memory_size 0x"
                    + Long.toHexString(size) + " passes 2^63; allowed: a range below 2^63");
        }
    }

    private static long[] fields(GuestRegion g) {
        return new long[]{g.guestPhys(), g.size(), g.userAddr(), 0};
    }

    private static void checkDisjoint(long[] a, long[] b, String what, String other) throws Refusal {
        if (a[0] < b[0] + b[1] && b[0] < a[0] + a[1]) {
            throw new Refusal(what + " (guest 0x" + Long.toHexString(a[0]) + "+0x" + Long.toHexString(a[1])
                    + ") overlaps " + other + " in guest memory; allowed: disjoint regions");
        }
        if (a[2] < b[2] + b[1] && b[2] < a[2] + a[1]) {
            throw new Refusal(what + " (user 0x" + Long.toHexString(a[2]) + "+0x" + Long.toHexString(a[1])
                    + ") overlaps " + other + " in the front-end's address space; allowed: disjoint regions");
        }
    }

    /**
     * Maps the region of {@code fd} (closed here either way), registers it with the driver and publishes it.
     * Mapped from the page holding mmap_offset, so only what the region covers is mapped.
     */
    private void addRegion(long[] r, int fd, String what) throws Refusal, NativeException {
        long size = r[1], offset = r[3];
        Arena arena = null;
        try {
            checkFile(r, fd, what);
            long page = Libc.pageSize();
            long skew = offset & (page - 1);
            arena = Arena.ofShared();
            MemorySegment mapping = SharedMemory.map(fd, offset - skew, size + skew, arena).asSlice(skew, size);
            long iova = driver.registerMemory(mapping);
            Mapped m = new Mapped(new GuestRegion(r[0], size, r[2], mapping, iova), arena);
            arena = null;
            regions.add(m);
            memory = memory.with(m.region());
            // INFO, with where it is mapped here: a fault in guest RAM is logged by the driver with the address
            // (CallerMemoryFault), which this line ties to the connection and the region.
            LOG.log(System.Logger.Level.INFO, "{0}: guest memory 0x{1}+0x{2} mapped at 0x{3}{4}", name,
                    Long.toHexString(r[0]), Long.toHexString(size), Long.toHexString(mapping.address()),
                    iova < 0 ? "" : ", iova 0x" + Long.toHexString(iova));
        } catch (NativeException e) {
            throw new Refusal(what + ": cannot map it: " + e.getMessage());
        } finally {
            if (arena != null) {
                arena.close();
            }
            Libc.close(fd);
        }
    }

    /** The region's file holds all of it and cannot shrink: what must hold before it is mapped. */
    private static void checkFile(long[] r, int fd, String what) throws Refusal, NativeException {
        long size = r[1], offset = r[3];
        FileStat st = FileCalls.fstat(fd);
        if (st.isRegularFile() && st.size() < offset + size) {
            throw new Refusal(what + " (guest 0x" + Long.toHexString(r[0]) + "): mmap_offset 0x"
                    + Long.toHexString(offset) + " + memory_size 0x"
                    + Long.toHexString(size) + " passes the end of its file (0x" + Long.toHexString(st.size())
                    + " bytes): touching it would fault; allowed: a range within the file");
        }
        requireSealed(r, fd, what);
    }

    /**
     * Refuses guest memory that can shrink under us. Guest RAM is copied into and out of by native code that
     * cannot survive a fault (libc's memcpy for reads of pmem kept in memory, libpmem's non-temporal copy for
     * writes to real pmem, a DMA engine), and the rings and status bytes are stored to from threads every
     * client shares: a front end that truncated its memory file while it is mapped would kill this process with
     * SIGBUS, and every NBD, ublk and vhost client with it. A memfd sealed with F_SEAL_SHRINK cannot be truncated
     * (fcntl(2)), and QEMU seals its memfd backends so unless told not to (memory-backend-memfd seal=on, the
     * default since QEMU 2.12; hugetlb=on keeps it for huge pages). A file that cannot carry seals
     * (memory-backend-file on tmpfs or hugetlbfs) or a memfd left unsealed (seal=off) is refused, naming that
     * fix. We cannot add the seal ourselves: sealing is the file's owner's decision (F_SEAL_SEAL may forbid it),
     * and a seal added now would not undo a truncation already made.
     */
    private static void requireSealed(long[] r, int fd, String what) throws Refusal, NativeException {
        int seals = SharedMemory.seals(fd);
        if (seals >= 0 && (seals & SharedMemory.F_SEAL_SHRINK) != 0) {
            return;
        }
        // A tmpfs or hugetlbfs file answers F_GET_SEALS with F_SEAL_SEAL alone: it can never be sealed.
        String kind = seals < 0 ? "cannot carry seals (not a memfd)"
                : "is not sealed with F_SEAL_SHRINK (seals 0x" + Integer.toHexString(seals) + ")";
        throw new Refusal(what + " (guest 0x" + Long.toHexString(r[0]) + "): its file " + FileCalls.describeFd(fd) + " "
                + kind + "; the front end could"
                + " truncate it while it is mapped, and a copy into or out of it would then kill this process (SIGBUS)"
                + "; allowed: guest RAM in a memfd sealed against shrinking: QEMU -object memory-backend-memfd,id=mem,"
                + "size=...,share=on (seal=on is its default; add hugetlb=on for huge pages)");
    }

    /**
     * Unregisters and unmaps one region no ring reads any more (every ring stopped or never started): at once, or,
     * while a ring that stopped undrained may still copy there (by the CPU or a DMA engine, through the
     * registration), once its last request is done ({@link PinnedMemory}).
     */
    private void release(Mapped m) {
        pinned.release(() -> {
            try {
                driver.unregisterMemory(m.region().mapping());
            } catch (RuntimeException e) { // possibly on a completion thread that serves others: log, go on
                LOG.log(System.Logger.Level.WARNING, "{0}: unregistering guest memory: {1}", name, e.toString());
            }
            try {
                m.arena().close();
            } catch (IllegalStateException e) { // still accessed (a native copy under way): it stays mapped
                LOG.log(System.Logger.Level.WARNING, "{0}: unmapping guest memory: {1}", name, e.toString());
            }
        });
    }

    /** Every region withdrawn and released (the rings stopped, or never started). */
    public void dropAll() {
        memory = GuestMemory.EMPTY;
        for (Mapped m : regions) {
            release(m);
        }
        regions.clear();
    }
}
