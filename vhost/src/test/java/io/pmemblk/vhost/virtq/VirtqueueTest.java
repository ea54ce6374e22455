package io.pmemblk.vhost.virtq;

import io.pmemblk.vhost.spec.SplitRingLayout;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestDriver.Buf;
import io.pmemblk.vhost.testing.GuestRam;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Well-formed chains, notification decisions and inflight recovery on one split ring, driven by a test driver in
 * guest memory: [0, 1M) and [1M, 2M) adjacent, [16M, 17M) after a hole.
 */
class VirtqueueTest {
    static final long MIB = 1 << 20;
    static final int N = 32;
    static final long ALL = GuestDriver.LINUX_FEATURES;

    final GuestRam ram = GuestRam.of(0, MIB, MIB, MIB, 16 * MIB, MIB);
    final GuestDriver guest = new GuestDriver(ram, N, 0x10000);
    final Chain chain = new Chain(32);
    final Arena arena = Arena.ofShared();

    @AfterEach
    void close() {
        ram.assertGuardsIntact();
        ram.close();
        arena.close();
    }

    Virtqueue queue(long features, Inflight inflight) {
        return new Virtqueue(0, TestRings.map(guest, features), features, 0, 32, inflight);
    }

    static List<Buf> request(long out, long outLen, long in, long inLen) {
        return List.of(new Buf(out, outLen, false), new Buf(in, inLen, true), new Buf(0x80000, 1, true));
    }

    @Test
    void aChainsBuffersAreSplitWhereTheyCrossIntoTheNextRegion() throws Exception {
        Virtqueue q = queue(ALL, null);
        assertThat(q.pop(ram.memory(), chain)).as("nothing offered").isFalse();
        int head = guest.chain(request(0x40000, 16, MIB - 4096, 8192));
        guest.offer(head);
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        assertThat(chain.head()).isEqualTo(head);
        assertThat(chain.readable()).isEqualTo(1);
        assertThat(chain.count()).as("header, data in two regions, status").isEqualTo(4);
        assertThat(chain.readableBytes()).isEqualTo(16);
        assertThat(chain.writableBytes()).isEqualTo(8193);
        assertThat(chain.length(1)).isEqualTo(4096);
        assertThat(chain.mapping(1)).isEqualTo(ram.region(0).mapping());
        assertThat(chain.offset(1)).isEqualTo(MIB - 4096);
        assertThat(chain.mapping(2)).isEqualTo(ram.region(1).mapping());
        assertThat(chain.offset(2)).isZero();
        assertThat(chain.lastWritableMapping()).isEqualTo(ram.region(0).mapping());
        assertThat(chain.lastWritableOffset()).isEqualTo(0x80000);
        assertThat(q.inFlight()).isEqualTo(1);
        assertThat(q.lastAvail()).isEqualTo(1);
    }

    @Test
    void buffersThatFollowOneAnotherInARegionAreOnePiece() throws Exception {
        Virtqueue q = queue(ALL, null);
        ram.write(0x40000, new byte[]{1, 2, 3, 4, 5, 6, 7, 8});
        // A WRITE's header with two data buffers right behind it, a gap, a third; the status byte right after the
        // third, but device-writable: the direction changes there, so it stays a piece of its own.
        guest.offer(guest.chain(List.of(new Buf(0x40000, 16, false), new Buf(0x40010, 4096, false),
                new Buf(0x41010, 4096, false), new Buf(0x43010, 512, false), new Buf(0x43210, 1, true))));
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        assertThat(chain.readable()).as("header and the first two data buffers as one piece, the third after a gap")
                .isEqualTo(2);
        assertThat(chain.count()).as("and the status byte").isEqualTo(3);
        assertThat(chain.offset(0)).isEqualTo(0x40000);
        assertThat(chain.length(0)).isEqualTo(16 + 4096 + 4096);
        assertThat(chain.offset(1)).isEqualTo(0x43010);
        assertThat(chain.length(1)).isEqualTo(512);
        assertThat(chain.offset(2)).isEqualTo(0x43210);
        assertThat(chain.readableBytes()).isEqualTo(16 + 4096 + 4096 + 512);
        assertThat(chain.writableBytes()).isEqualTo(1);
        assertThat(chain.readLE(0, 8)).isEqualTo(0x0807060504030201L);
    }

    @Test
    void aHeaderSplitAnywhereReadsAsOneValue() throws Exception {
        Virtqueue q = queue(ALL, null);
        ram.write(0x40000, new byte[]{1, 2, 3});
        ram.write(0x50000, new byte[]{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
        guest.offer(guest.chain(List.of(new Buf(0x40000, 3, false), new Buf(0x50000, 13, false), new Buf(0x80000, 1, true))));
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        assertThat(chain.readLE(0, 4)).isEqualTo(0x04030201L);
        assertThat(chain.readLE(8, 8)).isEqualTo(0x100f0e0d0c0b0a09L);
    }

    @Test
    void anIndirectTableAcrossTwoRegionsIsCopiedAndWalked() throws Exception {
        Virtqueue q = queue(ALL, null);
        // Three descriptors: the first in region 0's last 16 bytes, the others in region 1.
        int head = guest.indirect(request(0x40000, 16, 16 * MIB, 4096), MIB - 16);
        guest.offer(head);
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        assertThat(chain.count()).isEqualTo(3);
        assertThat(chain.mapping(1)).isEqualTo(ram.region(2).mapping());
        assertThat(chain.writableBytes()).isEqualTo(4097);
        // And one in one region is read in place.
        q.push(head, 0);
        guest.takeUsed();
        guest.offer(guest.indirect(request(0x40000, 16, 16 * MIB, 512), 0x60000));
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        assertThat(chain.writableBytes()).isEqualTo(513);
    }

    @Test
    void eventIdxInterruptsOnlyWhenUsedIdxPassesUsedEvent() throws Exception {
        Virtqueue q = queue(ALL, null);
        int signals = 0;
        for (int i = 0; i < 8; i++) {
            guest.offer(guest.chain(request(0x40000, 16, 0x50000, 512)));
        }
        int[] heads = new int[8];
        for (int i = 0; i < 8; i++) {
            assertThat(q.pop(ram.memory(), chain)).isTrue();
            heads[i] = chain.head();
        }
        guest.usedEvent(0); // interrupt me once used.idx passes 0
        for (int i = 0; i < 4; i++) {
            signals += q.push(heads[i], 1) ? 1 : 0;
        }
        assertThat(signals).as("the first push passes used_event 0; the next three do not").isEqualTo(1);
        guest.usedEvent(5); // the driver has seen 4 and wants to hear when the 6th lands
        assertThat(q.push(heads[4], 1)).as("used.idx 4 -> 5 does not pass 5").isFalse();
        assertThat(q.push(heads[5], 1)).as("used.idx 5 -> 6 passes 5").isTrue();
        q.beginBatch();
        assertThat(q.push(heads[6], 1)).as("inside the queue thread's batch: not published").isFalse();
        assertThat(q.push(heads[7], 1)).isFalse();
        assertThat(guest.usedIdx()).isEqualTo(6);
        guest.usedEvent(6);
        assertThat(q.endBatch()).as("one publication for the batch, passing 6").isTrue();
        assertThat(guest.usedIdx()).isEqualTo(8);
        assertThat(guest.takeUsed()).hasSize(8);
    }

    @Test
    void withoutEventIdxTheFlagsDecide() throws Exception {
        Virtqueue q = queue(VirtioFeatures.bit(VirtioFeatures.VERSION_1), null);
        guest.offer(guest.chain(request(0x40000, 16, 0x50000, 512)));
        guest.offer(guest.chain(request(0x40000, 16, 0x50000, 512)));
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        int a = chain.head();
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        guest.availFlags(SplitRingLayout.AVAIL_F_NO_INTERRUPT);
        assertThat(q.push(a, 1)).as("NO_INTERRUPT").isFalse();
        guest.availFlags(0);
        assertThat(q.push(chain.head(), 1)).isTrue();
        q.disableKicks();
        assertThat(guest.usedFlags()).isEqualTo(SplitRingLayout.USED_F_NO_NOTIFY);
        assertThat(q.enableKicks()).isFalse();
        assertThat(guest.usedFlags()).as("kicks re-armed before sleeping").isZero();
    }

    @Test
    void rearmingWithEventIdxAsksForTheNextEntryAndSeesOneThatRacedIn() throws Exception {
        Virtqueue q = queue(ALL, null);
        for (int i = 0; i < 3; i++) {
            guest.offer(guest.chain(request(0x40000, 16, 0x50000, 512)));
        }
        while (q.pop(ram.memory(), chain)) {
            q.push(chain.head(), 1);
        }
        q.disableKicks();
        assertThat(guest.availEvent()).as("not moved while busy: the driver's kicks stay suppressed").isZero();
        assertThat(q.enableKicks()).isFalse();
        assertThat(guest.availEvent()).as("kick me when avail.idx passes 3").isEqualTo(3);
        guest.offer(guest.chain(request(0x40000, 16, 0x50000, 512)));
        assertThat(q.enableKicks()).as("an entry offered before the re-check is seen").isTrue();
    }

    MemorySegment inflightRegion() {
        MemorySegment r = arena.allocate(Inflight.DESC + Inflight.DESC_STATE_BYTES * N, 64);
        r.set(ValueLayout.JAVA_SHORT_UNALIGNED, Inflight.DESC_NUM, (short) N);
        return r;
    }

    @Test
    void aRestartResubmitsWhatTheDeadBackEndLeftInFlightInPopOrderBeforeNewEntries() throws Exception {
        MemorySegment region = inflightRegion();
        Virtqueue first = queue(ALL, new Inflight(region, N));
        assertThat(first.recover()).as("fresh region").isZero();
        int[] heads = new int[5];
        for (int i = 0; i < 5; i++) {
            heads[i] = guest.chain(request(0x40000, 16, 0x50000, 512 * (i + 1)));
            guest.offer(heads[i]);
        }
        for (int i = 0; i < 5; i++) {
            assertThat(first.pop(ram.memory(), chain)).isTrue();
        }
        first.push(heads[1], 1);
        first.push(heads[3], 1);
        // Killed: heads 0, 2, 4 never complete. A new head is offered meanwhile.
        int later = guest.chain(request(0x40000, 16, 0x50000, 4096));
        guest.offer(later);
        Virtqueue second = queue(ALL, new Inflight(region, N));
        assertThat(second.recover()).isEqualTo(3);
        assertThat(second.lastAvail()).as("used.idx 2 + 3 in flight").isEqualTo(5);
        int[] expect = {heads[0], heads[2], heads[4], later};
        long[] data = {513, 1537, 2561, 4097};
        for (int i = 0; i < 4; i++) {
            assertThat(second.pop(ram.memory(), chain)).isTrue();
            assertThat(chain.head()).isEqualTo(expect[i]);
            assertThat(chain.writableBytes()).isEqualTo(data[i]);
        }
        assertThat(second.pop(ram.memory(), chain)).isFalse();
    }

    @Test
    void aBackEndKilledBetweenPublishingABatchAndUnmarkingItResubmitsOnlyTheRest() throws Exception {
        MemorySegment region = inflightRegion();
        Virtqueue first = queue(ALL, new Inflight(region, N));
        first.recover();
        int[] heads = new int[3];
        for (int i = 0; i < 3; i++) {
            heads[i] = guest.chain(request(0x40000, 16, 0x50000, 512));
            guest.offer(heads[i]);
            assertThat(first.pop(ram.memory(), chain)).isTrue();
        }
        // What a batch publication does up to used.idx, and no further: the marks of 0 and 2 are still set.
        guest.usedElem(0, heads[2], 1);
        guest.usedElem(1, heads[0], 1);
        guest.usedIdxRaw(2);
        Virtqueue second = queue(ALL, new Inflight(region, N));
        assertThat(second.recover()).as("only head " + heads[1] + " is still the guest's to wait for").isEqualTo(1);
        assertThat(second.pop(ram.memory(), chain)).isTrue();
        assertThat(chain.head()).isEqualTo(heads[1]);
        assertThat(second.lastAvail()).isEqualTo(3);
    }

    /**
     * A head pushed inside the queue thread's batch is not the guest's again until used.idx passes it: offered again
     * before that, it breaks the queue. Accepted, as it once was, each repeat took one more slot of the completions
     * waiting to be published, and the third push of a ring of 2 threw ArrayIndexOutOfBoundsException.
     */
    @Test
    void aHeadOfferedAgainBeforeItsCompletionIsPublishedBreaksTheQueue() throws Exception {
        GuestDriver small = new GuestDriver(ram, 2, MIB + 0x10000);
        MemorySegment region = arena.allocate(Inflight.DESC + Inflight.DESC_STATE_BYTES * 2, 64);
        Virtqueue q = new Virtqueue(0, TestRings.map(small, ALL), ALL, 0, 32, new Inflight(region, 2));
        q.recover();
        int head = small.chain(List.of(new Buf(0x40000, 16, false), new Buf(0x80000, 1, true)));
        small.offer(head);
        small.offer(head);
        q.beginBatch();
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        assertThat(q.push(head, 1)).as("inside the batch: held").isFalse();
        assertThatThrownBy(() -> q.pop(ram.memory(), chain)).isInstanceOf(BrokenRingException.class)
                .hasMessage("virtqueue 0: head " + head + " made available again before its completion was published:"
                        + " a head is the driver's again once used.idx has passed its used entry");
        assertThat(q.lastAvail()).as("the repeat is not taken").isEqualTo(1);
        assertThat(q.unpublished()).isEqualTo(1);
        q.endBatch();
        assertThat(small.usedIdx()).isEqualTo(1);
        assertThat(region.get(ValueLayout.JAVA_BYTE, Inflight.DESC + Inflight.STATE_INFLIGHT))
                .as("head 0's inflight mark cleared once published").isZero();
        // Published, the head is the driver's again: the same entry now pops, and its mark is set again.
        small.offer(head);
        assertThat(q.pop(ram.memory(), chain)).isTrue();
        assertThat(chain.head()).isEqualTo(head);
        assertThat(region.get(ValueLayout.JAVA_BYTE, Inflight.DESC + Inflight.STATE_INFLIGHT)).isEqualTo((byte) 1);
        q.push(head, 1);
        assertThat(small.usedIdx()).isEqualTo(2);
        assertThat(region.get(ValueLayout.JAVA_BYTE, Inflight.DESC + Inflight.STATE_INFLIGHT)).isZero();
    }
}
