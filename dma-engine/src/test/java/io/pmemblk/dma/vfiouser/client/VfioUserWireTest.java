package io.pmemblk.dma.vfiouser.client;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pmemblk.posix.Sockets;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/**
 * The one guard every typed request takes: it holds the wire's lock for the request and lets it go when the request
 * ends, and a request on a lost connection fails at once without keeping the lock (a kept lock would leave the
 * watcher unable to read, and close unable to free the buffers, from any other thread).
 */
class VfioUserWireTest {
    @Test
    void aRequestHoldsTheLockUntilItEndsAndARefusedOneDoesNotKeepIt() throws Exception {
        VfioUserWire wire = new VfioUserWire(Sockets.unixStreamSocket(), "wire-test.sock", Duration.ofMillis(300), null);
        try {
            try (var _ = wire.request()) {
                assertThat(wire.lock.isHeldByCurrentThread()).as("the lock during a request").isTrue();
            }
            assertThat(wire.lock.isLocked()).as("the lock after a request").isFalse();

            wire.lose("the device went away");
            assertThatThrownBy(wire::request)
                    .isInstanceOf(VfioUserException.class)
                    .hasMessageContaining("wire-test.sock is gone: the device went away")
                    .satisfies(e -> assertThat(((VfioUserException) e).connectionLost()).isTrue());
            assertThat(wire.lock.isLocked()).as("the lock after a request refused on a lost connection").isFalse();
        } finally {
            wire.shutdownForClose();
            wire.closeSocket();
            wire.freeBuffers();
        }
    }
}
