package io.pmemblk.vhost;

import io.pmemblk.queueing.testing.ThreadShortage;
import org.junit.jupiter.api.Test;

import java.time.Duration;

import static io.pmemblk.vhost.spec.VhostUserSpec.GET_QUEUE_NUM;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * A server the system makes no more threads for (ulimit -u, a cgroup's pids.max): a front-end it cannot give a
 * session thread is closed, and the next one is served. Once the session stayed recorded as the one front-end
 * served, and the OutOfMemoryError of Thread.start ended the accept loop: every QEMU after it was refused or never
 * answered.
 */
class ThreadShortageTest extends ServedMemoryDisk {
    ThreadShortageTest() {
        super(new Sizes(4L << 20, 1, 1, 128, 1L << 20));
    }

    @Test
    void aFrontEndWithoutASessionThreadIsClosedAndTheNextIsServed() throws Exception {
        server.threads = new ThreadShortage().refuse(1);
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            assertThat(fe.closedByBackEnd()).as("a front-end without a session thread is closed").isTrue();
        }
        assertThat(server.awaitDisconnected(Duration.ofSeconds(10))).as("its place given back").isTrue();
        try (TestFrontEnd next = TestFrontEnd.connect(socket)) {
            assertThat(next.get(GET_QUEUE_NUM)).as("the next front-end served").isEqualTo(1);
        }
        assertThat(log).anyMatch(l -> l.contains("vhost-user connection 1 closed: no thread could be made for it"));
    }
}
