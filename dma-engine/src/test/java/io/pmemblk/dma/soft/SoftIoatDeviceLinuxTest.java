package io.pmemblk.dma.soft;

import static io.pmemblk.dma.ioat.IoatSpec.*;
import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.IovaSpace;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.LockSupport;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The software device as Linux's ioatdma drives it (drivers/dma/ioat/dma.c, init.c), and as a device served to
 * another process needs it: what pmemblk's own driver never did to it.
 */
class SoftIoatDeviceLinuxTest {
    static final long CH = channelBase(0);
    /** IOVAs above 4 GiB, so that the upper halves of CHAINADDR and CHANCMP matter. */
    static final long HIGH_BASE = 3L << 32;

    final Arena arena = Arena.ofShared();
    SoftIoatDevice dev;

    @AfterEach
    void tearDown() {
        if (dev != null) {
            dev.close();
        }
        arena.close();
    }

    /** A ring of {@code n} descriptors linked in a circle, mapped in {@code space}. */
    private static long ring(IovaSpace space, MemorySegment ring, int n) {
        long iova = space.map(ring);
        for (int i = 0; i < n; i++) {
            ring.set(FIELD_U64, i * DESC_BYTES + DESC_NEXT, iova + ((i + 1) % n) * DESC_BYTES);
        }
        return iova;
    }

    private static void descriptor(MemorySegment ring, int slot, long size, int control, long src, long dst) {
        long d = slot * DESC_BYTES;
        ring.set(FIELD_U32, d + DESC_SIZE, (int) size);
        ring.set(FIELD_U32, d + DESC_CONTROL, control);
        ring.set(FIELD_U64, d + DESC_SRC, src);
        ring.set(FIELD_U64, d + DESC_DST, dst);
    }

    private static void awaitWord(MemorySegment word, long expected, SoftIoatDevice dev) {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (word.get(FIELD_U64, 0) != expected) {
            LockSupport.parkNanos(50_000); // bounded poll of device-written memory
            if (System.nanoTime() > deadline) {
                throw new AssertionError("writeback never became 0x" + Long.toHexString(expected) + ", is 0x"
                        + Long.toHexString(word.get(FIELD_U64, 0)) + ", CHANERR 0x" + Integer.toHexString(dev.read32(CH + CHANERR)));
            }
        }
    }

    /**
     * ioat_set_chainaddr and ioat_alloc_chan_resources write CHAINADDR and CHANCMP as two writel each, low then
     * high ("1 64b write doesn't work"); the channel arms at the whole address and writes back where CHANCMP says.
     * Seen failing with the CHAINADDR upper-half case taken out: "expected: 12884901888L" (0x3_0000_0000, the ring)
     * at the CHAINADDR read-back: the channel had been armed at the low half alone.
     */
    @Test
    void chainaddrAndChancmpTakeTwo32BitWritesLowThenHigh() {
        IovaSpace space = new IovaSpace(HIGH_BASE);
        dev = new SoftIoatDevice(space, 1, 12);
        MemorySegment ring = arena.allocate(4 * DESC_BYTES, 64);
        MemorySegment word = arena.allocate(8, 8);
        MemorySegment buf = arena.allocate(8192, 4096);
        long ringIova = ring(space, ring, 4);
        long wordIova = space.map(word);
        long bufIova = space.map(buf);
        assertThat(ringIova >>> 32).as("the ring lies above 4 GiB").isNotZero();
        for (int i = 0; i < 4096; i++) {
            buf.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 7 + 1));
        }
        dev.write8(CH + CHANCMD, CHANCMD_RESET);
        dev.write16(CH + CHANCTRL, CHANCTRL_RUN);
        dev.write32(CH + CHANCMP, (int) wordIova);
        dev.write32(CH + CHANCMP + 4, (int) (wordIova >>> 32));
        dev.write32(CH + CHAINADDR, (int) ringIova);
        dev.write32(CH + CHAINADDR + 4, (int) (ringIova >>> 32));
        assertThat(dev.read64(CH + CHAINADDR)).isEqualTo(ringIova);
        assertThat(Integer.toUnsignedLong(dev.read32(CH + CHAINADDR + 4))).isEqualTo(ringIova >>> 32);
        assertThat(dev.read64(CH + CHANCMP)).isEqualTo(wordIova);
        descriptor(ring, 0, 4096, OP_COPY | CTRL_COMPLETION_UPDATE, bufIova, bufIova + 4096);
        dev.write16(CH + DMACOUNT, 1);
        awaitWord(word, ringIova | CHANSTS_IDLE, dev);
        assertThat(MemorySegment.mismatch(buf, 0, 4096, buf, 4096, 8192)).isEqualTo(-1);
        assertThat(dev.bytesCopied()).isEqualTo(4096);
        assertThat(Integer.toUnsignedLong(dev.read32(CH + CHANSTS + 4))).as("CHANSTS's upper half")
                .isEqualTo(ringIova >>> 32);
    }

    /**
     * ioat_alloc_chan_resources rings the doorbell for its null descriptor, then polls CHANSTS for ACTIVE or IDLE
     * about 20 times, 1 us apart, and gives the channel up ("failed to start channel") otherwise; the hardware is
     * active from the DMACOUNT write. An engine that has not yet run (here: stalled) must still read ACTIVE.
     * Seen failing without the doorbell rule: "expected: 0L but was: 4L" (ARMED).
     */
    @Test
    void aDoorbellReadsActiveBeforeTheEngineHasRun() {
        IovaSpace space = new IovaSpace();
        boolean[] stalled = {true};
        dev = new SoftIoatDevice(space, 1, 12, new SoftFaults() {
            @Override
            public boolean stalled(int channel) {
                return stalled[0];
            }
        });
        MemorySegment ring = arena.allocate(2 * DESC_BYTES, 64);
        MemorySegment word = arena.allocate(8, 8);
        long ringIova = ring(space, ring, 2);
        long wordIova = space.map(word);
        dev.write8(CH + CHANCMD, CHANCMD_RESET);
        dev.write16(CH + CHANCTRL, CHANCTRL_RUN);
        dev.write64(CH + CHANCMP, wordIova);
        dev.write64(CH + CHAINADDR, ringIova);
        assertThat(dev.read64(CH + CHANSTS) & CHANSTS_STATUS_MASK).isEqualTo(CHANSTS_ARMED);
        descriptor(ring, 0, NULL_DESC_SIZE, CTRL_NULL | CTRL_COMPLETION_UPDATE, 0, 0);
        dev.write16(CH + DMACOUNT, 1);
        assertThat(dev.read64(CH + CHANSTS) & CHANSTS_STATUS_MASK).as("work pending, engine not run yet")
                .isEqualTo((long) CHANSTS_ACTIVE);
        assertThat(dev.descriptorsCompleted(0)).isZero();
        stalled[0] = false;
        dev.wake(0);
        awaitWord(word, ringIova | CHANSTS_IDLE, dev);
        assertThat(dev.read64(CH + CHANSTS)).isEqualTo(ringIova | CHANSTS_IDLE);
    }

    /**
     * A device reset (FLR, a vfio-user RESET, the client gone) leaves nothing of the last driver: CHANERR clear,
     * channels halted with no chain, interrupts off, and the next driver's start-up runs. Seen failing with
     * CHANERR left as it was: "[CHANERR after reset] expected: 0 but was: 16".
     */
    @Test
    void aDeviceResetClearsWhatTheLastDriverLeftAndTheNextOneStarts() {
        IovaSpace space = new IovaSpace();
        dev = new SoftIoatDevice(space, 2, 12);
        MemorySegment ring = arena.allocate(2 * DESC_BYTES, 64);
        MemorySegment word = arena.allocate(8, 8);
        long ringIova = ring(space, ring, 2);
        long wordIova = space.map(word);
        dev.write8(INTRCTRL, INTRCTRL_MASTER_INT_EN);
        dev.write8(CH + CHANCMD, CHANCMD_RESET);
        dev.write16(CH + CHANCTRL, CHANCTRL_RUN);
        dev.write64(CH + CHANCMP, wordIova);
        dev.write64(CH + CHAINADDR, 0x40); // not memory
        dev.write16(CH + DMACOUNT, 1);
        awaitWord(word, CHANSTS_HALTED, dev);
        assertThat(dev.read32(CH + CHANERR)).isEqualTo(CHANERR_CHAIN_ADDR_VALUE);

        dev.reset();
        assertThat(dev.read32(CH + CHANERR)).as("CHANERR after reset").isZero();
        assertThat(dev.read64(CH + CHANSTS)).as("halted, nothing completed").isEqualTo(CHANSTS_HALTED);
        assertThat(dev.read64(CH + CHAINADDR)).isZero();
        assertThat(dev.read16(CH + CHANCTRL)).isZero();
        assertThat(dev.read16(CH + DMACOUNT)).isZero();
        assertThat(dev.intrctrl()).as("interrupts off until a driver turns them on").isZero();

        word.set(FIELD_U64, 0, 0);
        dev.write16(CH + CHANCTRL, CHANCTRL_RUN);
        dev.write64(CH + CHANCMP, wordIova);
        dev.write64(CH + CHAINADDR, ringIova);
        descriptor(ring, 0, NULL_DESC_SIZE, CTRL_NULL | CTRL_COMPLETION_UPDATE, 0, 0);
        dev.write16(CH + DMACOUNT, 1);
        awaitWord(word, ringIova | CHANSTS_IDLE, dev);
    }

    /**
     * {@link SoftIoatDevice#fence()} returns only once the descriptor in flight has finished: what a vfio-user
     * DMA_UNMAP waits for before the client's memory is unmapped under the engine. Seen failing with an empty
     * fence: "[fence returned while a descriptor was in flight] Expecting value to be false but was true".
     */
    @Test
    void fenceWaitsForTheDescriptorInFlight() throws Exception {
        IovaSpace space = new IovaSpace();
        CountDownLatch inFlight = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        dev = new SoftIoatDevice(space, 1, 12, new SoftFaults() {
            @Override
            public int failDescriptor(int channel) {
                inFlight.countDown();
                try {
                    release.await(30, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                return 0;
            }
        });
        MemorySegment ring = arena.allocate(2 * DESC_BYTES, 64);
        MemorySegment word = arena.allocate(8, 8);
        long ringIova = ring(space, ring, 2);
        long wordIova = space.map(word);
        dev.write8(CH + CHANCMD, CHANCMD_RESET);
        dev.write16(CH + CHANCTRL, CHANCTRL_RUN);
        dev.write64(CH + CHANCMP, wordIova);
        dev.write64(CH + CHAINADDR, ringIova);
        descriptor(ring, 0, NULL_DESC_SIZE, CTRL_NULL | CTRL_COMPLETION_UPDATE, 0, 0);
        dev.write16(CH + DMACOUNT, 1);
        assertThat(inFlight.await(10, TimeUnit.SECONDS)).as("the engine took the descriptor").isTrue();
        CompletableFuture<Void> fence = CompletableFuture.runAsync(dev::fence);
        boolean early;
        try {
            fence.get(300, TimeUnit.MILLISECONDS);
            early = true;
        } catch (TimeoutException e) {
            early = false;
        }
        assertThat(early).as("fence returned while a descriptor was in flight").isFalse();
        release.countDown();
        fence.get(10, TimeUnit.SECONDS);
        assertThat(word.get(FIELD_U64, 0)).as("the descriptor finished before the fence returned")
                .isEqualTo(ringIova | CHANSTS_IDLE);
    }
}
