package io.pmemblk.vhost.blk;

import io.pmemblk.pmem.CrashModel;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Power cuts under the vhost-user-blk data path: a guest's random OUT requests, FLUSHes after some of them and
 * after every batch, through the real queue and the real pmem driver, whose persistence port is the
 * {@link CrashModel} (an image of the device holds only what was made durable, each other unit old or new at
 * random). The file is mapped through the page cache (the java mapper), so a write nobody persisted is lost in a
 * crash image as the page cache is lost in a power cut: the test can lose data.
 *
 * <p>The promise checked in every image, taken after each persistence step (on the thread that took it) and
 * after each answer the guest reads: with the write cache on, every write the guest saw answered before it sent
 * a FLUSH that was answered OK; with it off (write-through, no FLUSH needed), every write answered OK; and every
 * sector never written still holds its initial zeros. A sector is checked until the guest sends the next write
 * covering it (from then on either version may survive). Both routes: the CPU copying guest RAM into the mapping,
 * and the soft DMA engine copying straight from guest RAM.
 */
class VhostCrashTest {
    static final long MIB = PmemQueue.MIB;
    static final int SECTOR = 512;
    static final int DEVICE = 256 << 10;
    static final int BATCHES = 40;

    @TempDir
    Path dir;
    PmemQueue q;
    CrashModel model;

    /** What every image must hold: {@link #promised} in each {@link #pinned} sector. Under its own lock. */
    final byte[] promised = new byte[DEVICE];
    final BitSet pinned = new BitSet(DEVICE / SECTOR);
    final Random crashes = new Random(7);
    String violation;
    int images;
    /** The guest's requests in flight by head, for their status bytes. */
    final Map<Integer, Sent> inFlight = new HashMap<>();
    int flushesAnswered;

    private int sent(Sent s) {
        inFlight.put(s.head(), s);
        return s.head();
    }

    /** A write the guest sent: where, what, and whether the guest has seen it answered. */
    record W(int index, int sector, byte[] data) {
        boolean overlaps(int s, int len) {
            return sector * SECTOR < s * SECTOR + len && s * SECTOR < sector * SECTOR + data.length;
        }
    }

    static Stream<Arguments> cases() {
        return Stream.of(Arguments.of(Route.CPU, true), Arguments.of(Route.CPU, false),
                Arguments.of(Route.DMA, true), Arguments.of(Route.DMA, false));
    }

    @AfterEach
    void close() throws Exception {
        Closing.closeAll(q);
    }

    @ParameterizedTest(name = "{0}, write cache {1}")
    @MethodSource("cases")
    void everyPromisedWriteIsInEveryLaterCrashImage(Route route, boolean writeCache) throws Exception {
        CrashModel.Modelled m = CrashModel.open(dir.resolve("d.img"), DEVICE, PmemRegion.Mapper.JAVA);
        model = m.model();
        assertThat(m.region().isPmem()).as("page cache: unpersisted writes can be lost").isFalse();
        q = new PmemQueue(m.region(), route);
        VhostBlkQueue queue = q.queue;
        BlkGuest guest = new BlkGuest(q.ring, MIB, 8 * MIB);
        queue.writeCache(writeCache);
        pinned.set(0, DEVICE / SECTOR); // the new file's zeros are durable: nothing may appear where no write went
        model.afterEachStep(this::crashAndCheck);
        queue.start();

        Random rnd = new Random(route.ordinal() * 2 + (writeCache ? 1 : 0));
        Map<Integer, W> writes = new HashMap<>();
        Map<Integer, List<W>> flushes = new HashMap<>();
        List<W> answered = new ArrayList<>(); // answered, not yet covered by a FLUSH the guest sent
        int index = 0, written = 0;
        for (int batch = 0; batch < BATCHES; batch++) {
            List<W> inBatch = new ArrayList<>();
            for (int k = 1 + rnd.nextInt(8); k > 0; k--) {
                int len = SECTOR * (1 + rnd.nextInt(32));
                int sector;
                do { // never two overlapping writes in flight (as a filesystem does): the survivor is then defined
                    sector = rnd.nextInt((DEVICE - len) / SECTOR + 1);
                } while (overlapsAny(inBatch, sector, len));
                byte[] data = new byte[len];
                rnd.nextBytes(data);
                W w = new W(index++, sector, data);
                inBatch.add(w);
                synchronized (promised) { // before it is sent: from now on the old or the new content may survive
                    pinned.clear(sector, sector + len / SECTOR);
                }
                writes.put(sent(guest.write(sector, data, 1 + rnd.nextInt(4), rnd.nextBoolean())), w);
                q.kick.signal();
                if (rnd.nextInt(3) == 0) { // this one answered, then a FLUSH for everything answered so far
                    awaitAnswers(guest, writes, flushes, answered, writeCache, () -> !writes.containsValue(w));
                    flushes.put(sent(guest.send(BlkGuest.FLUSH, 0, null, 0, 1, false)), new ArrayList<>(answered));
                    answered.clear();
                    q.kick.signal();
                }
            }
            awaitAnswers(guest, writes, flushes, answered, writeCache, () -> writes.isEmpty());
            written += inBatch.size();
            flushes.put(sent(guest.send(BlkGuest.FLUSH, 0, null, 0, 1, false)), new ArrayList<>(answered));
            answered.clear();
            q.kick.signal();
            awaitAnswers(guest, writes, flushes, answered, writeCache, () -> flushes.isEmpty());
            crashAndCheck();
        }
        synchronized (promised) {
            assertThat(violation).as("a crash image lost a promised write").isNull();
            assertThat(pinned.cardinality()).as("every sector is checked again after the last FLUSH")
                    .isEqualTo(DEVICE / SECTOR);
            assertThat(images).as("crash images checked").isGreaterThan(BATCHES);
            System.out.println(route + ", write cache " + writeCache + ": " + written + " writes, " + images
                    + " crash images checked");
        }
        assertThat(flushesAnswered).as("FLUSHes answered OK").isGreaterThanOrEqualTo(BATCHES);
        assertThat(q.driver.region().memory().asSlice(0, DEVICE).toArray(ValueLayout.JAVA_BYTE))
                .as("the device holds the last write of each sector").isEqualTo(promised);
        assertThat(q.stats.bytes(route, true)).as("written by " + route).isPositive();
        assertThat(queue.broken()).isFalse();
    }

    private static boolean overlapsAny(List<W> ws, int sector, int len) {
        for (W w : ws) {
            if (w.overlaps(sector, len)) {
                return true;
            }
        }
        return false;
    }

    /**
     * Reads the guest's answers until {@code done}: a write answered is promised at once when the cache is off,
     * else it waits for the next FLUSH; a FLUSH answered promises what was answered before it was sent.
     */
    private void awaitAnswers(BlkGuest guest, Map<Integer, W> writes, Map<Integer, List<W>> flushes, List<W> answered,
                              boolean writeCache, java.util.function.BooleanSupplier done) throws InterruptedException {
        Waits.await("the guest's answers", () -> {
            for (Map.Entry<Integer, Integer> a : guest.answered().entrySet()) {
                W w = writes.remove(a.getKey());
                List<W> covered = w == null ? flushes.remove(a.getKey()) : null;
                int status = guest.status(inFlight.remove(a.getKey()));
                assertThat(status).as(w != null ? "write " + w.index() : "flush").isZero();
                if (w == null) {
                    flushesAnswered++;
                }
                if (w != null && writeCache) {
                    answered.add(w);
                } else {
                    synchronized (promised) {
                        for (W p : w != null ? List.of(w) : covered) {
                            System.arraycopy(p.data(), 0, promised, p.sector() * SECTOR, p.data().length);
                            pinned.set(p.sector(), p.sector() + p.data().length / SECTOR);
                        }
                    }
                }
            }
            return done.getAsBoolean();
        });
        crashAndCheck();
    }

    /** One crash now: an image the model says could survive, checked against every promise in force. */
    private void crashAndCheck() {
        synchronized (promised) {
            byte[] image = model.atomically(() -> model.crashImage(crashes));
            images++;
            if (violation != null) {
                return;
            }
            for (int s = pinned.nextSetBit(0); s >= 0; s = pinned.nextSetBit(s + 1)) {
                int at = s * SECTOR;
                if (!Arrays.equals(image, at, at + SECTOR, promised, at, at + SECTOR)) {
                    violation = "sector " + s + " in crash image " + images + " is not the content promised to the guest";
                    return;
                }
            }
        }
    }
}
