package io.pmemblk.dma.vfiouser.client;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pmemblk.dma.vfio.VfioAbi;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The client against a device it did not write: libvfio-user's sample {@code gpio-pci-idio-16}
 * (samples/gpio-pci-idio-16.c at efd091b): PCI 494f:0dc8, a 256-byte BAR2 whose input registers 0x1 and 0x5
 * read bit i set while output pin i has been pulsed a multiple of 3 times (every pin starts at 0, so 0xff), and
 * whose output registers 0x0 and 0x4 pulse the pins whose bits are written; one INTx, DMA regions accepted.
 */
class GpioSampleTest {
    private static final Duration TIMEOUT = Duration.ofSeconds(5);

    @TempDir
    Path dir;

    @Test
    void configSpaceAndBar2ReadBackAsTheSampleDefinesThem() throws Exception {
        try (LibvfioUserSample gpio = LibvfioUserSample.start("gpio-pci-idio-16", dir.resolve("gpio.sock"), dir.resolve("gpio.log"));
             VfioUserConnection c = VfioUserConnection.connect(gpio.socket().toString(), TIMEOUT, null)) {
            VfioUserConnection.DeviceInfo info = c.deviceInfo();
            assertThat(info.flags() & VfioAbi.DEVICE_FLAGS_PCI).as("a PCI device").isNotZero();
            assertThat(info.regions()).isGreaterThan(VfioAbi.PCI_CONFIG_REGION);

            VfioUserConnection.RegionInfo cfg = c.regionInfo(VfioAbi.PCI_CONFIG_REGION);
            assertThat(cfg.size()).as("conventional PCI configuration space").isEqualTo(256);
            VfioUserMmio config = new VfioUserMmio(c, VfioAbi.PCI_CONFIG_REGION, cfg.size(), false);
            assertThat(config.read16(VfioUserSpec.PCI_VENDOR_ID)).isEqualTo(0x494f);
            assertThat(config.read16(VfioUserSpec.PCI_DEVICE_ID)).isEqualTo(0x0dc8);
            assertThat(config.read32(0)).isEqualTo(0x0dc8_494f);

            VfioUserConnection.RegionInfo bar2 = c.regionInfo(2);
            assertThat(bar2.size()).isEqualTo(0x100);
            assertThat(bar2.readable() && bar2.writable()).isTrue();
            VfioUserMmio bar = new VfioUserMmio(c, 2, bar2.size(), true); // posted writes, as the engine's BAR0
            assertThat(bar.read8(0x1)).as("pins 0-7, none pulsed").isEqualTo(0xff);
            assertThat(bar.read8(0x5)).as("pins 8-15, none pulsed").isEqualTo(0xff);
            bar.write8(0x0, 0x01); // pin 0 pulsed once: posted, yet the read after it sees it (in-order server)
            assertThat(bar.read8(0x1)).isEqualTo(0xfe);
            bar.write8(0x0, 0x01);
            bar.write8(0x0, 0x01);
            assertThat(bar.read8(0x1)).as("pin 0 pulsed 3 times").isEqualTo(0xff);
            bar.write8(0x4, 0x80); // pin 15
            assertThat(bar.read8(0x5)).isEqualTo(0x7f);
            assertThat(bar.read8(0x1)).isEqualTo(0xff);
            assertThat(c.postedWrites()).isEqualTo(4);
            assertThat(bar.failedAccesses()).isZero();

            assertThat(c.irqCount(VfioAbi.PCI_INTX_IRQ)).as("the sample's one INTx").isEqualTo(1);
            assertThat(c.irqCount(VfioAbi.PCI_MSIX_IRQ)).isZero();
        }
    }

    /** DMA_MAP with a memfd's descriptor is taken; memory with no file behind it is refused before any message. */
    @Test
    void dmaRegionsAreGivenByDescriptorAndAnonymousMemoryIsRefusedNamingIt() throws Exception {
        try (LibvfioUserSample gpio = LibvfioUserSample.start("gpio-pci-idio-16", dir.resolve("gpio.sock"), dir.resolve("gpio.log"));
             VfioUserConnection c = VfioUserConnection.connect(gpio.socket().toString(), TIMEOUT, null);
             Arena arena = Arena.ofShared()) {
            VfioUserIovaSpace space = new VfioUserIovaSpace(VfioUserEngine.IOVA_BASE, 1L << 40);
            assertThat(space.attach(c)).isZero();
            MemorySegment shared = space.allocate(3 * 4096 + 100, 64, arena);
            long iova = space.map(shared);
            assertThat(iova).isEqualTo(VfioUserEngine.IOVA_BASE);
            assertThat(space.mappedRegions()).isEqualTo(1);

            MemorySegment anonymous = arena.allocate(4096, 4096);
            assertThatThrownBy(() -> space.map(anonymous))
                    .isInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("have no file behind them");
            assertThat(space.regions()).as("nothing mapped for it").isEqualTo(1);

            space.unmap(iova);
            assertThat(space.mappedRegions()).isZero();

            // a slice of someone else's mapping of a file (guest RAM as vhost maps it): the file offset of its page
            int memfd = io.pmemblk.posix.SharedMemory.memfd("guest-ram", 16 * 4096);
            MemorySegment ram;
            try {
                ram = io.pmemblk.posix.SharedMemory.map(memfd, 2 * 4096, 8 * 4096, arena);
            } finally {
                io.pmemblk.posix.Libc.close(memfd);
            }
            long sliceIova = space.map(ram.asSlice(4096 + 100, 5000));
            assertThat(sliceIova & 4095).as("byte 0 keeps its offset in the page").isEqualTo(100);
            space.unmap(sliceIova);
            // the connection still works after the map and unmap: both were answered
            assertThat(new VfioUserMmio(c, VfioAbi.PCI_CONFIG_REGION, 256, false).read16(0)).isEqualTo(0x494f);
            space.release();
        }
        String log = Files.readString(dir.resolve("gpio.log"));
        // the sample's own log: it got the region with our descriptor and mapped it (4 pages: 3 and a bit), then let it go
        assertThat(log).contains("adding DMA region [0x100000, 0x104000) offset=0 flags=0x3")
                .contains("mapped DMA region iova=[0x100000, 0x104000)")
                .contains("removing DMA region [0x100000, 0x104000)")
                // the slice: its two pages at the next IOVA (after a guard page), file offset 3 pages in
                .contains("adding DMA region [0x105000, 0x107000) offset=0x3000 flags=0x3");
    }

    /**
     * The doorbell path allocates nothing once compiled: a posted region write and a read reuse the connection's
     * buffers. Measured with the thread's allocation counter over batches of 5,000 of each; the path must reach a
     * batch that allocates (almost) nothing within 40 batches (before the JIT's optimising tier has compiled it,
     * some 40 bytes an access were seen in lower tiers; an allocating send path allocates ~190 bytes an access in
     * every batch).
     */
    @Test
    void postedWritesAndReadsAllocateNothing() throws Exception {
        try (LibvfioUserSample gpio = LibvfioUserSample.start("gpio-pci-idio-16", dir.resolve("gpio.sock"), dir.resolve("gpio.log"));
             VfioUserConnection c = VfioUserConnection.connect(gpio.socket().toString(), TIMEOUT, null)) {
            VfioUserMmio bar = new VfioUserMmio(c, 2, 0x100, true);
            long fewest = Long.MAX_VALUE;
            int sink = 0;
            for (int batch = 0; batch < 40 && fewest >= 5_000; batch++) {
                long before = allocatedBytes();
                for (int i = 0; i < 5_000; i++) {
                    bar.write8(0x0, 0);
                    sink += bar.read8(0x1);
                }
                fewest = Math.min(fewest, allocatedBytes() - before);
            }
            assertThat(sink % 0xff).isZero();
            assertThat(fewest).as("fewest bytes allocated by a batch of 5,000 posted writes and 5,000 reads").isLessThan(5_000);
            assertThat(bar.failedAccesses()).isZero();
        }
    }

    /** This thread's allocation counter, through the platform MBean (this module reads java.management only). */
    private static long allocatedBytes() throws Exception {
        return (Long) java.lang.management.ManagementFactory.getPlatformMBeanServer().getAttribute(
                new javax.management.ObjectName("java.lang:type=Threading"), "CurrentThreadAllocatedBytes");
    }

    /** The engine checks what it connected to: this is not an I/OAT device, and it says so. */
    @Test
    void theEngineRefusesADeviceThatIsNotIoat() throws Exception {
        try (LibvfioUserSample gpio = LibvfioUserSample.start("gpio-pci-idio-16", dir.resolve("gpio.sock"), dir.resolve("gpio.log"))) {
            assertThatThrownBy(() -> VfioUserEngine.open(gpio.socket().toString(), 64, TIMEOUT))
                    .isInstanceOf(VfioUserException.class)
                    .hasMessageContaining("494f:0dc8")
                    .hasMessageContaining("not an I/OAT DMA engine");
        }
    }
}
