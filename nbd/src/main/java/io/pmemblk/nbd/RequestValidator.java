package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;

import io.pmemblk.queueing.Status;

/**
 * Which NBD requests the server refuses, and with which error, as pure functions of the request and what the
 * handshake negotiated (nbdkit's {@code validate_request}): no socket, no state, so every rule has a row in a
 * table test. Sections cited are NetworkBlockDevice/nbd {@code doc/proto.md}.
 */
final class RequestValidator {
    private RequestValidator() {}

    /**
     * 0, or the errno to reply for a request ("Request types", "Request message", "Error values"). DISC never
     * gets here; a WRITE longer than {@code maxRequestBytes} also gets EINVAL, but the caller must hang up too
     * ({@link #writeTooLarge}) because it will not read the payload.
     *
     * @param offset the wire's u64 offset: values of 2^63 and above arrive negative and are out of range
     * @param length the wire's u32 length, unsigned (0..2^32-1)
     * @param eflags the transmission flags the handshake advertised: a command or flag they do not offer is
     *               refused, as nbdkit refuses what its plugin cannot do ("Transmission flags")
     */
    static int validate(int command, int flags, long offset, long length, int eflags, boolean structured,
                        boolean baseAllocation, long exportSize, int maxRequestBytes) {
        // "Command flags": FUA is valid on every command once SEND_FUA is advertised.
        int allowed = (eflags & TFLAG_SEND_FUA) != 0 ? CMD_FLAG_FUA : 0;
        boolean readOnly = (eflags & TFLAG_READ_ONLY) != 0;
        switch (command) {
            // NBD_CMD_FLAG_DF: only with structured replies ("NBD_CMD_READ").
            case CMD_READ -> allowed |= structured ? CMD_FLAG_DF : 0;
            // "NBD_FLAG_READ_ONLY": writing commands get EPERM (nbdkit: "write request on readonly connection").
            case CMD_WRITE -> {
                if (readOnly) {
                    return Status.EPERM;
                }
            }
            // A command the export does not advertise: EINVAL (nbdkit: "... operation not supported").
            case CMD_FLUSH -> {
                if ((eflags & TFLAG_SEND_FLUSH) == 0) {
                    return Status.EINVAL;
                }
            }
            case CMD_CACHE -> {
                if ((eflags & TFLAG_SEND_CACHE) == 0) {
                    return Status.EINVAL;
                }
            }
            case CMD_TRIM -> {
                if (readOnly || (eflags & TFLAG_SEND_TRIM) == 0) {
                    return readOnly ? Status.EPERM : Status.EINVAL;
                }
            }
            case CMD_WRITE_ZEROES -> {
                if (readOnly || (eflags & TFLAG_SEND_WRITE_ZEROES) == 0) {
                    return readOnly ? Status.EPERM : Status.EINVAL;
                }
                allowed |= CMD_FLAG_NO_HOLE | ((eflags & TFLAG_SEND_FAST_ZERO) != 0 ? CMD_FLAG_FAST_ZERO : 0);
            }
            case CMD_BLOCK_STATUS -> {
                // "NBD_CMD_BLOCK_STATUS": only after a metadata context was set, which needs structured replies.
                if (!structured || !baseAllocation) {
                    return Status.EINVAL;
                }
                allowed |= CMD_FLAG_REQ_ONE;
            }
            default -> {
                return Status.EINVAL; // "Request types": unknown commands get EINVAL
            }
        }
        if ((flags & ~allowed) != 0) {
            return Status.EINVAL; // "Command flags": a flag not valid for the command
        }
        if (command == CMD_FLUSH) {
            return offset == 0 && length == 0 ? 0 : Status.EINVAL; // "NBD_CMD_FLUSH": offset and length MUST be 0
        }
        if (command == CMD_READ && length > maxRequestBytes) {
            return Status.EINVAL; // "Block size constraints": above the advertised maximum payload
        }
        if (length == 0) {
            return Status.EINVAL; // "Request message": a zero length is unspecified; refuse it as nbdkit does
        }
        boolean writes = command == CMD_WRITE || command == CMD_WRITE_ZEROES;
        // "Error values": past the end is ENOSPC for writes, EINVAL otherwise. Unsigned: an offset >= 2^63 is
        // negative here and out of range like any other; the subtraction cannot overflow once offset is in range.
        if (offset < 0 || offset > exportSize || length > exportSize - offset) {
            return writes ? Status.ENOSPC : Status.EINVAL;
        }
        return 0;
    }

    /** A WRITE whose payload the server will not read: answer EINVAL, then disconnect ("Block size constraints"). */
    static boolean writeTooLarge(long length, int maxRequestBytes) {
        return length > maxRequestBytes;
    }
}
