package io.pmemblk.dma.vfiouser.client;

import static io.pmemblk.dma.vfiouser.client.VfioUserSpec.*;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pmemblk.dma.IovaFault;
import io.pmemblk.dma.vfio.VfioAbi;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.LockSupport;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * A server that breaks the protocol gets a clear error from the client, within the reply timeout, and never a
 * hang or a crash: garbage, short replies, a wrong msg_id, a close in the middle of a reply, silence, a reply
 * nobody asked for. A well-formed server command (DMA_WRITE) to memory that is not mapped is refused (EFAULT)
 * and the connection goes on.
 */
class ProtocolRobustnessTest {
    private static final Duration TIMEOUT = Duration.ofMillis(300);
    /**
     * The reply timeout where the stub does answer and the failure is in the answer: long enough that a stub thread
     * kept off a loaded 2-core machine's CPU for more than 300 ms still answers in time.
     */
    private static final Duration ANSWERED = Duration.ofSeconds(10);
    /** Bound on any one failure: the timeout, a slice or two of polling, and a loaded 2-core machine. */
    private static final long BOUND_MILLIS = 3_000;

    @TempDir
    Path dir;

    private Path socket() {
        return dir.resolve("stub.sock");
    }

    /** Connecting to a server scripted by {@code onVersion} fails with a message containing {@code expected}, in bounds. */
    private void connectFails(StubDevice.Script onVersion, String expected) throws Exception {
        connectFails(onVersion, expected, ANSWERED);
    }

    /** As {@link #connectFails(StubDevice.Script, String)}, replies awaited for {@code timeout}. */
    private void connectFails(StubDevice.Script onVersion, String expected, Duration timeout) throws Exception {
        try (StubDevice stub = new StubDevice(socket(), onVersion)) {
            long t0 = System.nanoTime();
            assertThatThrownBy(() -> VfioUserConnection.connect(socket().toString(), timeout, null).close())
                    .isInstanceOf(VfioUserException.class)
                    .hasMessageContaining(expected)
                    .satisfies(e -> assertThat(((VfioUserException) e).connectionLost()).isTrue());
            assertThat(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0)).isLessThan(BOUND_MILLIS);
        }
    }

    @Test
    void garbageWithAHugeSizeIsRefusedBeforeItIsRead() throws Exception {
        connectFails((m, d) -> d.send(StubDevice.message(0x4141, 0x4141, 0x41414141, 0x41414141, 0x41414141, new byte[0])),
                "a message of size 1094795585");
    }

    @Test
    void aSizeBelowTheHeaderIsRefused() throws Exception {
        connectFails((m, d) -> d.send(StubDevice.message(m.id(), m.command(), TYPE_REPLY, 0, 8, new byte[0])),
                "a message of size 8");
    }

    @Test
    void aShortVersionReplyIsRefused() throws Exception {
        connectFails((m, d) -> d.send(StubDevice.reply(m, new byte[]{0, 0})), "VERSION reply of 2 bytes is shorter");
    }

    @Test
    void aReplyWithTheWrongMsgIdIsRefused() throws Exception {
        connectFails((m, d) -> d.send(StubDevice.message(m.id() + 1, m.command(), TYPE_REPLY, 0, -1, new byte[4])),
                "the device sent a reply to VERSION (msg_id " + 2 + ")");
    }

    @Test
    void aCloseInTheMiddleOfAReplyIsRefused() throws Exception {
        connectFails((m, d) -> {
            byte[] full = StubDevice.versionReply(m);
            d.send(java.util.Arrays.copyOf(full, 20)); // the header and 4 bytes of a longer payload
            d.hangUp();
        }, "closed the connection in the middle of a message (20 bytes of it read)");
    }

    @Test
    void silenceEndsAtTheTimeout() throws Exception {
        connectFails((m, d) -> { }, "no reply to VERSION within 300 ms", TIMEOUT);
    }

    @Test
    void aVersionTheClientDoesNotSpeakIsRefused() throws Exception {
        connectFails((m, d) -> d.send(StubDevice.reply(m, new byte[]{1, 0, 0, 0})), "answered version 1.0");
    }

    /**
     * After a good handshake, the device dies while a register read waits: the read answers all ones (a removed
     * PCI device), the loss listener runs once, and every later access fails fast without a message.
     */
    @Test
    void aDeviceThatDiesUnderARegisterReadReadsAllOnesAndIsReportedOnce() throws Exception {
        CountDownLatch reads = new CountDownLatch(1);
        try (StubDevice stub = new StubDevice(socket(), (m, d) -> {
            if (m.command() == VERSION) {
                d.send(StubDevice.versionReply(m));
            } else if (m.command() == REGION_READ) {
                reads.countDown();
                d.hangUp(); // dies with the read in its hands
            }
        })) {
            VfioUserConnection c = VfioUserConnection.connect(socket().toString(), Duration.ofSeconds(30), null);
            AtomicInteger losses = new AtomicInteger();
            AtomicReference<String> why = new AtomicReference<>();
            CountDownLatch lost = new CountDownLatch(1);
            c.onLoss(reason -> {
                losses.incrementAndGet();
                why.set(reason);
                lost.countDown();
            });
            c.startWatcher("test-watch");
            VfioUserMmio bar = new VfioUserMmio(c, VfioAbi.PCI_BAR0_REGION, 0x4000, true);
            long t0 = System.nanoTime();
            assertThat(bar.read32(0x88)).as("a removed device reads all ones").isEqualTo(-1);
            assertThat(bar.read8(0)).isEqualTo(0xff);
            bar.write16(0x86, 1); // dropped, no exception
            assertThat(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0)).isLessThan(BOUND_MILLIS);
            assertThat(bar.failedAccesses()).isEqualTo(3);
            assertThat(lost.await(5, TimeUnit.SECONDS)).as("the loss listener ran").isTrue();
            assertThat(why.get()).contains("closed the connection");
            assertThat(c.lostReason()).isEqualTo(why.get());
            assertThat(stub.received.stream().filter(m -> m.command() == REGION_READ).count())
                    .as("nothing more sent after the loss").isEqualTo(1);
            c.close();
            assertThat(losses.get()).isEqualTo(1);
        }
    }

    /** A device that stops answering a region read: bounded by the timeout, then lost. */
    @Test
    void aDeviceThatHangsUnderARegisterReadIsGivenUpAtTheTimeout() throws Exception {
        try (StubDevice stub = new StubDevice(socket(), (m, d) -> {
            if (m.command() == VERSION) {
                d.send(StubDevice.versionReply(m));
            }
        })) {
            try (VfioUserConnection c = VfioUserConnection.connect(socket().toString(), TIMEOUT, null)) {
                long t0 = System.nanoTime();
                assertThatThrownBy(() -> c.regionRead(0, 0x88, 8))
                        .isInstanceOf(VfioUserException.class)
                        .hasMessageContaining("no reply to REGION_READ within 300 ms");
                assertThat(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0)).isBetween(250L, BOUND_MILLIS);
                assertThatThrownBy(() -> c.deviceInfo()).hasMessageContaining("is gone: no reply to REGION_READ");
            }
        }
    }

    /** The reply timeout of the tests where the device keeps the line busy and never answers. */
    private static final Duration BUSY_TIMEOUT = Duration.ofMillis(500);
    /**
     * Bound on a busy device's request: the timeout, a 100 ms receive slice, a send slice, and a loaded 2-core machine.
     * The @Timeout of those tests is longer: without a deadline check on every pass the request never returns, and
     * only a separate thread's timeout ends the test then.
     */
    private static final long BUSY_BOUND_MILLIS = 5_000;

    /**
     * A device that answers a register read one byte every 20 ms, a reply it never finishes: every receive slice
     * brings a byte, so the socket never times out, and only the deadline ends the request. The pace is well inside
     * the 100 ms slice so that a stalled stub thread on a loaded machine does not end it by an idle slice instead.
     */
    @Test
    @Timeout(value = 30, threadMode = Timeout.ThreadMode.SEPARATE_THREAD)
    void aReplyTrickledByteByByteIsGivenUpAtTheTimeout() throws Exception {
        try (StubDevice stub = new StubDevice(socket(), (m, d) -> {
            if (m.command() == VERSION) {
                d.send(StubDevice.versionReply(m));
            } else if (m.command() == REGION_READ) {
                // a reply header announcing 64 KiB, then its bytes one at a time: until the client hangs up
                byte[] reply = StubDevice.message(m.id(), m.command(), TYPE_REPLY, 0, HEADER + 65_536, new byte[65_536]);
                for (byte b : reply) {
                    d.send(new byte[]{b}); // throws once the client shut the socket: the script ends
                    Thread.sleep(20);
                }
            }
        }); VfioUserConnection c = VfioUserConnection.connect(socket().toString(), BUSY_TIMEOUT, null)) {
            long t0 = System.nanoTime();
            assertThatThrownBy(() -> c.regionRead(0, 0x88, 8))
                    .isInstanceOf(VfioUserException.class)
                    .hasMessageContaining("no rest of the reply to REGION_READ within 500 ms")
                    .satisfies(e -> assertThat(((VfioUserException) e).connectionLost()).isTrue());
            assertThat(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0)).isBetween(500L, BUSY_BOUND_MILLIS);
            assertThatThrownBy(() -> c.regionRead(0, 0x88, 8)).hasMessageContaining("is gone: no rest of the reply");
        }
    }

    /**
     * A device that answers a register read with DMA_WRITEs of its own, as fast as the socket takes them, each
     * served, and never with the reply: every pass of the exchange finds a command waiting, so no receive idles
     * into the timeout, and only the deadline ends the request. The writes come from a thread of their own so that
     * the stub goes on reading the client's replies (a full socket would end the request by the send's wait).
     * Serving each write takes the client a few ms (a slow DmaTarget), so the socket's backlog outlasts a stub
     * thread kept off a loaded machine's CPU for hundreds of ms: an empty socket would end it by an idle slice.
     */
    @Test
    @Timeout(value = 30, threadMode = Timeout.ThreadMode.SEPARATE_THREAD)
    void aDeviceThatSendsCommandsInsteadOfTheReplyIsGivenUpAtTheTimeout() throws Exception {
        AtomicBoolean stop = new AtomicBoolean();
        AtomicReference<Thread> chatter = new AtomicReference<>();
        try (Arena arena = Arena.ofShared()) {
            MemorySegment mem = arena.allocate(4096);
            VfioUserConnection.DmaTarget slowMemory = (address, length) -> {
                LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(5)); // the client's work per command, not a wait for anything
                return mem.asSlice(address, length);
            };
            try (StubDevice stub = new StubDevice(socket(), (m, d) -> {
                if (m.command() == VERSION) {
                    d.send(StubDevice.versionReply(m));
                } else if (m.command() == REGION_READ) {
                    chatter.set(Thread.ofPlatform().daemon().name("stub-chatter").start(() -> {
                        try {
                            for (int id = 1000; !stop.get(); id++) {
                                d.send(StubDevice.message(id, DMA_WRITE, TYPE_COMMAND, 0, -1, dma(0, new byte[]{1, 2, 3, 4})));
                            }
                        } catch (Exception ended) {
                            // the client shut the socket: the device is done
                        }
                    }));
                }
            })) {
                try (VfioUserConnection c = VfioUserConnection.connect(socket().toString(), BUSY_TIMEOUT, slowMemory)) {
                    long t0 = System.nanoTime();
                    assertThatThrownBy(() -> c.regionRead(0, 0x88, 8))
                            .isInstanceOf(VfioUserException.class)
                            .hasMessageContaining("no reply to REGION_READ within 500 ms (the device sent ")
                            .hasMessageContaining(" commands of its own meanwhile, the last DMA_WRITE)")
                            .satisfies(e -> assertThat(((VfioUserException) e).connectionLost()).isTrue());
                    assertThat(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0)).isBetween(500L, BUSY_BOUND_MILLIS);
                    assertThat(c.serverCommands()).as("the device's commands were served meanwhile").isPositive();
                } finally {
                    stop.set(true);
                    Thread t = chatter.get();
                    if (t != null) {
                        t.join(); // before the stub closes its descriptor, which another socket may then reuse
                    }
                }
            }
        }
    }

    /**
     * A region info whose cap_offset is near the top of the int range: the offset is checked against the reply
     * (where a sum in int arithmetic would wrap to a negative index) and the connection lost, naming it.
     */
    @Test
    void aRegionInfoCapabilityOffsetBeyondTheReplyLosesTheConnection() throws Exception {
        try (StubDevice stub = new StubDevice(socket(), (m, d) -> {
            if (m.command() == VERSION) {
                d.send(StubDevice.versionReply(m));
            } else if (m.command() == DEVICE_GET_REGION_INFO) {
                int index = ByteBuffer.wrap(m.payload()).order(ByteOrder.LITTLE_ENDIAN).getInt(RI_INDEX);
                d.send(StubDevice.reply(m, ByteBuffer.allocate(RI_BYTES).order(ByteOrder.LITTLE_ENDIAN)
                        .putInt(RI_BYTES).putInt(RI_FLAG_CAPS | VfioAbi.REGION_INFO_FLAG_READ).putInt(index)
                        .putInt(0x7FFFFFFC).putLong(0x4000).putLong(0).array()));
            }
        }); VfioUserConnection c = VfioUserConnection.connect(socket().toString(), ANSWERED, null)) {
            assertThatThrownBy(() -> c.regionInfo(0))
                    .isInstanceOf(VfioUserException.class)
                    .hasMessageContaining("cap_offset 0x7ffffffc")
                    .satisfies(e -> assertThat(((VfioUserException) e).connectionLost()).isTrue());
            assertThat(c.lostReason()).contains("cap_offset 0x7ffffffc");
        }
    }

    /** A reply when no request is outstanding: the watcher sees it and loses the connection, naming it. */
    @Test
    void anUnaskedReplyLosesTheConnection() throws Exception {
        CountDownLatch lost = new CountDownLatch(1);
        AtomicReference<String> why = new AtomicReference<>();
        try (StubDevice stub = new StubDevice(socket(), (m, d) -> {
            if (m.command() == VERSION) {
                d.send(StubDevice.versionReply(m));
                d.send(StubDevice.message(77, REGION_WRITE, TYPE_REPLY, 0, -1, new byte[16]));
            }
        }); VfioUserConnection c = VfioUserConnection.connect(socket().toString(), TIMEOUT, null)) {
            c.onLoss(r -> {
                why.set(r);
                lost.countDown();
            });
            c.startWatcher("test-watch");
            assertThat(lost.await(5, TimeUnit.SECONDS)).isTrue();
            assertThat(why.get()).contains("a reply to REGION_WRITE (msg_id 77) while no request was outstanding");
        }
    }

    /**
     * Server commands: a DMA_WRITE into mapped memory lands there, one to an address that is not mapped is
     * answered EFAULT, a DMA_READ reads back; the connection goes on (a register read after them works).
     */
    @Test
    void dmaWritesAndReadsFromTheServerAreServedAndBadAddressesRefused() throws Exception {
        AtomicReference<byte[]> dmaReadReply = new AtomicReference<>();
        AtomicReference<byte[]> badWriteReply = new AtomicReference<>();
        CountDownLatch served = new CountDownLatch(1);
        try (Arena arena = Arena.ofShared()) {
            MemorySegment mem = arena.allocate(4096);
            VfioUserConnection.DmaTarget target = (address, length) -> {
                if (address < 0x1000 || address + length > 0x2000) {
                    throw new IovaFault(address, length, "is not mapped");
                }
                return mem.asSlice(address - 0x1000, length);
            };
            try (StubDevice stub = new StubDevice(socket(), (m, d) -> {
                if (m.command() == VERSION) {
                    d.send(StubDevice.versionReply(m));
                } else if (m.command() == REGION_READ) {
                    // before answering, the device writes and reads client memory through messages
                    d.send(StubDevice.message(900, DMA_WRITE, TYPE_COMMAND, 0, -1, dma(0x1010, new byte[]{1, 2, 3, 4})));
                    d.send(StubDevice.message(901, DMA_WRITE, TYPE_COMMAND, 0, -1, dma(0x5000, new byte[]{9})));
                    d.send(StubDevice.message(902, DMA_READ, TYPE_COMMAND, 0, -1, dmaRead(0x1010, 4)));
                    d.send(StubDevice.readReply(m, 0x33));
                } else if (m.command() == DMA_READ && (m.flags() & FLAG_TYPE_MASK) == TYPE_REPLY) {
                    dmaReadReply.set(m.payload());
                } else if (m.command() == DMA_WRITE && m.id() == 901) {
                    badWriteReply.set(ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putInt(m.flags()).array());
                    served.countDown();
                }
            }); VfioUserConnection c = VfioUserConnection.connect(socket().toString(), Duration.ofSeconds(5), target)) {
                assertThat(c.regionRead(0, 0x08, 1)).isEqualTo(0x33);
                assertThat(mem.get(ValueLayout.JAVA_INT_UNALIGNED, 0x10)).isEqualTo(0x04030201);
                assertThat(served.await(5, TimeUnit.SECONDS)).isTrue();
                StubDevice.Message bad = stub.received.stream().filter(m -> m.id() == 901).findFirst().orElseThrow();
                assertThat(bad.flags() & FLAG_ERROR).as("EFAULT reply to the unmapped DMA_WRITE").isNotZero();
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
                while (dmaReadReply.get() == null && System.nanoTime() < deadline) {
                    Thread.onSpinWait();
                }
                byte[] r = dmaReadReply.get();
                assertThat(r).isNotNull();
                assertThat(ByteBuffer.wrap(r).order(ByteOrder.LITTLE_ENDIAN).getInt(16)).isEqualTo(0x04030201);
                assertThat(c.serverCommands()).isEqualTo(3);
                assertThat(c.lostReason()).isNull();
            }
        }
    }

    private static byte[] dma(long address, byte[] data) {
        return ByteBuffer.allocate(16 + data.length).order(ByteOrder.LITTLE_ENDIAN).putLong(address).putLong(data.length)
                .put(data).array();
    }

    private static byte[] dmaRead(long address, long count) {
        return ByteBuffer.allocate(16).order(ByteOrder.LITTLE_ENDIAN).putLong(address).putLong(count).array();
    }
}
