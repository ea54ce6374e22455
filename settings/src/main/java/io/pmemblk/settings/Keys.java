package io.pmemblk.settings;

import io.pmemblk.posix.Libc;

import java.net.InetSocketAddress;
import java.nio.file.Path;
import java.nio.file.attribute.GroupPrincipal;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

import static io.pmemblk.settings.ValueParsers.choice;
import static io.pmemblk.settings.ValueParsers.intRange;
import static io.pmemblk.settings.ValueParsers.listen;
import static io.pmemblk.settings.ValueParsers.nqn;
import static io.pmemblk.settings.ValueParsers.path;
import static io.pmemblk.settings.ValueParsers.powerOfTwo;
import static io.pmemblk.settings.ValueParsers.range;

/**
 * Every key of pmemblk's settings, declared once with its default, what it allows and a line of documentation,
 * grouped by area. A key is declared through its area's group, which is what puts it in {@link #ALL} (and in
 * {@code pmemblk.properties.example}): adding a key is one declaration.
 */
public final class Keys {
    private Keys() {}

    public static final int MAX_REQUEST_BYTES = 32 << 20;

    public enum DmaEngineKind { NONE, SOFT, VFIO, VFIO_USER }

    /** Least severe log records written, most severe first (java.util.logging's SEVERE .. FINEST). */
    public enum LogLevel { ERROR, WARNING, INFO, DEBUG, TRACE }

    /** nbd.tls: STARTTLS refused, offered, or required (the NBD frontend's TlsServer.off/load(required)). */
    public enum TlsMode { OFF, ON, REQUIRE }

    /**
     * pmem.mapper, by the names of the device's PmemRegion.Mapper (SettingsTest holds them equal), so that the
     * settings need not require the device module for one enum.
     */
    public enum Mapper { AUTO, LIBPMEM, JAVA }

    /** pmem.layout: the mapping served byte for byte, or a Block Translation Table over it (sector-atomic writes). */
    public enum Layout { RAW, BTT }

    /** The keys of one area, in the order they are declared: one stretch of {@link #ALL} and of the example file. */
    private static final class Group {
        private final List<Key<?>> keys = new ArrayList<>();

        <T> Key<T> key(String name, String defaultText, String allowed, String doc, Key.Parser<T> parser) {
            Key<T> k = Key.of(name, defaultText, allowed, doc, parser);
            keys.add(k);
            return k;
        }
    }

    // Declared before the keys: a static initialiser runs in the order of the text.
    private static final Group PMEM = new Group(), NBD = new Group(), QUEUE = new Group(), DMA = new Group(),
            ROUTE = new Group(), UBLK = new Group(), METRICS = new Group(), VHOST = new Group(), NVME = new Group(),
            BITMAP = new Group(), LOG = new Group();

    // ---- pmem ----
    public static final Key<Path> PMEM_PATH = PMEM.key("pmem.path", "auto",
            "auto, a file path (created if missing), or a device-DAX node /dev/daxX.Y",
            "Backing file of the persistent-memory region. auto: /var/lib/pmemblk/pmem0.img as root (the systemd"
                    + " unit's StateDirectory), $XDG_DATA_HOME/pmemblk/pmem0.img (~/.local/share/...) for other users."
                    + " The file and every directory above it must be owned by root or the serving user, and no"
                    + " directory writable by group or others unless sticky (like /tmp); a final symbolic link is not"
                    + " followed, except root's links under /dev to a /dev/daxX.Y node (udev's /dev/char/MAJ:MIN).",
            t -> t.trim().equalsIgnoreCase("auto") ? DefaultPaths.pmemPath(Libc.geteuid(), System.getenv()) : path(t));
    public static final Key<Long> PMEM_SIZE = PMEM.key("pmem.size", "1G",
            "a size that is a multiple of 4096, from 1M to 16T (suffixes K, M, G, T)",
            "Size of the region; an existing file of another size is refused unless pmem.resize=true.",
            t -> range(Sizes.parse(t), 1 << 20, 16L << 40, 4096));
    public static final Key<Boolean> PMEM_RESIZE = PMEM.key("pmem.resize", "false", "true or false",
            "Resize an existing backing file to pmem.size (shrinking discards data past the new end).",
            ValueParsers::bool);
    public static final Key<Mapper> PMEM_MAPPER = PMEM.key("pmem.mapper", "auto", "auto, libpmem or java",
            "How to map: libpmem when libpmem.so.1 loads (auto), libpmem only, or the JDK's FileChannel.map.",
            t -> choice(t, Mapper.class));
    public static final Key<Layout> PMEM_LAYOUT = PMEM.key("pmem.layout", "raw", "raw or btt",
            "How the region is laid out. raw: served byte for byte; a write torn by a power cut may read back part old,"
                    + " part new (in 8-byte pieces). btt: a Block Translation Table (the on-media format of PMDK's"
                    + " pmemblk pools, which pmempool checks), so every sector reads wholly old or wholly new after a"
                    + " crash; it costs capacity (map, flog, 256 spare blocks per arena) and a few persists per write."
                    + " The layout is this setting and pmemblk's record of the device (FILE.pmemblk-layout beside"
                    + " it), never the device's bytes, which a client writes: raw serves any file raw unless pmemblk"
                    + " recorded a BTT there (then refused: serve it as btt). btt creates a missing pmem.path with a"
                    + " BTT; an existing file must be one pmemblk recorded (`pmemblk format --layout btt FILE`) or"
                    + " a complete BTT made elsewhere (PMDK's `pmempool create -w blk`): no BTT is laid out over"
                    + " what may be data.",
            t -> choice(t, Layout.class));
    public static final Key<Integer> PMEM_SECTOR_SIZE = PMEM.key("pmem.sector-size", "4096", "512 or 4096 (512 only with pmem.layout=btt)",
            "The BTT's sector (logical block) size, the unit written atomically, for a BTT serve creates; an existing"
                    + " BTT keeps the size it was formatted with, and serving it with another one set here is refused.",
            ValueParsers::blockSize);

    // ---- nbd ----
    public static final Key<Path> NBD_SOCKET = NBD.key("nbd.socket", "auto",
            "auto, a path for a unix socket (created mode 0600), or empty for none",
            "Unix socket the NBD server listens on. auto: /run/pmemblk/nbd.sock as root (the systemd unit's"
                    + " RuntimeDirectory), $XDG_RUNTIME_DIR/pmemblk/nbd.sock for other users (beside the auto pmem.path"
                    + " without XDG_RUNTIME_DIR). Its directory is checked as pmem.path's are.",
            t -> t.isBlank() ? null : t.trim().equalsIgnoreCase("auto")
                    ? DefaultPaths.socketPath(Libc.geteuid(), System.getenv()) : path(t));
    public static final Key<Integer> NBD_PORT = NBD.key("nbd.port", "10809", "a TCP port 0..65535 (0 = no TCP listener)",
            "TCP port of the NBD server; 10809 is NBD's registered port.", t -> intRange(t, 0, 65535));
    public static final Key<String> NBD_BIND = NBD.key("nbd.bind", "127.0.0.1", "an IP address or host name",
            "Address the TCP listener binds to; anything but loopback exposes the export to the network: use"
                    + " nbd.tls=require with nbd.tls.verify-clients (without TLS the server starts with a warning).",
            ValueParsers::host);
    public static final Key<TlsMode> NBD_TLS = NBD.key("nbd.tls", "off", "off, on or require",
            "TLS on every NBD listener (NBD_OPT_STARTTLS, TLS 1.3): off refuses STARTTLS; on lets clients choose;"
                    + " require refuses every option before STARTTLS (NBD_REP_ERR_TLS_REQD) and ends a session that"
                    + " picks an export in plaintext. on and require need nbd.tls.certificate and nbd.tls.key.",
            t -> choice(t, TlsMode.class));
    public static final Key<Path> NBD_TLS_CERTIFICATE = NBD.key("nbd.tls.certificate", "",
            "a PEM file of X.509 certificates, the server's first, then any intermediate CAs; or empty",
            "The server's certificate chain (as nbdkit's server-cert.pem).", t -> t.isBlank() ? null : path(t));
    public static final Key<Path> NBD_TLS_KEY = NBD.key("nbd.tls.key", "",
            "a PEM private key, unencrypted: PKCS#8 (BEGIN PRIVATE KEY) or PKCS#1 RSA; or empty",
            "The server certificate's private key (as nbdkit's server-key.pem); keep it mode 0600.",
            t -> t.isBlank() ? null : path(t));
    public static final Key<Path> NBD_TLS_VERIFY_CLIENTS = NBD.key("nbd.tls.verify-clients", "off",
            "off, or a PEM file of CA certificates",
            "Client certificates: off asks for none (any client that completes TLS is served); a CA file makes"
                    + " every TLS client present a certificate that chains to one of these CAs, or be refused.",
            t -> t.trim().equalsIgnoreCase("off") ? null : path(t));
    public static final Key<String> NBD_EXPORT = NBD.key("nbd.export", "pmem0",
            "1 to 256 printable characters, no spaces",
            "Export name; clients may also use the empty (default) name.", ValueParsers::exportName);
    public static final Key<Integer> NBD_MAX_CONNECTIONS = NBD.key("nbd.max-connections", "128", "an integer 1..4096",
            "Connections served at once; more are refused at accept.", t -> intRange(t, 1, 4096));
    public static final Key<Integer> NBD_STALL_TIMEOUT = NBD.key("nbd.stall-timeout", "30", "whole seconds 1..3600",
            "A client stuck in the middle of a WRITE payload, or not reading its replies, for this long is disconnected"
                    + " so the tags it holds go back to the other clients of its queue.", t -> intRange(t, 1, 3600));
    public static final Key<Integer> NBD_HANDSHAKE_TIMEOUT = NBD.key("nbd.handshake-timeout", "10",
            "whole seconds 1..300",
            "A client must finish the whole negotiation (TLS handshake included) within this long, or it is"
                    + " disconnected and its connection slot freed (qemu's NBD server uses 10 s too): clients that"
                    + " connect and stall cannot hold nbd.max-connections slots for long.", t -> intRange(t, 1, 300));
    public static final Key<Integer> NBD_MAX_HANDSHAKES_PER_PEER = NBD.key("nbd.max-handshakes-per-peer", "8",
            "an integer 1..4096",
            "Connections of one TCP client (an address) still in their negotiation at once, once half the"
                    + " nbd.max-connections slots are taken; more are refused at accept and logged: one client that"
                    + " connects and stalls (without a certificate under nbd.tls=require, say) cannot hold every slot,"
                    + " and a burst of connections is refused nothing while the server has room. Unix socket clients"
                    + " (the serving user or root: the socket is 0600) are not limited.", t -> intRange(t, 1, 4096));
    public static final Key<Integer> NBD_IDLE_TIMEOUT = NBD.key("nbd.idle-timeout", "0",
            "whole seconds 0..604800 (0 = never)",
            "A connection with no request in flight and no new one for this long is disconnected. Off by default, as"
                    + " in nbdkit and qemu-nbd: the kernel's NBD client keeps the connection of an attached but unused"
                    + " device idle, and cutting it fails that device's next I/O (unless nbd-client reconnects).",
            t -> intRange(t, 0, 604800));
    public static final Key<Integer> NBD_BUSY_POLL = NBD.key("nbd.busy-poll", "50", "microseconds 0..1000 (0 = off)",
            "How long a connection's reader polls its socket for the next request before it sleeps, as Linux's"
                    + " busy_poll does for network cards: where waking a sleeping thread costs tens of microseconds"
                    + " (a VM), this takes a wake-up off every request at low queue depth. At most one reader fewer"
                    + " than the CPUs polls at once, and a connection whose client keeps it waiting longer rests from"
                    + " polling for a while, so idle clients cost no CPU. Plain connections only (not TLS).",
            t -> intRange(t, 0, 1000));

    // ---- queue ----
    public static final Key<Integer> QUEUES = QUEUE.key("queues", "auto", "auto (one per core, at most 8) or an integer 1..256",
            "Hardware queues of the block layer; connections are spread over them round-robin. Each has its own tags"
                    + " and queue.buffer-bytes of buffers.",
            t -> t.equalsIgnoreCase("auto") ? Math.min(8, Runtime.getRuntime().availableProcessors()) : intRange(t, 1, 256));
    public static final Key<Integer> QUEUE_DEPTH = QUEUE.key("queue.depth", "128", "an integer 1..4096",
            "Tags (requests in flight) per hardware queue.", t -> intRange(t, 1, 4096));
    public static final Key<Long> QUEUE_BUFFER_BYTES = QUEUE.key("queue.buffer-bytes", "64M",
            "a size from 32M (the largest request) to 4G, a multiple of 128K",
            "Registered data buffers per hardware queue; a full pool makes frontends wait (bounded memory).",
            t -> range(Sizes.parse(t), MAX_REQUEST_BYTES, 4L << 30, 128 << 10));

    // ---- dma ----
    public static final Key<DmaEngineKind> DMA_ENGINE = DMA.key("dma.engine", "none", "none, soft, vfio or vfio-user",
            "Copy offload: none (CPU only), soft (software I/OAT device), vfio (PCI DMA devices bound to vfio-pci, see"
                    + " dma.vfio.devices; pmem.path must be device DAX or on tmpfs/hugetlbfs, which the kernel can pin),"
                    + " vfio-user (the I/OAT device of another process, `pmemblk dma-device`, see dma.vfio-user.socket).",
            t -> choice(t, DmaEngineKind.class));
    public static final Key<List<String>> DMA_VFIO_DEVICES = DMA.key("dma.vfio.devices", "auto",
            "auto, or PCI addresses dddd:bb:dd.f separated by commas",
            "With dma.engine=vfio: the devices to drive (I/OAT channels, or QEMU's edu), one DMA channel per device"
                    + " channel; auto: every such device bound to vfio-pci (pmemblk dma list shows them).",
            ValueParsers::pciAddresses);
    public static final Key<Path> DMA_VFIO_USER_SOCKET = DMA.key("dma.vfio-user.socket", "",
            "the path of a vfio-user device's unix socket, or empty",
            "With dma.engine=vfio-user: the socket of the I/OAT device process (pmemblk dma-device --socket PATH);"
                    + " one DMA channel per device channel. If the device process goes away, copies in flight are"
                    + " redone by the CPU and pmemblk reconnects to this socket until it is back.",
            t -> t.isBlank() ? null : path(t));
    public static final Key<Integer> DMA_CHANNELS = DMA.key("dma.channels", "1", "an integer 1..64",
            "Channels of dma.engine=soft; hardware queue i uses channel i mod dma.channels. (vfio drives every channel"
                    + " of dma.vfio.devices, vfio-user those pmemblk dma-device --channels made.)", t -> intRange(t, 1, 64));
    public static final Key<Integer> DMA_RING_SIZE = DMA.key("dma.ring-size", "512", "a power of two 16..32768",
            "Descriptors per DMA channel ring.", t -> powerOfTwo(intRange(t, 16, 32768)));

    // ---- route ----
    public static final Key<Long> ROUTE_DMA_MIN_BYTES = ROUTE.key("route.dma.min-bytes", "256K",
            "a size from 1 to 32M, or off",
            "Requests at least this long go to DMA (when a DMA engine is configured); pmemblk tune measures it.",
            t -> t.equalsIgnoreCase("off") ? Long.MAX_VALUE : range(Sizes.parse(t), 1, MAX_REQUEST_BYTES, 1));
    public static final Key<Integer> ROUTE_DMA_MIN_SEGMENTS = ROUTE.key("route.dma.min-segments", "off",
            "an integer 1..256, or off",
            "Requests with at least this many 128 KiB buffer segments go to DMA (when a DMA engine is configured).",
            t -> t.equalsIgnoreCase("off") ? Integer.MAX_VALUE : intRange(t, 1, 256));
    public static final Key<Boolean> ROUTE_DMA_BOUNCE = ROUTE.key("route.dma.bounce", "false", "true or false",
            "Route NBD and ublk requests by the two thresholds above as well, through the queues' registered buffers."
                    + " Off, they stay on the CPU: the kernel's copy of their payload goes straight to or from the"
                    + " mapping, while by DMA it lands in a buffer first and the engine copies again, so the CPU saves"
                    + " nothing. vhost-user requests (guest RAM, which the engine reaches itself) and pmemblk bench go"
                    + " by the thresholds either way.", ValueParsers::bool);

    // ---- ublk ----
    public static final Key<Boolean> UBLK_ENABLED = UBLK.key("ublk.enabled", "false", "true or false",
            "Also serve the device as a Linux block device /dev/ublkbN (kernel module ublk_drv, Linux >= 6.4, root),"
                    + " beside NBD.", ValueParsers::bool);
    public static final Key<Integer> UBLK_ID = UBLK.key("ublk.id", "-1", "-1 (the kernel picks) or an integer 0..1048575",
            "ublk device id N (/dev/ublkbN). A fixed id lets a restarted server resume the device a killed one left"
                    + " quiesced (ublk.recovery).", t -> intRange(t, -1, (1 << 20) - 1));
    public static final Key<Integer> UBLK_QUEUES = UBLK.key("ublk.queues", "auto", "auto (= queues) or an integer 1..256",
            "ublk queues, one thread each; ublk queue i is served on hardware queue i, so at most queues."
                    + " The kernel allows at most one per CPU.",
            t -> t.equalsIgnoreCase("auto") ? 0 : intRange(t, 1, 256));
    public static final Key<Integer> UBLK_DEPTH = UBLK.key("ublk.depth", "auto", "auto (= queue.depth) or an integer 1..4096",
            "Requests in flight per ublk queue; at most queue.depth (each needs a tag of its hardware queue).",
            t -> t.equalsIgnoreCase("auto") ? 0 : intRange(t, 1, 4096));
    public static final Key<Integer> UBLK_BLOCK_SIZE = UBLK.key("ublk.block-size", "4096", "512 or 4096",
            "Logical block size of /dev/ublkbN (the physical block size is 4096 either way).", ValueParsers::blockSize);
    public static final Key<Boolean> UBLK_RECOVERY = UBLK.key("ublk.recovery", "true", "true or false",
            "When the server is killed, keep /dev/ublkbN with its I/O waiting (a mounted filesystem does not fail)"
                    + " until a server with the same ublk.id resumes it; false: the device goes away with the server.",
            ValueParsers::bool);

    // ---- metrics ----
    public static final Key<Integer> METRICS_PORT = METRICS.key("metrics.port", "0", "a TCP port 0..65535 (0 = off)",
            "Serves Prometheus metrics at http://127.0.0.1:PORT/metrics.", t -> intRange(t, 0, 65535));

    // ---- vhost ----
    public static final Key<Path> VHOST_SOCKET = VHOST.key("vhost.socket", "",
            "a path for a unix socket (created mode 0600), or empty for none",
            "Unix socket of the vhost-user-blk server: QEMU connects to it (-chardev socket,path=PATH[,reconnect=1]"
                    + " -device vhost-user-blk-pci,chardev=...) and its guest sees the device as a virtio disk, the"
                    + " data copied straight between guest memory and the device. One QEMU at a time. Its directory is"
                    + " checked as pmem.path's are.", t -> t.isBlank() ? null : path(t));
    public static final Key<GroupPrincipal> VHOST_SOCKET_GROUP = VHOST.key("vhost.socket-group", "",
            "a group this system knows, by name or number, or empty for none",
            "Group that may connect to vhost.socket: the socket is made mode 0660 and given to it, so a QEMU running"
                    + " as another user in that group (libvirt's, a distribution's kvm group) can reach it; its"
                    + " directory must let that group search it. Empty: mode 0600, the serving user (and root) only."
                    + " A server that is not root can only name a group it is a member of.",
            t -> t.isBlank() ? null : Groups.byNameOrNumber(t.trim()));
    public static final Key<Integer> VHOST_QUEUES = VHOST.key("vhost.queues", "8", "an integer 1..64",
            "Virtqueues a vhost-user-blk front-end may use: QEMU's num-queues (by default the guest's vCPU count) must"
                    + " be at most this, or QEMU refuses to start. Each ring the guest starts is one thread here, on"
                    + " hardware queue (ring mod queues); 64 bounds the threads one guest can make.",
            t -> intRange(t, 1, 64));
    public static final Key<Integer> VHOST_QUEUE_SIZE = VHOST.key("vhost.queue-size", "1024", "an integer 3..1024",
            "Largest virtqueue a vhost-user-blk guest may program (QEMU's queue-size, 128 by default, at most this;"
                    + " 1024 is QEMU's own limit). A request takes at least 3 descriptors (header, data, status), so"
                    + " smaller rings cannot carry one; QEMU's own virtio-blk refuses a queue-size of 2 or less.",
            t -> intRange(t, 3, 1024));
    public static final Key<Integer> VHOST_BUSY_POLL = VHOST.key("vhost.busy-poll", "20", "microseconds 0..1000 (0 = off)",
            "The longest a vhost-user-blk queue thread polls the guest's empty ring before it re-arms the guest's"
                    + " kick and sleeps on it: a kick costs the guest an exit and the thread a wake-up. Each queue's"
                    + " window adapts between 0 and this to the gaps between the guest's requests, and at most"
                    + " cores - 1 queue threads poll at once, so polling takes little CPU from the guest's vCPUs"
                    + " when it cannot catch a request; 0 turns it off.", t -> intRange(t, 0, 1000));
    public static final Key<Integer> VHOST_COALESCE = VHOST.key("vhost.coalesce", "100", "microseconds 0..1000 (0 = off)",
            "The longest a vhost-user-blk queue thread holds its completions back while it polls the ring for the"
                    + " guest's next requests, to publish them together with one interrupt (at most 16 at a time):"
                    + " an interrupt costs the guest far more than a request costs here. A guest that waits for each"
                    + " answer or for a few (8 holds in a row with no new request in them) closes it, tried again after"
                    + " 64 publishes, and after twice as many each time a try catches nothing (up to 4096). 0"
                    + " publishes at the end of every dispatch.", t -> intRange(t, 0, 1000));

    // ---- nvme ----
    public static final Key<InetSocketAddress> NVME_LISTEN = NVME.key("nvme.listen", "",
            "ADDRESS:PORT (an IPv6 address in brackets), or empty for none",
            "Where the NVMe/TCP target listens (4420 is NVMe/TCP's registered port): a Linux host connects with"
                    + " nvme connect -t tcp -a ADDRESS -s PORT -n NQN, and nvme discover lists the subsystem. Empty:"
                    + " no NVMe/TCP target. There is no TLS or authentication here: anything but loopback exposes the"
                    + " device to whoever can reach the port (nvme.allowed-hosts is a host's claim, not a proof).",
            t -> t.isBlank() ? null : listen(t.trim()));
    public static final Key<String> NVME_SUBSYSTEM_NQN = NVME.key("nvme.subsystem-nqn", "",
            "an NQN (nqn.YYYY-MM.reverse-domain:name, at most 223 bytes), or empty for the derived one",
            "NQN of the NVM subsystem the target serves. Empty: nqn.2026-12.io.pmemblk:<serial>, the serial derived"
                    + " from pmem.path, so a host's saved connection (and multipath's grouping) survives a restart.",
            t -> t.isBlank() ? null : nqn(t.trim()));
    public static final Key<List<String>> NVME_ALLOWED_HOSTS = NVME.key("nvme.allowed-hosts", "",
            "host NQNs separated by commas, or empty for any host",
            "Host NQNs (a host's /etc/nvme/hostnqn) that may connect to the subsystem; others get Connect Invalid"
                    + " Host. The discovery subsystem answers every host.",
            t -> t.isBlank() ? List.of() : Arrays.stream(t.split(",")).map(String::trim)
                    .filter(x -> !x.isEmpty()).map(ValueParsers::nqn).toList());
    public static final Key<Integer> NVME_QUEUES = NVME.key("nvme.queues", "4", "an integer 1..64",
            "I/O queues a host's controller may have (Set Features Number of Queues grants this; nvme connect -i"
                    + " asks); each is one TCP connection on hardware queue (qid - 1) mod queues.",
            t -> intRange(t, 1, 64));
    public static final Key<Integer> NVME_QUEUE_DEPTH = NVME.key("nvme.queue-depth", "128", "an integer 32..1024",
            "Entries an NVMe/TCP queue may have (CAP.MQES + 1; the Linux host asks for 128 by default, -Q)."
                    + " 32 is the admin queue the Linux host always asks for.", t -> intRange(t, 32, 1024));
    public static final Key<Integer> NVME_IN_CAPSULE_BYTES = NVME.key("nvme.in-capsule-bytes", "8192",
            "bytes 4096..131072, a multiple of 16",
            "Write data a host may send inside the command capsule (IOCCSZ); longer writes go by R2T/H2CData. At"
                    + " least 4 KiB: a Dataset Management command's 256 ranges come in the capsule.",
            t -> intRange(t, 4096, 131072, 16));
    public static final Key<Boolean> NVME_DIGESTS = NVME.key("nvme.digests", "true", "true or false",
            "Whether a host may turn on the CRC32C header and data digests (nvme connect -g -G); false answers"
                    + " ICReq with them off.", ValueParsers::bool);

    // ---- bitmap: dirty bitmaps (changed-block tracking for incremental backup; docs/bitmaps.md) ----
    /** bitmap.dir=auto before it is resolved against pmem.path ({@link Settings#bitmapDir}). */
    static final Path AUTO_PATH = Path.of("auto");
    public static final Key<Path> BITMAP_DIR = BITMAP.key("bitmap.dir", "off",
            "off, auto, or a directory path (created if missing)",
            "Where the dirty bitmaps live, with the control socket `pmemblk bitmap` talks to (control.sock); off:"
                    + " no tracking. auto: FILE.bitmaps beside pmem.path (for device DAX, daxX.Y.bitmaps in pmemblk's"
                    + " state directory). Checked as pmem.path's directories are.",
            t -> t.trim().equalsIgnoreCase("off") ? null : t.trim().equalsIgnoreCase("auto") ? AUTO_PATH : path(t));
    public static final Key<List<String>> BITMAP_NAMES = BITMAP.key("bitmap.names", "",
            "names separated by commas, each 1 to 64 of A-Z a-z 0-9 _ -; or empty",
            "Bitmaps that exist from start (created clean when missing; needs bitmap.dir). More are added while"
                    + " serving with `pmemblk bitmap add NAME`; every bitmap stays until removed.",
            ValueParsers::bitmapNames);
    public static final Key<Long> BITMAP_GRANULARITY = BITMAP.key("bitmap.granularity", "64K",
            "a power of two from 512 to 1G (suffixes K, M, G)",
            "Bytes each bit of a bitmap made from bitmap.names covers (QEMU's default: 64K). An existing bitmap of"
                    + " another granularity is refused at start.",
            t -> powerOfTwo(range(Sizes.parse(t), 512, 1L << 30, 1)));

    // ---- log ----
    public static final Key<LogLevel> LOG_LEVEL = LOG.key("log.level", "info", "error, warning, info, debug or trace",
            "Least severe log records written to stderr (the journal, under systemd); debug adds one line per"
                    + " connection's negotiated options.", t -> choice(t, LogLevel.class));

    /** Every key, in the order the example file documents them: the groups in this order, each as declared. */
    public static final Map<String, Key<?>> ALL = index(PMEM, NBD, QUEUE, DMA, ROUTE, UBLK, METRICS, VHOST, NVME, BITMAP,
            LOG);

    /**
     * The keys a running server applies when it reloads its settings (SIGHUP, systemctl reload) without
     * dropping a connection or a request: each is read through a volatile field where it is used. Every other key
     * shapes what start-up built (the mapping, the queues, the listeners) and needs a restart.
     */
    public static final Set<Key<?>> LIVE = Set.of(NBD_STALL_TIMEOUT, ROUTE_DMA_MIN_BYTES, ROUTE_DMA_MIN_SEGMENTS,
            ROUTE_DMA_BOUNCE, LOG_LEVEL);

    private static Map<String, Key<?>> index(Group... groups) {
        Map<String, Key<?>> m = new LinkedHashMap<>();
        for (Group g : groups) {
            for (Key<?> k : g.keys) {
                if (m.put(k.name(), k) != null) {
                    throw new AssertionError("key " + k.name() + " declared twice");
                }
            }
        }
        return Collections.unmodifiableMap(m);
    }
}
