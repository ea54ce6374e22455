package io.pmemblk.dma.ioat;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.Recorder;
import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.testing.ForwardingMmio;
import io.pmemblk.dma.testing.HeldDescriptor;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.Test;

/**
 * The doorbell page between the driver ({@link IoatChannel}) and the device model ({@link SoftIoatDevice}): the same
 * page both sides map when the device is a process of its own, here one segment both hold.
 */
class DoorbellPageTest {
    private static final long WAIT_NANOS = TimeUnit.SECONDS.toNanos(10);

    /** A one-channel device with its doorbell page, and a buffer registered for copies. */
    private static final class Paged implements AutoCloseable {
        final IovaSpace space = new IovaSpace();
        final Arena arena = Arena.ofShared();
        final MemorySegment page = arena.allocate(DoorbellPage.SIZE, 4096);
        final MemorySegment buf = arena.allocate(1 << 20, 4096);
        final long iova = space.map(buf);
        final SoftIoatDevice dev;
        final Recorder rec = new Recorder();

        Paged(SoftFaults faults) {
            dev = new SoftIoatDevice(space, 1, 16, faults);
            dev.useDoorbellPage(page);
        }

        /** A driver for channel 0 that rings in the page, completions to {@link #rec}. */
        IoatChannel channel() {
            IoatChannel ch = new IoatChannel(dev, 0, space, dev.interrupt(0), 64, page);
            ch.listener(rec);
            return ch;
        }

        /** Places one copy inside {@link #buf} and submits it. */
        void copy(IoatChannel ch, long from, long to, long length, Object ctx) {
            assertThat(ch.place(iova + from, iova + to, length, ctx)).as("room in the ring for %s", ctx).isTrue();
            ch.submit();
        }

        void awaitAsleep(String when) {
            await(() -> DoorbellPage.asleep(page, 0), "channel 0's engine says in the page that it sleeps, " + when);
        }

        @Override
        public void close() {
            dev.close();
            arena.close();
        }
    }

    private static void await(BooleanSupplier done, String what) {
        long deadline = System.nanoTime() + WAIT_NANOS;
        while (!done.getAsBoolean()) {
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("not within 10 s: " + what);
            }
            Thread.onSpinWait();
        }
    }

    @Test
    void anAwakeEngineTakesTheDoorbellFromThePageWithoutARegisterWrite() throws Exception {
        HeldDescriptor held = HeldDescriptor.later();
        try (Paged p = new Paged(held); IoatChannel ch = p.channel()) {
            assertThat(ch.doorbellPage()).isTrue();
            p.buf.asSlice(0, 4096).fill((byte) 7);
            held.hold();
            p.copy(ch, 0, 8192, 4096, "first"); // the engine may be asleep: this one may write the register
            held.awaitTaken();
            long registerBefore = p.dev.registerDoorbells(0);
            for (int i = 1; i <= 20; i++) {
                p.copy(ch, 0, 8192 + 4096L * i, 4096, i);
            }
            assertThat(p.dev.registerDoorbells(0)).as("DMACOUNT register writes while the engine was awake")
                    .isEqualTo(registerBefore);
            held.release();
            p.rec.awaitCount(21);
            for (int i = 1; i <= 20; i++) {
                assertThat(p.rec.status(i)).as("copy %d", i).isZero();
                assertThat(p.buf.get(ValueLayout.JAVA_BYTE, 8192 + 4096L * i + 4095)).isEqualTo((byte) 7);
            }
        }
    }

    @Test
    void aSleepingEngineIsWokenByTheRegisterTheDriverWritesWhenThePageSaysSo() {
        try (Paged p = new Paged(SoftFaults.NONE); IoatChannel ch = p.channel()) {
            for (int round = 0; round < 3; round++) {
                p.awaitAsleep("round " + round);
                long before = p.dev.registerDoorbells(0);
                p.copy(ch, 0, 4096, 512, round);
                p.rec.awaitCount(round + 1);
                assertThat(p.rec.status(round)).isZero();
                assertThat(p.dev.registerDoorbells(0)).as("the register written once to wake it").isEqualTo(before + 1);
            }
        }
    }

    /** The device behind a socket: DMACOUNT writes held back (on their way) until {@link #deliver}, and counted. */
    private static final class SlowRegisterWrites extends ForwardingMmio {
        final List<long[]> held = new ArrayList<>();
        int sent;
        boolean holding;

        SlowRegisterWrites(Mmio device) {
            super(device);
        }

        void deliver() {
            for (long[] w : held) {
                inner.write16(w[0], (int) w[1]);
            }
            held.clear();
        }

        @Override
        public void write16(long offset, int value) {
            if (holding && offset % IoatSpec.CHANNEL_MMIO_SIZE == IoatSpec.DMACOUNT) {
                held.add(new long[]{offset, value});
                sent++;
            } else {
                inner.write16(offset, value);
            }
        }
    }

    @Test
    void aSleepTheRegisterWasWrittenForIsNotRungAgainWhileThatWriteIsOnItsWay() {
        try (Paged p = new Paged(SoftFaults.NONE)) {
            SlowRegisterWrites bar = new SlowRegisterWrites(p.dev);
            try (IoatChannel ch = new IoatChannel(bar, 0, p.space, p.dev.interrupt(0), 64, p.page)) {
                ch.listener(p.rec);
                for (int round = 0; round < 3; round++) {
                    p.awaitAsleep("round " + round);
                    bar.holding = true;
                    int sentBefore = bar.sent;
                    for (int i = 0; i < 4; i++) {
                        p.copy(ch, 0, 4096 + 512L * i, 512, round * 4 + i);
                    }
                    assertThat(bar.sent - sentBefore).as("register writes for 4 doorbells in one sleep of the engine")
                            .isEqualTo(1);
                    bar.holding = false;
                    bar.deliver(); // the write reaches the device: the engine wakes and takes all four from the page
                    p.rec.awaitCount(round * 4 + 4);
                }
            }
        }
    }

    @Test
    void noDoorbellIsLostWhileTheEngineGoesToSleepAndWakes() {
        try (Paged p = new Paged(SoftFaults.NONE); IoatChannel ch = p.channel()) {
            // One copy at a time, each submitted as the engine is about to sleep after the last: a doorbell the
            // engine missed (rung in the page as it went to sleep, no register write) never completes.
            int rounds = 20_000;
            for (int i = 0; i < rounds; i++) {
                p.copy(ch, 0, 4096, 64, i);
                int n = i + 1;
                await(() -> p.rec.count() >= n, "copy " + n + " of " + rounds + " completes (register writes so far: "
                        + p.dev.registerDoorbells(0) + ")");
            }
            assertThat(p.rec.count()).isEqualTo(rounds);
        }
    }

    @Test
    void aResetForgetsTheDoorbellInThePageAndTheRegisterCountsAgain() {
        IovaSpace space = new IovaSpace();
        try (Arena arena = Arena.ofShared()) {
            MemorySegment page = arena.allocate(DoorbellPage.SIZE, 4096);
            SoftIoatDevice dev = new SoftIoatDevice(space, 2, 16);
            try {
                dev.useDoorbellPage(page);
                assertThat(DoorbellPage.refusal(page, 1)).isNull();
                DoorbellPage.doorbell(page, 1, DoorbellPage.VALID | 5);
                assertThat(dev.read16(IoatSpec.channelBase(1) + IoatSpec.DMACOUNT)).as("the page's count is DMACOUNT")
                        .isEqualTo(5);
                assertThat(dev.read16(IoatSpec.channelBase(0) + IoatSpec.DMACOUNT)).as("channel 0's untouched")
                        .isZero();
                dev.write8(IoatSpec.channelBase(1) + IoatSpec.CHANCMD, IoatSpec.CHANCMD_RESET);
                assertThat(DoorbellPage.doorbell(page, 1)).as("cleared by RESET").isZero();
                dev.write16(IoatSpec.channelBase(1) + IoatSpec.DMACOUNT, 3);
                assertThat(dev.read16(IoatSpec.channelBase(1) + IoatSpec.DMACOUNT)).isEqualTo(3);
            } finally {
                dev.close();
            }
        }
    }

    @Test
    void aDeviceResetUndoesWhatAClientWroteOverThePage() {
        try (Paged p = new Paged(SoftFaults.NONE)) {
            p.awaitAsleep("at first");
            // A client (a guest maps BAR2 writable) writes the whole page over, then goes: the device resets.
            p.page.fill((byte) 0);
            p.dev.reset();
            assertThat(DoorbellPage.refusal(p.page, 0)).as("the header, written again").isNull();
            // Before any register is touched: a doorbell in the page alone must be heard, so the sleeping engine
            // says again that it sleeps, and the driver writes the register.
            p.awaitAsleep("again after the reset");
            try (IoatChannel ch = p.channel()) {
                p.copy(ch, 0, 4096, 512, "after");
                p.rec.awaitCount(1);
                assertThat(p.rec.status("after")).isZero();
            }
        }
    }

    @Test
    void aPageThatIsNotADoorbellPageIsRefusedNamingWhatIsWrong() {
        IovaSpace space = new IovaSpace();
        try (Arena arena = Arena.ofShared()) {
            MemorySegment page = arena.allocate(DoorbellPage.SIZE, 4096);
            assertThat(DoorbellPage.refusal(page, 0)).contains("magic 0x0");
            DoorbellPage.format(page, 2);
            assertThat(DoorbellPage.refusal(page, 2)).contains("holds 2 channel(s), not channel 2");
            assertThat(DoorbellPage.refusal(arena.allocate(64), 0)).contains("64 bytes");
            SoftIoatDevice dev = new SoftIoatDevice(space, 1, 16);
            try {
                assertThatThrownBy(() -> new IoatChannel(dev, 0, space, dev.interrupt(0), 8, arena.allocate(4096)))
                        .isInstanceOf(IllegalArgumentException.class)
                        .hasMessageContaining("not a doorbell page for channel 0");
            } finally {
                dev.close();
            }
        }
    }
}
