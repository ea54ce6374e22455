package io.pmemblk.ublk;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.uring.IoUring;
import io.pmemblk.uring.IoUringAbi;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * A control command's completion is matched by its user data, on a real io_uring: /dev/null stands in for
 * /dev/ublk-control (what it answers a URING_CMD with differs between kernels; only the matching is tested).
 */
@Timeout(30)
class UblkControlTest {
    static final int OP = UblkAbi.UBLK_U_CMD_GET_FEATURES;

    @Test
    void commandsInARowEachTakeTheirOwnCompletion() throws Exception {
        int fd = FileCalls.open("/dev/null", FileCalls.O_RDWR, 0);
        try (Arena a = Arena.ofConfined(); IoUring ring = IoUring.open(4, 0, IoUringAbi.IORING_SETUP_SQE128)) {
            MemorySegment cmd = a.allocate(UblkAbi.CTRL_CMD_SIZE, 8);
            int first = UblkControl.await(ring, fd, OP, cmd, 7);
            // Nothing of the first command is left on the ring to be taken for the second's answer.
            assertThat(UblkControl.await(ring, fd, OP, cmd, 8)).isEqualTo(first);
            assertThat(ring.cq().drain((userData, result, flags) -> { })).isZero();
        } finally {
            Libc.close(fd);
        }
    }

    @Test
    void anotherCompletionOnTheControlRingFailsNamingBothUserData() throws Exception {
        int fd = FileCalls.open("/dev/null", FileCalls.O_RDWR, 0);
        try (Arena a = Arena.ofConfined(); IoUring ring = IoUring.open(4, 0, IoUringAbi.IORING_SETUP_SQE128)) {
            MemorySegment cmd = a.allocate(UblkAbi.CTRL_CMD_SIZE, 8);
            assertThat(ring.sq().nop(99)).isTrue(); // left behind by someone else: completes with the command
            assertThatThrownBy(() -> UblkControl.await(ring, fd, OP, cmd, 7))
                    .isInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("user data 7")
                    .hasMessageContaining("user data 99");
        } finally {
            Libc.close(fd);
        }
    }
}
