package io.pmemblk.vhost.virtq;

import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestDriver.Buf;
import io.pmemblk.vhost.testing.GuestRam;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.lang.foreign.MemorySegment;
import java.util.List;

import static io.pmemblk.vhost.testing.GuestDriver.INDIRECT;
import static io.pmemblk.vhost.testing.GuestDriver.NEXT;
import static io.pmemblk.vhost.testing.GuestDriver.WRITE;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Every rule a guest can break in a split ring (virtio 1.2 section 2.7, and the checks of libvhost-user and SPDK),
 * one test each: the pop refuses with a message naming what was wrong, reads nothing outside guest memory, and
 * marks nothing in flight. Guest memory: [0, 1M) and [1M, 2M) adjacent, [16M, 17M) after a hole.
 */
@Timeout(value = 10, threadMode = Timeout.ThreadMode.SEPARATE_THREAD) // a check missing may mean a walk that never ends
class HostileChainTest {
    static final long MIB = 1 << 20;
    static final int N = 8;
    static final long HOLE = 8 * MIB;
    static final long ALL = GuestDriver.LINUX_FEATURES;

    final GuestRam ram = GuestRam.of(0, MIB, MIB, MIB, 16 * MIB, MIB);
    final GuestDriver guest = new GuestDriver(ram, N, 0x10000);
    final Chain chain = new Chain(32);
    Virtqueue q = queue(ALL);

    @AfterEach
    void close() {
        ram.assertGuardsIntact();
        ram.close();
    }

    Virtqueue queue(long features) {
        return new Virtqueue(0, TestRings.map(guest, features), features, 0, 16, null);
    }

    void assertBroken(String what) {
        assertThatThrownBy(() -> q.pop(ram.memory(), chain)).isInstanceOf(BrokenRingException.class)
                .hasMessageStartingWith("virtqueue 0: ").hasMessageContaining(what);
        assertThat(q.inFlight()).as("a refused chain is not in flight").isZero();
    }

    /** A raw chain in descriptors 0.. of the ring, offered. */
    void offerRaw(long[]... descs) {
        for (int i = 0; i < descs.length; i++) {
            long[] d = descs[i];
            guest.desc(i, d[0], d[1], (int) d[2], (int) d[3]);
        }
        guest.availRing(guest.availIdx() % N, 0);
        guest.availIdx(guest.availIdx() + 1);
    }

    static long[] d(long addr, long len, int flags, int next) {
        return new long[]{addr, len, flags, next};
    }

    MemorySegment table(long gpa, long[]... descs) {
        MemorySegment t = ram.at(gpa, 16L * descs.length);
        for (int i = 0; i < descs.length; i++) {
            GuestDriver.desc(t, 16L * i, descs[i][0], descs[i][1], (int) descs[i][2], (int) descs[i][3]);
        }
        return t;
    }

    @Test
    void availIdxMovingMoreThanTheQueueSize() {
        guest.availIdx(N + 1);
        assertBroken("avail.idx moved from 0 to 9, 9 entries ahead: at most the queue size 8");
    }

    @Test
    void aHeadOutsideTheTable() {
        guest.availRing(0, N);
        guest.availIdx(1);
        assertBroken("avail.ring[0] is head 8: outside the descriptor table of 8");
    }

    @Test
    void nextOutsideTheTable() {
        offerRaw(d(0x40000, 16, NEXT, N));
        assertBroken("has next 8: outside its table of 8");
    }

    @Test
    void aLoopedChain() {
        offerRaw(d(0x40000, 16, NEXT, 1), d(0x40000, 16, NEXT, 0));
        assertBroken("longer than its table of 8 descriptors: a loop");
    }

    @Test
    void aZeroLengthBuffer() {
        offerRaw(d(0x40000, 16, NEXT, 1), d(0x40000, 0, WRITE, 0));
        assertBroken("zero-length buffer");
    }

    @Test
    void aReadableBufferAfterAWritableOne() {
        offerRaw(d(0x40000, 16, WRITE | NEXT, 1), d(0x40000, 16, 0, 0));
        assertBroken("device-readable after a device-writable one");
    }

    @Test
    void aBufferOutsideGuestMemory() {
        offerRaw(d(0x40000, 16, NEXT, 1), d(HOLE, 512, WRITE, 0));
        assertBroken("buffer at gpa 0x800000, 512 bytes, is outside guest memory");
    }

    @Test
    void aBufferRunningOffTheEndOfMemoryIntoTheHole() {
        offerRaw(d(2 * MIB - 256, 512, 0, 0));
        assertBroken("buffer at gpa 0x1fff00, 512 bytes, is outside guest memory");
    }

    @Test
    void aBufferWhoseEndWrapsPast2To64() {
        offerRaw(d(-256L, 0xffff_ffffL, 0, 0));
        assertBroken("is outside guest memory");
    }

    @Test
    void indirectWithoutTheFeature() {
        q = queue(VirtioFeatures.bit(VirtioFeatures.VERSION_1));
        table(0x60000, d(0x40000, 16, 0, 0));
        offerRaw(d(0x60000, 16, INDIRECT, 0));
        assertBroken("INDIRECT, but VIRTIO_RING_F_INDIRECT_DESC was not negotiated");
    }

    @Test
    void indirectWithNext() {
        table(0x60000, d(0x40000, 16, 0, 0));
        offerRaw(d(0x60000, 16, INDIRECT | NEXT, 1), d(0x40000, 16, WRITE, 0));
        assertBroken("INDIRECT and has NEXT");
    }

    @Test
    void indirectAfterTheHead() {
        table(0x60000, d(0x40000, 16, 0, 0));
        offerRaw(d(0x40000, 16, NEXT, 1), d(0x60000, 16, INDIRECT, 0));
        assertBroken("descriptor 1 of head 0 is INDIRECT: only a chain's head may be");
    }

    @Test
    void anIndirectTableWhoseLengthIsNotAMultipleOf16() {
        offerRaw(d(0x60000, 24, INDIRECT, 0));
        assertBroken("indirect table of head 0 is 24 bytes: allowed a multiple of 16 of 16..256 bytes");
    }

    @Test
    void anEmptyIndirectTable() {
        offerRaw(d(0x60000, 0, INDIRECT, 0));
        assertBroken("is 0 bytes: allowed a multiple of 16");
    }

    @Test
    void anIndirectTableAboveTheLimit() {
        offerRaw(d(0x60000, 16 * 17, INDIRECT, 0));
        assertBroken("is 272 bytes: allowed a multiple of 16 of 16..256 bytes");
    }

    @Test
    void anIndirectTableOutsideGuestMemory() {
        offerRaw(d(HOLE - 16, 32, INDIRECT, 0));
        assertBroken("indirect table of head 0 at gpa 0x7ffff0, 32 bytes, is outside guest memory");
    }

    @Test
    void indirectInsideAnIndirectTable() {
        table(0x60000, d(0x40000, 16, NEXT, 1), d(0x70000, 16, INDIRECT, 0));
        table(0x70000, d(0x40000, 16, 0, 0));
        offerRaw(d(0x60000, 32, INDIRECT, 0));
        assertBroken("indirect table is INDIRECT: one table per descriptor");
    }

    @Test
    void aLoopInsideAnIndirectTable() {
        table(0x60000, d(0x40000, 16, NEXT, 1), d(0x40000, 16, NEXT, 0));
        offerRaw(d(0x60000, 32, INDIRECT, 0));
        assertBroken("longer than its table of 2 (indirect) descriptors: a loop");
    }

    @Test
    void nextOutsideAnIndirectTable() {
        table(0x60000, d(0x40000, 16, NEXT, 2), d(0x40000, 16, 0, 0));
        offerRaw(d(0x60000, 32, INDIRECT, 0));
        assertBroken("has next 2: outside its table of 2 (indirect)");
    }

    @Test
    void aHeadOfferedAgainWhileInFlight() throws Exception {
        // Distinct heads below the queue size are at most the queue size: this check also bounds what is in
        // flight ("more heads in flight than N" cannot happen without a duplicate).
        offerRaw(d(0x40000, 16, 0, 0));
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        guest.availRing(1, 0);
        guest.availIdx(2);
        assertThatThrownBy(() -> q.pop(ram.memory(), chain)).isInstanceOf(BrokenRingException.class)
                .hasMessageContaining("head 0 made available again while still in flight");
        assertThat(q.inFlight()).isEqualTo(1);
    }

    @Test
    void aWellFormedChainIsStillServedAfterAllThat() throws Exception {
        guest.offer(guest.chain(List.of(new Buf(0x40000, 16, false), new Buf(0x50000, 1, true))));
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        assertThat(chain.count()).isEqualTo(2);
    }
}
