package io.pmemblk.bench.dma;

import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.vfio.VfioAbi;
import io.pmemblk.dma.vfiouser.client.VfioUserConnection;
import io.pmemblk.dma.vfiouser.client.VfioUserMmio;
import io.pmemblk.dma.vfiouser.device.IoatVfioUserDevice;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

/**
 * What one I/OAT register access costs the driver (the calling thread, {@code IoatChannel}) when the device is in
 * process ({@link SoftIoatDevice} behind {@link Mmio}: a volatile access) against the same device model served over
 * vfio-user ({@link VfioUserMmio}: one REGION_READ/REGION_WRITE message on a unix socket): a read (a round trip), a
 * write that waits for the reply (a round trip, as a configuration-space write), and a posted write (No_reply: one
 * sendmsg, the form the doorbell, DMACOUNT, takes; the server's side is not awaited, so its score is the sender's
 * cost while the server keeps up, and the server's rate when it does not).
 *
 * <p>The registers touched have no effect on a channel that was never started: CHANCMP's low half (written: the
 * completion address a start would use) and CHANSTS (read). DMACOUNT itself is not written here: on an unstarted
 * channel it would make the engine fetch a ring that is not there.
 *
 * <p>The device is {@code pmemblk dma-device} when {@code -Dpmemblk.bench.vfio-user.socket=PATH} names its socket
 * (a process of its own, as in production: {@code -jvmArgsAppend -Dpmemblk.bench.vfio-user.socket=/tmp/d.sock});
 * otherwise one is started in this JVM on a temporary socket (the same messages, between two threads of one process).
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class VfioUserRegisterBenchmark {
    private static final long CHANNEL0 = IoatSpec.CHANNEL_MMIO_SIZE;
    private static final long CHANCMP_LOW = CHANNEL0 + IoatSpec.CHANCMP;
    private static final long CHANSTS = CHANNEL0 + IoatSpec.CHANSTS;

    private SoftIoatDevice inProcess;
    private IoatVfioUserDevice served;
    private Path tempDir;
    private VfioUserConnection connection;
    private Mmio posted;
    private Mmio waited;
    private int value;
    /** The last value written to the served device's CHANCMP (0: never), checked at the end. */
    private int servedValue;

    @Setup(Level.Trial)
    public void setUp() throws IOException {
        inProcess = new SoftIoatDevice(new IovaSpace(), 1, 20);
        String socket = System.getProperty("pmemblk.bench.vfio-user.socket");
        if (socket == null || socket.isBlank()) {
            tempDir = Files.createTempDirectory("pmemblk-vfio-user-bench");
            served = IoatVfioUserDevice.start(tempDir.resolve("dev.sock"), 1, 20);
            socket = served.socket().toString();
        }
        connection = VfioUserConnection.connect(socket, Duration.ofSeconds(5), null);
        long size = connection.regionInfo(VfioAbi.PCI_BAR0_REGION).size();
        posted = new VfioUserMmio(connection, VfioAbi.PCI_BAR0_REGION, size, true);
        waited = new VfioUserMmio(connection, VfioAbi.PCI_BAR0_REGION, size, false);
        waited.write32(CHANCMP_LOW, 0); // an external device keeps what an earlier fork wrote
        // The model must answer what it is, or the figures would be of error replies.
        if (waited.read8(IoatSpec.CBVER) != inProcess.read8(IoatSpec.CBVER)) {
            throw new IllegalStateException("the device at " + socket + " reads CBVER 0x"
                    + Integer.toHexString(waited.read8(IoatSpec.CBVER)) + ", the model 0x"
                    + Integer.toHexString(inProcess.read8(IoatSpec.CBVER)));
        }
    }

    @TearDown(Level.Trial)
    public void tearDown() throws IOException {
        // A posted write the server has not taken yet is not lost: this read comes after it on the same socket.
        long back = waited.read32(CHANCMP_LOW) & 0xffff_ffffL;
        if (back != (servedValue & 0xffff_ffffL) || ((VfioUserMmio) posted).failedAccesses() != 0) {
            throw new IllegalStateException("CHANCMP read back 0x" + Long.toHexString(back) + " after writing 0x"
                    + Integer.toHexString(servedValue) + "; failed posted accesses: " + ((VfioUserMmio) posted).failedAccesses());
        }
        connection.close();
        if (served != null) {
            served.close();
            Files.deleteIfExists(tempDir.resolve("dev.sock"));
            Files.deleteIfExists(tempDir);
        }
        inProcess.close();
    }

    @Benchmark
    public void inProcessWrite() {
        inProcess.write32(CHANCMP_LOW, ++value);
    }

    @Benchmark
    public long inProcessRead() {
        return inProcess.read64(CHANSTS);
    }

    @Benchmark
    public void vfioUserPostedWrite() {
        posted.write32(CHANCMP_LOW, ++servedValue);
    }

    @Benchmark
    public void vfioUserWrite() {
        waited.write32(CHANCMP_LOW, ++servedValue);
    }

    @Benchmark
    public long vfioUserRead() {
        return waited.read64(CHANSTS);
    }
}
