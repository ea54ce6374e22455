package io.pmemblk.vhost.session;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.vhost.VhostUserBlkConfig;
import io.pmemblk.vhost.blk.BlkConfigSpace;
import io.pmemblk.vhost.blk.BlkDevice;
import io.pmemblk.vhost.blk.QueueWiring;
import io.pmemblk.vhost.blk.RingPolling;
import io.pmemblk.vhost.blk.VhostBlkQueue;
import io.pmemblk.vhost.blk.VringAddress;
import io.pmemblk.vhost.memory.MemoryTable;
import io.pmemblk.vhost.memory.PinnedMemory;
import io.pmemblk.vhost.protocol.Refusal;
import io.pmemblk.vhost.protocol.VhostUserChannel;
import io.pmemblk.vhost.protocol.VhostUserProtocolException;
import io.pmemblk.vhost.spec.SplitRingLayout;
import io.pmemblk.vhost.virtq.InflightRegion;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.ThreadFactory;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;

/**
 * One connection's vrings (vhost-user.rst "Ring states"): what the front-end set for each (SET_VRING_NUM, _ADDR,
 * _BASE, _KICK, _CALL, _ERR, _ENABLE), checked against {@code vhost.queues}, {@code vhost.queue-size} and the
 * memory table, and the {@link VhostBlkQueue} that serves a ring from SET_VRING_KICK to GET_VRING_BASE. A ring
 * stops drained (GET_VRING_BASE answers its true position) unless the front-end goes away; while memory is
 * replaced or removed, running rings are stopped and started again from where they stopped.
 */
final class Vrings implements MemoryTable.Rings, BlkConfigSpace.Rings {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.vhost");
    /** A ring stopping with requests in flight: how often the front-end's hang-up is checked, and the wait logged. */
    static final long HANGUP_CHECK_MILLIS = 200, WAIT_LOG_MILLIS = 10_000;

    private final VhostUserChannel channel;
    private final VhostUserBlkConfig config;
    /** One session at a time per server, so its queues' polling bound is the server's. */
    private final RingPolling polling;
    private final BlockLayer layer;
    private final BlkDevice device;
    private final MemoryTable memory;
    private final InflightRegion inflight;
    private final BlkConfigSpace configSpace;
    /** Guest memory and the inflight region stay mapped while a ring stopped undrained may touch them. */
    private final PinnedMemory pinned;
    private final String name;
    private final Vring[] vrings;
    private final ThreadFactory threads;
    /** The negotiated virtio features (SET_FEATURES), which every ring started serves. */
    private long features;
    private boolean featuresSet;
    /**
     * A ring was detached undrained (the front-end went away, or the server is closing): its base is not known, so
     * no ring starts again in this session (from a stale base it would run completed requests a second time).
     */
    private boolean undrained;

    /** What the front-end set for one ring, and the queue serving it while it runs. */
    private static final class Vring {
        VringAddress address;
        boolean addressed;
        EventFd kick, call, err;
        boolean enabled;
        VhostBlkQueue queue;

        Vring(int index) {
            address = VringAddress.unset(index);
        }
    }

    Vrings(VhostUserChannel channel, VhostUserBlkConfig config, BlockLayer layer, BlkDevice device,
           MemoryTable memory, InflightRegion inflight, BlkConfigSpace configSpace, PinnedMemory pinned, String name,
           ThreadFactory threads) {
        this.channel = channel;
        this.threads = threads;
        this.config = config;
        this.layer = layer;
        this.device = device;
        this.memory = memory;
        this.inflight = inflight;
        this.configSpace = configSpace;
        this.pinned = pinned;
        this.name = name;
        this.polling = new RingPolling(config.pollNanos(), config.coalesceNanos(), RingPolling.defaultMaxPollers());
        this.vrings = new Vring[config.queues()];
        for (int i = 0; i < vrings.length; i++) {
            vrings[i] = new Vring(i);
        }
    }

    /** SET_FEATURES, accepted: what the rings started from now on serve. */
    void negotiated(long f) {
        features = f;
        featuresSet = true;
    }

    /** The negotiated features (0 before SET_FEATURES). */
    long features() {
        return features;
    }

    /** RESET_OWNER: every ring stopped, the features forgotten. */
    void reset() {
        for (int i = 0; i < vrings.length; i++) {
            stopRing(i);
        }
        features = 0;
        featuresSet = false;
    }

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

    void setVringNum(MemorySegment p) throws Refusal {
        Vring v = stopped(p, "SET_VRING_NUM");
        int num = p.get(JAVA_INT_UNALIGNED, STATE_NUM);
        // Virtio 1.2 2.7: a split queue's size is a power of 2 (rte_vhost's vhost_user_set_vring_num refuses others).
        if (num < 1 || num > config.maxQueueSize() || Integer.bitCount(num) != 1) {
            throw new Refusal("vring " + p.get(JAVA_INT_UNALIGNED, STATE_INDEX) + " size " + Integer.toUnsignedString(num)
                    + "; allowed: a power of 2 in 1.." + config.maxQueueSize() + " (vhost.queue-size; virtio 1.2 2.7:"
                    + " a split queue's size is a power of 2)");
        }
        v.address = v.address.withSize(num);
    }

    void setVringBase(MemorySegment p) throws Refusal {
        Vring v = stopped(p, "SET_VRING_BASE");
        int base = p.get(JAVA_INT_UNALIGNED, STATE_NUM);
        if (base < 0 || base > 0xffff) {
            throw new Refusal("vring " + p.get(JAVA_INT_UNALIGNED, STATE_INDEX) + " base " + Integer.toUnsignedString(base)
                    + "; allowed: 0..65535 (a split ring's 16-bit avail index; packed rings are not offered)");
        }
        v.address = v.address.withBase(base);
    }

    void setVringAddr(MemorySegment p) throws Refusal {
        int index = p.get(JAVA_INT_UNALIGNED, ADDR_INDEX);
        Vring v = stopped(p, "SET_VRING_ADDR");
        int flags = p.get(JAVA_INT_UNALIGNED, ADDR_FLAGS);
        if ((flags & VRING_F_LOG) != 0) {
            throw new Refusal("vring " + index + " flags 0x" + Integer.toHexString(flags) + " ask for used-ring logging;"
                    + " allowed: 0 (VHOST_F_LOG_ALL is not offered)");
        }
        v.address = v.address.withRings(p.get(JAVA_LONG_UNALIGNED, ADDR_DESC), p.get(JAVA_LONG_UNALIGNED, ADDR_AVAIL),
                p.get(JAVA_LONG_UNALIGNED, ADDR_USED));
        v.addressed = true;
        if (v.address.size() > 0) {
            checkRing(index, v.address); // early, so the front-end hears of it where it went wrong; again at the start
        }
    }

    /**
     * The three rings of vring {@code index} lie in guest memory, each in one region, aligned as the virtio spec
     * demands (2.7: descriptors 16, avail 2, used 4), with room for their EVENT_IDX fields when it was negotiated:
     * QEMU sizes them so ({@code vhost_get_vring_avail_size}), and a ring without them may end right before a hole.
     * Before SET_FEATURES (features 0) the smaller size is checked; the start checks again with the features.
     */
    private void checkRing(int index, VringAddress a) throws Refusal {
        boolean eventIdx = (features & bit(F_EVENT_IDX)) != 0;
        checkRingPart(index, "descriptor table", a.desc(), SplitRingLayout.descBytes(a.size()), 16);
        checkRingPart(index, "avail ring", a.avail(), SplitRingLayout.availBytes(a.size(), eventIdx), 2);
        checkRingPart(index, "used ring", a.used(), SplitRingLayout.usedBytes(a.size(), eventIdx), 4);
    }

    private void checkRingPart(int index, String part, long addr, long length, int align) throws Refusal {
        if ((addr & (align - 1)) != 0) {
            throw new Refusal("vring " + index + " " + part + " at 0x" + Long.toHexString(addr) + "; allowed: a multiple"
                    + " of " + align);
        }
        if (memory.memory().userSlice(addr, length) == null) {
            throw new Refusal("vring " + index + " " + part + " at user address 0x" + Long.toHexString(addr) + " ("
                    + length + " bytes) is not within one region of the memory table (" + memory.regionCount()
                    + " regions); allowed: ring addresses inside the guest memory the front-end announced");
        }
    }

    void getVringBase(MemorySegment p) throws IOException, Refusal {
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
        r.set(JAVA_INT_UNALIGNED, STATE_NUM, v.address.base());
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

    void setVringKick(long word) throws Refusal {
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

    void setVringCall(long word) throws Refusal {
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

    void setVringErr(long word) throws Refusal {
        int index = (int) (word & VRING_IDX_MASK);
        int fd = fileOf(word, "SET_VRING_ERR");
        EventFd err = fd < 0 ? null : notifier(fd, "vring " + index + " err fd");
        Vring v = vrings[index];
        boolean running = v.queue != null;
        stopRing(index); // as for the call fd: the queue takes it at start, and must be done with the old one
        closeQuietly(v.err);
        v.err = err;
        if (running) {
            startRing(index);
        }
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

    void setVringEnable(MemorySegment p) throws Refusal {
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
        if (v.address.size() == 0 || !v.addressed) {
            throw new Refusal("vring " + index + " started before its " + (v.address.size() == 0 ? "SET_VRING_NUM" : "SET_VRING_ADDR")
                    + "; allowed: SET_VRING_NUM, SET_VRING_BASE and SET_VRING_ADDR, then SET_VRING_KICK");
        }
        if (!featuresSet) {
            throw new Refusal("vring " + index + " started before SET_FEATURES; allowed: features first");
        }
        checkRing(index, v.address);
        MemorySegment inflightSlice = inflight.slice(index, v.address.size());
        FrontendQueue submit = new FrontendQueue(layer.queue(index % layer.queueCount()));
        VhostBlkQueue q;
        try {
            q = new VhostBlkQueue(v.address,
                    new QueueWiring(features, v.kick, v.call, v.err, submit, memory::memory, inflightSlice, device, polling,
                            threads));
        } catch (IllegalArgumentException | IllegalStateException e) {
            throw new Refusal("vring " + index + " cannot start: " + e.getMessage()); // rings, or the inflight state
        }
        q.writeCache(configSpace.servesWriteback(features));
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
            v.address = v.address.withBase(q.detach(null));
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

    /** Rings running now. */
    int running() {
        int n = 0;
        for (Vring v : vrings) {
            n += v.queue != null ? 1 : 0;
        }
        return n;
    }

    /** Stops every running ring (draining its requests); their indexes, to start again. */
    @Override
    public int[] pause() {
        int[] paused = new int[running()];
        int n = 0;
        for (int i = 0; i < vrings.length; i++) {
            if (vrings[i].queue != null) {
                stopRing(i);
                paused[n++] = i;
            }
        }
        return paused;
    }

    @Override
    public void resume(int[] paused) {
        for (int i : paused) {
            try {
                startRing(i);
            } catch (Refusal r) {
                LOG.log(System.Logger.Level.WARNING, "{0}: vring {1} stays stopped after the memory change: {2}",
                        name, i, r.getMessage());
            }
        }
    }

    /** Every running ring to {@code writeback} (the server's mode as this driver's features allow it). */
    @Override
    public void writeCache(boolean writeback) {
        for (Vring v : vrings) {
            if (v.queue != null) {
                v.queue.writeCache(writeback);
            }
        }
    }

    /**
     * The session ends: every ring stopped, giving its requests at most {@code graceMillis} (a ring still busy
     * then is detached, see {@link #stopRing(int, long)}), and the front-end's eventfds closed.
     */
    void detachAll(long graceMillis) {
        for (int i = 0; i < vrings.length; i++) {
            stopRing(i, graceMillis);
        }
        for (Vring v : vrings) {
            closeQuietly(v.kick);
            closeQuietly(v.call);
            closeQuietly(v.err);
            v.kick = v.call = v.err = null;
        }
    }

    private static void closeQuietly(EventFd e) {
        if (e != null) {
            try {
                e.close();
            } catch (NativeException ignored) {
                // the front-end's descriptor: nothing to do if it is gone
            }
        }
    }
}
