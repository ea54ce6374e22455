package io.pmemblk.uring;

/**
 * The io_uring kernel ABI, written once. Source: {@code include/uapi/linux/io_uring.h}. Every struct offset and
 * constant below was checked by compiling {@code offsetof()}/the macros with gcc against Debian's linux-libc-dev
 * 6.1.187 copy of that header (2026-11-30), and agrees with the Linux 6.12.19 values in
 * /work/shared/notes/ublk.md section 3.2 (the layout is append-only); the tests exercise them on the 6.18 kernel of
 * the build machine. Only IORING_MAX_ENTRIES is kernel-internal (io_uring/io_uring.c). Little-endian x86-64.
 */
public final class IoUringAbi {
    private IoUringAbi() {}

    // struct io_uring_params (120 bytes)
    public static final int PARAMS_SIZE = 120;
    public static final int PARAMS_SQ_ENTRIES = 0;
    public static final int PARAMS_CQ_ENTRIES = 4;
    public static final int PARAMS_FLAGS = 8;
    public static final int PARAMS_SQ_THREAD_CPU = 12;
    public static final int PARAMS_SQ_THREAD_IDLE = 16;
    public static final int PARAMS_FEATURES = 20;
    public static final int PARAMS_WQ_FD = 24;
    /** struct io_sqring_offsets sq_off (40 bytes) */
    public static final int PARAMS_SQ_OFF = 40;
    /** struct io_cqring_offsets cq_off (40 bytes) */
    public static final int PARAMS_CQ_OFF = 80;

    // struct io_sqring_offsets: offsets, inside the SQ ring mapping, of the fields below
    public static final int SQ_OFF_HEAD = 0;
    public static final int SQ_OFF_TAIL = 4;
    public static final int SQ_OFF_RING_MASK = 8;
    public static final int SQ_OFF_RING_ENTRIES = 12;
    public static final int SQ_OFF_FLAGS = 16;
    public static final int SQ_OFF_DROPPED = 20;
    public static final int SQ_OFF_ARRAY = 24;

    // struct io_cqring_offsets
    public static final int CQ_OFF_HEAD = 0;
    public static final int CQ_OFF_TAIL = 4;
    public static final int CQ_OFF_RING_MASK = 8;
    public static final int CQ_OFF_RING_ENTRIES = 12;
    public static final int CQ_OFF_OVERFLOW = 16;
    public static final int CQ_OFF_CQES = 20;
    public static final int CQ_OFF_FLAGS = 24;

    // mmap offsets (IORING_OFF_*)
    public static final long IORING_OFF_SQ_RING = 0L;
    public static final long IORING_OFF_CQ_RING = 0x8000000L;
    public static final long IORING_OFF_SQES = 0x10000000L;

    // struct io_uring_sqe (64 bytes; 128 with IORING_SETUP_SQE128, the second half belonging to cmd[])
    public static final int SQE_SIZE = 64;
    public static final int SQE128_SIZE = 128;
    public static final int SQE_OPCODE = 0;        // u8
    public static final int SQE_FLAGS = 1;         // u8  IOSQE_*
    public static final int SQE_IOPRIO = 2;        // u16
    public static final int SQE_FD = 4;            // s32 (an index into the registered files with IOSQE_FIXED_FILE)
    public static final int SQE_OFF = 8;           // u64 file offset; union with addr2, {u32 cmd_op, u32 __pad1}
    public static final int SQE_CMD_OP = 8;        // u32 (URING_CMD)
    public static final int SQE_PAD1 = 12;         // u32, must be 0 for URING_CMD
    public static final int SQE_ADDR = 16;         // u64 buffer or iovec array
    public static final int SQE_LEN = 24;          // u32 buffer length or iovec count
    public static final int SQE_OP_FLAGS = 28;     // u32 union: rw_flags, fsync_flags, uring_cmd_flags, ...
    public static final int SQE_USER_DATA = 32;    // u64
    public static final int SQE_BUF_INDEX = 40;    // u16 (READ_FIXED/WRITE_FIXED)
    public static final int SQE_PERSONALITY = 42;  // u16
    public static final int SQE_FILE_INDEX = 44;   // u32
    public static final int SQE_CMD = 48;          // u8 cmd[]: 16 bytes in a 64-byte SQE, 80 with SQE128
    public static final int SQE_CMD_SIZE = 16;
    public static final int SQE128_CMD_SIZE = 80;

    // struct io_uring_cqe (16 bytes; 32 with IORING_SETUP_CQE32)
    public static final int CQE_SIZE = 16;
    public static final int CQE_USER_DATA = 0;     // u64
    public static final int CQE_RES = 8;           // s32, -errno on failure
    public static final int CQE_FLAGS = 12;        // u32 IORING_CQE_F_*

    // struct iovec (<linux/uio.h>), as IORING_REGISTER_BUFFERS and READV/WRITEV take it
    public static final int IOVEC_SIZE = 16;
    public static final int IOVEC_BASE = 0;
    public static final int IOVEC_LEN = 8;

    // enum io_uring_op (IORING_OP_*)
    public static final byte IORING_OP_NOP = 0;
    public static final byte IORING_OP_READV = 1;
    public static final byte IORING_OP_WRITEV = 2;
    public static final byte IORING_OP_FSYNC = 3;
    public static final byte IORING_OP_READ_FIXED = 4;
    public static final byte IORING_OP_WRITE_FIXED = 5;
    public static final byte IORING_OP_READ = 22;
    public static final byte IORING_OP_WRITE = 23;
    public static final byte IORING_OP_URING_CMD = 46;

    // sqe->flags
    public static final byte IOSQE_FIXED_FILE = 1 << 0;
    public static final byte IOSQE_IO_DRAIN = 1 << 1;
    public static final byte IOSQE_IO_LINK = 1 << 2;

    // sqe->fsync_flags
    public static final int IORING_FSYNC_DATASYNC = 1 << 0;

    // io_uring_setup() flags
    public static final int IORING_SETUP_CQSIZE = 1 << 3;
    public static final int IORING_SETUP_CLAMP = 1 << 4;
    public static final int IORING_SETUP_SUBMIT_ALL = 1 << 7;
    public static final int IORING_SETUP_COOP_TASKRUN = 1 << 8;
    public static final int IORING_SETUP_SQE128 = 1 << 10;
    public static final int IORING_SETUP_CQE32 = 1 << 11;
    public static final int IORING_SETUP_SINGLE_ISSUER = 1 << 12;
    public static final int IORING_SETUP_DEFER_TASKRUN = 1 << 13;

    // io_uring_params->features
    public static final int IORING_FEAT_SINGLE_MMAP = 1 << 0;
    public static final int IORING_FEAT_NODROP = 1 << 1;
    public static final int IORING_FEAT_SUBMIT_STABLE = 1 << 2;

    // sq_ring->flags
    public static final int IORING_SQ_NEED_WAKEUP = 1 << 0;
    public static final int IORING_SQ_CQ_OVERFLOW = 1 << 1;
    public static final int IORING_SQ_TASKRUN = 1 << 2;

    // io_uring_enter() flags
    public static final int IORING_ENTER_GETEVENTS = 1 << 0;

    // io_uring_register() opcodes
    public static final int IORING_REGISTER_BUFFERS = 0;
    public static final int IORING_UNREGISTER_BUFFERS = 1;
    public static final int IORING_REGISTER_FILES = 2;
    public static final int IORING_UNREGISTER_FILES = 3;

    /** Largest SQ the kernel accepts (kernel-internal IORING_MAX_ENTRIES, io_uring/io_uring.c); the CQ may be twice that. */
    public static final int IORING_MAX_ENTRIES = 32768;
    public static final int IORING_MAX_CQ_ENTRIES = 2 * IORING_MAX_ENTRIES;
}
