package io.pmemblk.vhost.blk;

import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.posix.EventFd;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestRam;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The guest's requests on the real pmem driver over a temp file, by each route: the CPU copying between guest RAM
 * and the mapping on the queue thread, or the software DMA engine copying straight between them (guest RAM
 * registered in its IOVA space, completions on the engine's thread). Every byte is checked on the device and in
 * the guest, and the driver's counters say which route moved it.
 */
class PmemDataPathTest {
    static final long MIB = 1 << 20;
    static final long DEVICE = 32 * MIB;

    @TempDir
    Path dir;
    PmemQueue q;
    CopyStats stats;
    PmemBlockDriver driver;
    EventFd kick;
    VhostBlkQueue queue;

    @AfterEach
    void close() throws Exception {
        Closing.closeAll(q);
    }

    @ParameterizedTest(name = "{0}")
    @EnumSource(Route.class)
    void guestDataReachesPmemAndComesBackByteForByte(Route route) throws Exception {
        q = new PmemQueue(PmemRegion.open(dir.resolve("d.img"), DEVICE, false, PmemRegion.Mapper.AUTO), route);
        stats = q.stats;
        driver = q.driver;
        kick = q.kick;
        queue = q.queue;
        GuestRam ram = q.ram;
        GuestDriver ring = q.ring;
        assertThat(ram.region(0).iova() != Request.NO_IOVA).as("guest RAM reachable by the engine").isEqualTo(route == Route.DMA);
        BlkGuest guest = new BlkGuest(ring, MIB, 8 * MIB);
        queue.start();

        Random rnd = new Random(route.ordinal());
        int n = 24;
        long[] sector = new long[n];
        byte[][] data = new byte[n][];
        long bytes = 0;
        List<Sent> writes = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            data[i] = new byte[512 * (1 + rnd.nextInt(i % 4 == 0 ? 512 : 32))];
            rnd.nextBytes(data[i]);
            sector[i] = i * 2048L;
            bytes += data[i].length;
            if (i % 5 == 2) {
                guest.allocAt(4 * MIB - 200); // this one's data crosses from region 0 into region 1
            }
            writes.add(guest.write(sector[i], data[i], 1 + rnd.nextInt(6), i % 2 == 0));
        }
        answer(guest, n);
        for (Sent w : writes) {
            assertThat(guest.status(w)).isZero();
        }
        Sent flush = guest.send(BlkGuest.FLUSH, 0, null, 0, 1, false);
        answer(guest, 1);
        assertThat(guest.status(flush)).isZero();
        for (int i = 0; i < n; i++) {
            assertThat(driver.region().memory().asSlice(sector[i] * 512, data[i].length).toArray(ValueLayout.JAVA_BYTE))
                    .as("write " + i + " in pmem").isEqualTo(data[i]);
        }
        List<Sent> reads = new ArrayList<>();
        guest = new BlkGuest(ring, MIB, 8 * MIB); // the writes are answered: their buffers may be used again
        for (int i = 0; i < n; i++) {
            if (i % 5 == 3) {
                guest.allocAt(4 * MIB - 300);
            }
            reads.add(guest.read(sector[i], data[i].length, 1 + rnd.nextInt(6), i % 2 == 1));
        }
        answer(guest, n);
        for (int i = 0; i < n; i++) {
            assertThat(guest.status(reads.get(i))).isZero();
            assertThat(guest.data(reads.get(i))).as("read " + i).isEqualTo(data[i]);
        }
        Route other = route == Route.DMA ? Route.CPU : Route.DMA;
        assertThat(stats.bytes(route, true)).as("written by " + route).isEqualTo(bytes);
        assertThat(stats.bytes(route, false)).as("read by " + route).isEqualTo(bytes);
        assertThat(stats.bytes(other, true) + stats.bytes(other, false)).as("moved by " + other).isZero();

        Sent discard = guest.range(BlkGuest.DISCARD, sector[0], 8, 0);
        Sent zero = guest.range(BlkGuest.WRITE_ZEROES, sector[1], 16, 1);
        Sent id = guest.send(BlkGuest.GET_ID, 0, null, 20, 1, false);
        Map<Integer, Integer> a = answer(guest, 3);
        assertThat(List.of(guest.status(discard), guest.status(zero), guest.status(id))).containsOnly(0);
        assertThat(driver.region().memory().asSlice(sector[0] * 512, 4096).toArray(ValueLayout.JAVA_BYTE))
                .isEqualTo(new byte[4096]);
        assertThat(driver.region().memory().asSlice(sector[1] * 512, 8192).toArray(ValueLayout.JAVA_BYTE))
                .isEqualTo(new byte[8192]);
        assertThat(guest.data(id)).isEqualTo(Arrays.copyOf("pmem0".getBytes(StandardCharsets.US_ASCII), 20));
        assertThat(a.get(id.head())).isEqualTo(21);
        assertThat(queue.broken()).isFalse();
    }

    Map<Integer, Integer> answer(BlkGuest guest, int n) throws InterruptedException {
        kick.signal();
        Map<Integer, Integer> got = new HashMap<>();
        Waits.await(n + " answers", () -> {
            got.putAll(guest.answered());
            return got.size() >= n;
        });
        assertThat(got).hasSize(n);
        return got;
    }
}
