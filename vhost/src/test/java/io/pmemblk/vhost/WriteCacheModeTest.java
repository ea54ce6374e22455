package io.pmemblk.vhost;

import io.pmemblk.vhost.testing.EventFds;
import io.pmemblk.vhost.testing.LogCapture;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.CrashModel;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.SharedMemory;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestRam;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.atomic.AtomicInteger;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The guest's write cache mode is the server's: the real server and its real sessions over
 * the real pmem driver on a page-cache file, driven by a front-end that replays QEMU 7.2's sequences (realize with one
 * GET_CONFIG, SET_CONFIG when the guest changes its cache, a reconnect with neither) and a guest that writes through a
 * split ring. Persistence is counted where it happens (each msync of the mapping, {@link CrashModel}'s steps), and a
 * power cut is a crash image of the device: a write nobody msync'd may be lost in it.
 */
class WriteCacheModeTest {
    static final long DISK = 4L << 20, RAM = 4L << 20, MIB = 1 << 20;
    static final int RING = 64, BLOCK = 4096;
    /** What Linux's virtio_blk acks of what the server offers, for its rings and its cache: FLUSH (9), CONFIG_WCE (11). */
    static final long LINUX = GuestDriver.LINUX_FEATURES | 1L << 9 | 1L << 11;
    /** What SeaBIOS acks (observed, shared/notes/vhost-user-observed.txt): SIZE_MAX, SEG_MAX, BLK_SIZE, bit 30, VERSION_1. */
    static final long SEABIOS = 0x140000046L;

    @TempDir
    Path dir;
    Path socket, image;
    CrashModel model;
    PmemBlockDriver driver;
    BlockLayer layer;
    VhostUserBlkServer server;
    final AtomicInteger msyncs = new AtomicInteger();
    final Arena arena = Arena.ofShared();
    int ramFd;
    GuestRam ram;
    GuestDriver ring;
    BlkGuest guest;
    final EventFds eventFds = new EventFds();
    final Random rnd = new Random(42);
    final LogCapture logs = new LogCapture("io.pmemblk.vhost");
    final List<String> log = logs.lines();

    @BeforeEach
    void open() throws Exception {
        logs.start();
        socket = dir.resolve("vhost.sock");
        image = dir.resolve("disk.img");
        CrashModel.Modelled m = CrashModel.open(image, DISK, PmemRegion.Mapper.JAVA);
        assertThat(m.region().isPmem()).as("page cache: a write nobody msync'd can be lost").isFalse();
        model = m.model();
        model.afterEachStep(msyncs::incrementAndGet); // on a page-cache mapping every step is an msync
        driver = new PmemBlockDriver(m.region(), new CopyStats());
        layer = new BlockLayer(driver, 1, 64, 4 * MIB, 1 << 20);
        long bytes = GuestRam.bytesFor(0, RAM);
        ramFd = SharedMemory.memfd("guest-ram", bytes);
        SharedMemory.seal(ramFd); // as QEMU's memory-backend-memfd: it cannot shrink under the server
        ram = new GuestRam(null, SharedMemory.map(ramFd, 0, bytes, arena), true, 0, RAM);
        ring = new GuestDriver(ram, RING, 0x10000);
        guest = new BlkGuest(ring, MIB, RAM);
    }

    @AfterEach
    void close() throws Exception {
        if (server != null) {
            server.close();
        }
        eventFds.close();
        Libc.close(ramFd);
        arena.close();
        Closing.closeAll(layer, driver);
        logs.stop();
    }

    private VhostUserBlkServer startServer() throws IOException {
        server = new VhostUserBlkServer(new VhostUserBlkConfig(socket, 1, 256), layer).recordWriteCache(image.toString());
        server.start();
        return server;
    }

    /** One front-end connection as QEMU 7.2 makes it, with one ring (vring 0) started from where the last stopped. */
    final class FrontEnd implements AutoCloseable {
        final TestFrontEnd fe;
        EventFd kick;
        /** The region is this connection's once added (QEMU sends it again only to a new connection). */
        boolean memory;

        FrontEnd() throws Exception {
            fe = TestFrontEnd.connect(socket);
            long offered = fe.get(GET_FEATURES);
            assertThat(offered & LINUX).as("the features Linux acks are offered").isEqualTo(LINUX);
            fe.set(SET_PROTOCOL_FEATURES, fe.get(GET_PROTOCOL_FEATURES));
            fe.send(SET_OWNER, 0, fe.empty());
        }

        /** GET_CONFIG of the 1-byte wce (QEMU reads the whole config once at realize; the byte is what matters). */
        int wce() throws Exception {
            MemorySegment p = fe.payload(CONFIG_REGION + 1);
            p.set(ValueLayout.JAVA_INT, CONFIG_OFFSET, 32);
            p.set(ValueLayout.JAVA_INT, CONFIG_SIZE, 1);
            fe.send(GET_CONFIG, 0, p);
            return fe.reply(GET_CONFIG).payload().get(ValueLayout.JAVA_BYTE, CONFIG_REGION);
        }

        /** The guest writes its cache_type: SET_CONFIG of wce with NEED_REPLY, as QEMU sends it; the ack. */
        long setWce(int wce) throws Exception {
            MemorySegment p = fe.payload(CONFIG_REGION + 1);
            p.set(ValueLayout.JAVA_INT, CONFIG_OFFSET, 32);
            p.set(ValueLayout.JAVA_INT, CONFIG_SIZE, 1);
            p.set(ValueLayout.JAVA_BYTE, CONFIG_REGION, (byte) wce);
            return fe.acked(SET_CONFIG, p);
        }

        void start(long features) throws Exception {
            fe.set(SET_FEATURES, features);
            if (memory) {
                startRing();
                return;
            }
            memory = true;
            MemorySegment reg = fe.memRegion(0, RAM, ram.user(0), GuestRam.GUARD);
            assertThat(fe.acked(ADD_MEM_REG, reg, ramFd)).as("ADD_MEM_REG").isZero();
            startRing();
        }

        private void startRing() throws Exception {
            EventFd call = eventFds.create();
            kick = eventFds.create();
            fe.startVring(ring, ring.availIdx(), call.fd(), kick.fd(), true);
        }

        /** The stop before a disconnect: GET_VRING_BASE answers where the ring is. */
        void stop() throws Exception {
            fe.send(SET_VRING_ENABLE, 0, fe.state(0, 0));
            fe.send(GET_VRING_BASE, 0, fe.state(0, 0));
            int base = fe.reply(GET_VRING_BASE).payload().get(ValueLayout.JAVA_INT_UNALIGNED, STATE_NUM);
            assertThat(base).as("GET_VRING_BASE after every request was answered").isEqualTo(ring.availIdx());
        }

        @Override
        public void close() throws Exception {
            fe.close();
            assertThat(server.awaitDisconnected(Duration.ofSeconds(10))).as("the session ended").isTrue();
        }
    }

    /** The blocks the last {@link #writes} wrote, and their data. */
    final Map<Integer, byte[]> lastWritten = new HashMap<>();

    /** {@code n} 4 KiB writes of fresh data at distinct blocks, each awaited OK, and no FLUSH; the msyncs they took. */
    private int writes(FrontEnd f, int n, int firstBlock) throws Exception {
        int before = msyncs.get();
        lastWritten.clear();
        for (int i = 0; i < n; i++) {
            byte[] data = new byte[BLOCK];
            rnd.nextBytes(data);
            int block = firstBlock + i;
            BlkGuest.Sent s = guest.write((long) block * BLOCK / 512, data, 1, false);
            f.kick.signal();
            Map<Integer, Integer> answered = new HashMap<>();
            Waits.await("write " + i + " answered", () -> {
                answered.putAll(guest.answered());
                return answered.containsKey(s.head());
            });
            assertThat(guest.status(s)).as("write " + i + " status").isZero();
            lastWritten.put(block, data);
        }
        return msyncs.get() - before;
    }

    /** A power cut now (images of the device: each unit not msync'd old or new at random) keeps the last writes. */
    private void aPowerCutKeepsTheLastWrites() {
        for (int cut = 0; cut < 8; cut++) {
            byte[] image = model.atomically(() -> model.crashImage(rnd));
            for (Map.Entry<Integer, byte[]> w : lastWritten.entrySet()) {
                byte[] got = Arrays.copyOfRange(image, w.getKey() * BLOCK, (w.getKey() + 1) * BLOCK);
                assertThat(Arrays.equals(got, w.getValue())).as("block " + w.getKey() + " as the guest wrote it in a"
                        + " power cut's image after its write completed (lost: the image holds "
                        + (Arrays.equals(got, new byte[BLOCK]) ? "zeros" : "other bytes") + ")").isTrue();
            }
        }
    }

    /** The check above can fail: writes left in the cache (writeback, no FLUSH yet) are missing from a power cut's image. */
    private void aPowerCutLosesSomeOfTheLastWrites() {
        byte[] image = model.atomically(() -> model.crashImage(rnd));
        assertThat(lastWritten.entrySet()).as("writes not yet flushed, in a power cut's image").anyMatch(w -> !Arrays.equals(
                Arrays.copyOfRange(image, w.getKey() * BLOCK, (w.getKey() + 1) * BLOCK), w.getValue()));
    }

    @Test
    void writeThroughSetOnceIsKeptAcrossAReconnectThatSendsNoSetConfig() throws Exception {
        startServer();
        try (FrontEnd f = new FrontEnd()) {
            assertThat(f.wce()).as("a fresh disk starts writeback (wce 1)").isEqualTo(1);
            f.start(LINUX);
            assertThat(writes(f, 4, 0)).as("writeback: 4 writes, no msync until a FLUSH").isZero();
            aPowerCutLosesSomeOfTheLastWrites();
            assertThat(f.setWce(0)).as("SET_CONFIG wce=0 acked").isZero();
            assertThat(writes(f, 4, 10)).as("write through: 4 writes, 4 msyncs").isEqualTo(4);
            aPowerCutKeepsTheLastWrites();
            f.stop();
        }
        // reconnect=1: realize again without GET_CONFIG, and QEMU sends no SET_CONFIG (its guest already set it)
        try (FrontEnd f = new FrontEnd()) {
            f.start(LINUX);
            assertThat(writes(f, 4, 20)).as("after the reconnect: 4 writes, 4 msyncs").isEqualTo(4);
            aPowerCutKeepsTheLastWrites();
            assertThat(f.wce()).as("GET_CONFIG still says write through").isZero();
            f.stop();
        }
    }

    @Test
    void writeThroughIsRecordedAndANewServerOnTheSameSocketServesIt() throws Exception {
        startServer();
        try (FrontEnd f = new FrontEnd()) {
            f.start(LINUX);
            assertThat(f.setWce(0)).as("SET_CONFIG wce=0 acked").isZero();
            f.stop();
        }
        Path record = dir.resolve("vhost.sock" + WriteCacheRecord.SUFFIX);
        assertThat(record).as("recorded before SET_CONFIG was acked").exists();
        assertThat(Files.getPosixFilePermissions(record)).isEqualTo(PosixFilePermissions.fromString("rw-------"));
        assertThat(Files.readString(record)).contains("device=" + image, "wce=0");
        server.close(); // the server goes (as a kill leaves its files); a new one starts over the same files
        startServer();
        assertThat(server.writeCache().writeback()).as("the new server's mode, from the record").isFalse();
        try (FrontEnd f = new FrontEnd()) {
            f.start(LINUX);
            assertThat(writes(f, 4, 30)).as("after the restart: 4 writes, 4 msyncs").isEqualTo(4);
            aPowerCutKeepsTheLastWrites();
            f.setWce(1); // the guest turns its cache on again: recorded too
            assertThat(writes(f, 4, 40)).as("writeback again: no msync").isZero();
            f.stop();
        }
        assertThat(Files.readString(record)).contains("wce=1");
        server.close();
        startServer();
        assertThat(server.writeCache().writeback()).as("writeback, as recorded last").isTrue();
    }

    @Test
    void aDriverWithNeitherFlushNorConfigWceIsServedWriteThroughAndLinuxsWriteback() throws Exception {
        startServer();
        try (FrontEnd f = new FrontEnd()) {
            f.start(SEABIOS);
            assertThat(writes(f, 4, 0)).as("neither FLUSH nor CONFIG_WCE: 4 writes, 4 msyncs").isEqualTo(4);
            aPowerCutKeepsTheLastWrites();
            f.stop();
            f.start(LINUX); // Linux resets the device and acks FLUSH and CONFIG_WCE: the cache is its to flush
            assertThat(writes(f, 4, 10)).as("a fresh disk under Linux: writeback, 0 msyncs").isZero();
            f.stop();
        }
    }

    @Test
    void aRecordThatCannotBeTrustedStartsWriteThroughAndSaysSo() throws Exception {
        Path record = dir.resolve("vhost.sock" + WriteCacheRecord.SUFFIX);
        Files.writeString(record, "pmemblk vhost-user-blk write cache v1\ndevice=" + image + "\nwce=7\n");
        startServer();
        assertThat(server.writeCache().writeback()).as("a record not as written: write through").isFalse();
        assertThat(log).anyMatch(l -> l.contains("cannot use the write cache record " + record)
                && l.contains("serving write through"));
        try (FrontEnd f = new FrontEnd()) {
            assertThat(f.wce()).as("the guest is told write through").isZero();
            f.start(LINUX);
            assertThat(writes(f, 4, 0)).as("4 writes, 4 msyncs").isEqualTo(4);
            aPowerCutKeepsTheLastWrites();
            f.stop();
        }
    }

    @Test
    void anotherDevicesRecordIsNotApplied() throws Exception {
        Path record = dir.resolve("vhost.sock" + WriteCacheRecord.SUFFIX);
        Files.writeString(record, "pmemblk vhost-user-blk write cache v1\ndevice=/elsewhere.img\nwce=0\n");
        Files.setPosixFilePermissions(record, PosixFilePermissions.fromString("rw-------"));
        startServer();
        assertThat(server.writeCache().writeback()).as("another disk's record: this one starts writeback").isTrue();
        assertThat(log).anyMatch(l -> l.contains("records the write cache of /elsewhere.img"));
    }

    @Test
    void aModeThatCannotBeRecordedIsRefusedAndNeverLessDurable() throws Exception {
        startServer();
        // a directory where the record belongs: the rename over it fails
        Files.createDirectory(dir.resolve("vhost.sock" + WriteCacheRecord.SUFFIX));
        Files.writeString(dir.resolve("vhost.sock" + WriteCacheRecord.SUFFIX).resolve("x"), "x");
        try (FrontEnd f = new FrontEnd()) {
            f.start(LINUX);
            assertThat(f.setWce(0)).as("SET_CONFIG refused: it could not be recorded").isNotZero();
            assertThat(log).anyMatch(l -> l.contains("cannot record the write cache in"));
            // QEMU keeps the guest's old mode (writeback, the guest sends FLUSH); the server stays write-through
            assertThat(writes(f, 4, 0)).as("write through all the same: 4 msyncs").isEqualTo(4);
            aPowerCutKeepsTheLastWrites();
            assertThat(f.setWce(1)).as("writeback cannot be recorded either").isNotZero();
            assertThat(writes(f, 4, 10)).as("still write through: 4 msyncs").isEqualTo(4);
            aPowerCutKeepsTheLastWrites();
            f.stop();
        }
    }
}
