package io.pmemblk.posix;

import org.junit.jupiter.api.Test;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

class CloseOnceTest {
    /** The number a closed descriptor had is handed to the next open: a second close must not close that file. */
    @Test
    void aSecondCloseLeavesTheFileThatReusedTheNumberOpen() throws Exception {
        int first = FileIo.eventfd(0, 0);
        CloseOnce closing = new CloseOnce(first);
        closing.close();
        int second = FileIo.eventfd(0, 0);
        try {
            assumeTrue(second == first, "the kernel gave the lowest free number back (another thread took it)");
            closing.close();
            assertThat(FileCalls.describeFd(second)).as("the newer file is still open").isEqualTo(EventFd.PROC_NAME);
        } finally {
            Libc.closeQuietly(second);
        }
    }

    @Test
    void closeQuietlyClosesAndSkipsWhatIsNotOpen() throws Exception {
        int fd = FileIo.eventfd(0, 0);
        Libc.closeQuietly(fd);
        assertThatThrownBy(() -> FileCalls.describeFd(fd)).as("closed: /proc/self/fd has no such entry")
                .isInstanceOf(NativeException.class)
                .satisfies(e -> assertThat(((NativeException) e).errno()).isEqualTo(Errno.ENOENT));
        Libc.closeQuietly(Integer.MAX_VALUE); // EBADF: swallowed
        Libc.closeQuietly(-1); // none opened: skipped
    }
}
