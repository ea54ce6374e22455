package io.pmemblk.cli;

import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.edu.EduDevice;
import io.pmemblk.dma.edu.EduSelfTest;
import io.pmemblk.dma.edu.EduSpec;
import io.pmemblk.dma.vfio.EventfdInterrupt;
import io.pmemblk.dma.vfio.PciDevices;
import io.pmemblk.dma.vfio.VfioAbi;
import io.pmemblk.dma.vfio.VfioContainer;
import io.pmemblk.dma.vfio.VfioDevice;
import io.pmemblk.dma.vfio.VfioException;
import io.pmemblk.dma.vfio.VfioIovaSpace;
import io.pmemblk.dma.vfio.VfioEngine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.lang.foreign.Arena;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.TimeUnit;

/** {@code pmemblk dma list|check}: the PCI DMA devices dma.engine=vfio can drive, and a check of one. */
@Command(name = "dma", mixinStandardHelpOptions = true,
        description = "PCI DMA devices for dma.engine=vfio.",
        subcommands = {DmaCommand.ListCommand.class, DmaCommand.CheckCommand.class})
final class DmaCommand implements Callable<Integer> {
    @Override
    public Integer call() {
        return new ListCommand().call();
    }

    @Command(name = "list", mixinStandardHelpOptions = true,
            description = "Show the I/OAT and edu PCI devices: driver, IOMMU group, whether usable, and how to bind them.")
    static final class ListCommand implements Callable<Integer> {
        @Override
        public Integer call() {
            Path devVfio = Path.of("/dev/vfio");
            List<PciDevices.Candidate> found = PciDevices.scan();
            for (PciDevices.Candidate c : found) {
                System.out.printf("%s %04x:%04x %-4s driver=%s iommu_group=%s %s%n", c.address(), c.vendor(), c.device(),
                        c.kind(), c.driver() == null ? "none" : c.driver(), c.group() < 0 ? "none" : c.group(),
                        c.usable() ? "usable" : "not usable: " + c.problem());
            }
            if (found.stream().noneMatch(PciDevices.Candidate::usable)) {
                System.out.println("nothing to use for dma.engine=vfio: " + PciDevices.nothingUsable(found, devVfio));
            }
            return 0;
        }
    }

    /**
     * The end-to-end proof on an edu device ({@link EduSelfTest}) through the same VFIO layer serve uses; the
     * IOMMU refuses the DMA to the unmapped IOVA and the kernel logs the fault.
     */
    @Command(name = "check", mixinStandardHelpOptions = true,
            description = "Copy through an edu device, then DMA to an unmapped IOVA and check the IOMMU stopped it.")
    static final class CheckCommand implements Callable<Integer> {
        @Option(names = "--device", description = "PCI address of the edu device (default: the first usable one)")
        String address;

        @Override
        public Integer call() throws Exception {
            PciDevices.Candidate c = PciDevices.scan().stream()
                    .filter(x -> x.kind() == PciDevices.Kind.EDU && x.usable() && (address == null || x.address().equals(address)))
                    .findFirst().orElseThrow(() -> new VfioException("no usable edu device" + (address == null ? "" : " at " + address)
                            + " (pmemblk dma list)"));
            try (VfioContainer container = VfioContainer.open(); Arena arena = Arena.ofShared()) {
                VfioDevice d = container.attach(c.group(), c.address()).device(c.address());
                d.enableBusMaster();
                Mmio bar = d.mapBar(0, EduSpec.BAR0_SIZE);
                EventfdInterrupt msi = d.enableInterrupts(VfioAbi.PCI_MSI_IRQ, 1).getFirst();
                EduDevice edu = new EduDevice(bar, msi);
                VfioIovaSpace space = new VfioIovaSpace(container, VfioEngine.IOVA_BASE, EduSpec.DMA_LIMIT);
                EduSelfTest.Result r = EduSelfTest.run(edu, space, arena, TimeUnit.SECONDS.toNanos(5));
                if (!r.copyFinished()) {
                    System.out.println("check: copy: a transfer did not finish in 5 s");
                    return 1;
                }
                System.out.println("check: copy RAM->edu->RAM of 4096 bytes in " + r.transfers() + " transfers ("
                        + msi.deviceInterrupts() + " interrupts): " + (r.copied() ? "match" : "MISMATCH"));
                System.out.println("check: DMA to unmapped IOVA 0x" + Long.toHexString(r.unmappedIova())
                        + ": device reports " + (r.refusedDone() ? "done" : "not done") + ", bytes changed: "
                        + r.bytesChanged());
                return r.passed() ? 0 : 1;
            }
        }
    }
}
