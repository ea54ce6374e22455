package io.pmemblk.cli;

import io.pmemblk.nvme.NvmeTcpConfig;
import io.pmemblk.nvme.NvmeTcpServer;
import io.pmemblk.settings.Keys;
import io.pmemblk.settings.Settings;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.LinkedHashSet;

/**
 * The NVMe/TCP target as the settings describe it: {@code nvme.listen} (empty: off), the subsystem NQN (derived
 * from pmem.path when empty), allowed hosts, queues, depth, in-capsule size, digests.
 */
final class NvmeFrontend {
    private NvmeFrontend() {}

    /** The largest NVMe Read/Write (MDTS): 1 MiB, what the Linux host splits larger requests to anyway. */
    static final int MAX_TRANSFER = 1 << 20;
    /** MAXH2CDATA: one H2CData PDU per 128 KiB buffer chunk, as SPDK's default max_io_size. */
    static final int MAX_H2C_DATA = 128 * 1024;

    /**
     * The serial (SN) and the seed of the namespace IDs: derived from the absolute path of the pmem file, so a
     * restarted server on the same file is the same subsystem and namespace to a host (and to multipath).
     */
    static String serial(Device device) {
        try {
            byte[] h = MessageDigest.getInstance("SHA-256").digest(device.region().path().toAbsolutePath().normalize()
                    .toString().getBytes(StandardCharsets.UTF_8));
            return HexFormat.of().formatHex(h, 0, 8);
        } catch (NoSuchAlgorithmException e) {
            throw new AssertionError("SHA-256 is in every JDK", e);
        }
    }

    /**
     * MQES + 1: at most the hardware queue's tags (queue.depth), so that a host alone on its hardware queue never
     * has more commands in flight than tags, and a write waiting for its H2CData cannot leave the reader blocked
     * for a tag in front of that very data (docs/nvme-tcp.md, Limits). 32 at least: the Linux host's admin queue.
     */
    static int depth(Settings s) {
        int want = s.get(Keys.NVME_QUEUE_DEPTH);
        int tags = s.get(Keys.QUEUE_DEPTH);
        if (want > tags) {
            System.err.println("pmemblk: nvme.queue-depth=" + want + " is more than queue.depth=" + tags
                    + " tags per hardware queue: NVMe queues get " + Math.max(32, tags) + " entries");
        }
        return Math.max(32, Math.min(want, tags));
    }

    /** The server (listening, not yet started), or null when nvme.listen is empty. */
    static NvmeTcpServer server(Settings s, Device device) throws IOException {
        InetSocketAddress listen = s.get(Keys.NVME_LISTEN);
        if (listen == null) {
            return null;
        }
        String serial = serial(device);
        String nqn = s.get(Keys.NVME_SUBSYSTEM_NQN) != null ? s.get(Keys.NVME_SUBSYSTEM_NQN)
                : "nqn.2026-12.io.pmemblk:" + serial;
        NvmeTcpConfig config = new NvmeTcpConfig(listen.getHostString(), listen.getPort(), nqn,
                new LinkedHashSet<>(s.get(Keys.NVME_ALLOWED_HOSTS)), s.get(Keys.NVME_QUEUES),
                depth(s), s.get(Keys.NVME_IN_CAPSULE_BYTES),
                Math.min(MAX_TRANSFER, device.layer().maxRequestBytes()), MAX_H2C_DATA, s.get(Keys.NVME_DIGESTS),
                s.get(Keys.NVME_DIGESTS), serial);
        // VWC 0 only where every write is persistent when it completes (real pmem: each writer drains its stores,
        // docs/durability.md); on the page-cache mapping Flush and FUA are what make data durable
        return new NvmeTcpServer(config, device.layer(), !device.driver().isPmem());
    }
}
