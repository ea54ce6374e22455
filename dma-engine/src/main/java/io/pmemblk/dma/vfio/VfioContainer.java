package io.pmemblk.dma.vfio;

import static io.pmemblk.dma.vfio.VfioAbi.*;
import static io.pmemblk.posix.Errno.*;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

import io.pmemblk.posix.Errno;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A VFIO container ({@code /dev/vfio/vfio}) with the type1v2 IOMMU: one IOMMU domain, the groups attached to it,
 * and the DMA mappings made in it. Set-up follows the kernel's documented order (shared/notes/vfio.md §1.1: API
 * version, extension, group viable, group to container, SET_IOMMU, IOMMU info). Closing detaches and closes the
 * groups (and their devices) first, then the container, whose release drops any mapping still left.
 */
public final class VfioContainer implements AutoCloseable {
    /** An IOVA window the IOMMU accepts, end inclusive (VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE). */
    public record IovaRange(long start, long end) { }

    private final int fd;
    private final List<VfioGroup> groups = new ArrayList<>();
    private boolean iommuSet;
    private long pageSizes;
    private List<IovaRange> ranges = List.of();
    private boolean closed;

    private VfioContainer(int fd) {
        this.fd = fd;
    }

    /** Opens /dev/vfio/vfio and checks the API version and type1v2 support. */
    public static VfioContainer open() throws VfioException {
        Path dev = Path.of("/dev/vfio/vfio");
        if (!Files.exists(dev)) {
            throw new VfioException("/dev/vfio/vfio does not exist: the vfio-pci driver is not loaded (modprobe vfio-pci),"
                    + " or this kernel has no VFIO");
        }
        int fd;
        try {
            fd = FileCalls.open(dev.toString(), FileCalls.O_RDWR, 0);
        } catch (NativeException e) {
            throw new VfioException("cannot open /dev/vfio/vfio: " + e.getMessage() + (e.errno() == EACCES || e.errno() == EPERM
                    ? " (run as root, or give this user the VFIO group's device node)" : ""), e);
        }
        VfioContainer c = new VfioContainer(fd);
        try {
            int api = Libc.ioctl(fd, GET_API_VERSION, 0L, "VFIO_GET_API_VERSION");
            if (api != API_VERSION) {
                throw new VfioException("VFIO API version " + api + ", this driver speaks version " + API_VERSION);
            }
            if (Libc.ioctl(fd, CHECK_EXTENSION, TYPE1V2_IOMMU, "VFIO_CHECK_EXTENSION") <= 0) {
                throw new VfioException("the kernel's VFIO has no type1v2 IOMMU backend: no IOMMU is enabled (boot with"
                        + " intel_iommu=on or amd_iommu=on, and enable VT-d/AMD-Vi in the firmware)");
            }
            return c;
        } catch (NativeException e) {
            c.close();
            throw new VfioException("VFIO container set-up failed: " + e.getMessage(), e);
        } catch (VfioException e) {
            c.close();
            throw e;
        }
    }

    /**
     * Attaches IOMMU group {@code number} ({@code /dev/vfio/N}): it must be viable (every device in it bound to
     * vfio-pci or to no driver). The first group also sets the IOMMU type and reads its page sizes and IOVA ranges.
     */
    public VfioGroup attach(int number, String forDevice) throws VfioException {
        Path node = Path.of("/dev/vfio/" + number);
        if (!Files.exists(node)) {
            throw new VfioException(forDevice + " is in IOMMU group " + number + " but /dev/vfio/" + number
                    + " does not exist: bind it to vfio-pci first (" + PciDevices.bindCommands(forDevice) + ")");
        }
        int gfd;
        try {
            gfd = FileCalls.open(node.toString(), FileCalls.O_RDWR, 0);
        } catch (NativeException e) {
            throw new VfioException("cannot open " + node + ": " + e.getMessage() + (e.errno() == EBUSY
                    ? " (another process, e.g. another pmemblk or QEMU, holds the group)" : ""), e);
        }
        VfioGroup g = new VfioGroup(this, number, gfd);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment st = a.allocate(GROUP_STATUS);
            st.set(JAVA_INT, offset(GROUP_STATUS, "argsz"), (int) GROUP_STATUS.byteSize());
            Libc.ioctl(gfd, GROUP_GET_STATUS, st, "VFIO_GROUP_GET_STATUS");
            if ((st.get(JAVA_INT, offset(GROUP_STATUS, "flags")) & GROUP_FLAGS_VIABLE) == 0) {
                throw new VfioException("IOMMU group " + number + " is not viable: every device in it must be bound to"
                        + " vfio-pci (or to no driver); its devices: " + PciDevices.groupMembers(number)
                        + ". Bind each with: " + PciDevices.bindCommands("ADDR"));
            }
            MemorySegment cfd = a.allocateFrom(JAVA_INT, fd);
            Libc.ioctl(gfd, GROUP_SET_CONTAINER, cfd, "VFIO_GROUP_SET_CONTAINER");
            g.attached = true;
            if (!iommuSet) {
                Libc.ioctl(fd, SET_IOMMU, TYPE1V2_IOMMU, "VFIO_SET_IOMMU(TYPE1v2)");
                iommuSet = true;
                readIommuInfo();
            }
        } catch (NativeException e) {
            g.close();
            throw new VfioException("attaching IOMMU group " + number + " failed: " + e.getMessage(), e);
        } catch (VfioException e) {
            g.close();
            throw e;
        }
        groups.add(g);
        return g;
    }

    /** VFIO_IOMMU_GET_INFO: page sizes, then (if offered) the capability chain for the IOVA ranges. */
    private void readIommuInfo() throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment info = a.allocate(IOMMU_INFO);
            info.set(JAVA_INT, 0, (int) IOMMU_INFO.byteSize());
            Libc.ioctl(fd, IOMMU_GET_INFO, info, "VFIO_IOMMU_GET_INFO");
            int argsz = info.get(JAVA_INT, 0);
            if ((info.get(JAVA_INT, offset(IOMMU_INFO, "flags")) & IOMMU_INFO_CAPS) != 0 && argsz > IOMMU_INFO.byteSize()) {
                info = a.allocate(argsz, 8);
                info.set(JAVA_INT, 0, argsz);
                Libc.ioctl(fd, IOMMU_GET_INFO, info, "VFIO_IOMMU_GET_INFO");
            }
            pageSizes = info.get(JAVA_LONG, offset(IOMMU_INFO, "iova_pgsizes"));
            ranges = iovaRanges(info);
        }
    }

    /** The IOVA ranges in an IOMMU info buffer's capability chain; empty when it offers none (then any IOVA). */
    static List<IovaRange> iovaRanges(MemorySegment info) {
        List<IovaRange> out = new ArrayList<>();
        if ((info.get(JAVA_INT, offset(IOMMU_INFO, "flags")) & IOMMU_INFO_CAPS) == 0) {
            return out;
        }
        long next = Integer.toUnsignedLong(info.get(JAVA_INT, offset(IOMMU_INFO, "cap_offset")));
        for (int hops = 0; next != 0 && next + 16 <= info.byteSize() && hops < 64; hops++) {
            int id = Short.toUnsignedInt(info.get(JAVA_SHORT, next + offset(CAP_HEADER, "id")));
            if (id == IOMMU_TYPE1_INFO_CAP_IOVA_RANGE) {
                int n = info.get(JAVA_INT, next + 8);
                for (int i = 0; i < n && next + 16 + 16L * (i + 1) <= info.byteSize(); i++) {
                    out.add(new IovaRange(info.get(JAVA_LONG, next + 16 + 16L * i), info.get(JAVA_LONG, next + 24 + 16L * i)));
                }
            }
            next = Integer.toUnsignedLong(info.get(JAVA_INT, next + offset(CAP_HEADER, "next")));
        }
        return out;
    }

    /** Bitmap of the IOMMU's page sizes (bit n: 2^n bytes). */
    public long pageSizes() {
        return pageSizes;
    }

    /** The IOVA windows the IOMMU accepts (empty: it reported none). */
    public List<IovaRange> iovaRanges() {
        return ranges;
    }

    /**
     * VFIO_IOMMU_MAP_DMA of {@code size} bytes at {@code vaddr} (page aligned) to {@code iova}, readable and
     * writable by the device. The kernel pins the pages; what it refuses to pin gets the fix in the message.
     */
    public void mapDma(long vaddr, long iova, long size) throws VfioException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment m = a.allocate(DMA_MAP);
            m.set(JAVA_INT, offset(DMA_MAP, "argsz"), (int) DMA_MAP.byteSize());
            m.set(JAVA_INT, offset(DMA_MAP, "flags"), DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE);
            m.set(JAVA_LONG, offset(DMA_MAP, "vaddr"), vaddr);
            m.set(JAVA_LONG, offset(DMA_MAP, "iova"), iova);
            m.set(JAVA_LONG, offset(DMA_MAP, "size"), size);
            Libc.ioctl(fd, IOMMU_MAP_DMA, m, "VFIO_IOMMU_MAP_DMA");
        } catch (NativeException e) {
            throw new VfioException(mapFailure(e.errno(), vaddr, iova, size) + " [" + e.getMessage() + "]", e);
        }
    }

    /** What a MAP_DMA errno means for pmemblk (mm/gup.c check_vma_flags, vfio_iommu_type1.c; notes §1.3). */
    static String mapFailure(int errno, long vaddr, long iova, long size) {
        String what = "mapping " + size + " bytes at 0x" + Long.toHexString(vaddr) + " for DMA (IOVA 0x"
                + Long.toHexString(iova) + ") failed: ";
        return what + switch (errno) {
            case EOPNOTSUPP -> "the kernel does not pin a file on a DAX filesystem (fsdax) for device DMA. With"
                    + " dma.engine=vfio use a device-DAX node (pmem.path=/dev/daxX.Y; ndctl create-namespace -m devdax)"
                    + " or a file on tmpfs/hugetlbfs";
            case EFAULT -> "the kernel does not pin a writable shared mapping of a page-cache file (ext4, xfs, ...) for"
                    + " device DMA. With dma.engine=vfio use a device-DAX node (pmem.path=/dev/daxX.Y) or a file on"
                    + " tmpfs/hugetlbfs";
            case ENOMEM -> "the locked-memory limit is too low (ulimit -l, RLIMIT_MEMLOCK; run as root or raise it)";
            case ENOENT -> "no memory at that address";
            default -> Errno.name(errno);
        };
    }

    /** VFIO_IOMMU_UNMAP_DMA; returns the bytes the kernel unmapped. */
    public long unmapDma(long iova, long size) throws VfioException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment m = a.allocate(DMA_UNMAP);
            m.set(JAVA_INT, offset(DMA_UNMAP, "argsz"), (int) DMA_UNMAP.byteSize());
            m.set(JAVA_LONG, offset(DMA_UNMAP, "iova"), iova);
            m.set(JAVA_LONG, offset(DMA_UNMAP, "size"), size);
            Libc.ioctl(fd, IOMMU_UNMAP_DMA, m, "VFIO_IOMMU_UNMAP_DMA");
            return m.get(JAVA_LONG, offset(DMA_UNMAP, "size"));
        } catch (NativeException e) {
            throw new VfioException("unmapping IOVA 0x" + Long.toHexString(iova) + " (" + size + " bytes) failed: "
                    + e.getMessage(), e);
        }
    }

    public boolean isClosed() {
        return closed;
    }

    /** Closes the groups (their devices first), then the container. Idempotent; the first failure is thrown last. */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        Teardown t = new Teardown();
        t.each(groups.reversed(), VfioGroup::close);
        t.closeFd(fd);
        t.finish();
    }
}
