package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.queueing.Status;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * Every rule of {@link RequestValidator}, one row each. Sections cited are NetworkBlockDevice/nbd
 * {@code doc/proto.md}.
 */
class RequestValidatorTest {
    static final long EXPORT = 1L << 20;
    static final int MAX = 64 * 1024;
    static final int OK = 0;
    static final int EINVAL = Status.EINVAL;
    static final int ENOSPC = Status.ENOSPC;
    static final int EPERM = Status.EPERM;
    /** Every transmission flag a driver's capabilities can give: what the pmem driver's export advertises. */
    static final int ALL = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA | TFLAG_SEND_TRIM
            | TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO | TFLAG_SEND_CACHE | TFLAG_CAN_MULTI_CONN;
    /** A flag bit no command accepts ("Command flags" defines bits 0..4 only). */
    static final int UNKNOWN_FLAG = 1 << 5;

    /** what, command, flags, offset, length, structured, base:allocation, export size, expected. */
    static Stream<Arguments> requests() {
        return Stream.of(
                // "Request types": each command in bounds, negotiated as it needs.
                row("READ", CMD_READ, 0, 0, 4096, true, true, EXPORT, OK),
                row("READ with simple replies", CMD_READ, 0, 0, 4096, false, false, EXPORT, OK),
                row("WRITE", CMD_WRITE, 0, 4096, 4096, false, false, EXPORT, OK),
                row("FLUSH", CMD_FLUSH, 0, 0, 0, false, false, EXPORT, OK),
                row("TRIM", CMD_TRIM, 0, 0, 4096, false, false, EXPORT, OK),
                row("CACHE", CMD_CACHE, 0, 0, 4096, false, false, EXPORT, OK),
                row("WRITE_ZEROES", CMD_WRITE_ZEROES, 0, 0, 4096, false, false, EXPORT, OK),
                row("BLOCK_STATUS after base:allocation", CMD_BLOCK_STATUS, 0, 0, 4096, true, true, EXPORT, OK),
                // "NBD_CMD_BLOCK_STATUS": needs a metadata context, which needs structured replies.
                row("BLOCK_STATUS without structured replies", CMD_BLOCK_STATUS, 0, 0, 4096, false, false, EXPORT,
                        EINVAL),
                row("BLOCK_STATUS without a meta context", CMD_BLOCK_STATUS, 0, 0, 4096, true, false, EXPORT,
                        EINVAL),
                // "Request types": an unknown command is EINVAL.
                row("command 8 (unknown)", 8, 0, 0, 4096, true, true, EXPORT, EINVAL),
                row("command 0xffff (unknown)", 0xffff, 0, 0, 4096, true, true, EXPORT, EINVAL),

                // "Command flags": FUA on every command (SEND_FUA is always advertised).
                row("READ+FUA", CMD_READ, CMD_FLAG_FUA, 0, 4096, true, true, EXPORT, OK),
                row("WRITE+FUA", CMD_WRITE, CMD_FLAG_FUA, 0, 4096, false, false, EXPORT, OK),
                row("FLUSH+FUA", CMD_FLUSH, CMD_FLAG_FUA, 0, 0, false, false, EXPORT, OK),
                row("TRIM+FUA", CMD_TRIM, CMD_FLAG_FUA, 0, 4096, false, false, EXPORT, OK),
                row("CACHE+FUA", CMD_CACHE, CMD_FLAG_FUA, 0, 4096, false, false, EXPORT, OK),
                row("WRITE_ZEROES+FUA", CMD_WRITE_ZEROES, CMD_FLAG_FUA, 0, 4096, false, false, EXPORT, OK),
                row("BLOCK_STATUS+FUA", CMD_BLOCK_STATUS, CMD_FLAG_FUA, 0, 4096, true, true, EXPORT, OK),
                // NBD_CMD_FLAG_DF: READ only, and only with structured replies.
                row("READ+DF structured", CMD_READ, CMD_FLAG_DF, 0, 4096, true, false, EXPORT, OK),
                row("READ+DF simple replies", CMD_READ, CMD_FLAG_DF, 0, 4096, false, false, EXPORT, EINVAL),
                row("WRITE+DF", CMD_WRITE, CMD_FLAG_DF, 0, 4096, true, true, EXPORT, EINVAL),
                // NBD_CMD_FLAG_NO_HOLE and NBD_CMD_FLAG_FAST_ZERO: WRITE_ZEROES only.
                row("WRITE_ZEROES+NO_HOLE", CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 4096, false, false, EXPORT, OK),
                row("WRITE_ZEROES+FAST_ZERO", CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 4096, false, false, EXPORT,
                        OK),
                row("WRITE_ZEROES+NO_HOLE+FAST_ZERO+FUA", CMD_WRITE_ZEROES,
                        CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA, 0, 4096, false, false, EXPORT, OK),
                row("WRITE+NO_HOLE", CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 4096, false, false, EXPORT, EINVAL),
                row("TRIM+NO_HOLE", CMD_TRIM, CMD_FLAG_NO_HOLE, 0, 4096, false, false, EXPORT, EINVAL),
                row("WRITE+FAST_ZERO", CMD_WRITE, CMD_FLAG_FAST_ZERO, 0, 4096, false, false, EXPORT, EINVAL),
                // NBD_CMD_FLAG_REQ_ONE: BLOCK_STATUS only.
                row("BLOCK_STATUS+REQ_ONE", CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 4096, true, true, EXPORT, OK),
                row("READ+REQ_ONE", CMD_READ, CMD_FLAG_REQ_ONE, 0, 4096, true, true, EXPORT, EINVAL),
                row("READ+unknown flag", CMD_READ, UNKNOWN_FLAG, 0, 4096, true, true, EXPORT, EINVAL),
                row("WRITE+flag bit 15", CMD_WRITE, 0x8000, 0, 4096, true, true, EXPORT, EINVAL),
                row("FLUSH+unknown flag", CMD_FLUSH, UNKNOWN_FLAG, 0, 0, true, true, EXPORT, EINVAL),

                // "NBD_CMD_FLUSH": offset and length MUST be zero.
                row("FLUSH with an offset", CMD_FLUSH, 0, 4096, 0, false, false, EXPORT, EINVAL),
                row("FLUSH with a length", CMD_FLUSH, 0, 0, 1, false, false, EXPORT, EINVAL),
                // "Request message": zero-length requests are refused (nbdkit does the same).
                row("READ of 0 bytes", CMD_READ, 0, 0, 0, true, true, EXPORT, EINVAL),
                row("WRITE of 0 bytes", CMD_WRITE, 0, 0, 0, true, true, EXPORT, EINVAL),
                row("TRIM of 0 bytes", CMD_TRIM, 0, 0, 0, true, true, EXPORT, EINVAL),
                row("CACHE of 0 bytes", CMD_CACHE, 0, 0, 0, true, true, EXPORT, EINVAL),
                row("WRITE_ZEROES of 0 bytes", CMD_WRITE_ZEROES, 0, 0, 0, true, true, EXPORT, EINVAL),
                row("BLOCK_STATUS of 0 bytes", CMD_BLOCK_STATUS, 0, 0, 0, true, true, EXPORT, EINVAL),
                // "Block size constraints": a READ above the maximum payload; data-less commands are not bound by it.
                row("READ of the maximum", CMD_READ, 0, 0, MAX, true, true, EXPORT, OK),
                row("READ one byte over the maximum", CMD_READ, 0, 0, MAX + 1, true, true, EXPORT, EINVAL),
                row("READ of u32 max", CMD_READ, 0, 0, 0xffff_ffffL, true, true, 1L << 40, EINVAL),
                row("WRITE over the maximum (the caller hangs up)", CMD_WRITE, 0, 0, MAX + 1, true, true, EXPORT, OK),
                row("TRIM of the whole export", CMD_TRIM, 0, 0, EXPORT, true, true, EXPORT, OK),
                row("WRITE_ZEROES of u32 max in a large export", CMD_WRITE_ZEROES, 0, 0, 0xffff_ffffL, true, true,
                        1L << 40, OK),
                row("BLOCK_STATUS of u32 max in a large export", CMD_BLOCK_STATUS, 0, 0, 0xffff_ffffL, true, true,
                        1L << 40, OK),

                // "Error values": past the end is ENOSPC for writes, EINVAL otherwise.
                row("READ ending at the end", CMD_READ, 0, EXPORT - 4096, 4096, true, true, EXPORT, OK),
                row("READ one byte past the end", CMD_READ, 0, EXPORT - 4095, 4096, true, true, EXPORT, EINVAL),
                row("WRITE one byte past the end", CMD_WRITE, 0, EXPORT - 4095, 4096, true, true, EXPORT, ENOSPC),
                row("WRITE_ZEROES past the end", CMD_WRITE_ZEROES, 0, EXPORT - 1, 2, true, true, EXPORT, ENOSPC),
                row("TRIM past the end", CMD_TRIM, 0, EXPORT - 1, 2, true, true, EXPORT, EINVAL),
                row("CACHE past the end", CMD_CACHE, 0, EXPORT, 1, true, true, EXPORT, EINVAL),
                row("BLOCK_STATUS past the end", CMD_BLOCK_STATUS, 0, EXPORT, 1, true, true, EXPORT, EINVAL),
                row("WRITE at the end", CMD_WRITE, 0, EXPORT, 1, true, true, EXPORT, ENOSPC),
                row("WRITE beyond the end", CMD_WRITE, 0, EXPORT + 4096, 4096, true, true, EXPORT, ENOSPC),
                row("WRITE_ZEROES of u32 max past a small export", CMD_WRITE_ZEROES, 0, 0, 0xffff_ffffL, true, true,
                        EXPORT, ENOSPC),

                // "Request message": the offset is a u64. From 2^63 up it arrives negative; it is past any end.
                row("READ at 2^64-1", CMD_READ, 0, -1L, 1, true, true, EXPORT, EINVAL),
                row("WRITE at 2^64-1", CMD_WRITE, 0, -1L, 1, true, true, EXPORT, ENOSPC),
                row("READ at 2^63", CMD_READ, 0, Long.MIN_VALUE, 4096, true, true, EXPORT, EINVAL),
                row("WRITE_ZEROES at 2^63", CMD_WRITE_ZEROES, 0, Long.MIN_VALUE, 4096, true, true, EXPORT, ENOSPC),
                row("READ at 2^63-1", CMD_READ, 0, Long.MAX_VALUE, 1, true, true, EXPORT, EINVAL),
                // offset + length wraps to a small number in u64: only the subtraction form sees it is past the end
                row("READ at 2^64-4096 in a 2^63-1 export", CMD_READ, 0, -4096L, 4096, true, true, Long.MAX_VALUE,
                        EINVAL),
                row("WRITE at 2^64-4096 in a 2^63-1 export", CMD_WRITE, 0, -4096L, 8192, true, true, Long.MAX_VALUE,
                        ENOSPC),
                row("TRIM ending at 2^63-1 in a 2^63-1 export", CMD_TRIM, 0, Long.MAX_VALUE - 4096, 4096, true, true,
                        Long.MAX_VALUE, OK),
                row("TRIM one past 2^63-1 in a 2^63-1 export", CMD_TRIM, 0, Long.MAX_VALUE - 4095, 4096, true, true,
                        Long.MAX_VALUE, EINVAL));
    }

    static Arguments row(String what, int command, int flags, long offset, long length, boolean structured,
                         boolean baseAllocation, long export, int expected) {
        return Arguments.of(what, command, flags, offset, length, structured, baseAllocation, export, expected);
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("requests")
    void validate(String what, int command, int flags, long offset, long length, boolean structured,
                  boolean baseAllocation, long export, int expected) {
        assertEquals(expected, RequestValidator.validate(command, flags, offset, length, ALL, structured,
                baseAllocation, export, MAX), what);
    }

    /** what, command, flags, the export's transmission flags, expected ("Transmission flags", nbdkit's rules). */
    static Stream<Arguments> capabilities() {
        int readOnly = TFLAG_HAS_FLAGS | TFLAG_READ_ONLY | TFLAG_SEND_FLUSH | TFLAG_SEND_CACHE;
        return Stream.of(
                Arguments.of("TRIM without SEND_TRIM", CMD_TRIM, 0, ALL & ~TFLAG_SEND_TRIM, EINVAL),
                Arguments.of("TRIM with SEND_TRIM", CMD_TRIM, 0, ALL, OK),
                Arguments.of("FLUSH without SEND_FLUSH", CMD_FLUSH, 0, ALL & ~TFLAG_SEND_FLUSH, EINVAL),
                Arguments.of("CACHE without SEND_CACHE", CMD_CACHE, 0, ALL & ~TFLAG_SEND_CACHE, EINVAL),
                Arguments.of("WRITE_ZEROES without SEND_WRITE_ZEROES", CMD_WRITE_ZEROES, 0,
                        ALL & ~(TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO), EINVAL),
                Arguments.of("WRITE_ZEROES+FAST_ZERO without SEND_FAST_ZERO", CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO,
                        ALL & ~TFLAG_SEND_FAST_ZERO, EINVAL),
                Arguments.of("WRITE_ZEROES without SEND_FAST_ZERO", CMD_WRITE_ZEROES, 0, ALL & ~TFLAG_SEND_FAST_ZERO, OK),
                Arguments.of("WRITE+FUA without SEND_FUA", CMD_WRITE, CMD_FLAG_FUA, ALL & ~TFLAG_SEND_FUA, EINVAL),
                Arguments.of("WRITE without SEND_FUA", CMD_WRITE, 0, ALL & ~TFLAG_SEND_FUA, OK),
                Arguments.of("READ read-only", CMD_READ, 0, readOnly, OK),
                Arguments.of("FLUSH read-only", CMD_FLUSH, 0, readOnly, OK),
                Arguments.of("WRITE read-only", CMD_WRITE, 0, readOnly, EPERM),
                Arguments.of("TRIM read-only", CMD_TRIM, 0, readOnly, EPERM),
                Arguments.of("WRITE_ZEROES read-only", CMD_WRITE_ZEROES, 0, readOnly, EPERM));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("capabilities")
    void refusesWhatTheExportDoesNotAdvertise(String what, int command, int flags, int eflags, int expected) {
        long length = command == CMD_FLUSH ? 0 : 4096;
        assertEquals(expected, RequestValidator.validate(command, flags, 0, length, eflags, false, false, EXPORT,
                MAX), what);
    }

    @Test
    void onlyAWriteAboveTheMaximumMakesTheServerHangUp() {
        assertFalse(RequestValidator.writeTooLarge(MAX, MAX));
        assertTrue(RequestValidator.writeTooLarge(MAX + 1L, MAX));
        assertTrue(RequestValidator.writeTooLarge(0xffff_ffffL, MAX));
    }
}
