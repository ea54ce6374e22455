package io.pmemblk.dma.vfiouser.device;

/**
 * The PCI identity and layout of the I/OAT function served over vfio-user, written once. Sources: Linux
 * {@code include/uapi/linux/pci_regs.h} (capability IDs and MSI-X fields), {@code include/linux/pci_ids.h} and
 * {@code drivers/dma/ioat/init.c} ({@code ioat_pci_tbl}), {@code drivers/dma/ioat/registers.h}
 * ({@code IOAT_PCI_CHANERR_INT_OFFSET}), libvfio-user {@code include/pci_caps/px.h}.
 */
public final class IoatPci {
    private IoatPci() {}

    public static final int VENDOR_INTEL = 0x8086;
    /**
     * PCI_DEVICE_ID_INTEL_IOAT_BWD0 (Atom C2000 CBDMA, I/OAT 3.3), in ioat_pci_tbl: a part for which Linux keeps the
     * XOR and PQ capabilities it reads (on the Xeon parts, SKX 0x2021 among them, ioat3_dma_probe strips them and a
     * device without them is made DMA_PRIVATE, so md RAID456 could never use its channels: async_tx, built without
     * channel switching in Debian, takes only devices with memcpy, xor, xor_val, pq, pq_val and interrupt).
     */
    public static final int DEVICE_IOAT_BWD0 = 0x0C50;
    /** What the model does: copies, XOR/XOR_VAL, PQ/PQ_VAL (registers.h IOAT_CAP_XOR 0x100, IOAT_CAP_PQ 0x200). */
    public static final int DMA_CAPABILITY = io.pmemblk.dma.ioat.IoatSpec.DMACAP_XOR | io.pmemblk.dma.ioat.IoatSpec.DMACAP_PQ;
    /** Class 08 (base system peripheral), subclass 80 (other), prog-if 00: what CBDMA functions report. */
    public static final int CLASS_BASE = 0x08;
    public static final int CLASS_SUB = 0x80;
    public static final int CLASS_PROG_IF = 0x00;

    /** BAR0: the I/OAT register file, 16 KiB as on the hardware (a power of two, as PCI needs). */
    public static final long BAR0_SIZE = 0x4000;
    /**
     * The MSI-X table in BAR0 (BIR 0), where the BWD parts have it (ioat_reset_hw saves and restores BAR0 0x1000,
     * 0x1008 and 0x1800 around a channel reset on them), past the register file of up to 31 channels; QEMU emulates it.
     */
    public static final int MSIX_TABLE_OFFSET = 0x1000;
    /** The MSI-X pending-bit array in BAR0 (BIR 0). */
    public static final int MSIX_PBA_OFFSET = 0x1800;
    /** Most channels this layout holds: their registers (0x80 each from 0x80) end before the MSI-X table. */
    public static final int MAX_CHANNELS = MSIX_TABLE_OFFSET / 0x80 - 1;

    /** Config-space CHANERR_INT (registers.h IOAT_PCI_CHANERR_INT_OFFSET): read and written back by ioat_reset_hw. */
    public static final int CHANERR_INT_OFFSET = 0x180;

    // pci_regs.h
    public static final int PCI_CAP_ID_EXP = 0x10;
    public static final int PCI_CAP_ID_MSIX = 0x11;
    /** PCI_EXP_FLAGS: version in bits 3:0 (2), device/port type in 7:4 (0, PCI_EXP_TYPE_ENDPOINT). */
    public static final int PCI_EXP_FLAGS = 2;
    public static final int PCI_EXP_FLAGS_VERSION_2 = 2;
    /** libvfio-user's struct pxcap size (VFIO_USER_PCI_CAP_EXP_SIZEOF, px.h): the whole v2 capability. */
    public static final int PCI_CAP_EXP_SIZEOF = 0x3c;
    /** PCI_MSIX_FLAGS: table size - 1 in bits 10:0 (PCI_MSIX_FLAGS_QSIZE). */
    public static final int PCI_MSIX_FLAGS = 2;
    /** PCI_MSIX_TABLE: offset | BIR (bits 2:0). */
    public static final int PCI_MSIX_TABLE = 4;
    /** PCI_MSIX_PBA: offset | BIR (bits 2:0). */
    public static final int PCI_MSIX_PBA = 8;
    public static final int PCI_CAP_MSIX_SIZEOF = 12;
}
