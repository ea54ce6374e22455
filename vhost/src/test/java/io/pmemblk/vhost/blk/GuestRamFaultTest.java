package io.pmemblk.vhost.blk;

import io.pmemblk.vhost.testing.LogCapture;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.Routing;
import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.SharedMemory;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestRam;
import io.pmemblk.vhost.virtq.VirtioFeatures;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Guest RAM that faults under a request (the session refuses memory a front end could truncate; a poisoned line
 * of guest RAM still can fault): that request answers IOERR, the log names the guest RAM region and not the
 * device, and the queue serves on. Guest RAM here is a memfd the test cuts after its first 2 MiB.
 */
class GuestRamFaultTest {
    static final long MIB = 1 << 20;
    @TempDir
    Path dir;

    @Test
    void aFaultInGuestRamFailsThatRequestWithIoerrNamingTheRegionAndTheQueueServesOn() throws Exception {
        LogCapture logs = new LogCapture("io.pmemblk");
        List<String> log = logs.lines();
        logs.start();
        long bytes = GuestRam.bytesFor(0, 4 * MIB);
        int fd = SharedMemory.memfd("guest-ram", bytes);
        Arena arena = Arena.ofShared();
        PmemBlockDriver driver = new PmemBlockDriver(PmemRegion.open(dir.resolve("d.img"), 16 * MIB, false,
                PmemRegion.Mapper.AUTO), new CopyStats(), null, Routing.CPU_ONLY);
        BlockLayer layer = new BlockLayer(driver, 1, 16, 4 * MIB, 1 << 20);
        EventFd kick = EventFd.create(true), call = EventFd.create(true);
        VhostBlkQueue queue = null;
        try {
            GuestRam ram = new GuestRam(null, SharedMemory.map(fd, 0, bytes, arena), 0, 4 * MIB);
            GuestDriver ring = new GuestDriver(ram, 16, 0x10000);
            queue = new VhostBlkQueue(new VringAddress(0, 16, ring.descUser(), ring.availUser(), ring.usedUser(), 0),
                    new QueueWiring(VirtioFeatures.bit(VirtioFeatures.VERSION_1), kick, call, new FrontendQueue(layer.queue(0)),
                            ram::memory, null, BlkDevice.of(16 * MIB, false, true, true, "pmem0")));
            queue.start();
            BlkGuest guest = new BlkGuest(ring, MIB, 2 * MIB);
            FileCalls.ftruncate(fd, GuestRam.GUARD + 2 * MIB); // guest RAM from gpa 2 MiB on is gone
            long header = 0x80000, status = 0x90000, gone = 3 * MIB;
            ram.write(header, new byte[16]); // VIRTIO_BLK_T_IN of sector 0
            BlkGuest.Sent s = guest.raw(List.of(new GuestDriver.Buf(header, 16, false),
                    new GuestDriver.Buf(gone, 65536, true), new GuestDriver.Buf(status, 1, true)), status);
            kick.signal();
            Map<Integer, Integer> answered = awaitAnswer(guest);
            assertThat(answered).containsKey(s.head());
            assertThat(guest.status(s)).as("VIRTIO_BLK_S_IOERR").isEqualTo(1);
            assertThat(log).as("the log names guest RAM and its region, not the device").anyMatch(l ->
                    l.contains("vhost-blk-q0 head " + s.head() + ": IOERR: guest RAM GuestRegion[gpa 0x0..0x400000")
                            && l.contains("at offset 0x300000 (65536 bytes) faulted: the front end's memory, not the"
                            + " device"));
            assertThat(log).noneMatch(l -> l.contains("if the backing file was truncated"));
            BlkGuest.Sent ok = guest.read(0, 4096, 1, false); // within the first 2 MiB
            kick.signal();
            assertThat(awaitAnswer(guest)).containsKey(ok.head());
            assertThat(guest.status(ok)).as("the next request").isZero();
        } finally {
            logs.stop();
            if (queue != null) {
                queue.stop();
            }
            Closing.closeAll(kick, call, driver, layer);
            arena.close();
            Libc.close(fd);
        }
    }

    /** The requests answered, waiting (bounded) for at least one. */
    private static Map<Integer, Integer> awaitAnswer(BlkGuest guest) {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (true) {
            Map<Integer, Integer> a = guest.answered();
            if (!a.isEmpty()) {
                return a;
            }
            assertThat(System.nanoTime() - deadline).as("an answer within 10 s").isNegative();
            java.util.concurrent.locks.LockSupport.parkNanos(100_000);
        }
    }
}
