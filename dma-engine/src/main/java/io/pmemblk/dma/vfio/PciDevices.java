package io.pmemblk.dma.vfio;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.stream.Stream;

/**
 * The PCI devices pmemblk can drive through VFIO, found in sysfs: Intel I/OAT (CBDMA) channels by the IDs SPDK
 * and Linux's ioatdma accept (shared/notes/vfio.md §2), and QEMU's edu (1234:11e8). For each: its driver, its
 * IOMMU group, whether it can be used now, and why not.
 */
public final class PciDevices {
    private PciDevices() {}

    public enum Kind { IOAT, EDU }

    /** One candidate. {@code group} is -1 without an IOMMU group; {@code problem} is null when usable. */
    public record Candidate(String address, int vendor, int device, Kind kind, String driver, int group, String problem) {
        public boolean usable() {
            return problem == null;
        }
    }

    static final int INTEL = 0x8086, QEMU = 0x1234, EDU_DEVICE = 0x11e8;
    /** I/OAT v3 device IDs (SPDK include/spdk/pci_ids.h, lib/env_dpdk/pci_ioat.c; Linux drivers/dma/ioat). */
    private static final int[][] IOAT_RANGES = {
            {0x3c20, 0x3c27}, {0x3c2e, 0x3c2f}, {0x0e20, 0x0e27}, {0x0e2e, 0x0e2f}, {0x2f20, 0x2f27}, {0x2f2e, 0x2f2f},
            {0x0c50, 0x0c53}, {0x6f50, 0x6f53}, {0x6f20, 0x6f27}, {0x6f2e, 0x6f2f}, {0x2021, 0x2021}, {0x0b00, 0x0b00}};

    public static final Path SYSFS = Path.of("/sys/bus/pci/devices");

    static Kind kind(int vendor, int device) {
        if (vendor == QEMU && device == EDU_DEVICE) {
            return Kind.EDU;
        }
        if (vendor == INTEL) {
            for (int[] r : IOAT_RANGES) {
                if (device >= r[0] && device <= r[1]) {
                    return Kind.IOAT;
                }
            }
        }
        return null;
    }

    /** Every candidate under {@code sysfs} (a /sys/bus/pci/devices tree), sorted by address. */
    public static List<Candidate> scan(Path sysfs, Path devVfio) {
        List<Candidate> out = new ArrayList<>();
        if (!Files.isDirectory(sysfs)) {
            return out;
        }
        try (Stream<Path> s = Files.list(sysfs)) {
            for (Path d : s.sorted().toList()) {
                int vendor = hex(d.resolve("vendor"));
                int device = hex(d.resolve("device"));
                Kind k = kind(vendor, device);
                if (k == null) {
                    continue;
                }
                String address = d.getFileName().toString();
                String driver = link(d.resolve("driver"));
                String g = link(d.resolve("iommu_group"));
                int group = g == null ? -1 : Integer.parseInt(g);
                String problem = null;
                if (group < 0) {
                    problem = "no IOMMU group: the IOMMU is off (boot with intel_iommu=on or amd_iommu=on)";
                } else if (!"vfio-pci".equals(driver)) {
                    problem = (driver == null ? "bound to no driver" : "bound to " + driver) + ", not vfio-pci; bind it: "
                            + bindCommands(address);
                } else if (!Files.exists(devVfio.resolve(Integer.toString(group)))) {
                    problem = devVfio.resolve(Integer.toString(group)) + " is missing";
                }
                out.add(new Candidate(address, vendor, device, k, driver, group, problem));
            }
        } catch (IOException e) {
            throw new UncheckedIOException("listing " + sysfs, e);
        }
        return out;
    }

    public static List<Candidate> scan() {
        return scan(SYSFS, Path.of("/dev/vfio"));
    }

    /** Why nothing can be used, when {@link #scan} finds nothing usable: for {@code dma list} and serve's error. */
    public static String nothingUsable(List<Candidate> found, Path devVfio) {
        StringBuilder b = new StringBuilder();
        if (found.isEmpty()) {
            b.append("no I/OAT (Intel CBDMA) or QEMU edu PCI device on this machine");
        } else {
            b.append("no candidate is bound to vfio-pci (see pmemblk dma list for the bind commands)");
        }
        if (!Files.isDirectory(devVfio)) {
            b.append("; ").append(devVfio).append(" does not exist (modprobe vfio-pci; the kernel needs an IOMMU:"
                    + " intel_iommu=on)");
        }
        return b.toString();
    }

    /** The commands that hand {@code address} to vfio-pci (driver_override, then a new probe). */
    public static String bindCommands(String address) {
        return "modprobe vfio-pci; echo vfio-pci > /sys/bus/pci/devices/" + address + "/driver_override; "
                + "[ -e /sys/bus/pci/devices/" + address + "/driver ] && echo " + address + " > /sys/bus/pci/devices/"
                + address + "/driver/unbind; echo " + address + " > /sys/bus/pci/drivers_probe";
    }

    /** The devices of IOMMU group {@code number}, with their drivers, for a "group not viable" message. */
    static String groupMembers(int number) {
        Path dir = Path.of("/sys/kernel/iommu_groups/" + number + "/devices");
        try (Stream<Path> s = Files.list(dir)) {
            return s.map(p -> p.getFileName() + " (" + java.util.Objects.requireNonNullElse(
                    link(SYSFS.resolve(p.getFileName().toString()).resolve("driver")), "no driver") + ")").sorted().toList().toString();
        } catch (IOException e) {
            return "(cannot list " + dir + ")";
        }
    }

    private static int hex(Path p) {
        try {
            String t = Files.readString(p).trim().toLowerCase(Locale.ROOT);
            return Integer.parseInt(t.startsWith("0x") ? t.substring(2) : t, 16);
        } catch (IOException | NumberFormatException e) {
            return -1;
        }
    }

    private static String link(Path p) {
        try {
            return Files.isSymbolicLink(p) ? Files.readSymbolicLink(p).getFileName().toString() : null;
        } catch (IOException e) {
            return null;
        }
    }
}
