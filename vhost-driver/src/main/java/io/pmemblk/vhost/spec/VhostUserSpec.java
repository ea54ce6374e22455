package io.pmemblk.vhost.spec;

/**
 * The vhost-user protocol as a back-end needs it, written once. Sources (the tags of
 * {@code ../shared/notes/vhost-user.md}): [S] qemu/qemu {@code docs/interop/vhost-user.rst} @v7.2.22;
 * [Q] {@code hw/virtio/vhost-user.c} @v7.2.22; [LVU] {@code subprojects/libvhost-user/libvhost-user.h};
 * [L] torvalds/linux {@code include/uapi/linux/vhost_types.h}, {@code virtio_config.h}, {@code virtio_ring.h};
 * sizes and offsets printed by a C program against glibc 2.36 and these headers. Byte order is the host's
 * (x86-64: little-endian) for header and payload [S] "Message Specification".
 */
public final class VhostUserSpec {
    private VhostUserSpec() {}

    // ---- header [S] "Message Specification"; [LVU] VHOST_USER_HDR_SIZE = offsetof(VhostUserMsg, payload.u64) = 12
    public static final int HEADER_SIZE = 12;
    public static final int HDR_REQUEST = 0, HDR_FLAGS = 4, HDR_SIZE = 8;
    /** flags: version 1 in bits 0-1, REPLY bit 2, NEED_REPLY bit 3 [S]; [Q] VHOST_USER_*_MASK. */
    public static final int VERSION = 0x1, VERSION_MASK = 0x3, FLAG_REPLY = 0x4, FLAG_NEED_REPLY = 0x8;
    /** QEMU 7.2 accepts a reply only with flags exactly this ({@code vhost_user_read_header}: else EPROTO) [Q]. */
    public static final int REPLY_FLAGS = VERSION | FLAG_REPLY;
    /**
     * The largest payload: libvhost-user refuses {@code size > sizeof(payload)} = 272 on x86-64 (VhostUserConfig
     * 12+256 = 268, VhostUserMemory 8+8*32 = 264) [LVU] {@code vu_message_read_default}.
     */
    public static final int MAX_PAYLOAD = 272;
    /** Regions one SET_MEM_TABLE carries, and so its most fds: {@code VHOST_MEMORY_BASELINE_NREGIONS} [Q]. */
    public static final int MAX_TABLE_REGIONS = 8;
    /** The most fds any front-end message carries (SET_MEM_TABLE's) [S] "Communication". */
    public static final int MAX_FDS = MAX_TABLE_REGIONS;

    // ---- request ids [S] "Front-end message types"; [Q] enum VhostUserRequest
    public static final int GET_FEATURES = 1, SET_FEATURES = 2, SET_OWNER = 3, RESET_OWNER = 4, SET_MEM_TABLE = 5,
            SET_LOG_BASE = 6, SET_LOG_FD = 7, SET_VRING_NUM = 8, SET_VRING_ADDR = 9, SET_VRING_BASE = 10,
            GET_VRING_BASE = 11, SET_VRING_KICK = 12, SET_VRING_CALL = 13, SET_VRING_ERR = 14,
            GET_PROTOCOL_FEATURES = 15, SET_PROTOCOL_FEATURES = 16, GET_QUEUE_NUM = 17, SET_VRING_ENABLE = 18,
            SEND_RARP = 19, NET_SET_MTU = 20, SET_SLAVE_REQ_FD = 21, IOTLB_MSG = 22, SET_VRING_ENDIAN = 23,
            GET_CONFIG = 24, SET_CONFIG = 25, CREATE_CRYPTO_SESSION = 26, CLOSE_CRYPTO_SESSION = 27,
            POSTCOPY_ADVISE = 28, POSTCOPY_LISTEN = 29, POSTCOPY_END = 30, GET_INFLIGHT_FD = 31,
            SET_INFLIGHT_FD = 32, GPU_SET_SOCKET = 33, RESET_DEVICE = 34, VRING_KICK = 35, GET_MAX_MEM_SLOTS = 36,
            ADD_MEM_REG = 37, REM_MEM_REG = 38, SET_STATUS = 39, GET_STATUS = 40;

    private static final String[] NAMES = {null, "GET_FEATURES", "SET_FEATURES", "SET_OWNER", "RESET_OWNER",
            "SET_MEM_TABLE", "SET_LOG_BASE", "SET_LOG_FD", "SET_VRING_NUM", "SET_VRING_ADDR", "SET_VRING_BASE",
            "GET_VRING_BASE", "SET_VRING_KICK", "SET_VRING_CALL", "SET_VRING_ERR", "GET_PROTOCOL_FEATURES",
            "SET_PROTOCOL_FEATURES", "GET_QUEUE_NUM", "SET_VRING_ENABLE", "SEND_RARP", "NET_SET_MTU",
            "SET_SLAVE_REQ_FD", "IOTLB_MSG", "SET_VRING_ENDIAN", "GET_CONFIG", "SET_CONFIG", "CREATE_CRYPTO_SESSION",
            "CLOSE_CRYPTO_SESSION", "POSTCOPY_ADVISE", "POSTCOPY_LISTEN", "POSTCOPY_END", "GET_INFLIGHT_FD",
            "SET_INFLIGHT_FD", "GPU_SET_SOCKET", "RESET_DEVICE", "VRING_KICK", "GET_MAX_MEM_SLOTS", "ADD_MEM_REG",
            "REM_MEM_REG", "SET_STATUS", "GET_STATUS"};

    /** The request's name ({@code "SET_VRING_KICK(12)"}), for log lines; unknown ids by number. */
    public static String name(int request) {
        return request > 0 && request < NAMES.length ? NAMES[request] + "(" + request + ")" : "request " + Integer.toUnsignedString(request);
    }

    // ---- virtio and vhost feature bits [L] virtio_config.h, virtio_ring.h, vhost_types.h
    public static final int F_NOTIFY_ON_EMPTY = 24, F_LOG_ALL = 26, F_ANY_LAYOUT = 27, F_INDIRECT_DESC = 28,
            F_EVENT_IDX = 29, F_VERSION_1 = 32, F_ACCESS_PLATFORM = 33, F_RING_PACKED = 34;
    /** Bit 30 of GET_FEATURES: the back-end speaks protocol features [S] "Protocol features". */
    public static final int F_PROTOCOL_FEATURES = 30;

    // ---- protocol feature bits [S] "Protocol features"
    public static final int PF_MQ = 0, PF_LOG_SHMFD = 1, PF_RARP = 2, PF_REPLY_ACK = 3, PF_NET_MTU = 4,
            PF_SLAVE_REQ = 5, PF_CROSS_ENDIAN = 6, PF_CRYPTO_SESSION = 7, PF_PAGEFAULT = 8, PF_CONFIG = 9,
            PF_SLAVE_SEND_FD = 10, PF_HOST_NOTIFIER = 11, PF_INFLIGHT_SHMFD = 12, PF_RESET_DEVICE = 13,
            PF_INBAND_NOTIFICATIONS = 14, PF_CONFIGURE_MEM_SLOTS = 15, PF_STATUS = 16;

    public static long bit(int n) {
        return 1L << n;
    }

    // ---- payloads [S] "Message Specification"; [L] vhost_types.h; sizes printed here
    /** {@code struct vhost_vring_state}: u32 index, u32 num. */
    public static final int STATE_SIZE = 8, STATE_INDEX = 0, STATE_NUM = 4;
    /** {@code struct vhost_vring_addr}: index, flags (bit 0 VHOST_VRING_F_LOG), desc, used, avail, log_guest_addr. */
    public static final int ADDR_SIZE = 40, ADDR_INDEX = 0, ADDR_FLAGS = 4, ADDR_DESC = 8, ADDR_USED = 16,
            ADDR_AVAIL = 24, ADDR_LOG = 32;
    public static final int VRING_F_LOG = 0x1;
    /** A u64 payload (features, queue count, the file-carrying KICK/CALL/ERR word). */
    public static final int U64_SIZE = 8;
    /** KICK/CALL/ERR u64: bits 0-7 the vring index, bit 8 "no fd" [S]; VHOST_USER_VRING_{IDX,NOFD}_MASK [Q]. */
    public static final long VRING_IDX_MASK = 0xff, VRING_NOFD_MASK = 0x100;
    /** {@code VhostUserMemoryRegion}: guest_phys_addr, memory_size, userspace_addr, mmap_offset. */
    public static final int REGION_SIZE = 32, REGION_GPA = 0, REGION_SIZE_FIELD = 8, REGION_UADDR = 16,
            REGION_MMAP_OFFSET = 24;
    /** {@code VhostUserMemory}: u32 nregions, u32 padding, regions[8]. */
    public static final int MEMORY_NREGIONS = 0, MEMORY_REGIONS = 8;
    /** {@code VhostUserMemRegMsg} (ADD/REM_MEM_REG): u64 padding, one region. */
    public static final int MEM_REG_SIZE = 8 + REGION_SIZE, MEM_REG_REGION = 8;
    /** {@code VhostUserConfig}: u32 offset, u32 size, u32 flags, u8 region[256]. */
    public static final int CONFIG_OFFSET = 0, CONFIG_SIZE = 4, CONFIG_FLAGS = 8, CONFIG_REGION = 12,
            MAX_CONFIG_SIZE = 256;
    /** SET_CONFIG flags: 0 = from the front-end (VHOST_SET_CONFIG_TYPE_MASTER), 1 = migration [S]. */
    public static final int CONFIG_TYPE_FRONTEND = 0, CONFIG_TYPE_MIGRATION = 1;
    /** {@code VhostUserInflight}: u64 mmap_size, u64 mmap_offset, u16 num_queues, u16 queue_size, 4 pad. */
    public static final int INFLIGHT_SIZE = 24, INFLIGHT_MMAP_SIZE = 0, INFLIGHT_MMAP_OFFSET = 8,
            INFLIGHT_NUM_QUEUES = 16, INFLIGHT_QUEUE_SIZE = 18;
    /** {@code VhostUserLog}: u64 mmap_size, u64 mmap_offset. */
    public static final int LOG_SIZE = 16;

    /**
     * Split-ring inflight region per queue [S] "Inflight I/O tracking"; [LVU] {@code vu_get_inflight_fd}:
     * a 16-byte {@code QueueRegionSplit} head (u64 features, u16 version, u16 desc_num, u16 last_batch_head,
     * u16 used_idx), then {@code DescStateSplit desc[desc_num]} of 16 bytes each; libvhost-user's stride per queue
     * is {@code ALIGN_UP(16 * queue_size + 2, 64)} (queue size 128: 2112 bytes), which this back-end keeps so a
     * region it hands out has the layout libvhost-user's tools expect.
     */
    public static final int INFLIGHT_FEATURES = 0, INFLIGHT_VERSION = 8, INFLIGHT_DESC_NUM = 10,
            INFLIGHT_LAST_BATCH_HEAD = 12, INFLIGHT_USED_IDX = 14, INFLIGHT_DESC = 16, INFLIGHT_DESC_SIZE = 16;

    public static long inflightQueueStride(int queueSize) {
        return (16L * queueSize + 2 + 63) & ~63L;
    }

    /** The payload size a request must carry; -1 when it varies (SET_MEM_TABLE, GET/SET_CONFIG). */
    public static int expectedSize(int request) {
        return switch (request) {
            case GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM, GET_MAX_MEM_SLOTS, SET_OWNER, RESET_OWNER,
                 GET_STATUS -> 0;
            case SET_FEATURES, SET_PROTOCOL_FEATURES, SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR, SET_STATUS,
                 SET_LOG_FD -> U64_SIZE;
            case SET_VRING_NUM, SET_VRING_BASE, GET_VRING_BASE, SET_VRING_ENABLE -> STATE_SIZE;
            case SET_VRING_ADDR -> ADDR_SIZE;
            case ADD_MEM_REG, REM_MEM_REG -> MEM_REG_SIZE;
            case GET_INFLIGHT_FD, SET_INFLIGHT_FD -> INFLIGHT_SIZE;
            case SET_LOG_BASE -> LOG_SIZE;
            default -> -1;
        };
    }

    /**
     * The most fds a request may carry [S] "Communication": one per region for SET_MEM_TABLE (checked against
     * nregions by the session), one for the file-carrying ones (none when their NOFD bit is set), none otherwise.
     * REM_MEM_REG carries none from QEMU 7.2 ({@code send_remove_regions}); later front-ends attach the region's.
     */
    public static int maxFds(int request) {
        return switch (request) {
            case SET_MEM_TABLE -> MAX_TABLE_REGIONS;
            case ADD_MEM_REG, REM_MEM_REG, SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR, SET_SLAVE_REQ_FD,
                 SET_INFLIGHT_FD, SET_LOG_BASE, SET_LOG_FD -> 1;
            default -> 0;
        };
    }
}
