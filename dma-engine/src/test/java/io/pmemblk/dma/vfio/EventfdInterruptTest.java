package io.pmemblk.dma.vfio;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.posix.FileIo;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** A real eventfd: what the kernel adds counts as device interrupts, the driver's own wake-ups do not. */
class EventfdInterruptTest {
    @Test
    void countsWhatTheKernelSignalledApartFromWakeUps() throws Exception {
        try (EventfdInterrupt irq = new EventfdInterrupt(); Arena a = Arena.ofConfined()) {
            assertThat(irq.await(20, TimeUnit.MILLISECONDS)).as("nothing pending").isFalse();
            MemorySegment three = a.allocate(ValueLayout.JAVA_LONG);
            three.set(ValueLayout.JAVA_LONG, 0, 3L);
            assertThat(FileIo.write(irq.fd(), three)).isEqualTo(8); // as the kernel's eventfd_signal would, three times
            assertThat(irq.await(1, TimeUnit.SECONDS)).isTrue();
            assertThat(irq.deviceInterrupts()).isEqualTo(3);
            irq.signal();
            assertThat(irq.await(1, TimeUnit.SECONDS)).as("a latched wake-up").isTrue();
            assertThat(irq.deviceInterrupts()).isEqualTo(3);
            assertThat(irq.await(20, TimeUnit.MILLISECONDS)).as("consumed").isFalse();
        }
    }

    @Test
    void aWaiterIsWokenFromAnotherThread() throws Exception {
        try (EventfdInterrupt irq = new EventfdInterrupt()) {
            Thread t = Thread.ofPlatform().start(irq::signal);
            assertThat(irq.await(5, TimeUnit.SECONDS)).isTrue();
            t.join();
        }
    }
}
