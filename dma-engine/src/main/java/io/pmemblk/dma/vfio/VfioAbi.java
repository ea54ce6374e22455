package io.pmemblk.dma.vfio;

import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

import java.lang.foreign.MemoryLayout;
import java.lang.foreign.StructLayout;
import java.lang.invoke.VarHandle;

/**
 * The kernel's VFIO ABI as pmemblk uses it, written once. Source: {@code include/uapi/linux/vfio.h}
 * (torvalds/linux@02256acf), summarised with offsets in shared/notes/vfio.md §1.1. Every ioctl is
 * {@code _IO(';', 100 + n)}: no size is encoded, each struct starts with {@code argsz}. x86-64, little-endian,
 * naturally aligned.
 */
public final class VfioAbi {
    private VfioAbi() {}

    private static final long BASE = 0x3B00 | 100;
    public static final long GET_API_VERSION = BASE;           // 0x3B64, container, no argument
    public static final long CHECK_EXTENSION = BASE + 1;       // int by value
    public static final long SET_IOMMU = BASE + 2;             // int by value, after a group is attached
    public static final long GROUP_GET_STATUS = BASE + 3;
    public static final long GROUP_SET_CONTAINER = BASE + 4;   // pointer to the container fd
    public static final long GROUP_UNSET_CONTAINER = BASE + 5;
    public static final long GROUP_GET_DEVICE_FD = BASE + 6;   // pointer to "dddd:bb:dd.f\0"
    public static final long DEVICE_GET_INFO = BASE + 7;
    public static final long DEVICE_GET_REGION_INFO = BASE + 8;
    public static final long DEVICE_GET_IRQ_INFO = BASE + 9;
    public static final long DEVICE_SET_IRQS = BASE + 10;
    public static final long DEVICE_RESET = BASE + 11;
    public static final long IOMMU_GET_INFO = BASE + 12;
    public static final long IOMMU_MAP_DMA = BASE + 13;
    public static final long IOMMU_UNMAP_DMA = BASE + 14;

    public static final int API_VERSION = 0;
    public static final int TYPE1V2_IOMMU = 3;

    public static final int GROUP_FLAGS_VIABLE = 1;
    public static final int DEVICE_FLAGS_RESET = 1;
    public static final int DEVICE_FLAGS_PCI = 2;
    public static final int REGION_INFO_FLAG_READ = 1, REGION_INFO_FLAG_WRITE = 2, REGION_INFO_FLAG_MMAP = 4;
    public static final int IRQ_INFO_EVENTFD = 1;
    public static final int IRQ_SET_DATA_NONE = 1, IRQ_SET_DATA_EVENTFD = 4, IRQ_SET_ACTION_TRIGGER = 0x20;
    public static final int DMA_MAP_FLAG_READ = 1, DMA_MAP_FLAG_WRITE = 2;
    public static final int IOMMU_INFO_PGSIZES = 1, IOMMU_INFO_CAPS = 2;
    /** VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE: {hdr, nr_iovas u32@8, reserved@12, ranges{start,end inclusive}@16}. */
    public static final int IOMMU_TYPE1_INFO_CAP_IOVA_RANGE = 1;

    /** vfio-pci region and IRQ indexes (include/uapi/linux/vfio.h, VFIO_PCI_*_REGION_INDEX / *_IRQ_INDEX). */
    public static final int PCI_BAR0_REGION = 0, PCI_BAR2_REGION = 2, PCI_CONFIG_REGION = 7;
    public static final int PCI_INTX_IRQ = 0, PCI_MSI_IRQ = 1, PCI_MSIX_IRQ = 2;
    /** PCI config space: the command register and its memory-space and bus-master bits (PCI 3.0 §6.2.2). */
    public static final int PCI_COMMAND = 0x04, PCI_COMMAND_MEMORY = 0x2, PCI_COMMAND_MASTER = 0x4;

    /** struct vfio_group_status: 8 bytes. */
    public static final StructLayout GROUP_STATUS = MemoryLayout.structLayout(
            JAVA_INT.withName("argsz"), JAVA_INT.withName("flags"));
    /** struct vfio_device_info: 24 bytes. */
    public static final StructLayout DEVICE_INFO = MemoryLayout.structLayout(
            JAVA_INT.withName("argsz"), JAVA_INT.withName("flags"), JAVA_INT.withName("num_regions"),
            JAVA_INT.withName("num_irqs"), JAVA_INT.withName("cap_offset"), JAVA_INT.withName("pad"));
    /** struct vfio_region_info: 32 bytes. */
    public static final StructLayout REGION_INFO = MemoryLayout.structLayout(
            JAVA_INT.withName("argsz"), JAVA_INT.withName("flags"), JAVA_INT.withName("index"),
            JAVA_INT.withName("cap_offset"), JAVA_LONG.withName("size"), JAVA_LONG.withName("offset"));
    /** struct vfio_irq_info: 16 bytes. */
    public static final StructLayout IRQ_INFO = MemoryLayout.structLayout(
            JAVA_INT.withName("argsz"), JAVA_INT.withName("flags"), JAVA_INT.withName("index"), JAVA_INT.withName("count"));
    /** struct vfio_irq_set with data[] (one s32 eventfd per vector) after its 20-byte head. */
    public static final StructLayout IRQ_SET = MemoryLayout.structLayout(
            JAVA_INT.withName("argsz"), JAVA_INT.withName("flags"), JAVA_INT.withName("index"),
            JAVA_INT.withName("start"), JAVA_INT.withName("count"));
    /** struct vfio_iommu_type1_info: 24 bytes before its capability chain. */
    public static final StructLayout IOMMU_INFO = MemoryLayout.structLayout(
            JAVA_INT.withName("argsz"), JAVA_INT.withName("flags"), JAVA_LONG.withName("iova_pgsizes"),
            JAVA_INT.withName("cap_offset"), JAVA_INT.withName("pad"));
    /** struct vfio_info_cap_header: 8 bytes; {@code next} counts from the start of the info buffer (0 = last). */
    public static final StructLayout CAP_HEADER = MemoryLayout.structLayout(
            JAVA_SHORT.withName("id"), JAVA_SHORT.withName("version"), JAVA_INT.withName("next"));
    /** struct vfio_iommu_type1_dma_map: 32 bytes. */
    public static final StructLayout DMA_MAP = MemoryLayout.structLayout(
            JAVA_INT.withName("argsz"), JAVA_INT.withName("flags"), JAVA_LONG.withName("vaddr"),
            JAVA_LONG.withName("iova"), JAVA_LONG.withName("size"));
    /** struct vfio_iommu_type1_dma_unmap without its bitmap: 24 bytes; the kernel writes back the size unmapped. */
    public static final StructLayout DMA_UNMAP = MemoryLayout.structLayout(
            JAVA_INT.withName("argsz"), JAVA_INT.withName("flags"), JAVA_LONG.withName("iova"), JAVA_LONG.withName("size"));

    /** Offset of a named field, for building and reading the structs above. */
    public static long offset(StructLayout layout, String field) {
        return layout.byteOffset(MemoryLayout.PathElement.groupElement(field));
    }

    static VarHandle field(StructLayout layout, String field) {
        return layout.varHandle(MemoryLayout.PathElement.groupElement(field));
    }
}
