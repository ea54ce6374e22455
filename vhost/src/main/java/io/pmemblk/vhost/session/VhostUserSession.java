package io.pmemblk.vhost.session;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.FileStat;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.SharedMemory;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.log.RateLimitedLog;
import io.pmemblk.vhost.VhostUserBlkConfig;
import io.pmemblk.vhost.WriteCacheMode;
import io.pmemblk.vhost.blk.BlkDevice;
import io.pmemblk.vhost.blk.RingPolling;
import io.pmemblk.vhost.blk.VhostBlkQueue;
import io.pmemblk.vhost.blk.VirtioBlk;
import io.pmemblk.vhost.blk.VirtioBlkConfig;
import io.pmemblk.vhost.memory.GuestMemory;
import io.pmemblk.vhost.memory.GuestRegion;
import io.pmemblk.vhost.protocol.VhostUserChannel;
import io.pmemblk.vhost.protocol.VhostUserProtocolException;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;

import static io.pmemblk.vhost.protocol.VhostUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED;

/**
 * One front-end's connection (QEMU's vhost-user-blk-pci): its features, its memory table, its rings, its inflight
 * region. {@link #run} reads and answers messages on the calling thread until the front-end closes or breaks the
 * protocol, then stops every ring, withdraws and unmaps the memory and closes what the front-end passed.
 *
 * <p>Every number the front-end sends is checked before it is used: a vring index against {@code vhost.queues},
 * a ring size against {@code vhost.queue-size}, regions against overflow, overlap, their file's size and the slot
 * count, ring addresses against the memory table, config offsets against the config space. A message refused is
 * answered with a REPLY_ACK failure when the front-end asked for one, else the connection is closed; either way
 * with a log line naming the field, its value and what is allowed. A ring runs as a {@link VhostBlkQueue} from
 * SET_VRING_KICK to GET_VRING_BASE; while memory is replaced or removed, running rings are stopped (their
 * requests drained) and started again from where they stopped, so no request touches memory that is going.
 */
public final class VhostUserSession implements Runnable {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.vhost");
    /** The server's: a front-end that sends bad messages (or reconnects to send more) cannot flood the log. */
    private final RateLimitedLog refusals;
    /** Memory slots a front-end may fill with ADD_MEM_REG: libvhost-user 7.2's VHOST_USER_MAX_RAM_SLOTS. */
    public static final int MAX_MEM_SLOTS = 32;
    /** Ring features this back-end serves on top of the device's (split ring only: no RING_PACKED). */
    static final long RING_FEATURES = bit(F_VERSION_1) | bit(F_INDIRECT_DESC) | bit(F_EVENT_IDX)
            | bit(F_PROTOCOL_FEATURES);
    /** MQ, REPLY_ACK, CONFIG, INFLIGHT_SHMFD, CONFIGURE_MEM_SLOTS: no STATUS, no SLAVE_REQ, no logging. */
    public static final long PROTOCOL_FEATURES = bit(PF_MQ) | bit(PF_REPLY_ACK) | bit(PF_CONFIG)
            | bit(PF_INFLIGHT_SHMFD) | bit(PF_CONFIGURE_MEM_SLOTS);
    /** VIRTIO_BLK_F_CONFIG_WCE's field in virtio_blk_config [VB]: the only one SET_CONFIG may write. */
    static final int CONFIG_WCE_OFFSET = 32;
    /**
     * The ring size seg_max and size_max are computed for: GET_CONFIG comes once, at realize, before any ring
     * size is known, so QEMU's default queue-size (128) stands for it (a larger ring only holds more requests).
     */
    static final int CONFIG_QUEUE_SIZE = 128;
    /** A ring stopping with requests in flight: how often the front-end's hang-up is checked, and the wait logged. */
    static final long HANGUP_CHECK_MILLIS = 200, WAIT_LOG_MILLIS = 10_000;
    /**
     * The session is ending (the front-end closed, or the server): how long a ring's requests get to complete and
     * be published before the ring is detached. Most complete within microseconds; a stuck one does not hold the
     * server's stop, and keeps only guest memory mapped ({@link PinnedMemory}).
     */
    static final long TEARDOWN_GRACE_MILLIS = 1_000;

    private final VhostUserChannel channel;
    private final VhostUserBlkConfig config;
    /** One session at a time per server, so its queues' polling bound is the server's. */
    private final RingPolling polling;
    private final BlockLayer layer;
    private final BlkDevice device;
    private final String name;
    private final long offeredFeatures;
    private final Vring[] vrings;
    private final List<Mapped> regions = new ArrayList<>();
    /** What the rings read, per batch: replaced whole, published by this volatile write. */
    private volatile GuestMemory memory = GuestMemory.EMPTY;
    private long features;
    private boolean featuresSet;
    private long protocolFeatures;
    private Inflight inflight;
    /** virtio_blk_config.wce: the server's, kept across connections and (recorded) restarts; FLUSH is durable either way. */
    private final WriteCacheMode writeCache;
    /** Guest memory and the inflight region stay mapped while a ring stopped undrained may touch them. */
    private final PinnedMemory pinned = new PinnedMemory();
    /**
     * A ring was detached undrained (the front-end went away, or the server is closing): its base is not known, so
     * no ring starts again in this session (from a stale base it would run completed requests a second time).
     */
    private boolean undrained;

    /** One guest memory region: what the rings see, and the arena that unmaps it. */
    private record Mapped(GuestRegion region, Arena arena) {}

    /** The inflight region QEMU handed back (SET_INFLIGHT_FD), split layout. */
    private record Inflight(Arena arena, MemorySegment region, int queues, int queueSize) {}

    /** What the front-end set for one ring, and the queue serving it while it runs. */
    private static final class Vring {
        int num;
        int base;
        boolean addressed;
        long desc, used, avail;
        EventFd kick, call, err;
        boolean enabled;
        VhostBlkQueue queue;
    }

    /** A message refused: answered with a REPLY_ACK failure when asked for, else the connection closes. */
    private static final class Refusal extends Exception {
        private static final long serialVersionUID = 1L;

        Refusal(String message) {
            super(message, null, false, false);
        }
    }

    /**
     * @param writeCache the server's write cache mode: what GET_CONFIG answers and SET_CONFIG changes
     * @param refusals   where refused messages are logged (the server's limit, shared by its connections)
     */
    public VhostUserSession(VhostUserChannel channel, VhostUserBlkConfig config, BlockLayer layer, BlkDevice device,
                            WriteCacheMode writeCache, String name, RateLimitedLog refusals) {
        this.writeCache = java.util.Objects.requireNonNull(writeCache, "writeCache");
        this.channel = channel;
        this.refusals = refusals;
        this.config = config;
        this.layer = layer;
        this.device = device;
        this.name = name;
        this.offeredFeatures = RING_FEATURES | VirtioBlkConfig.features(device);
        this.polling = new RingPolling(config.pollNanos(), config.coalesceNanos(), RingPolling.defaultMaxPollers());
        this.vrings = new Vring[config.queues()];
        for (int i = 0; i < vrings.length; i++) {
            vrings[i] = new Vring();
        }
    }

    /** The virtio features offered at GET_FEATURES. */
    public long offeredFeatures() {
        return offeredFeatures;
    }

    /** What the rings read: the memory table now. */
    GuestMemory memory() {
        return memory;
    }

    /** Serves the connection until it ends, then tears everything down. Never throws. */
    @Override
    public void run() {
        try {
            while (channel.read()) {
                dispatch();
            }
            LOG.log(System.Logger.Level.INFO, "{0}: the front-end closed the connection", name);
        } catch (VhostUserProtocolException e) {
            refusals.refused("{0}: closing: {1}", name, e.getMessage());
        } catch (IOException | RuntimeException e) {
            LOG.log(System.Logger.Level.WARNING, "{0}: closing after a failure: {1}", name, e.toString());
        } finally {
            teardown();
        }
    }

    /** Wakes {@link #run} from another thread: it sees the end of the stream and tears down. */
    public void shutdown() {
        channel.shutdown();
    }

    private void dispatch() throws IOException {
        int request = channel.request();
        try {
            handle(request);
            if (channel.needsReply() && !hasReplyOfItsOwn(request)) {
                channel.replyU64(request, 0); // REPLY_ACK: done
            }
        } catch (Refusal r) {
            String what = name(request) + " refused: " + r.getMessage();
            if (channel.needsReply() && !hasReplyOfItsOwn(request)) {
                refusals.refused("{0}: {1}", name, what);
                channel.replyU64(request, 1);
            } else {
                throw new VhostUserProtocolException(what);
            }
        }
    }

    private static boolean hasReplyOfItsOwn(int request) {
        return switch (request) {
            case GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM, GET_MAX_MEM_SLOTS, GET_VRING_BASE, GET_CONFIG,
                 GET_INFLIGHT_FD, GET_STATUS -> true;
            default -> false;
        };
    }

    /** Handles the message just read, replying when it has a reply of its own. */
    private void handle(int request) throws IOException, Refusal {
        MemorySegment p = channel.payload();
        switch (request) {
            case GET_FEATURES -> channel.replyU64(request, offeredFeatures);
            case SET_FEATURES -> setFeatures(p.get(JAVA_LONG_UNALIGNED, 0));
            case SET_OWNER -> { } // the session is the connection's already
            case RESET_OWNER -> resetOwner();
            case GET_PROTOCOL_FEATURES -> channel.replyU64(request, PROTOCOL_FEATURES);
            case SET_PROTOCOL_FEATURES -> setProtocolFeatures(p.get(JAVA_LONG_UNALIGNED, 0));
            case GET_QUEUE_NUM -> channel.replyU64(request, config.queues());
            case GET_MAX_MEM_SLOTS -> channel.replyU64(request, MAX_MEM_SLOTS);
            case SET_MEM_TABLE -> setMemTable(p);
            case ADD_MEM_REG -> addMemReg(p);
            case REM_MEM_REG -> remMemReg(p);
            case SET_VRING_NUM -> setVringNum(p);
            case SET_VRING_ADDR -> setVringAddr(p);
            case SET_VRING_BASE -> setVringBase(p);
            case GET_VRING_BASE -> getVringBase(p);
            case SET_VRING_KICK -> setVringKick(p.get(JAVA_LONG_UNALIGNED, 0));
            case SET_VRING_CALL -> setVringCall(p.get(JAVA_LONG_UNALIGNED, 0));
            case SET_VRING_ERR -> setVringErr(p.get(JAVA_LONG_UNALIGNED, 0));
            case SET_VRING_ENABLE -> setVringEnable(p);
            case GET_CONFIG -> getConfig(p);
            case SET_CONFIG -> setConfig(p);
            case GET_INFLIGHT_FD -> getInflightFd(p);
            case SET_INFLIGHT_FD -> setInflightFd(p);
            case SET_LOG_BASE, SET_LOG_FD -> throw new Refusal("dirty logging (migration) is not served: this back-end"
                    + " offers neither VHOST_F_LOG_ALL nor LOG_SHMFD");
            case SET_SLAVE_REQ_FD -> throw new Refusal("no back-end channel: SLAVE_REQ (protocol bit 5) is not offered");
            case SET_STATUS, GET_STATUS -> throw new Refusal("STATUS (protocol bit 16) is not offered");
            default -> throw new VhostUserProtocolException(name(request) + " (" + channel.size() + " bytes) is not a"
                    + " message this back-end serves; allowed: the vhost-user-blk messages of QEMU 7.2 (ids 1-18,"
                    + " 24, 25, 31, 32, 36-38)");
        }
    }

    // ------------------------------------------------------------ features

    private void setFeatures(long f) throws Refusal {
        long unknown = f & ~offeredFeatures;
        if (unknown != 0) {
            throw new Refusal("features 0x" + Long.toHexString(f) + " include 0x" + Long.toHexString(unknown)
                    + ", never offered; allowed: bits of 0x" + Long.toHexString(offeredFeatures));
        }
        if ((f & bit(F_VERSION_1)) == 0) {
            throw new Refusal("features 0x" + Long.toHexString(f) + " lack VIRTIO_F_VERSION_1 (bit 32): only virtio 1"
                    + " drivers are served (little-endian rings)");
        }
        if (runningRings() > 0) {
            throw new Refusal("features changed while " + runningRings() + " rings run; allowed: before"
                    + " SET_VRING_KICK, or after GET_VRING_BASE");
        }
        features = f;
        featuresSet = true;
    }

    private void setProtocolFeatures(long f) throws Refusal {
        long unknown = f & ~PROTOCOL_FEATURES;
        if (unknown != 0) {
            throw new Refusal("protocol features 0x" + Long.toHexString(f) + " include 0x" + Long.toHexString(unknown)
                    + ", never offered; allowed: bits of 0x" + Long.toHexString(PROTOCOL_FEATURES));
        }
        protocolFeatures = f;
    }

    private void resetOwner() {
        for (int i = 0; i < vrings.length; i++) {
            stopRing(i);
        }
        features = 0;
        featuresSet = false;
    }

    // ------------------------------------------------------------ memory

    private void setMemTable(MemorySegment p) throws IOException, Refusal {
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
        int[] paused = pauseRings();
        dropAllRegions();
        for (int i = 0; i < n; i++) {
            addRegion(table[i], channel.takeFd(i), "region " + i);
        }
        resumeRings(paused);
    }

    private void addMemReg(MemorySegment p) throws IOException, Refusal {
        if (channel.fdCount() != 1) {
            throw new Refusal(channel.fdCount() + " file descriptors; allowed: exactly 1, the region's");
        }
        long[] r = region(p, MEM_REG_REGION, "region");
        if (regions.size() >= MAX_MEM_SLOTS) {
            throw new Refusal("all " + MAX_MEM_SLOTS + " memory slots are used (GET_MAX_MEM_SLOTS); remove one first");
        }
        for (Mapped m : regions) {
            checkDisjoint(r, fields(m.region()), "the new region", "a region already added");
        }
        addRegion(r, channel.takeFd(0), "region");
    }

    private void remMemReg(MemorySegment p) throws Refusal {
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
        int[] paused = pauseRings();
        memory = memory.without(gpa, uaddr, size);
        regions.remove(found);
        release(found);
        resumeRings(paused);
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
            FileStat st = Libc.fstat(fd);
            if (st.isRegularFile() && st.size() < offset + size) {
                throw new Refusal(what + " (guest 0x" + Long.toHexString(r[0]) + "): mmap_offset 0x"
                        + Long.toHexString(offset) + " + memory_size 0x"
                        + Long.toHexString(size) + " passes the end of its file (0x" + Long.toHexString(st.size())
                        + " bytes): touching it would fault; allowed: a range within the file");
            }
            requireSealed(r, fd, what);
            long page = Libc.pageSize();
            long skew = offset & (page - 1);
            arena = Arena.ofShared();
            MemorySegment mapping = SharedMemory.map(fd, offset - skew, size + skew, arena).asSlice(skew, size);
            long iova = layer.driver().registerMemory(mapping);
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
        throw new Refusal(what + " (guest 0x" + Long.toHexString(r[0]) + "): its file " + Libc.describeFd(fd) + " "
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
                layer.driver().unregisterMemory(m.region().mapping());
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

    /** Unmaps the inflight region, as {@link #release} unmaps guest memory (a late completion must not find it gone). */
    private void release(Inflight i) {
        pinned.release(() -> i.arena().close());
    }

    private void dropAllRegions() {
        memory = GuestMemory.EMPTY;
        for (Mapped m : regions) {
            release(m);
        }
        regions.clear();
    }

    // ------------------------------------------------------------ rings

    private Vring vring(long index, String request) throws Refusal {
        if (index < 0 || index >= vrings.length) {
            throw new Refusal("vring index " + index + "; allowed: 0.." + (vrings.length - 1) + " (vhost.queues="
                    + vrings.length + ", GET_QUEUE_NUM)");
        }
        return vrings[(int) index];
    }

    private Vring stopped(MemorySegment p, String field) throws Refusal {
        int index = p.get(JAVA_INT_UNALIGNED, STATE_INDEX);
        Vring v = vring(Integer.toUnsignedLong(index), field);
        if (v.queue != null) {
            throw new Refusal(field + " of vring " + index + " while it runs; allowed: before SET_VRING_KICK or after"
                    + " GET_VRING_BASE");
        }
        return v;
    }

    private void setVringNum(MemorySegment p) throws Refusal {
        Vring v = stopped(p, "SET_VRING_NUM");
        int num = p.get(JAVA_INT_UNALIGNED, STATE_NUM);
        if (num < 1 || num > config.maxQueueSize()) {
            throw new Refusal("vring " + p.get(JAVA_INT_UNALIGNED, STATE_INDEX) + " size " + Integer.toUnsignedString(num)
                    + "; allowed: 1.." + config.maxQueueSize() + " (vhost.queue-size)");
        }
        v.num = num;
    }

    private void setVringBase(MemorySegment p) throws Refusal {
        Vring v = stopped(p, "SET_VRING_BASE");
        int base = p.get(JAVA_INT_UNALIGNED, STATE_NUM);
        if (base < 0 || base > 0xffff) {
            throw new Refusal("vring " + p.get(JAVA_INT_UNALIGNED, STATE_INDEX) + " base " + Integer.toUnsignedString(base)
                    + "; allowed: 0..65535 (a split ring's 16-bit avail index; packed rings are not offered)");
        }
        v.base = base;
    }

    private void setVringAddr(MemorySegment p) throws Refusal {
        int index = p.get(JAVA_INT_UNALIGNED, ADDR_INDEX);
        Vring v = stopped(p, "SET_VRING_ADDR");
        int flags = p.get(JAVA_INT_UNALIGNED, ADDR_FLAGS);
        if ((flags & VRING_F_LOG) != 0) {
            throw new Refusal("vring " + index + " flags 0x" + Integer.toHexString(flags) + " ask for used-ring logging;"
                    + " allowed: 0 (VHOST_F_LOG_ALL is not offered)");
        }
        v.desc = p.get(JAVA_LONG_UNALIGNED, ADDR_DESC);
        v.used = p.get(JAVA_LONG_UNALIGNED, ADDR_USED);
        v.avail = p.get(JAVA_LONG_UNALIGNED, ADDR_AVAIL);
        v.addressed = true;
        if (v.num > 0) {
            checkRing(index, v); // early, so the front-end hears of it where it went wrong; again at the start
        }
    }

    /**
     * The three rings of vring {@code index} lie in guest memory, each in one region, aligned as the virtio spec
     * demands (2.7: descriptors 16, avail 2, used 4), with room for their EVENT_IDX fields.
     */
    private void checkRing(int index, Vring v) throws Refusal {
        checkRingPart(index, "descriptor table", v.desc, 16L * v.num, 16);
        checkRingPart(index, "avail ring", v.avail, 6 + 2L * v.num, 2);
        checkRingPart(index, "used ring", v.used, 6 + 8L * v.num, 4);
    }

    private void checkRingPart(int index, String part, long addr, long length, int align) throws Refusal {
        if ((addr & (align - 1)) != 0) {
            throw new Refusal("vring " + index + " " + part + " at 0x" + Long.toHexString(addr) + "; allowed: a multiple"
                    + " of " + align);
        }
        if (memory.userSlice(addr, length) == null) {
            throw new Refusal("vring " + index + " " + part + " at user address 0x" + Long.toHexString(addr) + " ("
                    + length + " bytes) is not within one region of the memory table (" + regions.size()
                    + " regions); allowed: ring addresses inside the guest memory the front-end announced");
        }
    }

    private void getVringBase(MemorySegment p) throws IOException, Refusal {
        int index = p.get(JAVA_INT_UNALIGNED, STATE_INDEX);
        Vring v = vring(Integer.toUnsignedLong(index), "GET_VRING_BASE");
        if (!stopRing(index)) {
            // Never a stale index: the position is not known while requests are out, and nobody waits for it.
            throw new VhostUserProtocolException("GET_VRING_BASE of vring " + index + " not answered: the front-end"
                    + " went away (or the server is closing) while requests of the ring were in flight");
        }
        // the ring is stopped [S] "Ring states": libvhost-user closes its kick and call fds; QEMU sends new ones
        closeQuietly(v.kick);
        closeQuietly(v.call);
        v.kick = null;
        v.call = null;
        MemorySegment r = channel.replyPayload();
        r.set(JAVA_INT_UNALIGNED, STATE_INDEX, index);
        r.set(JAVA_INT_UNALIGNED, STATE_NUM, v.base);
        channel.reply(GET_VRING_BASE, STATE_SIZE);
    }

    /** The vring a KICK/CALL/ERR word names, and its fd (-1 when bit 8 says none), checked against the fds sent. */
    private int fileOf(long word, String request) throws Refusal {
        long index = word & VRING_IDX_MASK;
        if ((word & ~(VRING_IDX_MASK | VRING_NOFD_MASK)) != 0) {
            throw new Refusal("u64 0x" + Long.toHexString(word) + " sets bits beyond the index (0-7) and no-fd (8)"
                    + " flag; allowed: those only");
        }
        vring(index, request);
        boolean noFd = (word & VRING_NOFD_MASK) != 0;
        if (channel.fdCount() != (noFd ? 0 : 1)) {
            throw new Refusal("vring " + index + ": " + channel.fdCount() + " file descriptors"
                    + (noFd ? " with the no-fd flag; allowed: none" : "; allowed: exactly 1 (or bit 8 and none)"));
        }
        return noFd ? -1 : channel.takeFd(0);
    }

    private void setVringKick(long word) throws Refusal {
        int index = (int) (word & VRING_IDX_MASK);
        int fd = fileOf(word, "SET_VRING_KICK");
        if (fd < 0) {
            throw new Refusal("vring " + index + " without a kick fd (polling mode) is not served; allowed: an eventfd");
        }
        EventFd kick = notifier(fd, "vring " + index + " kick fd");
        Vring v = vrings[index];
        stopRing(index);
        closeQuietly(v.kick);
        v.kick = kick;
        startRing(index); // SET_VRING_KICK starts the ring [S] "Ring states"
    }

    private void setVringCall(long word) throws Refusal {
        int index = (int) (word & VRING_IDX_MASK);
        int fd = fileOf(word, "SET_VRING_CALL");
        EventFd call = fd < 0 ? null : notifier(fd, "vring " + index + " call fd");
        Vring v = vrings[index];
        boolean running = v.queue != null;
        stopRing(index); // the queue takes its call fd at start: a new one means a restart where it stopped
        closeQuietly(v.call);
        v.call = call;
        if (running) {
            startRing(index);
        }
    }

    private void setVringErr(long word) throws Refusal {
        int index = (int) (word & VRING_IDX_MASK);
        int fd = fileOf(word, "SET_VRING_ERR");
        EventFd err = fd < 0 ? null : notifier(fd, "vring " + index + " err fd");
        Vring v = vrings[index];
        closeQuietly(v.err);
        v.err = err; // kept for the front-end's sake; a broken ring closes the session
    }

    /**
     * The front end's notifier {@code fd}, checked to be an eventfd and made non-blocking
     * ({@link EventFd#adoptNotifier}): a write to anything else, or to an eventfd whose counter the front end
     * filled, could block the thread that signals it. Closed here when refused.
     */
    private static EventFd notifier(int fd, String what) throws Refusal {
        try {
            return EventFd.adoptNotifier(fd, what);
        } catch (IllegalArgumentException | NativeException e) {
            try {
                Libc.close(fd);
            } catch (NativeException ignored) {
                // ours to close; nothing else to do if it is gone
            }
            throw new Refusal(e.getMessage());
        }
    }

    private void setVringEnable(MemorySegment p) throws Refusal {
        int index = p.get(JAVA_INT_UNALIGNED, STATE_INDEX);
        Vring v = vring(Integer.toUnsignedLong(index), "SET_VRING_ENABLE");
        int num = p.get(JAVA_INT_UNALIGNED, STATE_NUM);
        if (num != 0 && num != 1) {
            throw new Refusal("vring " + index + " enable " + Integer.toUnsignedString(num) + "; allowed: 0 or 1");
        }
        v.enabled = num == 1;
        if (v.queue != null) {
            v.queue.enable(v.enabled); // disabled: nothing more is popped; enabled again: it resumes where it was
        }
    }

    private void startRing(int index) throws Refusal {
        Vring v = vrings[index];
        if (undrained) {
            throw new IllegalStateException("vring " + index + " not started: a ring was stopped with requests in"
                    + " flight (the front-end went away or the server is closing), and the session ends");
        }
        if (v.num == 0 || !v.addressed) {
            throw new Refusal("vring " + index + " started before its " + (v.num == 0 ? "SET_VRING_NUM" : "SET_VRING_ADDR")
                    + "; allowed: SET_VRING_NUM, SET_VRING_BASE and SET_VRING_ADDR, then SET_VRING_KICK");
        }
        if (!featuresSet) {
            throw new Refusal("vring " + index + " started before SET_FEATURES; allowed: features first");
        }
        checkRing(index, v);
        MemorySegment inflightSlice = null;
        if (inflight != null) {
            if (index >= inflight.queues() || v.num > inflight.queueSize()) {
                throw new Refusal("vring " + index + " of size " + v.num + " has no place in the inflight region ("
                        + inflight.queues() + " queues of " + inflight.queueSize() + "); allowed: index below "
                        + inflight.queues() + ", size at most " + inflight.queueSize());
            }
            long stride = inflightQueueStride(inflight.queueSize());
            inflightSlice = inflight.region().asSlice(stride * index, stride);
        }
        FrontendQueue submit = new FrontendQueue(layer.queue(index % layer.queueCount()));
        VhostBlkQueue q;
        try {
            q = new VhostBlkQueue(index, v.num, v.desc, v.avail, v.used, v.base, features, v.kick, v.call, submit,
                    this::memory, inflightSlice, device, polling);
        } catch (IllegalArgumentException | IllegalStateException e) {
            throw new Refusal("vring " + index + " cannot start: " + e.getMessage()); // rings, or the inflight state
        }
        q.writeCache(servesWriteback(features));
        // With VHOST_USER_F_PROTOCOL_FEATURES negotiated a ring starts disabled, until SET_VRING_ENABLE(1)
        // (vhost-user.rst "Ring states"; QEMU 7.2 sends it after the kicks); without it, enabled.
        q.enable(v.enabled || (features & bit(F_PROTOCOL_FEATURES)) == 0);
        q.start();
        v.queue = q;
    }

    /**
     * Stops vring {@code index} if it runs, waiting for every request in flight to complete and be published
     * first, for as long as that takes while the front-end waits: GET_VRING_BASE must answer the ring's true
     * position (vhost-user.rst "Ring states": the ring stops there; QEMU stores the answer and restarts the ring
     * from it, so an index short of it makes a restart run completed requests again, from whatever their buffers
     * hold by then), and a request may not be given up on while it can still touch guest memory. A FLUSH is one
     * msync and may take longer than any bound we could pick; QEMU's own virtio-blk drains without a bound too
     * ({@code blk_drain} at reset). The wait ends early only when the front-end hangs up or the server shuts the
     * session down: then nobody waits for the answer, and the ring is detached ({@link #stopRing(int, long)}).
     * @return whether it stopped drained (its base is then where it stopped); false: detached with requests out
     */
    private boolean stopRing(int index) {
        return stopRing(index, -1);
    }

    /**
     * Stops vring {@code index} if it runs: halts its thread, waits for its requests (at most {@code graceMillis};
     * negative: while the front-end is connected, logging every {@link #WAIT_LOG_MILLIS}), and detaches it. A ring
     * still busy then completes into nothing: its guest memory and the inflight region stay mapped until its last
     * request is done ({@link PinnedMemory}), and what it had in flight stays marked in the inflight region, for
     * the next start to resubmit.
     * @return whether it stopped drained (or was not running)
     */
    private boolean stopRing(int index, long graceMillis) {
        Vring v = vrings[index];
        VhostBlkQueue q = v.queue;
        if (q == null) {
            return true;
        }
        v.queue = null;
        q.halt();
        long from = System.nanoTime();
        long nextLog = WAIT_LOG_MILLIS;
        boolean quiet;
        try {
            if (graceMillis >= 0) {
                quiet = q.awaitQuiet(graceMillis);
            } else {
                while (!(quiet = q.awaitQuiet(HANGUP_CHECK_MILLIS)) && !channel.hungUp()) {
                    long waited = (System.nanoTime() - from) / 1_000_000;
                    if (waited >= nextLog) {
                        nextLog += WAIT_LOG_MILLIS;
                        LOG.log(System.Logger.Level.WARNING, "{0}: vring {1} stopping: waited {2} s for its requests"
                                + " in flight (heads {3}) to complete; the front-end waits for the ring''s position"
                                + " until they do", name, index, waited / 1000, q.inFlightHeads());
                    }
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            quiet = false;
        }
        if (quiet) {
            v.base = q.detach(null);
            return true;
        }
        String heads = q.inFlightHeads();
        undrained = true;
        pinned.pin();
        q.detach(pinned::unpin);
        LOG.log(System.Logger.Level.ERROR, "{0}: vring {1} stopped with requests still in flight (heads {2}): the"
                + " front-end went away or the server is closing; their completions are not published, and guest"
                + " memory stays mapped until they are done", name, index, heads);
        return false;
    }

    private int runningRings() {
        int n = 0;
        for (Vring v : vrings) {
            n += v.queue != null ? 1 : 0;
        }
        return n;
    }

    /** Stops every running ring (draining its requests); their indexes, to start again. */
    private int[] pauseRings() {
        int[] paused = new int[runningRings()];
        int n = 0;
        for (int i = 0; i < vrings.length; i++) {
            if (vrings[i].queue != null) {
                stopRing(i);
                paused[n++] = i;
            }
        }
        return paused;
    }

    private void resumeRings(int[] paused) {
        for (int i : paused) {
            try {
                startRing(i);
            } catch (Refusal r) {
                LOG.log(System.Logger.Level.WARNING, "{0}: vring {1} stays stopped after the memory change: {2}",
                        name, i, r.getMessage());
            }
        }
    }

    // ------------------------------------------------------------ config

    /**
     * Whether rings of a driver that negotiated {@code f} may leave writes in the cache until a FLUSH. Only with
     * VIRTIO_BLK_F_FLUSH can the driver ask for durability; with CONFIG_WCE it reads and sets the mode, without it
     * it was never told of a cache. So as Linux's virtio_blk ({@code virtblk_get_cache_mode}) and QEMU's virtio-blk
     * ({@code virtio_blk_set_features}) decide: neither FLUSH nor CONFIG_WCE (SeaBIOS) is write-through; FLUSH
     * without CONFIG_WCE is writeback; CONFIG_WCE follows the server's mode (and without FLUSH, write-through, as
     * a guest that cannot flush has nothing else).
     */
    private boolean servesWriteback(long f) {
        if ((f & bit(VirtioBlk.F_FLUSH)) == 0) {
            return false;
        }
        return (f & bit(VirtioBlk.F_CONFIG_WCE)) == 0 || writeCache.writeback();
    }

    private void getConfig(MemorySegment p) throws IOException, Refusal {
        int offset = p.get(JAVA_INT_UNALIGNED, CONFIG_OFFSET);
        int size = p.get(JAVA_INT_UNALIGNED, CONFIG_SIZE);
        checkConfigSize(offset, size);
        byte[] cfg = VirtioBlkConfig.bytes(device, config.queues(), Math.min(config.maxQueueSize(), CONFIG_QUEUE_SIZE),
                layer.maxRequestBytes());
        cfg[CONFIG_WCE_OFFSET] = (byte) (writeCache.writeback() ? 1 : 0);
        MemorySegment r = channel.replyPayload();
        MemorySegment.copy(p, 0, r, 0, CONFIG_REGION); // offset, size and flags as asked
        r.asSlice(CONFIG_REGION, size).fill((byte) 0); // past the config space: zero, nothing offered there
        int have = Math.min(size, cfg.length - offset);
        if (have > 0) {
            MemorySegment.copy(cfg, offset, r, JAVA_BYTE, CONFIG_REGION, have);
        }
        channel.reply(GET_CONFIG, CONFIG_REGION + size);
    }

    private void checkConfigSize(int offset, int size) throws Refusal {
        if (size < 1 || size > MAX_CONFIG_SIZE || channel.size() != CONFIG_REGION + size) {
            throw new Refusal("config size " + Integer.toUnsignedString(size) + " in a payload of " + channel.size()
                    + " bytes; allowed: 1.." + MAX_CONFIG_SIZE + " and a payload of 12 + size");
        }
        if (offset < 0 || offset > MAX_CONFIG_SIZE - size) {
            throw new Refusal("config offset " + Integer.toUnsignedString(offset) + " + size " + size + "; allowed: within"
                    + " the " + MAX_CONFIG_SIZE + "-byte config space");
        }
    }

    private void setConfig(MemorySegment p) throws Refusal {
        int offset = p.get(JAVA_INT_UNALIGNED, CONFIG_OFFSET);
        int size = p.get(JAVA_INT_UNALIGNED, CONFIG_SIZE);
        int flags = p.get(JAVA_INT_UNALIGNED, CONFIG_FLAGS);
        checkConfigSize(offset, size);
        if (flags != CONFIG_TYPE_FRONTEND || offset != CONFIG_WCE_OFFSET || size != 1) {
            throw new Refusal("a write of " + size + " bytes at config offset " + offset + " with flags " + flags
                    + "; allowed: the 1-byte wce at offset " + CONFIG_WCE_OFFSET + " with flags 0 (front-end)");
        }
        byte wce = p.get(JAVA_BYTE, CONFIG_REGION);
        if (wce != 0 && wce != 1) {
            throw new Refusal("wce " + wce + "; allowed: 0 (write through) or 1 (writeback)");
        }
        boolean on = wce == 1;
        if (!on) {
            applyWriteCache(false); // write through before it is recorded: never less durable than the guest was told
        }
        IOException failed = null;
        try {
            writeCache.set(on); // recorded durably before the reply QEMU waits for (REPLY_ACK) leaves
        } catch (IOException e) {
            failed = e;
        }
        applyWriteCache(servesWriteback(features)); // write through: every write durable before it completes
        if (failed != null) {
            throw new Refusal("the guest's write cache " + (on ? "on" : "off") + " is not in force ("
                    + (writeCache.writeback() ? "writeback" : "write through") + " is): " + failed.getMessage());
        }
        LOG.log(System.Logger.Level.INFO, "{0}: the guest set the cache to {1}{2}", name,
                on ? "writeback" : "write through",
                writeCache.recordedAt() == null ? "" : ", recorded in " + writeCache.recordedAt());
    }

    /** Every running ring to {@code writeback} (the server's mode as this driver's features allow it). */
    private void applyWriteCache(boolean writeback) {
        for (Vring v : vrings) {
            if (v.queue != null) {
                v.queue.writeCache(writeback);
            }
        }
    }

    // ------------------------------------------------------------ inflight

    private void getInflightFd(MemorySegment p) throws IOException, Refusal {
        if ((protocolFeatures & bit(PF_INFLIGHT_SHMFD)) == 0) {
            throw new Refusal("INFLIGHT_SHMFD (protocol bit 12) was not negotiated");
        }
        int queues = Short.toUnsignedInt(p.get(JAVA_SHORT_UNALIGNED, INFLIGHT_NUM_QUEUES));
        int queueSize = Short.toUnsignedInt(p.get(JAVA_SHORT_UNALIGNED, INFLIGHT_QUEUE_SIZE));
        checkInflightShape(queues, queueSize);
        long size = inflightQueueStride(queueSize) * queues;
        int fd = SharedMemory.memfd("pmemblk-vhost-inflight", size);
        try {
            SharedMemory.seal(fd); // the front-end maps it too, and hands it back after our restart
            MemorySegment r = channel.replyPayload();
            r.set(JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_SIZE, size);
            r.set(JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_OFFSET, 0L);
            r.set(JAVA_SHORT_UNALIGNED, INFLIGHT_NUM_QUEUES, (short) queues);
            r.set(JAVA_SHORT_UNALIGNED, INFLIGHT_QUEUE_SIZE, (short) queueSize);
            r.set(JAVA_INT_UNALIGNED, INFLIGHT_QUEUE_SIZE + 2, 0);
            channel.reply(GET_INFLIGHT_FD, INFLIGHT_SIZE, fd);
        } finally {
            Libc.close(fd); // QEMU has its copy; it sends it back with SET_INFLIGHT_FD, which maps it
        }
    }

    private void checkInflightShape(int queues, int queueSize) throws Refusal {
        if (queues < 1 || queues > vrings.length) {
            throw new Refusal("inflight num_queues " + queues + "; allowed: 1.." + vrings.length + " (vhost.queues)");
        }
        if (queueSize < 1 || queueSize > config.maxQueueSize()) {
            throw new Refusal("inflight queue_size " + queueSize + "; allowed: 1.." + config.maxQueueSize()
                    + " (vhost.queue-size)");
        }
    }

    private void setInflightFd(MemorySegment p) throws Refusal, NativeException {
        if (channel.fdCount() != 1) {
            throw new Refusal(channel.fdCount() + " file descriptors; allowed: exactly 1, the inflight region's");
        }
        int fd = channel.takeFd(0);
        Arena arena = null;
        try {
            long size = p.get(JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_SIZE);
            long offset = p.get(JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_OFFSET);
            int queues = Short.toUnsignedInt(p.get(JAVA_SHORT_UNALIGNED, INFLIGHT_NUM_QUEUES));
            int queueSize = Short.toUnsignedInt(p.get(JAVA_SHORT_UNALIGNED, INFLIGHT_QUEUE_SIZE));
            checkInflightShape(queues, queueSize);
            long needed = inflightQueueStride(queueSize) * queues;
            if (size < needed || size > needed + Libc.pageSize()) {
                throw new Refusal("inflight mmap_size " + size + " for " + queues + " queues of " + queueSize
                        + "; allowed: " + needed + " (+ up to a page)");
            }
            if (offset < 0 || (offset & (Libc.pageSize() - 1)) != 0 || offset > Long.MAX_VALUE - size) {
                throw new Refusal("inflight mmap_offset 0x" + Long.toHexString(offset) + "; allowed: a page multiple");
            }
            FileStat st = Libc.fstat(fd);
            if (!st.isRegularFile() || st.size() < offset + size) {
                throw new Refusal("the inflight fd holds " + st.size() + " bytes, not the " + (offset + size)
                        + " its mmap_offset and mmap_size need; allowed: the memfd GET_INFLIGHT_FD gave");
            }
            int seals = SharedMemory.seals(fd); // -1: a file that cannot be sealed at all
            if (seals < 0 || (seals & SharedMemory.F_SEAL_SHRINK) == 0) {
                // Ours (GET_INFLIGHT_FD, this server's or the one before it) is a memfd sealed so; one that can
                // shrink would fault the rings' inflight updates once the front end truncated it.
                throw new Refusal("the inflight fd is not a memfd sealed with F_SEAL_SHRINK; allowed: the memfd"
                        + " GET_INFLIGHT_FD gave (sealed)");
            }
            if (runningRings() > 0) {
                throw new Refusal("inflight region replaced while " + runningRings() + " rings run; allowed: before"
                        + " SET_VRING_KICK");
            }
            arena = Arena.ofShared();
            MemorySegment region = SharedMemory.map(fd, offset, size, arena);
            long stride = inflightQueueStride(queueSize);
            for (int q = 0; q < queues; q++) {
                // each queue's desc_num, as libvhost-user writes it (vu_set_inflight_fd): the queue reads it back
                region.set(JAVA_SHORT_UNALIGNED, q * stride + INFLIGHT_DESC_NUM, (short) queueSize);
            }
            if (inflight != null) {
                release(inflight);
            }
            inflight = new Inflight(arena, region, queues, queueSize);
            arena = null;
        } finally {
            if (arena != null) {
                arena.close();
            }
            Libc.close(fd);
        }
    }

    // ------------------------------------------------------------ teardown

    private static void closeQuietly(EventFd e) {
        if (e != null) {
            try {
                e.close();
            } catch (NativeException ignored) {
                // the front-end's descriptor: nothing to do if it is gone
            }
        }
    }

    /** Stops every ring, then withdraws and unmaps memory and closes the front-end's descriptors and the socket. */
    private void teardown() {
        for (int i = 0; i < vrings.length; i++) {
            stopRing(i, TEARDOWN_GRACE_MILLIS);
        }
        for (Vring v : vrings) {
            closeQuietly(v.kick);
            closeQuietly(v.call);
            closeQuietly(v.err);
            v.kick = v.call = v.err = null;
        }
        dropAllRegions();
        if (inflight != null) {
            release(inflight);
        }
        inflight = null;
        channel.close();
    }
}
