package io.pmemblk.ublk;

import io.pmemblk.posix.Errno;

/**
 * The ublk kernel ABI, written once. Source: {@code include/uapi/linux/ublk_cmd.h} of Linux 6.12.19 (the guest
 * kernel of scripts/vm is Debian's 6.12), with the rules the driver applies in {@code drivers/block/ublk_drv.c};
 * every struct offset was checked with gcc {@code offsetof()} against that header (see
 * /work/shared/notes/ublk.md, sections 1-2, for the table and the sources). Little-endian x86-64.
 *
 * <p>Commands are the ioctl-encoded values ({@code _IOR/_IOWR('u', nr, size)}): 6.12 accepts the legacy numbers
 * too when CONFIG_BLKDEV_UBLK_LEGACY_OPCODES=y, but GET_FEATURES exists only encoded and newer kernels may drop
 * the legacy ones.
 */
final class UblkAbi {
    private UblkAbi() {}

    /** The control device (misc device of ublk_drv); {@code /dev/ublkcN} and {@code /dev/ublkbN} per device. */
    static final String CONTROL_DEVICE = "/dev/ublk-control";

    // Control commands: _IOR('u', nr, 32) = 0x8020_75nn, _IOWR('u', nr, 32) = 0xC020_75nn (32 = struct ublksrv_ctrl_cmd)
    static final int UBLK_U_CMD_GET_DEV_INFO = 0x80207502;
    static final int UBLK_U_CMD_ADD_DEV = 0xC0207504;
    static final int UBLK_U_CMD_DEL_DEV = 0xC0207505;
    static final int UBLK_U_CMD_START_DEV = 0xC0207506;
    static final int UBLK_U_CMD_STOP_DEV = 0xC0207507;
    static final int UBLK_U_CMD_SET_PARAMS = 0xC0207508;
    static final int UBLK_U_CMD_GET_PARAMS = 0x80207509;
    static final int UBLK_U_CMD_START_USER_RECOVERY = 0xC0207510;
    static final int UBLK_U_CMD_END_USER_RECOVERY = 0xC0207511;
    static final int UBLK_U_CMD_GET_FEATURES = 0x80207513;
    /** DEL_DEV without waiting for the last reference to /dev/ublkcN (Linux 6.9, commit 13fe8e6825e4). */
    static final int UBLK_U_CMD_DEL_DEV_ASYNC = 0x80207514;

    // I/O commands on /dev/ublkcN: _IOWR('u', nr, 16) (16 = struct ublksrv_io_cmd)
    static final int UBLK_U_IO_FETCH_REQ = 0xC0107520;
    static final int UBLK_U_IO_COMMIT_AND_FETCH_REQ = 0xC0107521;

    // struct ublksrv_ctrl_cmd (32 bytes, in the SQE's cmd area: needs IORING_SETUP_SQE128)
    static final int CTRL_CMD_SIZE = 32;
    static final int CTRL_CMD_DEV_ID = 0;        // u32
    static final int CTRL_CMD_QUEUE_ID = 4;      // u16, 0xFFFF when not for a queue (ADD_DEV requires it)
    static final int CTRL_CMD_LEN = 6;           // u16 length of the buffer at addr
    static final int CTRL_CMD_ADDR = 8;          // u64 user buffer
    static final int CTRL_CMD_DATA = 16;         // u64 data[0]: the server's pid for START_DEV / END_USER_RECOVERY
    static final short NO_QUEUE = (short) 0xFFFF;
    static final int NEW_DEV_ID = -1;            // 0xFFFFFFFF: let the kernel choose the id

    // struct ublksrv_ctrl_dev_info (64 bytes)
    static final int DEV_INFO_SIZE = 64;
    static final int DEV_INFO_NR_HW_QUEUES = 0;  // u16
    static final int DEV_INFO_QUEUE_DEPTH = 2;   // u16
    static final int DEV_INFO_STATE = 4;         // u16 UBLK_S_DEV_*
    static final int DEV_INFO_MAX_IO_BUF_BYTES = 8; // u32
    static final int DEV_INFO_DEV_ID = 12;       // u32
    static final int DEV_INFO_SRV_PID = 16;      // s32
    static final int DEV_INFO_FLAGS = 24;        // u64 UBLK_F_*
    /** u64 ublksrv_flags: "for ublksrv internal use, invisible to ublk driver"; kept with the device until DEL_DEV. */
    static final int DEV_INFO_SRV_FLAGS = 32;
    static final int DEV_INFO_OWNER_UID = 40;    // u32
    static final int DEV_INFO_OWNER_GID = 44;    // u32
    static final int UBLK_S_DEV_DEAD = 0, UBLK_S_DEV_LIVE = 1, UBLK_S_DEV_QUIESCED = 2;

    // UBLK_F_* feature flags
    static final long UBLK_F_URING_CMD_COMP_IN_TASK = 1L << 1;
    static final long UBLK_F_USER_RECOVERY = 1L << 3;
    static final long UBLK_F_USER_RECOVERY_REISSUE = 1L << 4;
    static final long UBLK_F_UNPRIVILEGED_DEV = 1L << 5;
    static final long UBLK_F_CMD_IOCTL_ENCODE = 1L << 6;
    static final long UBLK_F_USER_COPY = 1L << 7;

    // struct ublk_params (112 bytes in 6.12: len, types, basic, discard, devt, zoned)
    static final int PARAMS_SIZE = 112;
    static final int PARAMS_LEN = 0;             // u32
    static final int PARAMS_TYPES = 4;           // u32 UBLK_PARAM_TYPE_*
    static final int UBLK_PARAM_TYPE_BASIC = 1, UBLK_PARAM_TYPE_DISCARD = 2;
    // struct ublk_param_basic at 8 (32 bytes)
    static final int BASIC_ATTRS = 8;            // u32 UBLK_ATTR_*
    static final int BASIC_LOGICAL_BS_SHIFT = 12;  // u8
    static final int BASIC_PHYSICAL_BS_SHIFT = 13; // u8
    static final int BASIC_IO_OPT_SHIFT = 14;    // u8
    static final int BASIC_IO_MIN_SHIFT = 15;    // u8
    static final int BASIC_MAX_SECTORS = 16;     // u32, 512-byte sectors
    static final int BASIC_CHUNK_SECTORS = 20;   // u32
    static final int BASIC_DEV_SECTORS = 24;     // u64
    static final int BASIC_VIRT_BOUNDARY_MASK = 32; // u64
    static final int UBLK_ATTR_READ_ONLY = 1, UBLK_ATTR_ROTATIONAL = 2, UBLK_ATTR_VOLATILE_CACHE = 4, UBLK_ATTR_FUA = 8;
    // struct ublk_param_discard at 40 (20 bytes)
    static final int DISCARD_ALIGNMENT = 40;     // u32
    static final int DISCARD_GRANULARITY = 44;   // u32, must not be 0
    static final int DISCARD_MAX_SECTORS = 48;   // u32
    static final int DISCARD_MAX_WRITE_ZEROES_SECTORS = 52; // u32
    static final int DISCARD_MAX_SEGMENTS = 56;  // u16, must be 1 when max_discard_sectors != 0
    // struct ublk_param_devt at 60 (16 bytes, filled by GET_PARAMS): char major/minor, disk major/minor

    // struct ublksrv_io_cmd (16 bytes, in the SQE's cmd area: fits a 64-byte SQE)
    static final int IO_CMD_SIZE = 16;
    static final int IO_CMD_Q_ID = 0;            // u16
    static final int IO_CMD_TAG = 2;             // u16
    static final int IO_CMD_RESULT = 4;          // s32: bytes done, or -errno; 0 for FLUSH/DISCARD/WRITE_ZEROES
    static final int IO_CMD_ADDR = 8;            // u64: must be 0 with UBLK_F_USER_COPY

    // struct ublksrv_io_desc (24 bytes), an array per queue mmapped read-only from /dev/ublkcN
    static final int IO_DESC_SIZE = 24;
    static final int IO_DESC_OP_FLAGS = 0;       // u32: op in bits 0-7, UBLK_IO_F_* above
    static final int IO_DESC_NR_SECTORS = 4;     // u32
    static final int IO_DESC_START_SECTOR = 8;   // u64
    static final int UBLK_IO_OP_READ = 0, UBLK_IO_OP_WRITE = 1, UBLK_IO_OP_FLUSH = 2, UBLK_IO_OP_DISCARD = 3,
            UBLK_IO_OP_WRITE_ZEROES = 5;
    static final int UBLK_IO_F_FUA = 1 << 13;
    static final int UBLK_MAX_QUEUE_DEPTH = 4096;

    /**
     * Bytes of queue q's descriptor array to mmap: {@code depth} descriptors rounded up to a page, as the kernel's
     * ublk_queue_cmd_buf_size() sizes it (ublk_ch_mmap refuses any other length). The page is the kernel's own
     * (sysconf(_SC_PAGESIZE)): 4 KiB on x86-64, up to 64 KiB on arm64.
     */
    static long descriptorBytes(int depth, long page) {
        return roundUp(depth * (long) IO_DESC_SIZE, page);
    }

    /**
     * mmap offset of queue q's descriptor array: q times UBLK_MAX_QUEUE_DEPTH descriptors rounded up to a page
     * (ublk_ch_mmap's max_sz; ublksrv's ublk_queue_max_cmd_buf_sz), whatever the depth.
     */
    static long descriptorOffset(int q, long page) {
        return q * roundUp(UBLK_MAX_QUEUE_DEPTH * (long) IO_DESC_SIZE, page);
    }

    private static long roundUp(long bytes, long page) {
        return (bytes + page - 1) / page * page;
    }

    /** CQE res of FETCH / COMMIT_AND_FETCH: a new request for the tag; or the device is stopping (-ENODEV). */
    static final int UBLK_IO_RES_OK = 0, UBLK_IO_RES_ABORT = -Errno.ENODEV;

    /**
     * The user-copy position of byte {@code offset} of request (q, tag): pread/pwrite on {@code /dev/ublkcN} at it
     * move the request's data (UBLKSRV_IO_BUF_OFFSET 0x80000000, tag at bit 25, queue at bit 41). Added, not
     * OR-ed: bit 31 of the base overlaps tag bit 6.
     */
    static long userCopyPosition(int q, int tag, long offset) {
        return 0x8000_0000L + ((long) q << 41) + ((long) tag << 25) + offset;
    }

    /** Largest request the user-copy offset can address: 25 bits of in-request offset. */
    static final int USER_COPY_MAX_BYTES = 1 << 25;
}
