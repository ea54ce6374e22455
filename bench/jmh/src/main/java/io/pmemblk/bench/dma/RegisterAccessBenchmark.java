package io.pmemblk.bench.dma;

import io.pmemblk.bench.MeasuredRun;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.vfio.VfioAbi;
import io.pmemblk.dma.vfiouser.client.VfioUserConnection;
import io.pmemblk.dma.vfiouser.client.VfioUserMmio;
import io.pmemblk.dma.vfiouser.device.IoatVfioUserDevice;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.TearDown;

/**
 * What one I/OAT register access costs the driver: against the software device in this process (a method call on
 * its register file), and against the same model served over vfio-user by libvfio-user ({@code pmemblk
 * dma-device}'s device, here in this JVM on its own run-loop thread: the socket hop and the server's message
 * handling are all there, only the process boundary's scheduling is not). The register is channel 0's CHANERR
 * (write 0: write-1-to-clear of nothing, no side effect), so every access is the bare cost of reaching the device.
 * <ul>
 *   <li>{@code vfioUserPostedWrite}: a REGION_WRITE with No_reply, what the driver's doorbell (DMACOUNT) costs;
 *       a stream of them is bounded by how fast the server drains the socket;</li>
 *   <li>{@code vfioUserRead}: a REGION_READ, a full round trip;</li>
 *   <li>{@code vfioUserWrite}: a REGION_WRITE waiting for its reply (what a non-posted doorbell would cost);</li>
 *   <li>{@code inProcessWrite}, {@code inProcessRead}: the software device's register file.</li>
 * </ul>
 * Needs libvfio-user (../shared/peers/build-libvfio-user.sh, or -Dpmemblk.libvfio-user=PATH).
 */
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
public class RegisterAccessBenchmark extends MeasuredRun {
    private static final long CHANERR = IoatSpec.channelBase(0) + IoatSpec.CHANERR;

    private Path dir;
    private IoatVfioUserDevice served;
    private VfioUserConnection connection;
    private Mmio postedBar;
    private Mmio waitingBar;
    private SoftIoatDevice local;

    @Setup(Level.Trial)
    public void setUp() throws Exception {
        dir = Files.createTempDirectory("pmemblk-regbench");
        Path socket = dir.resolve("ioat.sock");
        served = IoatVfioUserDevice.start(socket, 1, 20);
        connection = VfioUserConnection.connect(socket.toString(), Duration.ofSeconds(10), null);
        long bar0 = connection.regionInfo(VfioAbi.PCI_BAR0_REGION).size();
        postedBar = new VfioUserMmio(connection, VfioAbi.PCI_BAR0_REGION, bar0, true);
        waitingBar = new VfioUserMmio(connection, VfioAbi.PCI_BAR0_REGION, bar0, false);
        local = new SoftIoatDevice(new IovaSpace(), 1, 20, SoftFaults.NONE);
    }

    @TearDown(Level.Trial)
    public void tearDown() throws Exception {
        connection.close();
        served.close();
        local.close();
        Files.deleteIfExists(dir.resolve("ioat.sock"));
        Files.deleteIfExists(dir);
    }

    @Benchmark
    public void vfioUserPostedWrite() {
        postedBar.write32(CHANERR, 0);
    }

    @Benchmark
    public void vfioUserWrite() {
        waitingBar.write32(CHANERR, 0);
    }

    @Benchmark
    public int vfioUserRead() {
        return postedBar.read32(CHANERR);
    }

    @Benchmark
    public void inProcessWrite() {
        local.write32(CHANERR, 0);
    }

    @Benchmark
    public int inProcessRead() {
        return local.read32(CHANERR);
    }
}
