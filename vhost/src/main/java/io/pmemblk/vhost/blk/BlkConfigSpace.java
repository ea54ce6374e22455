package io.pmemblk.vhost.blk;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.vhost.WriteCacheMode;
import io.pmemblk.vhost.protocol.Refusal;
import io.pmemblk.vhost.protocol.VhostUserChannel;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;

/**
 * The virtio-blk config space as the front-end reads and writes it (GET_CONFIG, SET_CONFIG; virtio 1.2 5.2.4), and
 * the write cache mode (wce) in it. The mode is the server's, not this connection's ({@link WriteCacheMode}): QEMU
 * reads the config once, at realize, and writes nothing when it reconnects, so what the guest set outlives the
 * connection, and is recorded to outlive a restart.
 */
public final class BlkConfigSpace {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.vhost");
    /** VIRTIO_BLK_F_CONFIG_WCE's field in virtio_blk_config [VB]: the only one SET_CONFIG may write. */
    static final int CONFIG_WCE_OFFSET = 32;
    /**
     * The ring size seg_max and size_max are computed for: GET_CONFIG comes once, at realize, before any ring
     * size is known, so QEMU's default queue-size (128) stands for it (a larger ring only holds more requests).
     */
    static final int CONFIG_QUEUE_SIZE = 128;

    /** The rings running now, as a change of the mode reaches them. */
    public interface Rings {
        /** Every running ring to {@code writeback} (the server's mode as their driver's features allow it). */
        void writeCache(boolean writeback);
    }

    private final VhostUserChannel channel;
    private final BlkDevice device;
    private final BlockLayer layer;
    private final int queues;
    private final int maxQueueSize;
    /** virtio_blk_config.wce: the server's, kept across connections and (recorded) restarts; FLUSH is durable either way. */
    private final WriteCacheMode writeCache;
    private final String name;

    /**
     * @param layer        the block layer: its largest request bounds seg_max and size_max
     * @param queues       vhost.queues (num_queues)
     * @param maxQueueSize vhost.queue-size
     * @param writeCache   the server's write cache mode: what GET_CONFIG answers and SET_CONFIG changes
     * @param name         the connection's name, for the log
     */
    public BlkConfigSpace(VhostUserChannel channel, BlkDevice device, BlockLayer layer, int queues, int maxQueueSize,
                          WriteCacheMode writeCache, String name) {
        this.channel = channel;
        this.device = device;
        this.layer = layer;
        this.queues = queues;
        this.maxQueueSize = maxQueueSize;
        this.writeCache = java.util.Objects.requireNonNull(writeCache, "writeCache");
        this.name = name;
    }

    /**
     * Whether rings of a driver that negotiated {@code f} may leave writes in the cache until a FLUSH. Only with
     * VIRTIO_BLK_F_FLUSH can the driver ask for durability; with CONFIG_WCE it reads and sets the mode, without it
     * it was never told of a cache. So as Linux's virtio_blk ({@code virtblk_get_cache_mode}) and QEMU's virtio-blk
     * ({@code virtio_blk_set_features}) decide: neither FLUSH nor CONFIG_WCE (SeaBIOS) is write-through; FLUSH
     * without CONFIG_WCE is writeback; CONFIG_WCE follows the server's mode (and without FLUSH, write-through, as
     * a guest that cannot flush has nothing else).
     */
    public boolean servesWriteback(long f) {
        if ((f & bit(VirtioBlk.F_FLUSH)) == 0) {
            return false;
        }
        return (f & bit(VirtioBlk.F_CONFIG_WCE)) == 0 || writeCache.writeback();
    }

    public void getConfig(MemorySegment p) throws IOException, Refusal {
        checkConfigHeader();
        int offset = p.get(JAVA_INT_UNALIGNED, CONFIG_OFFSET);
        int size = p.get(JAVA_INT_UNALIGNED, CONFIG_SIZE);
        checkConfigSize(offset, size);
        byte[] cfg = VirtioBlkConfig.bytes(device, queues, Math.min(maxQueueSize, CONFIG_QUEUE_SIZE),
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

    /** The payload holds offset, size and flags: its size varies, so the channel could not check it. */
    private void checkConfigHeader() throws Refusal {
        if (channel.size() < CONFIG_REGION) {
            throw new Refusal("payload of " + channel.size() + " bytes; allowed: 12 + size (offset, size and flags,"
                    + " then the config bytes)");
        }
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

    /**
     * SET_CONFIG: only wce may be written. A change to write-through reaches the running rings before it is
     * recorded, a change to writeback only after (never less durable than the guest was told); the change is
     * recorded durably before the reply leaves.
     * @param features what the driver negotiated: whether its rings may serve writeback at all
     * @param rings    the rings running now, told the mode they serve
     */
    public void setConfig(MemorySegment p, long features, Rings rings) throws Refusal {
        checkConfigHeader();
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
            rings.writeCache(false); // write through before it is recorded: never less durable than the guest was told
        }
        IOException failed = null;
        try {
            writeCache.set(on); // recorded durably before the reply QEMU waits for (REPLY_ACK) leaves
        } catch (IOException e) {
            failed = e;
        }
        rings.writeCache(servesWriteback(features)); // write through: every write durable before it completes
        if (failed != null) {
            throw new Refusal("the guest's write cache " + (on ? "on" : "off") + " is not in force ("
                    + (writeCache.writeback() ? "writeback" : "write through") + " is): " + failed.getMessage());
        }
        LOG.log(System.Logger.Level.INFO, "{0}: the guest set the cache to {1}{2}", name,
                on ? "writeback" : "write through",
                writeCache.recordedAt() == null ? "" : ", recorded in " + writeCache.recordedAt());
    }
}
