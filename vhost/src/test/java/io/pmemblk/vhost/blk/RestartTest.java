package io.pmemblk.vhost.blk;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.Mman;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestRam;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A back-end killed with requests in flight, and the next one resubmitting them from the inflight region, as QEMU's
 * {@code reconnect=1} with INFLIGHT_SHMFD expects. Guest RAM is one shared file mapped three times, as three
 * processes map QEMU's memfd: the guest's view, the dead back-end's (unmapped when it is killed, so it can touch
 * nothing afterwards) and the new back-end's. The dead back-end's block layer never completes what it took: its
 * device holds them, as a killed process's requests simply vanish.
 */
class RestartTest {
    static final long MIB = 1 << 20;
    static final int N = 64;
    static final long[] LAYOUT = {0, 4 * MIB, 4 * MIB, 4 * MIB};
    static final long FEATURES = GuestDriver.LINUX_FEATURES;

    @TempDir
    Path dir;

    @Test
    void requestsInFlightWhenTheBackEndDiesCompleteAfterTheRestart() throws Exception {
        long bytes = GuestRam.bytesFor(LAYOUT);
        int fd = FileCalls.open(dir.resolve("guest-ram").toString(), FileCalls.O_RDWR | FileCalls.O_CREAT, 0600);
        FileCalls.ftruncate(fd, bytes);
        Arena guestArena = Arena.ofShared(), deadArena = Arena.ofShared(), nextArena = Arena.ofShared();
        MemoryBlockDriver dead = new MemoryBlockDriver(16 * MIB), next = new MemoryBlockDriver(16 * MIB);
        BlockLayer deadLayer = new BlockLayer(dead, 1, 32, 4 * MIB, 1 << 20);
        BlockLayer nextLayer = new BlockLayer(next, 1, 32, 4 * MIB, 1 << 20);
        EventFd kick = EventFd.create(true), call = EventFd.create(true);
        // QEMU's inflight region, zeroed as GET_INFLIGHT_FD makes it: it outlives the back-end. One queue of N.
        Arena qemu = Arena.ofShared();
        MemorySegment inflight = qemu.allocate(16 + 16L * N, 64);
        VhostBlkQueue second = null;
        try {
            GuestRam guestRam = new GuestRam(guestArena, map(fd, bytes, guestArena), true, LAYOUT);
            GuestRam deadRam = new GuestRam(deadArena, map(fd, bytes, deadArena), false, LAYOUT);
            GuestDriver ring = new GuestDriver(guestRam, N, 0x10000);
            BlkGuest guest = new BlkGuest(ring, MIB, 8 * MIB);
            BlkDevice device = BlkDevice.of(16 * MIB, false, true, true, "restart");
            dead.hold();
            VhostBlkQueue first = new VhostBlkQueue(new VringAddress(0, N, ring.descUser(), ring.availUser(), ring.usedUser(), 0),
                    new QueueWiring(FEATURES, kick, call, new FrontendQueue(deadLayer.queue(0)), deadRam::memory, inflight, device));
            first.start();
            assertThat(inflight.get(ValueLayout.JAVA_SHORT_UNALIGNED, 10)).as("desc_num, written at the first start")
                    .isEqualTo((short) N);
            assertThat(inflight.get(ValueLayout.JAVA_SHORT_UNALIGNED, 8)).as("version 1").isEqualTo((short) 1);
            Random rnd = new Random(1);
            Map<Integer, byte[]> written = new HashMap<>();
            Map<Integer, Sent> sent = new HashMap<>();
            guest.allocAt(4 * MIB - 1000); // some of the data crosses into the second region
            for (int i = 0; i < 6; i++) {
                byte[] data = new byte[4096 * (1 + i)];
                rnd.nextBytes(data);
                Sent s = guest.write(i * 64L, data, 1 + i % 3, i % 2 == 0);
                written.put(i, data);
                sent.put(i, s);
            }
            kick.signal();
            assertThat(dead.awaitHeld(6, 10_000)).as("the first back-end took all six").isTrue();

            // SIGKILL: its mapping of guest RAM is gone; the thread finds out at its next look at the ring.
            deadArena.close();
            kick.signal();
            Waits.join("the dead back-end's queue thread", first.thread());
            assertThat(first.broken()).isTrue();
            assertThat(ring.usedIdx()).as("nothing was answered").isZero();

            // QEMU reconnects: GET_VRING_BASE failed, so last_avail_idx = used.idx; the inflight region is handed over.
            GuestRam nextRam = new GuestRam(nextArena, map(fd, bytes, nextArena), false, LAYOUT);
            second = new VhostBlkQueue(new VringAddress(0, N, ring.descUser(), ring.availUser(), ring.usedUser(), ring.usedIdx()),
                    new QueueWiring(FEATURES, kick, call, new FrontendQueue(nextLayer.queue(0)), nextRam::memory, inflight, device));
            assertThat(second.lastAvail()).as("used.idx 0 + 6 in flight").isEqualTo(6);
            second.start(); // no kick: what was in flight is resubmitted at once
            Map<Integer, Integer> answered = new HashMap<>();
            Waits.await("the six resubmitted writes answered", () -> {
                answered.putAll(guest.answered());
                return answered.size() == 6;
            });
            for (int i = 0; i < 6; i++) {
                assertThat(guest.status(sent.get(i))).as("write " + i).isZero();
                assertThat(next.memory.asSlice(i * 64L * 512, written.get(i).length).toArray(ValueLayout.JAVA_BYTE))
                        .as("write " + i + " on the new back-end's device").isEqualTo(written.get(i));
            }
            Sent after = guest.read(0, 4096, 2, false);
            kick.signal();
            Waits.await("a new request after the restart", () -> guest.answered().size() == 1);
            assertThat(guest.data(after)).isEqualTo(java.util.Arrays.copyOf(written.get(0), 4096));
            assertThat(second.stop()).isEqualTo(7);
            second = null;
            guestRam.assertGuardsIntact();
        } finally {
            if (second != null) {
                second.stop();
            }
            Closing.closeAll(kick, call, nextLayer, next, deadLayer, dead);
            for (Arena a : new Arena[]{guestArena, deadArena, nextArena, qemu}) {
                if (a.scope().isAlive()) {
                    a.close();
                }
            }
            Libc.close(fd);
        }
    }

    static MemorySegment map(int fd, long bytes, Arena owner) throws Exception {
        return Mman.map(fd, bytes, Mman.PROT_READ | Mman.PROT_WRITE, Mman.MAP_SHARED, 0, owner);
    }
}
