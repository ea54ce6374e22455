package io.pmemblk.vhost.session;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.log.RateLimitedLog;
import io.pmemblk.vhost.VhostUserBlkConfig;
import io.pmemblk.vhost.WriteCacheMode;
import io.pmemblk.vhost.blk.BlkConfigSpace;
import io.pmemblk.vhost.blk.BlkDevice;
import io.pmemblk.vhost.blk.VhostBlkQueue;
import io.pmemblk.vhost.blk.VirtioBlkConfig;
import io.pmemblk.vhost.memory.MemoryTable;
import io.pmemblk.vhost.memory.PinnedMemory;
import io.pmemblk.vhost.protocol.Refusal;
import io.pmemblk.vhost.protocol.VhostUserChannel;
import io.pmemblk.vhost.protocol.VhostUserProtocolException;
import io.pmemblk.vhost.virtq.InflightRegion;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.ThreadFactory;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;

/**
 * One front-end's connection (QEMU's vhost-user-blk-pci): {@link #run} reads and answers messages on the calling thread until the front-end closes or breaks the
 * protocol, then stops every ring, withdraws and unmaps the memory and closes what the front-end passed.
 *
 * <p>Every number the front-end sends is checked before it is used: a vring index against {@code vhost.queues},
 * a ring size against {@code vhost.queue-size}, regions against overflow, overlap, their file's size and the slot
 * count, ring addresses against the memory table, config offsets against the config space. A message refused is
 * answered with a REPLY_ACK failure when the front-end asked for one, else the connection is closed; either way
 * with a log line naming the field, its value and what is allowed.
 *
 * <p>As libvhost-user's {@code vu_process_message}, the session dispatches each message to the part it belongs to:
 * features and ownership here, the memory table ({@link MemoryTable}), the vrings ({@link Vrings}), the inflight
 * region ({@link InflightRegion}) and the device's config space ({@link BlkConfigSpace}). A ring runs as a {@link VhostBlkQueue} from
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
    /**
     * The session is ending (the front-end closed, or the server): how long a ring's requests get to complete and
     * be published before the ring is detached. Most complete within microseconds; a stuck one does not hold the
     * server's stop, and keeps only guest memory mapped ({@link PinnedMemory}).
     */
    static final long TEARDOWN_GRACE_MILLIS = 1_000;

    private final VhostUserChannel channel;
    private final VhostUserBlkConfig config;
    private final String name;
    private final long offeredFeatures;
    private long protocolFeatures;
    private final MemoryTable memory;
    private final InflightRegion inflight;
    private final BlkConfigSpace configSpace;
    private final Vrings vrings;

    /**
     * @param writeCache the server's write cache mode: what GET_CONFIG answers and SET_CONFIG changes
     * @param refusals   where refused messages are logged (the server's limit, shared by its connections)
     * @param threads    makes each ring's queue thread, unstarted
     */
    public VhostUserSession(VhostUserChannel channel, VhostUserBlkConfig config, BlockLayer layer, BlkDevice device,
                            WriteCacheMode writeCache, String name, RateLimitedLog refusals, ThreadFactory threads) {
        this.channel = channel;
        this.refusals = refusals;
        this.config = config;
        this.name = name;
        this.offeredFeatures = RING_FEATURES | VirtioBlkConfig.features(device);
        // Guest memory and the inflight region stay mapped while a ring stopped undrained may touch them.
        PinnedMemory pinned = new PinnedMemory();
        this.memory = new MemoryTable(channel, layer.driver(), pinned, name, MAX_MEM_SLOTS);
        this.inflight = new InflightRegion(channel, config.queues(), config.maxQueueSize(), pinned);
        this.configSpace = new BlkConfigSpace(channel, device, layer, config.queues(), config.maxQueueSize(), writeCache,
                name);
        this.vrings = new Vrings(channel, config, layer, device, memory, inflight, configSpace, pinned, name, threads);
    }

    /** The virtio features offered at GET_FEATURES. */
    public long offeredFeatures() {
        return offeredFeatures;
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

    /** Ends a session whose thread never started ({@link #run} not called): nothing read, the socket closed. */
    public void closeUnstarted() {
        channel.shutdown();
        teardown();
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
            case RESET_OWNER -> vrings.reset();
            case GET_PROTOCOL_FEATURES -> channel.replyU64(request, PROTOCOL_FEATURES);
            case SET_PROTOCOL_FEATURES -> setProtocolFeatures(p.get(JAVA_LONG_UNALIGNED, 0));
            case GET_QUEUE_NUM -> channel.replyU64(request, config.queues());
            case GET_MAX_MEM_SLOTS -> channel.replyU64(request, MAX_MEM_SLOTS);
            case SET_MEM_TABLE -> memory.setMemTable(p, vrings);
            case ADD_MEM_REG -> memory.addMemReg(p);
            case REM_MEM_REG -> memory.remMemReg(p, vrings);
            case SET_VRING_NUM -> vrings.setVringNum(p);
            case SET_VRING_ADDR -> vrings.setVringAddr(p);
            case SET_VRING_BASE -> vrings.setVringBase(p);
            case GET_VRING_BASE -> vrings.getVringBase(p);
            case SET_VRING_KICK -> vrings.setVringKick(p.get(JAVA_LONG_UNALIGNED, 0));
            case SET_VRING_CALL -> vrings.setVringCall(p.get(JAVA_LONG_UNALIGNED, 0));
            case SET_VRING_ERR -> vrings.setVringErr(p.get(JAVA_LONG_UNALIGNED, 0));
            case SET_VRING_ENABLE -> vrings.setVringEnable(p);
            case GET_CONFIG -> configSpace.getConfig(p);
            case SET_CONFIG -> configSpace.setConfig(p, vrings.features(), vrings);
            case GET_INFLIGHT_FD -> inflight.getInflightFd(p, protocolFeatures);
            case SET_INFLIGHT_FD -> inflight.setInflightFd(p, vrings.running());
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
        if (vrings.running() > 0) {
            throw new Refusal("features changed while " + vrings.running() + " rings run; allowed: before"
                    + " SET_VRING_KICK, or after GET_VRING_BASE");
        }
        vrings.negotiated(f);
    }

    private void setProtocolFeatures(long f) throws Refusal {
        long unknown = f & ~PROTOCOL_FEATURES;
        if (unknown != 0) {
            throw new Refusal("protocol features 0x" + Long.toHexString(f) + " include 0x" + Long.toHexString(unknown)
                    + ", never offered; allowed: bits of 0x" + Long.toHexString(PROTOCOL_FEATURES));
        }
        protocolFeatures = f;
    }

    // ------------------------------------------------------------ teardown

    /** Stops every ring, then withdraws and unmaps memory and closes the front-end's descriptors and the socket. */
    private void teardown() {
        vrings.detachAll(TEARDOWN_GRACE_MILLIS);
        memory.dropAll();
        inflight.release();
        channel.close();
    }
}
