package io.pmemblk.vhost.blk;

import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.posix.EventFd;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestDriver.Buf;
import io.pmemblk.vhost.testing.GuestRam;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

import static io.pmemblk.vhost.testing.GuestDriver.INDIRECT;
import static io.pmemblk.vhost.testing.GuestDriver.NEXT;
import static io.pmemblk.vhost.testing.GuestDriver.WRITE;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * Rounds of good requests, bad requests and (in some rounds) one hostile chain, at random. Each round serves a
 * fresh ring. Asserted: every good request before the hostile chain completes with the right data, every bad one
 * with its status, the hostile chain breaks the queue and nothing after it is taken; nothing outside guest memory
 * is written (guard zones) and the device holds exactly what the completed writes put there (nothing read from
 * outside guest memory reached it). The real pmem driver over a temp file serves them. The seed is printed;
 * {@code -Dvhost.seed=N} replays a run.
 */
class HostileGuestRandomTest {
    static final long MIB = 1 << 20;
    static final int N = 128;
    static final int SLOTS = 128, SLOT_SECTORS = 256; // 128 KiB slots over a 16 MiB device
    static final long DEVICE = (long) SLOTS * SLOT_SECTORS * 512;
    static final long HOLE = 10 * MIB;
    static final long FEATURES = GuestDriver.LINUX_FEATURES;

    enum Kind { WRITE, READ, BAD, HOSTILE }

    record Item(Kind kind, Sent sent, int slot, byte[] data, int expectStatus) {}

    @TempDir
    Path dir;

    @Test
    void goodRequestsCompleteAndHostileChainsTouchNothingOutsideGuestMemory() throws Exception {
        long seed = Long.getLong("vhost.seed", System.nanoTime());
        System.out.println("HostileGuestRandomTest seed " + seed + " (replay: -Dvhost.seed=" + seed + ")");
        Random rnd = new Random(seed);
        GuestRam ram = GuestRam.of(0, 4 * MIB, 4 * MIB, 4 * MIB, 16 * MIB, MIB);
        PmemBlockDriver driver = new PmemBlockDriver(PmemRegion.open(dir.resolve("d.img"), DEVICE, false,
                PmemRegion.Mapper.AUTO), new CopyStats());
        BlockLayer layer = new BlockLayer(driver, 1, 32, 4 * MIB, 1 << 20);
        EventFd kick = EventFd.create(true), call = EventFd.create(true);
        byte[][] shadow = new byte[SLOTS][];
        int broken = 0, good = 0, bad = 0;
        try {
            for (int round = 0; round < 40; round++) {
                String where = "seed " + seed + " round " + round;
                GuestDriver ring = new GuestDriver(ram, N, 0x10000);
                BlkGuest guest = new BlkGuest(ring, 2 * MIB, 7 * MIB);
                VhostBlkQueue q = new VhostBlkQueue(new VringAddress(0, N, ring.descUser(), ring.availUser(), ring.usedUser(), 0),
                        new QueueWiring(FEATURES, kick, call, new FrontendQueue(layer.queue(0)), ram::memory, null,
                                BlkDevice.of(DEVICE, false, true, true, "random")));
                q.start();
                int count = 1 + rnd.nextInt(12);
                int hostileAt = rnd.nextInt(3) == 0 ? rnd.nextInt(count) : -1;
                List<Integer> slots = new ArrayList<>();
                for (int s = 0; s < SLOTS; s++) {
                    slots.add(s);
                }
                java.util.Collections.shuffle(slots, rnd);
                List<Item> items = new ArrayList<>();
                for (int i = 0; i < count; i++) {
                    int slot = slots.get(i);
                    if (rnd.nextInt(4) == 0) {
                        guest.allocAt(4 * MIB - 64 * (1 + rnd.nextInt(32))); // across the region boundary
                    }
                    if (i == hostileAt) {
                        items.add(new Item(Kind.HOSTILE, hostile(rnd, guest, ring), slot, null, -1));
                        continue;
                    }
                    int pieces = 1 + rnd.nextInt(5);
                    boolean indirect = rnd.nextBoolean();
                    switch (rnd.nextInt(3)) {
                        case 0 -> {
                            byte[] data = new byte[512 * (1 + rnd.nextInt(SLOT_SECTORS))];
                            rnd.nextBytes(data);
                            items.add(new Item(Kind.WRITE, guest.write((long) slot * SLOT_SECTORS, data, pieces, indirect),
                                    slot, data, 0));
                        }
                        case 1 -> {
                            int len = 512 * (1 + rnd.nextInt(SLOT_SECTORS));
                            items.add(new Item(Kind.READ, guest.read((long) slot * SLOT_SECTORS, len, pieces, indirect),
                                    slot, null, 0));
                        }
                        default -> items.add(badRequest(rnd, guest, slot));
                    }
                }
                kick.signal();
                int answerable = hostileAt < 0 ? count : hostileAt;
                Map<Integer, Integer> answered = new HashMap<>();
                Waits.await(where + ": " + answerable + " answers" + (hostileAt >= 0 ? " and the queue broken" : ""), () -> {
                    answered.putAll(guest.answered());
                    return answered.size() >= answerable && (hostileAt < 0 || q.broken());
                });
                assertThat(q.stop()).as(where + ": avail entries taken").isEqualTo(answerable);
                assertThat(answered).as(where + ": nothing after the hostile chain is answered").hasSize(answerable);
                assertThat(q.broken()).as(where).isEqualTo(hostileAt >= 0);
                broken += hostileAt >= 0 ? 1 : 0;
                for (int i = 0; i < answerable; i++) {
                    Item it = items.get(i);
                    assertThat(guest.status(it.sent())).as(where + " request " + i + " " + it.kind()).isEqualTo(it.expectStatus());
                    if (it.kind() == Kind.WRITE) {
                        byte[] s = shadow[it.slot()] == null ? new byte[SLOT_SECTORS * 512] : shadow[it.slot()];
                        System.arraycopy(it.data(), 0, s, 0, it.data().length);
                        shadow[it.slot()] = s;
                        good++;
                    } else if (it.kind() == Kind.READ) {
                        byte[] expect = shadow[it.slot()] == null ? new byte[SLOT_SECTORS * 512] : shadow[it.slot()];
                        assertThat(guest.data(it.sent())).as(where + " read " + i)
                                .isEqualTo(java.util.Arrays.copyOf(expect, it.sent().dataLen()));
                        good++;
                    } else {
                        bad++;
                    }
                }
                ram.assertGuardsIntact();
            }
            for (int s = 0; s < SLOTS; s++) {
                byte[] expect = shadow[s] == null ? new byte[SLOT_SECTORS * 512] : shadow[s];
                assertThat(driver.region().memory().asSlice((long) s * SLOT_SECTORS * 512, SLOT_SECTORS * 512L)
                        .toArray(ValueLayout.JAVA_BYTE)).as("seed " + seed + ": device slot " + s).isEqualTo(expect);
            }
            System.out.println("HostileGuestRandomTest: " + good + " good, " + bad + " refused, " + broken + " rounds broken");
            assertThat(good).isPositive();
        } finally {
            Closing.closeAll(kick, call, layer, driver, ram);
        }
    }

    /** A request the device must refuse, with the status it must give. */
    static Item badRequest(Random rnd, BlkGuest g, int slot) {
        long cap = DEVICE / 512;
        return switch (rnd.nextInt(7)) {
            case 0 -> new Item(Kind.BAD, g.read(cap - rnd.nextInt(4), 4096, 1, false), slot, null, VirtioBlk.S_IOERR);
            case 1 -> new Item(Kind.BAD, g.write((long) slot * SLOT_SECTORS, new byte[100 + rnd.nextInt(400)], 1, false),
                    slot, null, VirtioBlk.S_IOERR);
            case 2 -> new Item(Kind.BAD, g.send(50 + rnd.nextInt(1000), 0, null, 0, 1, false), slot, null, VirtioBlk.S_UNSUPP);
            case 3 -> new Item(Kind.BAD, g.range(BlkGuest.DISCARD, (long) slot * SLOT_SECTORS, 8, 1), slot, null,
                    VirtioBlk.S_UNSUPP);
            case 4 -> new Item(Kind.BAD, g.send(BlkGuest.OUT, (long) slot * SLOT_SECTORS, new byte[512], 512, 2, true),
                    slot, null, VirtioBlk.S_IOERR);
            case 5 -> new Item(Kind.BAD, g.read(rnd.nextLong() | Long.MIN_VALUE, 512, 1, false), slot, null, VirtioBlk.S_IOERR);
            default -> new Item(Kind.BAD, g.range(BlkGuest.WRITE_ZEROES, cap - 4, 8 + rnd.nextInt(100), 0), slot, null,
                    VirtioBlk.S_IOERR);
        };
    }

    /** A chain no driver may offer; the queue must break on it. */
    static Sent hostile(Random rnd, BlkGuest g, GuestDriver ring) {
        long h = g.alloc(16), st = g.alloc(1);
        List<Buf> ok = List.of(new Buf(h, 16, false), new Buf(st, 1, true));
        int head;
        switch (rnd.nextInt(9)) {
            case 0 -> { // a loop
                head = ring.chain(ok);
                List<Integer> ids = ring.descriptors(head);
                ring.desc(ids.get(1), st, 1, WRITE | NEXT, head);
            }
            case 1 -> { // next outside the table
                head = ring.chain(ok);
                List<Integer> ids = ring.descriptors(head);
                ring.desc(ids.get(1), st, 1, WRITE | NEXT, N + rnd.nextInt(1000));
            }
            case 2 -> head = ring.chain(List.of(new Buf(h, 16, false), new Buf(st, 0, true))); // zero length
            case 3 -> head = ring.chain(List.of(new Buf(st, 1, true), new Buf(h, 16, false))); // readable after writable
            case 4 -> head = ring.chain(List.of(new Buf(h, 16, false), // a buffer in the hole, or running into it
                    rnd.nextBoolean() ? new Buf(HOLE + rnd.nextInt(1 << 20), 4096, true)
                            : new Buf(8 * MIB - 100, 4096, true), new Buf(st, 1, true)));
            case 5 -> { // an indirect table of a bad length
                head = ring.chain(ok);
                ring.desc(head, g.alloc(64), 16 * (1 + rnd.nextInt(4)) + 1 + rnd.nextInt(15), INDIRECT, 0);
            }
            case 6 -> { // an indirect table in the hole
                head = ring.chain(ok);
                ring.desc(head, HOLE + 16L * rnd.nextInt(1000), 32, INDIRECT, 0);
            }
            case 7 -> { // an indirect table holding an INDIRECT descriptor
                long inner = g.alloc(16);
                head = ring.indirect(List.of(new Buf(h, 16, false), new Buf(inner, 16, false)), g.alloc(32));
                byte[] d = new byte[16];
                java.lang.foreign.MemorySegment s = java.lang.foreign.MemorySegment.ofArray(d);
                GuestDriver.desc(s, 0, inner, 16, INDIRECT, 0);
                g.ram.write(tableOf(ring, head) + 16, d);
            }
            default -> { // a buffer whose end wraps past 2^64
                head = ring.chain(List.of(new Buf(h, 16, false), new Buf(-4096L + rnd.nextInt(4096), 0x10000, true),
                        new Buf(st, 1, true)));
            }
        }
        ring.offer(head);
        return new Sent(head, st, 0, 0);
    }

    /** Where head's indirect table is (its ring descriptor's address). */
    static long tableOf(GuestDriver ring, int head) {
        return ring.ram.at(ring.descGpa + 16L * head, 8).get(ValueLayout.JAVA_LONG_UNALIGNED, 0);
    }
}
