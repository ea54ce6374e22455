package io.pmemblk.nbd;

import io.pmemblk.queueing.Status;

/**
 * Wire constants of the NBD protocol, all big-endian, as written in NetworkBlockDevice/nbd {@code doc/proto.md}
 * (sections "Values", "Option types", "Structured reply types", "Error values") and {@code nbd-protocol.h} of
 * libguestfs/nbdkit. Written once here; nothing else spells a magic number.
 */
final class NbdProtocol {
    /**
     * Refused requests and options, at DEBUG by command or option name (as nbdkit logs them), within the
     * process's refusal-log limit: a hostile client cannot flood the log.
     */
    static final io.pmemblk.queueing.log.RateLimitedLog REFUSALS = io.pmemblk.queueing.log.RateLimitedLog.to(
            System.getLogger("io.pmemblk.nbd.refusals"), System.Logger.Level.DEBUG);

    private NbdProtocol() {}

    // Handshake (proto.md "Newstyle negotiation").
    static final long NBDMAGIC = 0x4e42444d41474943L;
    static final long IHAVEOPT = 0x49484156454F5054L;
    static final long OPTION_REPLY_MAGIC = 0x3e889045565a9L;

    static final int FLAG_FIXED_NEWSTYLE = 1;
    static final int FLAG_NO_ZEROES = 1 << 1;
    static final int CLIENT_FLAG_FIXED_NEWSTYLE = 1;
    static final int CLIENT_FLAG_NO_ZEROES = 1 << 1;

    // Options.
    static final int OPT_EXPORT_NAME = 1;
    static final int OPT_ABORT = 2;
    static final int OPT_LIST = 3;
    static final int OPT_STARTTLS = 5;
    static final int OPT_INFO = 6;
    static final int OPT_GO = 7;
    static final int OPT_STRUCTURED_REPLY = 8;
    static final int OPT_LIST_META_CONTEXT = 9;
    static final int OPT_SET_META_CONTEXT = 10;
    static final int OPT_EXTENDED_HEADERS = 11;

    // Option reply types; errors have bit 31 set.
    static final int REP_ACK = 1;
    static final int REP_SERVER = 2;
    static final int REP_INFO = 3;
    static final int REP_META_CONTEXT = 4;
    static final int REP_ERR_UNSUP = 0x80000001;
    static final int REP_ERR_POLICY = 0x80000002;
    static final int REP_ERR_INVALID = 0x80000003;
    static final int REP_ERR_TLS_REQD = 0x80000005;
    static final int REP_ERR_UNKNOWN = 0x80000006;
    static final int REP_ERR_SHUTDOWN = 0x80000007;
    static final int REP_ERR_TOO_BIG = 0x80000009;

    // NBD_INFO_* items of NBD_REP_INFO.
    static final int INFO_EXPORT = 0;
    static final int INFO_NAME = 1;
    static final int INFO_DESCRIPTION = 2;
    static final int INFO_BLOCK_SIZE = 3;

    // Transmission flags.
    static final int TFLAG_HAS_FLAGS = 1;
    static final int TFLAG_READ_ONLY = 1 << 1;
    static final int TFLAG_SEND_FLUSH = 1 << 2;
    static final int TFLAG_SEND_FUA = 1 << 3;
    static final int TFLAG_ROTATIONAL = 1 << 4;
    static final int TFLAG_SEND_TRIM = 1 << 5;
    static final int TFLAG_SEND_WRITE_ZEROES = 1 << 6;
    static final int TFLAG_SEND_DF = 1 << 7;
    static final int TFLAG_CAN_MULTI_CONN = 1 << 8;
    static final int TFLAG_SEND_CACHE = 1 << 10;
    static final int TFLAG_SEND_FAST_ZERO = 1 << 11;

    // Transmission phase.
    static final int REQUEST_MAGIC = 0x25609513;
    static final int SIMPLE_REPLY_MAGIC = 0x67446698;
    static final int STRUCTURED_REPLY_MAGIC = 0x668e33ef;
    /** magic u32, flags u16, type u16, cookie u64, offset u64, length u32. */
    static final int REQUEST_HEADER_BYTES = 28;
    /** magic u32, error u32, cookie u64. */
    static final int SIMPLE_REPLY_BYTES = 16;
    /** magic u32, flags u16, type u16, cookie u64, length u32. */
    static final int CHUNK_HEADER_BYTES = 20;

    static final int CMD_READ = 0;
    static final int CMD_WRITE = 1;
    static final int CMD_DISC = 2;
    static final int CMD_FLUSH = 3;
    static final int CMD_TRIM = 4;
    static final int CMD_CACHE = 5;
    static final int CMD_WRITE_ZEROES = 6;
    static final int CMD_BLOCK_STATUS = 7;

    static final int CMD_FLAG_FUA = 1;
    static final int CMD_FLAG_NO_HOLE = 1 << 1;
    static final int CMD_FLAG_DF = 1 << 2;
    static final int CMD_FLAG_REQ_ONE = 1 << 3;
    static final int CMD_FLAG_FAST_ZERO = 1 << 4;

    static final int REPLY_FLAG_DONE = 1;
    static final int REPLY_TYPE_NONE = 0;
    static final int REPLY_TYPE_OFFSET_DATA = 1;
    static final int REPLY_TYPE_BLOCK_STATUS = 5;
    static final int REPLY_TYPE_ERROR = 0x8001;

    static final String META_BASE_ALLOCATION = "base:allocation";
    /** Context id we hand out for base:allocation after NBD_OPT_SET_META_CONTEXT. */
    static final int META_ID_BASE_ALLOCATION = 1;
    /** QEMU's namespace and its dirty bitmap contexts, "qemu:dirty-bitmap:NAME" (qemu docs/interop/nbd.rst). */
    static final String META_QEMU = "qemu:", META_DIRTY_BITMAP = "qemu:dirty-bitmap:";
    /** Context id of the i-th bitmap a connection selected: this plus i. */
    static final int META_ID_FIRST_BITMAP = 2;
    /** A dirty bitmap context's one flag (qemu include/block/nbd.h NBD_STATE_DIRTY): the block was written. */
    static final int STATE_DIRTY = 1;

    /** proto.md: strings SHOULD be <= 256 bytes and MUST be <= 4096. */
    static final int MAX_STRING_BYTES = 4096;

    /**
     * A client-supplied string made safe for a log line or a reply: control characters become '?', and it is
     * cut at 128 characters, so a client can neither forge log lines nor flood the log.
     */
    /** A command's name as proto.md writes it (nbdkit's name_of_nbd_cmd), for log lines. */
    static String commandName(int command) {
        return switch (command) {
            case CMD_READ -> "NBD_CMD_READ";
            case CMD_WRITE -> "NBD_CMD_WRITE";
            case CMD_DISC -> "NBD_CMD_DISC";
            case CMD_FLUSH -> "NBD_CMD_FLUSH";
            case CMD_TRIM -> "NBD_CMD_TRIM";
            case CMD_CACHE -> "NBD_CMD_CACHE";
            case CMD_WRITE_ZEROES -> "NBD_CMD_WRITE_ZEROES";
            case CMD_BLOCK_STATUS -> "NBD_CMD_BLOCK_STATUS";
            default -> "command " + command;
        };
    }

    /** An option's name as proto.md writes it (nbdkit's name_of_nbd_opt), for log lines. */
    static String optionName(int option) {
        return switch (option) {
            case OPT_EXPORT_NAME -> "NBD_OPT_EXPORT_NAME";
            case OPT_ABORT -> "NBD_OPT_ABORT";
            case OPT_LIST -> "NBD_OPT_LIST";
            case OPT_STARTTLS -> "NBD_OPT_STARTTLS";
            case OPT_INFO -> "NBD_OPT_INFO";
            case OPT_GO -> "NBD_OPT_GO";
            case OPT_STRUCTURED_REPLY -> "NBD_OPT_STRUCTURED_REPLY";
            case OPT_LIST_META_CONTEXT -> "NBD_OPT_LIST_META_CONTEXT";
            case OPT_SET_META_CONTEXT -> "NBD_OPT_SET_META_CONTEXT";
            case OPT_EXTENDED_HEADERS -> "NBD_OPT_EXTENDED_HEADERS";
            default -> "option " + option;
        };
    }

    /** An error's name as proto.md writes it ("Error values"), for log lines. */
    static String errorName(int error) {
        return switch (error) {
            case Status.EPERM -> "NBD_EPERM";
            case Status.EIO -> "NBD_EIO";
            case Status.ENOMEM -> "NBD_ENOMEM";
            case Status.EINVAL -> "NBD_EINVAL";
            case Status.ENOSPC -> "NBD_ENOSPC";
            case Status.EOVERFLOW -> "NBD_EOVERFLOW";
            case Status.ENOTSUP -> "NBD_ENOTSUP";
            case Status.ESHUTDOWN -> "NBD_ESHUTDOWN";
            default -> "error " + error;
        };
    }

    static String printable(String s) {
        StringBuilder b = new StringBuilder(Math.min(s.length(), 140));
        for (int i = 0; i < s.length() && i < 128; i++) {
            char c = s.charAt(i);
            b.append(Character.isISOControl(c) || Character.getType(c) == Character.LINE_SEPARATOR
                    || Character.getType(c) == Character.PARAGRAPH_SEPARATOR ? '?' : c);
        }
        if (s.length() > 128) {
            b.append("...(").append(s.length()).append(" chars)");
        }
        return b.toString();
    }
}
