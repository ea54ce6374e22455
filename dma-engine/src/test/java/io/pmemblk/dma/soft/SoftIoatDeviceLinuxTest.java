package io.pmemblk.dma.soft;

import static io.pmemblk.dma.ioat.IoatSpec.*;
import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.testing.Futures;
import io.pmemblk.dma.testing.HeldDescriptor;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
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

    /**
     * What a driver gives channel 0: a ring of {@code n} descriptors linked in a circle and its completion word,
     * both mapped in {@code space}.
     */
    private class RingMemory {
        final IovaSpace space;
        final MemorySegment ring;
        final MemorySegment word;
        final long ringIova;
        final long wordIova;

        RingMemory(IovaSpace space, int n) {
            this.space = space;
            ring = arena.allocate(n * DESC_BYTES, 64);
            word = arena.allocate(8, 8);
            ringIova = ring(space, ring, n);
            wordIova = space.map(word);
        }
    }

    private static void descriptor(MemorySegment ring, int slot, long size, int control, long src, long dst) {
        long d = slot * DESC_BYTES;
        ring.set(FIELD_U32, d + DESC_SIZE, (int) size);
        ring.set(FIELD_U32, d + DESC_CONTROL, control);
        ring.set(FIELD_U64, d + DESC_SRC, src);
        ring.set(FIELD_U64, d + DESC_DST, dst);
    }

    /** Channel 0 started as a driver starts it: reset, RUN, completion word {@code wordIova}, chain {@code chain}. */
    private void arm(long wordIova, long chain) {
        dev.write8(CH + CHANCMD, CHANCMD_RESET);
        dev.write16(CH + CHANCTRL, CHANCTRL_RUN);
        dev.write64(CH + CHANCMP, wordIova);
        dev.write64(CH + CHAINADDR, chain);
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
        RingMemory m = new RingMemory(space, 4);
        MemorySegment buf = arena.allocate(8192, 4096);
        long bufIova = space.map(buf);
        assertThat(m.ringIova >>> 32).as("the ring lies above 4 GiB").isNotZero();
        for (int i = 0; i < 4096; i++) {
            buf.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 7 + 1));
        }
        dev.write8(CH + CHANCMD, CHANCMD_RESET);
        dev.write16(CH + CHANCTRL, CHANCTRL_RUN);
        dev.write32(CH + CHANCMP, (int) m.wordIova);
        dev.write32(CH + CHANCMP + 4, (int) (m.wordIova >>> 32));
        dev.write32(CH + CHAINADDR, (int) m.ringIova);
        dev.write32(CH + CHAINADDR + 4, (int) (m.ringIova >>> 32));
        assertThat(dev.read64(CH + CHAINADDR)).isEqualTo(m.ringIova);
        assertThat(Integer.toUnsignedLong(dev.read32(CH + CHAINADDR + 4))).isEqualTo(m.ringIova >>> 32);
        assertThat(dev.read64(CH + CHANCMP)).isEqualTo(m.wordIova);
        descriptor(m.ring, 0, 4096, OP_COPY | CTRL_COMPLETION_UPDATE, bufIova, bufIova + 4096);
        dev.write16(CH + DMACOUNT, 1);
        awaitWord(m.word, m.ringIova | CHANSTS_IDLE, dev);
        assertThat(MemorySegment.mismatch(buf, 0, 4096, buf, 4096, 8192)).isEqualTo(-1);
        assertThat(dev.bytesCopied()).isEqualTo(4096);
        assertThat(Integer.toUnsignedLong(dev.read32(CH + CHANSTS + 4))).as("CHANSTS's upper half")
                .isEqualTo(m.ringIova >>> 32);
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
        RingMemory m = new RingMemory(space, 2);
        arm(m.wordIova, m.ringIova);
        assertThat(dev.read64(CH + CHANSTS) & CHANSTS_STATUS_MASK).isEqualTo(CHANSTS_ARMED);
        descriptor(m.ring, 0, NULL_DESC_SIZE, CTRL_NULL | CTRL_COMPLETION_UPDATE, 0, 0);
        dev.write16(CH + DMACOUNT, 1);
        assertThat(dev.read64(CH + CHANSTS) & CHANSTS_STATUS_MASK).as("work pending, engine not run yet")
                .isEqualTo((long) CHANSTS_ACTIVE);
        assertThat(dev.descriptorsCompleted(0)).isZero();
        stalled[0] = false;
        dev.wake(0);
        awaitWord(m.word, m.ringIova | CHANSTS_IDLE, dev);
        assertThat(dev.read64(CH + CHANSTS)).isEqualTo(m.ringIova | CHANSTS_IDLE);
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
        RingMemory m = new RingMemory(space, 2);
        dev.write8(INTRCTRL, INTRCTRL_MASTER_INT_EN);
        arm(m.wordIova, 0x40); // not memory
        dev.write16(CH + DMACOUNT, 1);
        awaitWord(m.word, CHANSTS_HALTED, dev);
        assertThat(dev.read32(CH + CHANERR)).isEqualTo(CHANERR_CHAIN_ADDR_VALUE);

        dev.reset();
        assertThat(dev.read32(CH + CHANERR)).as("CHANERR after reset").isZero();
        assertThat(dev.read64(CH + CHANSTS)).as("halted, nothing completed").isEqualTo(CHANSTS_HALTED);
        assertThat(dev.read64(CH + CHAINADDR)).isZero();
        assertThat(dev.read16(CH + CHANCTRL)).isZero();
        assertThat(dev.read16(CH + DMACOUNT)).isZero();
        assertThat(dev.intrctrl()).as("interrupts off until a driver turns them on").isZero();

        m.word.set(FIELD_U64, 0, 0);
        dev.write16(CH + CHANCTRL, CHANCTRL_RUN);
        dev.write64(CH + CHANCMP, m.wordIova);
        dev.write64(CH + CHAINADDR, m.ringIova);
        descriptor(m.ring, 0, NULL_DESC_SIZE, CTRL_NULL | CTRL_COMPLETION_UPDATE, 0, 0);
        dev.write16(CH + DMACOUNT, 1);
        awaitWord(m.word, m.ringIova | CHANSTS_IDLE, dev);
    }

    /**
     * {@link SoftIoatDevice#fence()} returns only once the descriptor in flight has finished: what a vfio-user
     * DMA_UNMAP waits for before the client's memory is unmapped under the engine. Seen failing with an empty
     * fence: "[fence returned while a descriptor was in flight] Expecting value to be false but was true".
     */
    @Test
    void fenceWaitsForTheDescriptorInFlight() throws Exception {
        IovaSpace space = new IovaSpace();
        HeldDescriptor held = new HeldDescriptor();
        dev = new SoftIoatDevice(space, 1, 12, held);
        RingMemory m = new RingMemory(space, 2);
        arm(m.wordIova, m.ringIova);
        descriptor(m.ring, 0, NULL_DESC_SIZE, CTRL_NULL | CTRL_COMPLETION_UPDATE, 0, 0);
        dev.write16(CH + DMACOUNT, 1);
        assertThat(held.awaitTaken(10, TimeUnit.SECONDS)).as("the engine took the descriptor").isTrue();
        CompletableFuture<Void> fence = CompletableFuture.runAsync(dev::fence);
        boolean early = Futures.doneWithin(fence, 300);
        assertThat(early).as("fence returned while a descriptor was in flight").isFalse();
        held.release();
        fence.get(10, TimeUnit.SECONDS);
        assertThat(m.word.get(FIELD_U64, 0)).as("the descriptor finished before the fence returned")
                .isEqualTo(m.ringIova | CHANSTS_IDLE);
    }

    /** A device with XOR and PQ, a ring of 8, a completion word and a 64 KiB buffer of pseudo-random bytes. */
    private final class Raid extends RingMemory {
        final MemorySegment buf = arena.allocate(64 << 10, 4096);
        final long bufIova = space.map(buf);

        Raid() {
            super(new IovaSpace(), 8);
            dev = new SoftIoatDevice(space, 1, 12, SoftFaults.NONE, n -> new io.pmemblk.dma.SoftInterrupt(),
                    DMACAP_XOR | DMACAP_PQ);
            java.util.Random r = new java.util.Random(43);
            for (long i = 0; i < buf.byteSize(); i++) {
                buf.set(ValueLayout.JAVA_BYTE, i, (byte) r.nextInt());
            }
            arm(wordIova, ringIova);
        }

        long at(int page) {
            return bufIova + page * 4096L;
        }

        void field(int slot, long offset, long value) {
            ring.set(FIELD_U64, slot * DESC_BYTES + offset, value);
        }

        /** Slot {@code slot}: op over {@code sources} (4 KiB pages of buf), extension in slot+1 when needed. */
        void raid(int slot, int op, int extra, int[] sources, long dstOrP, long q, byte[] coef) {
            boolean pq = op == OP_PQ || op == OP_PQ_VAL;
            long[] offsets = pq ? PQ_SRC_OFFSETS : XOR_SRC_OFFSETS;
            int inBase = pq ? PQ_BASE_SOURCES : XOR_BASE_SOURCES;
            long d = slot * DESC_BYTES;
            ring.set(FIELD_U32, d + DESC_SIZE, 4096);
            ring.set(FIELD_U32, d + DESC_CONTROL, op << CTRL_OP_SHIFT | (sources.length - 2) << CTRL_SRC_CNT_SHIFT
                    | CTRL_COMPLETION_UPDATE | extra);
            field(slot, pq ? PQ_P : DESC_DST, dstOrP);
            if (pq) {
                field(slot, PQ_Q, q);
                for (int i = 0; i < sources.length; i++) {
                    ring.set(ValueLayout.JAVA_BYTE, d + PQ_COEF + i, coef[i]);
                }
            }
            for (int i = 0; i < sources.length; i++) {
                field(i < inBase ? slot : slot + 1, offsets[i], at(sources[i]));
            }
        }

        byte b(int page, int i) {
            return buf.get(ValueLayout.JAVA_BYTE, page * 4096L + i);
        }
    }

    /**
     * ioatdma's own XOR self-test, as ioat_xor_val_self_test runs it: an XOR of 6 sources (an extension descriptor),
     * XOR_VAL of the result with its sources (zero: completes), and XOR_VAL after the result was spoiled: the
     * channel halts with XOR_P_OR_CRC (0x10000), the descriptor not completed, and after Linux's restart (CHANERR
     * cleared, CHAINADDR at the next descriptor, no RESET, DMACOUNT from 0) exactly the next descriptor runs.
     * Seen failing with the validation taken out of RaidMath.xor: "[XOR_VAL of a spoiled parity] expected: 65536
     * but was: 0"; with arming not restarting the count: "[after the restart] ... CHANERR 0x10000" (the engine ran
     * on into stale descriptors).
     */
    @Test
    void xorAndXorValAsIoatdmasSelfTestRunsThem() {
        Raid r = new Raid();
        int[] six = {1, 2, 3, 4, 5, 6};
        r.raid(0, OP_XOR, 0, six, r.at(0), 0, null); // slots 0 and 1
        dev.write16(CH + DMACOUNT, 2);
        awaitWord(r.word, r.ringIova | CHANSTS_IDLE, dev);
        for (int i = 0; i < 4096; i++) {
            int x = 0;
            for (int p : six) {
                x ^= r.b(p, i);
            }
            assertThat(r.b(0, i)).as("parity byte %d", i).isEqualTo((byte) x);
        }
        r.raid(2, OP_XOR_VAL, 0, six, r.at(0), 0, null); // slots 2 and 3: the parity XOR its sources is zero
        dev.write16(CH + DMACOUNT, 4);
        awaitWord(r.word, (r.ringIova + 2 * DESC_BYTES) | CHANSTS_IDLE, dev);
        assertThat(dev.read32(CH + CHANERR)).isZero();

        r.buf.set(ValueLayout.JAVA_BYTE, 100, (byte) (r.b(0, 100) ^ 1));
        r.raid(4, OP_XOR_VAL, 0, six, r.at(0), 0, null); // slots 4 and 5
        dev.write16(CH + DMACOUNT, 6);
        awaitWord(r.word, (r.ringIova + 2 * DESC_BYTES) | CHANSTS_HALTED, dev);
        assertThat(dev.read32(CH + CHANERR)).as("XOR_VAL of a spoiled parity").isEqualTo(CHANERR_XOR_P_OR_CRC);

        // ioat_eh, then ioat_restart_channel: clear CHANERR, CHANCMP again, CHAINADDR at the next one, DMACOUNT 1
        dev.write32(CH + CHANERR, CHANERR_XOR_P_OR_CRC);
        dev.write64(CH + CHANCMP, r.wordIova);
        dev.write64(CH + CHAINADDR, r.ringIova + 6 * DESC_BYTES);
        r.ring.set(FIELD_U32, 6 * DESC_BYTES + DESC_SIZE, NULL_DESC_SIZE);
        r.ring.set(FIELD_U32, 6 * DESC_BYTES + DESC_CONTROL, CTRL_NULL | CTRL_COMPLETION_UPDATE);
        r.ring.set(FIELD_U32, 7 * DESC_BYTES + DESC_CONTROL, 0x42 << CTRL_OP_SHIFT); // stale: must not run
        dev.write16(CH + DMACOUNT, 1);
        awaitWord(r.word, (r.ringIova + 6 * DESC_BYTES) | CHANSTS_IDLE, dev);
        assertThat(dev.read32(CH + CHANERR)).as("after the restart").isZero();
    }

    /**
     * PQ of 5 sources (an extension descriptor) writes P (their XOR) and Q (sum of coefficient times source in
     * GF(2^8) mod 0x11d, as lib/raid6); PQ_VAL of them completes, and with Q spoiled halts with XOR_Q (0x20000) only.
     * Seen failing twice while the model was written: with bit 5 read as the copy format's null bit (it is part of
     * a PQ descriptor's source count), "writeback never became 0x10000001, is 0x10000003, CHANERR 0x800" (the
     * extension run as a copy); with a GF product sign-extended into the check, "writeback never became
     * 0x10000081, is 0x10000003, CHANERR 0x20000" (a good Q refused).
     */
    @Test
    void pqWritesPAndQAndPqValChecksThem() {
        assertThat(RaidMath.gfMul(2, 0x80)).as("x * x^7 = x^8 = x^4+x^3+x^2+1").isEqualTo(0x1d);
        assertThat(RaidMath.gfMul(0x1d, 1)).isEqualTo(0x1d);
        Raid r = new Raid();
        int[] five = {2, 3, 4, 5, 6};
        byte[] coef = {1, 2, 4, 8, (byte) 0x8e};
        r.raid(0, OP_PQ, 0, five, r.at(0), r.at(1), coef);
        dev.write16(CH + DMACOUNT, 2);
        awaitWord(r.word, r.ringIova | CHANSTS_IDLE, dev);
        for (int i = 0; i < 4096; i++) {
            int p = 0;
            int q = 0;
            for (int s = 0; s < five.length; s++) {
                p ^= r.b(five[s], i);
                q ^= RaidMath.gfMul(coef[s] & 0xFF, r.b(five[s], i) & 0xFF);
            }
            assertThat(r.b(0, i)).as("P byte %d", i).isEqualTo((byte) p);
            assertThat(r.b(1, i)).as("Q byte %d", i).isEqualTo((byte) q);
        }
        r.raid(2, OP_PQ_VAL, 0, five, r.at(0), r.at(1), coef);
        dev.write16(CH + DMACOUNT, 4);
        awaitWord(r.word, (r.ringIova + 2 * DESC_BYTES) | CHANSTS_IDLE, dev);
        r.buf.set(ValueLayout.JAVA_BYTE, 4096 + 7, (byte) (r.b(1, 7) ^ 0x40));
        r.raid(4, OP_PQ_VAL, 0, five, r.at(0), r.at(1), coef);
        dev.write16(CH + DMACOUNT, 6);
        awaitWord(r.word, (r.ringIova + 2 * DESC_BYTES) | CHANSTS_HALTED, dev);
        assertThat(dev.read32(CH + CHANERR)).as("Q spoiled, P good").isEqualTo(CHANERR_XOR_Q);
    }

    /** A device made without XOR and PQ refuses their descriptors as unknown operations (CONTROL, 0x400). */
    @Test
    void withoutTheCapabilityRaidDescriptorsHaltWithControl() {
        IovaSpace space = new IovaSpace();
        dev = new SoftIoatDevice(space, 1, 12);
        RingMemory m = new RingMemory(space, 2);
        assertThat(dev.read32(DMACAPABILITY)).isZero();
        arm(m.wordIova, m.ringIova);
        descriptor(m.ring, 0, 64, OP_XOR << CTRL_OP_SHIFT, 0, 0);
        dev.write16(CH + DMACOUNT, 1);
        awaitWord(m.word, CHANSTS_HALTED, dev);
        assertThat(dev.read32(CH + CHANERR)).isEqualTo(CHANERR_CONTROL);
    }
}
