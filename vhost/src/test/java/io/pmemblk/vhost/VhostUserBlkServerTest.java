package io.pmemblk.vhost;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.SharedMemory;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.vhost.session.VhostUserSession;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The server against a front-end that sends what QEMU 7.2 sends (the wire log in
 * {@code ../shared/notes/vhost-user-observed.txt}: realize, the SeaBIOS session, Linux's reset and full start, the
 * stop, a reconnect), over a real unix socket, guest memory in a real memfd; and against a front-end that breaks
 * the protocol in each way the session checks, which must get an error reply or a closed connection, a log line
 * naming what was wrong, and leave the server serving the next front-end.
 */
class VhostUserBlkServerTest extends ServedMemoryDisk {
    static final long DISK = 4L << 20;
    static final int QUEUES = 2, QUEUE_SIZE = 256, RING = 128;
    /** The guest's RAM as QEMU 7.2 splits a pc machine's (note section 2, ADD_MEM_REG): a hole at 0xa0000-0xc0000. */
    static final long RAM = 1L << 20, LOW = 0xa0000, HIGH = 0xc0000;

    /** The front-end's own view of guest RAM's address: it plays QEMU's userspace_addr. */
    long uaddr;

    VhostUserBlkServerTest() {
        super(new Sizes(DISK, 2, QUEUES, QUEUE_SIZE, RAM));
    }

    @BeforeEach
    void start() {
        uaddr = ramView.address();
    }

    /** Where vring {@code i}'s rings lie in guest RAM (user addresses), in the high region. */
    private long ringBase(int i) {
        return uaddr + 0xd0000 + 0x10000L * i;
    }

    private MemorySegment addr(TestFrontEnd fe, int i, long desc) {
        return fe.vringAddr(i, desc, ringBase(i) + 0x1000, ringBase(i) + 0x2000);
    }

    /** Realize (note section 3A): features, protocol features, queue count, slots, owner, call/err per queue. */
    private long realize(TestFrontEnd fe, boolean getConfig) throws IOException {
        long features = fe.get(GET_FEATURES);
        assertThat(features & bit(F_VERSION_1)).isNotZero();
        assertThat(features & bit(F_PROTOCOL_FEATURES)).isNotZero();
        assertThat(features & (bit(F_INDIRECT_DESC) | bit(F_EVENT_IDX))).isEqualTo(bit(F_INDIRECT_DESC) | bit(F_EVENT_IDX));
        assertThat(features & bit(F_RING_PACKED)).as("packed rings are not served").isZero();
        long protocol = fe.get(GET_PROTOCOL_FEATURES);
        assertThat(protocol).isEqualTo(VhostUserSession.PROTOCOL_FEATURES);
        assertThat(protocol & bit(PF_CONFIG)).as("QEMU's blk refuses a back-end without CONFIG").isNotZero();
        fe.set(SET_PROTOCOL_FEATURES, protocol & 0x1ffff); // QEMU acks what it knows of what is offered
        assertThat(fe.get(GET_QUEUE_NUM)).isEqualTo(QUEUES);
        assertThat(fe.get(GET_MAX_MEM_SLOTS)).isEqualTo(VhostUserSession.MAX_MEM_SLOTS);
        fe.send(SET_OWNER, 0, fe.empty());
        assertThat(fe.get(GET_FEATURES)).isEqualTo(features);
        for (int i = 0; i < QUEUES; i++) {
            fe.set(SET_VRING_CALL, i, eventFds.create().fd());
            fe.set(SET_VRING_ERR, i, eventFds.create().fd());
        }
        if (getConfig) {
            MemorySegment p = fe.payload(CONFIG_REGION + 57);
            p.set(ValueLayout.JAVA_INT, CONFIG_SIZE, 57);
            fe.send(GET_CONFIG, 0, p);
            TestFrontEnd.Reply r = fe.reply(GET_CONFIG);
            assertThat(r.payload().byteSize()).as("GET_CONFIG reply of the request's size").isEqualTo(69);
            MemorySegment cfg = r.payload().asSlice(CONFIG_REGION);
            assertThat(cfg.get(ValueLayout.JAVA_LONG_UNALIGNED, 0)).as("capacity in sectors").isEqualTo(DISK / 512);
            assertThat(cfg.get(ValueLayout.JAVA_INT_UNALIGNED, 20)).as("blk_size").isEqualTo(512);
            assertThat(cfg.get(ValueLayout.JAVA_SHORT_UNALIGNED, 34)).as("num_queues").isEqualTo((short) QUEUES);
        }
        return features;
    }

    /**
     * Start (section 3B): features twice, inflight, calls, memory when new, then each ring's NUM/BASE/ADDR/KICK.
     * Returns each started ring's kick and call eventfds.
     */
    private EventFd[][] start(TestFrontEnd fe, long features, int[] bases, boolean sendMemory) throws IOException {
        EventFd[][] notifiers = new EventFd[bases.length][2];
        fe.set(SET_FEATURES, features);
        for (int i = 0; i < bases.length; i++) {
            notifiers[i][1] = eventFds.create();
            fe.set(SET_VRING_CALL, i, notifiers[i][1].fd());
        }
        fe.set(SET_FEATURES, features);
        if (sendMemory) {
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), ramFd)).isZero();
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(HIGH, RAM - HIGH, uaddr + HIGH, HIGH), ramFd)).isZero();
        }
        for (int i = 0; i < bases.length; i++) {
            // the guest's rings as a driver left them: avail and used idx at the base QEMU restores
            long ring = ringBase(i) - uaddr;
            ramView.set(ValueLayout.JAVA_SHORT, ring + 0x1000 + 2, (short) bases[i]);
            ramView.set(ValueLayout.JAVA_SHORT, ring + 0x2000 + 2, (short) bases[i]);
            fe.send(SET_VRING_NUM, 0, fe.state(i, RING));
            fe.send(SET_VRING_BASE, 0, fe.state(i, bases[i]));
            fe.send(SET_VRING_ADDR, 0, addr(fe, i, ringBase(i)));
            notifiers[i][0] = eventFds.create();
            fe.set(SET_VRING_KICK, i, notifiers[i][0].fd());
        }
        for (int i = 0; i < QUEUES; i++) {
            fe.send(SET_VRING_ENABLE, 0, fe.state(i, 1));
        }
        return notifiers;
    }

    /**
     * What SeaBIOS does on vring 0 (observed: one request before Linux resets the device): a READ of sector 0 as a
     * three-descriptor chain (header, 512 bytes, status) in the high region, avail idx 0 -> 1, a kick; then waits
     * for the call and checks the used ring, the status and the data against the disk.
     */
    private void readSectorZero(EventFd kick, EventFd call) throws Exception {
        readSectorZero(kick, call, ringBase(0) - uaddr + 0x1000);
    }

    /** As above, with vring 0's avail ring at {@code avail} (a gpa). */
    private void readSectorZero(EventFd kick, EventFd call, long avail) throws Exception {
        long ring = ringBase(0) - uaddr, header = 0xf0000, data = 0xf1000, status = 0xf2000; // gpa = file offset here
        for (int d = 0; d < 3; d++) {
            long at = ring + 16L * d;
            ramView.set(ValueLayout.JAVA_LONG, at, d == 0 ? header : d == 1 ? data : status);
            ramView.set(ValueLayout.JAVA_INT, at + 8, d == 0 ? 16 : d == 1 ? 512 : 1);
            ramView.set(ValueLayout.JAVA_SHORT, at + 12, (short) (d == 0 ? 1 : d == 1 ? 3 : 2)); // NEXT, WRITE
            ramView.set(ValueLayout.JAVA_SHORT, at + 14, (short) (d + 1));
        }
        ramView.set(ValueLayout.JAVA_INT, header, 0); // VIRTIO_BLK_T_IN
        ramView.set(ValueLayout.JAVA_LONG, header + 8, 0L); // sector 0
        ramView.set(ValueLayout.JAVA_BYTE, status, (byte) 0xff);
        for (int i = 0; i < 512; i++) {
            driver.memory.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 7 + 1));
        }
        ramView.set(ValueLayout.JAVA_SHORT, avail + 4, (short) 0); // avail ring[0] = head 0
        ramView.set(ValueLayout.JAVA_SHORT, avail + 2, (short) 1); // avail idx
        kick.signal();
        assertThat(call.await(10_000)).as("the call eventfd signalled within 10 s").isTrue();
        assertThat(ramView.get(ValueLayout.JAVA_SHORT, ring + 0x2000 + 2)).as("used idx").isEqualTo((short) 1);
        assertThat(ramView.get(ValueLayout.JAVA_INT, ring + 0x2000 + 4)).as("used id").isZero();
        assertThat(ramView.get(ValueLayout.JAVA_INT, ring + 0x2000 + 8)).as("used len: data + status").isEqualTo(513);
        assertThat(ramView.get(ValueLayout.JAVA_BYTE, status)).as("VIRTIO_BLK_S_OK").isZero();
        assertThat(ramView.asSlice(data, 512).mismatch(driver.memory.asSlice(0, 512))).isEqualTo(-1);
    }

    /** Stop: every ring disabled, then GET_VRING_BASE of each started one; the bases it answers. */
    private int[] stop(TestFrontEnd fe, int started) throws IOException {
        for (int i = 0; i < QUEUES; i++) {
            fe.send(SET_VRING_ENABLE, 0, fe.state(i, 0));
        }
        int[] bases = new int[started];
        for (int i = 0; i < started; i++) {
            fe.send(GET_VRING_BASE, 0, fe.state(i, 0));
            TestFrontEnd.Reply r = fe.reply(GET_VRING_BASE);
            assertThat(r.payload().get(ValueLayout.JAVA_INT_UNALIGNED, STATE_INDEX)).isEqualTo(i);
            bases[i] = r.payload().get(ValueLayout.JAVA_INT_UNALIGNED, STATE_NUM);
        }
        return bases;
    }

    /** /proc/self/maps lines of the guest RAM memfd: the test's own mapping, plus the server's while it serves. */
    private static long ramMappings() throws IOException {
        return Files.readAllLines(Path.of("/proc/self/maps")).stream().filter(l -> l.contains("/memfd:guest-ram")).count();
    }

    private static long openEventFds() throws IOException {
        try (var fds = Files.list(Path.of("/proc/self/fd"))) {
            return fds.filter(p -> {
                try {
                    return Files.readSymbolicLink(p).toString().contains("eventfd");
                } catch (IOException gone) {
                    return false;
                }
            }).count();
        }
    }

    /**
     * The inflight region is touched by the rings for every request, as guest RAM is: an fd that can shrink under
     * them is refused as guest RAM's is, and the sealed memfd GET_INFLIGHT_FD gave is taken.
     */
    @Test
    void anInflightFdThatCanShrinkIsRefusedAndTheSealedOneGetInflightFdGaveIsTaken() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, true);
            MemorySegment ask = fe.payload(INFLIGHT_SIZE);
            ask.set(ValueLayout.JAVA_SHORT, INFLIGHT_NUM_QUEUES, (short) QUEUES);
            ask.set(ValueLayout.JAVA_SHORT, INFLIGHT_QUEUE_SIZE, (short) RING);
            fe.send(GET_INFLIGHT_FD, 0, ask);
            int[] ours = new int[1];
            TestFrontEnd.Reply inflight = fe.reply(GET_INFLIGHT_FD, ours);
            long size = inflight.payload().get(ValueLayout.JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_SIZE);
            int unsealed = SharedMemory.memfd("inflight-unsealed", size);
            try {
                assertThat(fe.acked(SET_INFLIGHT_FD, inflight.payload(), unsealed)).as("an unsealed memfd").isNotZero();
                assertThat(fe.acked(SET_INFLIGHT_FD, inflight.payload(), ours[0])).as("the one GET_INFLIGHT_FD gave")
                        .isZero();
            } finally {
                Libc.close(unsealed);
                Libc.close(ours[0]);
            }
        }
        assertThat(server.awaitDisconnected(Duration.ofSeconds(10))).isTrue();
    }

    @Test
    void replaysQemuRealizeTheSeaBiosSessionLinuxsResetAndAReconnect() throws Exception {
        long before = openEventFds();
        long offered;
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            offered = realize(fe, true);
            // SeaBIOS: VERSION_1 | bit 30 | SIZE_MAX | SEG_MAX | BLK_SIZE, queue 0 only; a GET_INFLIGHT_FD first
            MemorySegment inflightAsk = fe.payload(INFLIGHT_SIZE);
            inflightAsk.set(ValueLayout.JAVA_SHORT, INFLIGHT_NUM_QUEUES, (short) QUEUES);
            inflightAsk.set(ValueLayout.JAVA_SHORT, INFLIGHT_QUEUE_SIZE, (short) RING);
            fe.set(SET_FEATURES, 0x140000046L);
            fe.send(GET_INFLIGHT_FD, 0, inflightAsk);
            int[] inflightFd = new int[1];
            TestFrontEnd.Reply inflight = fe.reply(GET_INFLIGHT_FD, inflightFd);
            long size = inflight.payload().get(ValueLayout.JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_SIZE);
            assertThat(size).as("libvhost-user's stride per queue").isEqualTo(2L * 2112);
            assertThat(inflightFd[0]).isNotNegative();
            assertThat(FileCalls.fstat(inflightFd[0]).size()).isEqualTo(size);
            fe.send(SET_INFLIGHT_FD, 0, inflight.payload(), inflightFd[0]);
            EventFd[][] seabios = start(fe, 0x140000046L, new int[]{0}, true);
            MemorySegment region = SharedMemory.map(inflightFd[0], 0, size, arena);
            for (int q = 0; q < QUEUES; q++) {
                assertThat(region.get(ValueLayout.JAVA_SHORT, q * 2112L + INFLIGHT_DESC_NUM)).as("desc_num of queue " + q)
                        .isEqualTo((short) RING);
            }
            assertThat(ramMappings()).as("both regions mapped by the server").isEqualTo(3);
            readSectorZero(seabios[0][0], seabios[0][1]);
            assertThat(stop(fe, 1)).as("GET_VRING_BASE after SeaBIOS's one request, as observed").containsExactly(1);
            // Linux resets and starts both queues with all it acks of what was offered; regions unchanged
            long linux = 0x170007e46L & offered;
            fe.send(SET_INFLIGHT_FD, 0, inflight.payload(), inflightFd[0]);
            start(fe, linux, new int[]{1, 0}, false);
            assertThat(stop(fe, 2)).containsExactly(1, 0);
            assertThat(fe.get(GET_QUEUE_NUM)).as("still served after the stop").isEqualTo(QUEUES);
            Libc.close(inflightFd[0]);
        }
        assertThat(server.awaitDisconnected(Duration.ofSeconds(10))).as("session ended").isTrue();
        assertThat(ramMappings()).as("the server unmapped guest RAM").isEqualTo(1);
        eventFds.close();
        assertThat(openEventFds()).as("every kick, call and err fd the server got is closed").isEqualTo(before);
        // reconnect=1: realize again without GET_CONFIG, then at once the start, every region re-sent
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            long features = realize(fe, false);
            start(fe, 0x170007e46L & features, new int[]{7, 3}, true);
            assertThat(stop(fe, 2)).containsExactly(7, 3);
        }
        assertThat(server.awaitDisconnected(Duration.ofSeconds(10))).isTrue();
        assertThat(log).anyMatch(l -> l.contains("vhost-user connection 2 opened"));
    }

    // ------------------------------------------------------------ malformed front-ends

    /** After a refusal the connection is gone (or answered), a log line says why, and the next front-end is served. */
    private void assertClosedWithLog(TestFrontEnd fe, String... logged) throws Exception {
        assertThat(fe.closedByBackEnd()).as("the back-end closed the connection").isTrue();
        assertLogged(logged);
        assertNextFrontEndServed();
    }

    private void assertLogged(String... fragments) {
        assertThat(log).as("a log line naming what was wrong").anyMatch(l -> {
            for (String f : fragments) {
                if (!l.contains(f)) {
                    return false;
                }
            }
            return true;
        });
    }

    private void assertNextFrontEndServed() throws Exception {
        assertThat(server.awaitDisconnected(Duration.ofSeconds(10))).isTrue();
        try (TestFrontEnd next = TestFrontEnd.connect(socket)) {
            assertThat(next.get(GET_QUEUE_NUM)).isEqualTo(QUEUES);
        }
        assertThat(server.awaitDisconnected(Duration.ofSeconds(10))).isTrue();
    }

    @Test
    void aPayloadOverTheBoundClosesTheConnection() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            fe.sendHeader(SET_MEM_TABLE, VERSION, 4096);
            assertClosedWithLog(fe, "SET_MEM_TABLE(5)", "4096 bytes", "at most 272");
        }
    }

    @Test
    void aPayloadOfTheWrongSizeClosesTheConnection() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            fe.send(SET_FEATURES, 0, fe.payload(4));
            assertClosedWithLog(fe, "SET_FEATURES(2)", "4 bytes", "exactly 8");
        }
    }

    @Test
    void anotherVersionClosesTheConnection() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            fe.sendHeader(GET_FEATURES, 0x2, 0);
            assertClosedWithLog(fe, "GET_FEATURES(1)", "version 2", "allowed: version 1");
        }
    }

    @Test
    void aMissingRegionFdIsAnErrorReply() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0))).as("REPLY_ACK failure").isNotZero();
            assertLogged("ADD_MEM_REG(37) refused", "0 file descriptors", "exactly 1");
            assertThat(fe.get(GET_QUEUE_NUM)).as("the connection goes on").isEqualTo(QUEUES);
        }
        assertNextFrontEndServed();
    }

    @Test
    void extraFdsCloseTheConnectionAndAreClosed() throws Exception {
        long before = openEventFds();
        try (TestFrontEnd fe = TestFrontEnd.connect(socket); EventFd a = EventFd.create(true);
             EventFd b = EventFd.create(true)) {
            fe.set(SET_VRING_CALL, 0, a.fd(), b.fd());
            assertClosedWithLog(fe, "SET_VRING_CALL(13)", "2 file descriptors", "at most 1");
        }
        assertThat(openEventFds()).as("the server's copies are closed").isEqualTo(before);
    }

    @Test
    void aKickWordWithoutItsFdClosesTheConnection() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            fe.set(SET_VRING_KICK, 0);
            assertClosedWithLog(fe, "SET_VRING_KICK(12) refused", "vring 0: 0 file descriptors", "exactly 1");
        }
    }

    @Test
    void aVringIndexPastTheQueueCountIsRefused() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            assertThat(fe.acked(SET_VRING_NUM, fe.state(QUEUES, RING))).isNotZero();
            assertLogged("SET_VRING_NUM(8) refused", "vring index 2", "allowed: 0..1");
            fe.send(SET_VRING_BASE, 0, fe.state(-1, 0)); // no NEED_REPLY: nothing to answer with, so it closes
            assertClosedWithLog(fe, "SET_VRING_BASE(10) refused", "vring index 4294967295", "allowed: 0..1");
        }
    }

    /** Virtio 1.2 2.7: a split queue's size is a power of 2; 3 was taken, and its ring served. */
    @Test
    void aVringSizeNotAPowerOfTwoIsRefused() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            assertThat(fe.acked(SET_VRING_NUM, fe.state(0, 3))).isNotZero();
            assertLogged("SET_VRING_NUM(8) refused", "vring 0 size 3; allowed: a power of 2 in 1.." + QUEUE_SIZE);
            assertThat(fe.acked(SET_VRING_NUM, fe.state(0, 4))).as("a power of 2 is taken").isZero();
        }
    }

    /**
     * Without EVENT_IDX an avail ring has no used_event: QEMU sizes it 4 + 2 x size bytes, and it may end where its
     * region ends (here right before the pc hole). The 2 bytes more it was checked for refused it.
     */
    @Test
    void withoutEventIdxAnAvailRingMayEndWhereItsRegionEnds() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            long features = 0x140000046L & realize(fe, false); // SeaBIOS's: no EVENT_IDX
            assertThat(features & bit(F_EVENT_IDX)).isZero();
            fe.set(SET_FEATURES, features);
            EventFd call = eventFds.create(), kick = eventFds.create();
            fe.set(SET_VRING_CALL, 0, call.fd());
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), ramFd)).isZero();
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(HIGH, RAM - HIGH, uaddr + HIGH, HIGH), ramFd)).isZero();
            long avail = LOW - (4 + 2L * RING); // gpa = file offset; the last bytes of the low region
            ramView.set(ValueLayout.JAVA_SHORT, avail + 2, (short) 0);
            ramView.set(ValueLayout.JAVA_SHORT, ringBase(0) - uaddr + 0x2000 + 2, (short) 0);
            fe.send(SET_VRING_NUM, 0, fe.state(0, RING));
            fe.send(SET_VRING_BASE, 0, fe.state(0, 0));
            assertThat(fe.acked(SET_VRING_ADDR, fe.vringAddr(0, ringBase(0), uaddr + avail, ringBase(0) + 0x2000)))
                    .as("an avail ring of 4 + 2 x " + RING + " bytes ending at the region's end").isZero();
            assertThat(fe.acked(SET_VRING_KICK, fe.u64(0), kick.fd())).as("the ring starts").isZero();
            fe.send(SET_VRING_ENABLE, 0, fe.state(0, 1));
            readSectorZero(kick, call, avail);
            assertThat(stop(fe, 1)).containsExactly(1);
        }
    }

    @Test
    void aRingOutsideTheRegionsClosesTheConnection() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            long features = realize(fe, false);
            fe.set(SET_FEATURES, 0x170007e46L & features);
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), ramFd)).isZero();
            fe.send(SET_VRING_NUM, 0, fe.state(0, RING));
            // in the hole between the regions: guest RAM QEMU never announced
            fe.send(SET_VRING_ADDR, 0, addr(fe, 0, uaddr + LOW + 0x1000));
            assertClosedWithLog(fe, "SET_VRING_ADDR(9) refused", "descriptor table at user address 0x"
                    + Long.toHexString(uaddr + LOW + 0x1000), "not within one region");
        }
        assertThat(ramMappings()).as("the region it did add is unmapped with the session").isEqualTo(1);
    }

    @Test
    void aRegionPastTheEndOfItsFileIsRefused() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, RAM, uaddr, HIGH), ramFd)).isNotZero();
            assertLogged("ADD_MEM_REG(37) refused", "passes the end of its file");
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), ramFd)).isZero();
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0x1000, LOW, uaddr + LOW, 0), ramFd)).as("overlap").isNotZero();
            assertLogged("ADD_MEM_REG(37) refused", "overlaps a region already added in guest memory");
        }
        assertNextFrontEndServed();
    }

    @Test
    void aMemfdShorterThanItsRegionIsRefusedBeforeItIsMappedAndTheJvmLives() throws Exception {
        int shortFd = SharedMemory.memfd("guest-ram", LOW / 2); // QEMU says LOW bytes; the file holds half
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), shortFd)).isNotZero();
            assertLogged("ADD_MEM_REG(37) refused", "region (guest 0x0)", "memory_size 0x" + Long.toHexString(LOW),
                    "passes the end of its file (0x" + Long.toHexString(LOW / 2) + " bytes)");
            assertThat(ramMappings()).as("the short file is never mapped").isEqualTo(1);
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), ramFd)).as("a whole one is").isZero();
            assertThat(fe.get(GET_QUEUE_NUM)).as("still served").isEqualTo(QUEUES);
        } finally {
            Libc.close(shortFd);
        }
        assertNextFrontEndServed();
    }

    /**
     * Guest RAM that can shrink under the server is refused, naming the fix (a front end that
     * truncated it killed the JVM with SIGBUS in libc's memcpy): a memfd without F_SEAL_SHRINK (QEMU's seal=off)
     * and a file on tmpfs (memory-backend-file mem-path=/dev/shm/...), neither mapped; the connection and the
     * server serve on. The sealed memfd every other test uses (QEMU's default) is served, and cannot be truncated.
     */
    @Test
    void guestRamThatCanShrinkIsRefusedNamingTheFixAndNeverMapped() throws Exception {
        int unsealed = SharedMemory.memfd("guest-ram-unsealed", RAM);
        Path shm = Files.createTempFile(Path.of("/dev/shm"), "pmemblk-guest-ram", ".img");
        int tmpfs = FileCalls.open(shm.toString(), FileCalls.O_RDWR | FileCalls.O_CLOEXEC, 0);
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            FileCalls.ftruncate(tmpfs, RAM);
            realize(fe, false);
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), unsealed)).as("unsealed memfd")
                    .isNotZero();
            assertLogged("ADD_MEM_REG(37) refused", "region (guest 0x0): its file /memfd:guest-ram-unsealed",
                    "is not sealed with F_SEAL_SHRINK", "SIGBUS", "memory-backend-memfd", "seal=on");
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), tmpfs)).as("tmpfs file").isNotZero();
            assertLogged("ADD_MEM_REG(37) refused", "its file " + shm, "is not sealed with F_SEAL_SHRINK",
                    "memory-backend-memfd");
            assertThat(Files.readAllLines(Path.of("/proc/self/maps"))).as("neither is mapped")
                    .noneMatch(l -> l.contains("guest-ram-unsealed") || l.contains(shm.toString()));
            assertThat(fe.acked(SET_MEM_TABLE, fe.memTable(0, LOW, uaddr, 0), unsealed)).as("SET_MEM_TABLE too")
                    .isNotZero();
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), ramFd)).as("the sealed memfd").isZero();
            assertThat(fe.get(GET_QUEUE_NUM)).as("still served").isEqualTo(QUEUES);
            assertThatThrownBy(() -> FileCalls.ftruncate(ramFd, 0)).as("a sealed memfd cannot be cut under the server")
                    .isInstanceOf(NativeException.class);
        } finally {
            Libc.close(unsealed);
            Libc.close(tmpfs);
            Files.delete(shm);
        }
        assertNextFrontEndServed();
    }

    /**
     * A SET_MEM_TABLE refused for one of its files (here a memfd that can shrink) is answered with a failure and
     * changes nothing: the memory table and the running ring stay as they were, and the ring serves on. (It used
     * to stop the rings and unmap the old table before it looked at the files, and leave them so: the guest's
     * I/O hung, though the front-end was told only that its new table failed.)
     */
    @Test
    void aMemTableRefusedForItsFileLeavesTheMemoryAndTheRunningRingsAsTheyWere() throws Exception {
        int unsealed = SharedMemory.memfd("guest-ram-unsealed", RAM);
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            long features = realize(fe, false);
            EventFd[][] n = start(fe, 0x170007e46L & features, new int[]{0}, true);
            readSectorZeroPolled(n[0][0], 0);
            assertThat(fe.acked(SET_MEM_TABLE, fe.memTable(0, RAM, uaddr, 0), unsealed)).as("an unsealed memfd")
                    .isNotZero();
            assertLogged("SET_MEM_TABLE(5) refused", "is not sealed with F_SEAL_SHRINK");
            assertThat(ramMappings()).as("both regions still mapped by the server").isEqualTo(3);
            readSectorZeroPolled(n[0][0], 1);
            assertThat(stop(fe, 1)).containsExactly(2);
        } finally {
            Libc.close(unsealed);
        }
        assertNextFrontEndServed();
    }

    /**
     * Request {@code k} (0-based, one at a time) on vring 0: readSectorZero's READ of sector 0, its completion
     * seen in the used ring (bounded wait) rather than through the call eventfd, which a test may have filled.
     */
    private void readSectorZeroPolled(EventFd kick, int k) {
        long ring = ringBase(0) - uaddr, header = 0xf0000, data = 0xf1000, status = 0xf2000;
        for (int d = 0; d < 3; d++) {
            long at = ring + 16L * d;
            ramView.set(ValueLayout.JAVA_LONG, at, d == 0 ? header : d == 1 ? data : status);
            ramView.set(ValueLayout.JAVA_INT, at + 8, d == 0 ? 16 : d == 1 ? 512 : 1);
            ramView.set(ValueLayout.JAVA_SHORT, at + 12, (short) (d == 0 ? 1 : d == 1 ? 3 : 2));
            ramView.set(ValueLayout.JAVA_SHORT, at + 14, (short) (d + 1));
        }
        ramView.set(ValueLayout.JAVA_INT, header, 0);
        ramView.set(ValueLayout.JAVA_LONG, header + 8, 0L);
        ramView.set(ValueLayout.JAVA_BYTE, status, (byte) 0xff);
        ramView.set(ValueLayout.JAVA_SHORT, ring + 0x1000 + 4 + 2L * (k % RING), (short) 0);
        // used_event (EVENT_IDX): an interrupt for this very completion, so every completion writes the call fd
        ramView.set(ValueLayout.JAVA_SHORT, ring + 0x1000 + 4 + 2L * RING, (short) k);
        ramView.set(ValueLayout.JAVA_SHORT, ring + 0x1000 + 2, (short) (k + 1));
        kick.signal();
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (ramView.get(ValueLayout.JAVA_SHORT, ring + 0x2000 + 2) != (short) (k + 1)) {
            assertThat(System.nanoTime() - deadline).as("request " + k + " completed within 10 s (used idx "
                    + ramView.get(ValueLayout.JAVA_SHORT, ring + 0x2000 + 2) + ")").isNegative();
            java.util.concurrent.locks.LockSupport.parkNanos(100_000);
        }
        assertThat(ramView.get(ValueLayout.JAVA_BYTE, status)).as("request " + k + " VIRTIO_BLK_S_OK").isZero();
    }

    /** Sets {@code e}'s counter to 2^64-2, the most a write may leave: one more and a blocking write waits. */
    static void fill(EventFd e) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment max = a.allocate(ValueLayout.JAVA_LONG);
            max.set(ValueLayout.JAVA_LONG, 0, 0xfffffffffffffffeL);
            assertThat(io.pmemblk.posix.FileIo.write(e.fd(), max)).as("the counter set to 2^64-2").isEqualTo(8);
        }
    }

    /**
     * A front end that fills its call eventfd's counter (a queue thread that wrote blocking would block for good
     * in write(2), serving nothing more): the ring keeps serving, the stop answers, the next front end is served.
     */
    @Test
    void aCallEventfdWithAFullCounterStallsNothing() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            long features = realize(fe, false);
            EventFd[][] n = start(fe, 0x170007e46L & features, new int[]{0}, true);
            EventFd blocking = EventFd.create(false); // a blocking one: QEMU's are not, a hostile front end's may be
            eventFds.add(blocking);
            fill(blocking);
            fe.set(SET_VRING_CALL, 0, blocking.fd()); // while the ring runs: it restarts where it stopped
            for (int k = 0; k < 8; k++) {
                readSectorZeroPolled(n[0][0], k);
            }
            assertThat(stop(fe, 1)).containsExactly(8);
        }
        assertNextFrontEndServed();
    }

    /** fcntl(fd, F_SETFL, 0): what a hostile front end can do to the open file description it shares with us. */
    @SuppressWarnings("restricted")
    static void clearNonBlocking(int fd) throws Throwable {
        java.lang.foreign.Linker linker = java.lang.foreign.Linker.nativeLinker();
        java.lang.invoke.MethodHandle fcntl = linker.downcallHandle(linker.defaultLookup().find("fcntl").orElseThrow(),
                java.lang.foreign.FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.JAVA_INT, ValueLayout.JAVA_INT,
                        ValueLayout.JAVA_INT), java.lang.foreign.Linker.Option.firstVariadicArg(2));
        assertThat((int) fcntl.invokeExact(fd, 4 /* F_SETFL */, 0)).as("F_SETFL 0").isZero();
    }

    /**
     * The DMA route (the real pmem driver and the software I/OAT engine, one channel, whose completion thread every
     * client shares) with a front end whose call eventfd's counter is full (an engine
     * completion thread blocked in write(2) would leave a later NBD 1 MiB write on the DMA route never completed and
     * SIGTERM hung): the ring serves on; then with O_NONBLOCK cleared again by the front end, another client's 1 MiB
     * write on the DMA route completes, and the server closes within a bound.
     */
    @Test
    void aCallEventfdWithAFullCounterStallsNoOtherClientOnTheDmaRoute() throws Throwable {
        io.pmemblk.dma.DmaEngine engine = io.pmemblk.dma.DmaEngine.soft(new io.pmemblk.dma.IovaSpace(), 1, 512);
        io.pmemblk.pmem.PmemBlockDriver pmem = new io.pmemblk.pmem.PmemBlockDriver(io.pmemblk.pmem.PmemRegion.open(
                dir.resolve("d.img"), DISK, false, io.pmemblk.pmem.PmemRegion.Mapper.AUTO),
                new io.pmemblk.pmem.CopyStats(), engine, new io.pmemblk.pmem.Routing(1, 1));
        BlockLayer dmaLayer = new BlockLayer(pmem, QUEUES, 16, 4L << 20, 1 << 20);
        Path dmaSocket = dir.resolve("dma.sock");
        VhostUserBlkServer dmaServer = new VhostUserBlkServer(new VhostUserBlkConfig(dmaSocket, QUEUES, QUEUE_SIZE),
                dmaLayer);
        MemorySegment other = arena.allocate(1 << 20, 4096); // another client's (an NBD connection's) buffer
        EventFd blocking = EventFd.create(false);
        eventFds.add(blocking);
        try {
            dmaServer.start();
            long otherIova = pmem.registerMemory(other);
            try (TestFrontEnd fe = TestFrontEnd.connect(dmaSocket)) {
                long features = realize(fe, false);
                EventFd[][] n = start(fe, 0x170007e46L & features, new int[]{0}, true);
                fill(blocking);
                fe.set(SET_VRING_CALL, 0, blocking.fd());
                for (int k = 0; k < 8; k++) {
                    readSectorZeroPolled(n[0][0], k); // each one copied by the engine, completed on its thread
                }
                // The interrupt of request 7 is handed to the queue thread after its answer is published, and may
                // not be sent yet: cleared now, O_NONBLOCK would block that send (the front end's own queue, as
                // designed) before request 8 is taken. Setting the call again restarts the ring, whose stop sends
                // what is due, before the acknowledgement; the next interrupt is request 8's, sent after its answer
                // is published.
                assertThat(fe.acked(SET_VRING_CALL, fe.u64(0), blocking.fd())).as("SET_VRING_CALL done").isZero();
                clearNonBlocking(blocking.fd()); // the server's writes to it would block again
                readSectorZeroPolled(n[0][0], 8);
                io.pmemblk.queueing.FrontendQueue client = new io.pmemblk.queueing.FrontendQueue(dmaLayer.queue(1));
                java.util.concurrent.BlockingQueue<io.pmemblk.queueing.Request> done =
                        new java.util.concurrent.ArrayBlockingQueue<>(1);
                io.pmemblk.queueing.Request w = client.acquireIov(io.pmemblk.queueing.Op.WRITE, 0, 1 << 20);
                w.addIov(other, otherIova);
                w.completion = done::add;
                client.add(w);
                client.dispatch();
                assertThat(done.poll(10, java.util.concurrent.TimeUnit.SECONDS)).as("the other client's 1 MiB write"
                        + " on the DMA route completed within 10 s").isSameAs(w);
                assertThat(w.status()).isEqualTo(io.pmemblk.queueing.Status.OK);
                assertThat(w.route).as("by the engine").isEqualTo(io.pmemblk.queueing.Route.DMA);
                w.release();
            }
            long closing = System.nanoTime();
            java.util.concurrent.CompletableFuture<Void> closed =
                    java.util.concurrent.CompletableFuture.runAsync(dmaServer::close);
            closed.get(30, java.util.concurrent.TimeUnit.SECONDS); // as SIGTERM's shutdown does
            assertThat(System.nanoTime() - closing).as("closed within 30 s").isLessThan(30_000_000_000L);
        } finally {
            blocking.drain(); // frees a writer still blocked on it (the front end's own queue thread)
            dmaServer.close();
            pmem.unregisterMemory(other);
            dmaLayer.close();
            pmem.close();
        }
    }

    /** A kick or call that is not an eventfd (a regular file, a socket) is refused, naming what it is. */
    @Test
    void aKickOrCallThatIsNotAnEventfdIsRefusedNamingWhatItIs() throws Exception {
        int file = SharedMemory.memfd("not-an-eventfd", 8);
        int sock = io.pmemblk.posix.Sockets.unixStreamSocket();
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            assertThat(fe.acked(SET_VRING_CALL, fe.u64(0), file)).as("a regular file as call").isNotZero();
            assertLogged("SET_VRING_CALL", "refused", "vring 0 call fd is /memfd:not-an-eventfd",
                    "not an eventfd; allowed: an eventfd(2)");
            assertThat(fe.acked(SET_VRING_KICK, fe.u64(1), sock)).as("a socket as kick").isNotZero();
            assertLogged("SET_VRING_KICK", "refused", "vring 1 kick fd is socket:[", "not an eventfd");
            assertThat(fe.acked(SET_VRING_CALL, fe.u64(1), eventFds.create().fd())).as("an eventfd is taken").isZero();
            assertThat(fe.get(GET_QUEUE_NUM)).as("still served").isEqualTo(QUEUES);
        } finally {
            Libc.close(file);
            Libc.close(sock);
        }
        assertNextFrontEndServed();
    }

    @Test
    void theInflightMemfdWeHandOutCannotBeShrunkOrGrown() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            fe.set(SET_FEATURES, 0x140000046L);
            MemorySegment ask = fe.payload(INFLIGHT_SIZE);
            ask.set(ValueLayout.JAVA_SHORT, INFLIGHT_NUM_QUEUES, (short) QUEUES);
            ask.set(ValueLayout.JAVA_SHORT, INFLIGHT_QUEUE_SIZE, (short) RING);
            fe.send(GET_INFLIGHT_FD, 0, ask);
            int[] fd = new int[1];
            long size = fe.reply(GET_INFLIGHT_FD, fd).payload().get(ValueLayout.JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_SIZE);
            try {
                assertThat(SharedMemory.seals(fd[0]) & (SharedMemory.F_SEAL_SHRINK | SharedMemory.F_SEAL_GROW))
                        .isEqualTo(SharedMemory.F_SEAL_SHRINK | SharedMemory.F_SEAL_GROW);
                for (long to : new long[]{0, size - 4096, size + 4096}) {
                    org.assertj.core.api.Assertions.assertThatThrownBy(() -> FileCalls.ftruncate(fd[0], to))
                            .as("ftruncate to " + to).isInstanceOf(NativeException.class)
                            .satisfies(x -> assertThat(((NativeException) x).errno()).isEqualTo(io.pmemblk.posix.Errno.EPERM));
                }
                assertThat(FileCalls.fstat(fd[0]).size()).isEqualTo(size);
            } finally {
                Libc.close(fd[0]);
            }
        }
    }

    @Test
    void removingAnUnknownRegionIsAnErrorReplyAndAKnownOneIsUnmapped() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            assertThat(fe.acked(ADD_MEM_REG, fe.memRegion(0, LOW, uaddr, 0), ramFd)).isZero();
            assertThat(fe.acked(REM_MEM_REG, fe.memRegion(0, LOW + 4096, uaddr, 0))).isNotZero();
            assertLogged("REM_MEM_REG(38) refused", "no region at guest 0x0", "size 0xa1000");
            assertThat(ramMappings()).isEqualTo(2);
            assertThat(fe.acked(REM_MEM_REG, fe.memRegion(0, LOW, uaddr, 0))).isZero();
            assertThat(ramMappings()).as("unmapped at once").isEqualTo(1);
        }
        assertNextFrontEndServed();
    }

    @Test
    void anUnknownRequestClosesTheConnection() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            fe.send(99, FLAG_NEED_REPLY, fe.payload(8));
            assertClosedWithLog(fe, "request 99", "is not a message this back-end serves");
        }
    }

    @Test
    void aConfigWriteOtherThanWceIsRefused() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            MemorySegment p = fe.payload(CONFIG_REGION + 8);
            p.set(ValueLayout.JAVA_INT, CONFIG_SIZE, 8);
            assertThat(fe.acked(SET_CONFIG, p)).isNotZero();
            assertLogged("SET_CONFIG(25) refused", "8 bytes at config offset 0", "the 1-byte wce at offset 32");
            MemorySegment wce = fe.payload(CONFIG_REGION + 1);
            wce.set(ValueLayout.JAVA_INT, CONFIG_OFFSET, 32);
            wce.set(ValueLayout.JAVA_INT, CONFIG_SIZE, 1);
            assertThat(fe.acked(SET_CONFIG, wce)).as("write through").isZero();
            MemorySegment ask = fe.payload(CONFIG_REGION + 60);
            ask.set(ValueLayout.JAVA_INT, CONFIG_SIZE, 60);
            fe.send(GET_CONFIG, 0, ask);
            assertThat(fe.reply(GET_CONFIG).payload().get(ValueLayout.JAVA_BYTE, CONFIG_REGION + 32)).isZero();
        }
    }

    /**
     * The messages whose payload size varies (SET_MEM_TABLE, GET_CONFIG, SET_CONFIG) cut shorter than their fixed
     * part are refused as any bad message is: a REPLY_ACK failure naming the size, and the connection goes on;
     * without NEED_REPLY a closed connection with a line saying why. (They used to end the session with an
     * IndexOutOfBoundsException, unlimited in the log, the REPLY_ACK never sent.)
     */
    @Test
    void aVariablePayloadShorterThanItsFixedPartIsRefusedNamingItsSize() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            assertThat(fe.acked(SET_CONFIG, fe.payload(4))).as("SET_CONFIG of 4 bytes").isNotZero();
            assertLogged("SET_CONFIG(25) refused", "payload of 4 bytes", "allowed: 12 + size");
            assertThat(fe.acked(SET_MEM_TABLE, fe.payload(2))).as("SET_MEM_TABLE of 2 bytes").isNotZero();
            assertLogged("SET_MEM_TABLE(5) refused", "payload of 2 bytes", "allowed: 8 + 32 per region");
            assertThat(fe.get(GET_QUEUE_NUM)).as("the connection goes on").isEqualTo(QUEUES);
            fe.send(GET_CONFIG, 0, fe.empty());
            assertClosedWithLog(fe, "GET_CONFIG(24) refused", "payload of 0 bytes", "allowed: 12 + size");
        }
    }

    @Test
    void aFloodOfRefusedMessagesIsCutToAFewLogLinesAndEachIsStillAnswered() throws Exception {
        try (TestFrontEnd fe = TestFrontEnd.connect(socket)) {
            realize(fe, false);
            for (int i = 0; i < 500; i++) {
                MemorySegment p = fe.payload(CONFIG_REGION + 8);
                p.set(ValueLayout.JAVA_INT, CONFIG_SIZE, 8);
                assertThat(fe.acked(SET_CONFIG, p)).as("refusal " + i).isNotZero();
            }
            assertThat(fe.get(GET_QUEUE_NUM)).as("still served").isEqualTo(QUEUES);
        }
        long lines = log.stream().filter(l -> l.contains("SET_CONFIG(25) refused")).count();
        assertThat(lines).as("log lines for 500 refusals").isBetween(1L,
                2L * io.pmemblk.queueing.log.RateLimitedLog.LINES_PER_SECOND); // a second may turn over once
    }

    @Test
    void aSecondFrontEndIsRefusedWhileOneIsServed() throws Exception {
        try (TestFrontEnd first = TestFrontEnd.connect(socket)) {
            assertThat(first.get(GET_QUEUE_NUM)).isEqualTo(QUEUES);
            try (TestFrontEnd second = TestFrontEnd.connect(socket)) {
                assertThat(second.closedByBackEnd()).isTrue();
            }
            assertLogged("refusing front-end connection 2", "connection 1 is still open");
            assertThat(first.get(GET_QUEUE_NUM)).as("the first is still served").isEqualTo(QUEUES);
        }
        assertNextFrontEndServed();
    }

    @Test
    void aLiveSocketPathIsRefusedAndAStaleOneReplaced() throws Exception {
        VhostUserBlkServer other = new VhostUserBlkServer(new VhostUserBlkConfig(socket, 1, 128), layer);
        try (other) {
            org.assertj.core.api.Assertions.assertThatThrownBy(other::start).isInstanceOf(IOException.class)
                    .hasMessageContaining("another server is accepting connections on it");
        }
        assertThat(socket).as("the live server's socket is left alone").exists();
        server.close();
        assertThat(socket).as("removed on close").doesNotExist();
    }
}
