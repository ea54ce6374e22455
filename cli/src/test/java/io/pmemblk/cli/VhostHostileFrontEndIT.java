package io.pmemblk.cli;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.FileIo;
import io.pmemblk.vhost.driver.DriverRing;
import io.pmemblk.vhost.driver.FrontEnd;
import io.pmemblk.vhost.driver.MemfdGuestRam;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

import static io.pmemblk.vhost.spec.SplitRingLayout.F_NEXT;
import static io.pmemblk.vhost.spec.SplitRingLayout.F_WRITE;
import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * A real {@code pmemblk serve} (vhost-user and NBD, copies of 64 KiB and more by the software DMA engine) against
 * a vhost-user front end of our own that does what QEMU never does: fill its call eventfd's counter,
 * hand over guest RAM it can truncate. Every other client is served on, and SIGTERM ends the
 * server within a bound. And a driver that acks neither FLUSH nor CONFIG_WCE, as SeaBIOS does, gets
 * every write durable when it completes.
 */
class VhostHostileFrontEndIT {
    static final long VERSION_1 = bit(F_VERSION_1);
    static final long RAM = 4 << 20, DESC = 0x10000, AVAIL = 0x11000, USED = 0x12000, HEADER = 0x20000,
            STATUS = 0x30000, DATA = 0x100000;
    static final int RING = 16, DATA_BYTES = 64 << 10;

    @TempDir
    Path tmp;

    /** Serve with vhost-user and NBD, copies from 64 KiB on by the soft engine (NBD ones bounced). */
    private ServerProcess serve(Path dir) throws Exception {
        return ServerProcess.start(dir, java.util.Map.of(), ServerProcess.sets("pmem.path=" + dir.resolve("p.img"),
                "pmem.size=64M", "nbd.socket=" + dir.resolve("s"), "nbd.port=0", "vhost.socket=" + dir.resolve("v"),
                "dma.engine=soft", "route.dma.bounce=true", "route.dma.min-bytes=65536", "queue.buffer-bytes=32M"), 2);
    }

    /** A 1 MiB NBD write and its read-back (qemu-io), on the DMA route: it must end within 30 s. */
    private static void nbdWriteCompletes(ServerProcess s) throws Exception {
        ServerProcess.Run w = ServerProcess.run(List.of("timeout", "30", "qemu-io", "-f", "raw", "-c",
                "write -P 0x5a 8M 1M", "-c", "read -P 0x5a 8M 1M", s.unixUri()), 40);
        assertThat(w.exit()).as("the NBD client's 1 MiB write completed within 30 s: %s", w.out()).isZero();
        assertThat(w.out()).doesNotContain("Pattern verification failed").contains("read 1048576/1048576 bytes");
    }

    /** SIGTERM: the server exits 0 within 30 s. */
    private static void terminatesWithin30s(ServerProcess s) throws Exception {
        long t0 = System.nanoTime();
        int exit = s.terminate();
        assertThat(System.nanoTime() - t0).as("stop time after SIGTERM").isLessThan(TimeUnit.SECONDS.toNanos(30));
        assertThat(exit).as("exit code; stderr:%n%s", s.stderr()).isZero();
    }

    /**
     * Item 5: the call eventfd handed over blocking, with its counter at 2^64-2. On the code before the fix the
     * engine's completion thread blocked in write(2) on the first completion, the NBD client's 1 MiB DMA write
     * never completed and SIGTERM hung.
     */
    @Test
    void aFullCallEventfdStallsNeitherItsRingNorAnNbdClientNorSigterm() throws Exception {
        Path dir = tmp.toRealPath();
        try (ServerProcess s = serve(dir); HostileFrontEnd fe = new HostileFrontEnd(dir.resolve("v"), true)) {
            EventFd call = EventFd.create(false); // blocking, as a hostile front end may make it
            try {
                try (Arena a = Arena.ofConfined()) {
                    MemorySegment max = a.allocate(ValueLayout.JAVA_LONG);
                    max.set(ValueLayout.JAVA_LONG, 0, 0xfffffffffffffffeL);
                    assertThat(FileIo.write(call.fd(), max)).isEqualTo(8);
                }
                fe.startRing(call);
                for (int k = 0; k < 4; k++) {
                    fe.read64k(k); // each by the engine, completed on its thread, each due an interrupt
                }
                nbdWriteCompletes(s);
                fe.read64k(4);
                fe.close();
                terminatesWithin30s(s);
            } finally {
                call.drain(); // frees a writer still blocked on it, should one be
                call.close();
            }
        }
    }

    /**
     * Item 4: guest RAM in a memfd without F_SEAL_SHRINK is refused at SET_MEM_TABLE, naming the fix; the server
     * serves on. Before the fix it was served, and once the front end truncated it a 64 KiB READ copied into it by
     * the soft engine killed the channel's thread: DMA-routed I/O and SIGTERM hung (with pmem on tmpfs, libc's
     * memcpy killed the JVM).
     */
    @Test
    void unsealedGuestRamIsRefusedAndTheServerServesOn() throws Exception {
        Path dir = tmp.toRealPath();
        try (ServerProcess s = serve(dir)) {
            HostileFrontEnd fe = new HostileFrontEnd(dir.resolve("v"), false);
            EventFd call = EventFd.create(true);
            try {
                fe.startRing(call);
                FileCalls.ftruncate(fe.ram.fd(), DATA); // the front end takes away its memory from the data buffer on
                fe.read64k(0); // on the code before the fix: the engine's channel thread dies of the fault
            } catch (IOException | AssertionError refused) {
                // the connection was closed at SET_MEM_TABLE (sends fail, or nothing completes): what the fix does
            } finally {
                fe.close();
                call.close();
            }
            nbdWriteCompletes(s);
            assertThat(s.stderr()).as("the refusal, naming the fix").contains("SET_MEM_TABLE").contains(
                    "is not sealed with F_SEAL_SHRINK").contains("memory-backend-memfd");
            terminatesWithin30s(s);
        }
    }

    /**
     * Item 2: SeaBIOS acks VERSION_1 and no FLUSH or CONFIG_WCE (this front end's features), so it can never ask for
     * durability and believes each write done when it completes. After 4 completed 4 KiB WRITEs the server's mapping
     * of the disk file holds no dirty page: a power cut of the server's view (the page cache gone with the host) loses
     * none of them. On the code before the fix the writes stayed in the page cache (4 writes, 0 msyncs).
     */
    @Test
    void aDriverWithNeitherFlushNorConfigWceHasEveryWriteDurableWhenItCompletes() throws Exception {
        Path dir = tmp.toRealPath();
        Path image = dir.resolve("p.img");
        try (ServerProcess s = ServerProcess.start(dir, java.util.Map.of(), ServerProcess.sets("pmem.path=" + image,
                "pmem.size=64M", "nbd.socket=", "nbd.port=0", "vhost.socket=" + dir.resolve("v")), 1)) {
            HostileFrontEnd fe = new HostileFrontEnd(dir.resolve("v"), true);
            EventFd call = EventFd.create(true);
            try {
                fe.startRing(call);
                assertThat(dirtyKib(s.process.pid(), image)).as("dirty KiB of the image before the writes").isZero();
                for (int k = 0; k < 4; k++) {
                    fe.request(k, 1, 8L * k, 4096); // VIRTIO_BLK_T_OUT, 4 KiB at sector 8k
                }
                assertThat(dirtyKib(s.process.pid(), image))
                        .as("KiB of the 16 KiB the driver wrote that a power cut of the server's view would lose")
                        .isZero();
            } finally {
                fe.close();
                call.close();
            }
            terminatesWithin30s(s);
        }
        byte[] bytes = java.nio.file.Files.readAllBytes(image);
        for (int k = 0; k < 4; k++) {
            assertThat(bytes[k * 4096]).as("block %d holds the front end's pattern", k).isEqualTo((byte) (0x40 + k));
        }
    }

    /** KiB of {@code file} the mappings of process {@code pid} hold dirty (Shared_Dirty + Private_Dirty in smaps). */
    private static long dirtyKib(long pid, Path file) throws Exception {
        long kib = 0;
        boolean on = false;
        for (String l : java.nio.file.Files.readAllLines(Path.of("/proc/" + pid + "/smaps"))) {
            if (l.matches("^[0-9a-f]+-[0-9a-f]+ .*")) {
                on = l.endsWith(" " + file);
            } else if (on && (l.startsWith("Shared_Dirty:") || l.startsWith("Private_Dirty:"))) {
                kib += Long.parseLong(l.replaceAll("[^0-9]", ""));
            }
        }
        return kib;
    }

    /** A front end with one ring of 16 over 4 MiB of guest RAM in a memfd, sealed or not. */
    static final class HostileFrontEnd implements AutoCloseable {
        final MemfdGuestRam ram;
        final DriverRing ring;
        final FrontEnd fe;
        final EventFd kick;
        boolean closed;

        HostileFrontEnd(Path socket, boolean sealed) throws Exception {
            fe = FrontEnd.connect(socket);
            ram = new MemfdGuestRam("guest-ram", RAM, sealed); // sealed as QEMU's memory-backend-memfd (seal=on)
            ring = new DriverRing(ram, DESC, RING);
            kick = EventFd.create(true);
        }

        /** Features, the memory table (one region: all of RAM at gpa 0), ring 0 of 16 with {@code call}. */
        void startRing(EventFd call) throws Exception {
            fe.send(SET_OWNER, 0, fe.empty());
            fe.set(SET_FEATURES, VERSION_1);
            fe.send(SET_MEM_TABLE, 0, fe.memTable(0, RAM, ram.user(0), 0), ram.fd());
            fe.send(SET_VRING_NUM, 0, fe.state(0, RING));
            fe.send(SET_VRING_BASE, 0, fe.state(0, 0));
            fe.send(SET_VRING_ADDR, 0, fe.vringAddr(0, ring.descUser(), ring.availUser(), ring.usedUser()));
            fe.set(SET_VRING_CALL, 0, call.fd());
            fe.set(SET_VRING_KICK, 0, kick.fd());
            fe.get(GET_FEATURES); // its reply: everything sent before it has been handled
        }

        /** Request {@code k}: a 64 KiB READ of sector 0 (header, data, status), its completion awaited in the used ring. */
        void read64k(int k) {
            request(k, 0, 0, DATA_BYTES);
        }

        /**
         * Request {@code k} of {@code type} (VIRTIO_BLK_T_IN 0, T_OUT 1) at {@code sector}, {@code bytes} long (a
         * WRITE's data filled with 0x40 + k), its completion awaited in the used ring and its status OK.
         */
        void request(int k, int type, long sector, int bytes) {
            int dataFlags = F_NEXT | (type == 0 ? F_WRITE : 0); // the device writes a READ's data buffer
            ring.desc(0, HEADER, 16, F_NEXT, 1);
            ring.desc(1, DATA, bytes, dataFlags, 2);
            ring.desc(2, STATUS, 1, F_WRITE, 3);
            MemorySegment view = ram.at(0, RAM);
            view.set(ValueLayout.JAVA_INT, HEADER, type);
            view.set(ValueLayout.JAVA_LONG, HEADER + 8, sector);
            if (type == 1) {
                view.asSlice(DATA, bytes).fill((byte) (0x40 + k));
            }
            view.set(ValueLayout.JAVA_BYTE, STATUS, (byte) 0xff);
            ring.offer(0);
            kick.signal();
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (ring.usedIdx() != k + 1) {
                assertThat(System.nanoTime() - deadline).as("%s %d completed within 10 s (used idx %d)", what(type), k,
                        ring.usedIdx()).isNegative();
                LockSupport.parkNanos(200_000); // bounded poll of what the server writes
            }
            assertThat(view.get(ValueLayout.JAVA_BYTE, STATUS)).as("%s %d status OK", what(type), k).isZero();
        }

        private static String what(int type) {
            return type == 0 ? "READ" : "WRITE";
        }

        @Override
        public void close() throws Exception {
            if (!closed) {
                closed = true;
                fe.close();
                kick.close();
                ram.close();
            }
        }
    }
}
