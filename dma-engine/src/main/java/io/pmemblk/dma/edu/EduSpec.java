package io.pmemblk.dma.edu;

/**
 * QEMU's {@code edu} PCI device (1234:11e8), registers in BAR0, written once. Source: qemu/qemu hw/misc/edu.c
 * (@06b40d25) and docs/specs/edu.rst; the QEMU 7.2 limits were measured in a guest (shared/notes/vfio.md §4, §4.1).
 * Offsets below 0x80 take 4-byte accesses only, from 0x80 4 or 8.
 */
public final class EduSpec {
    private EduSpec() {}

    public static final int VENDOR = 0x1234, DEVICE = 0x11e8;
    public static final long BAR0_SIZE = 1 << 20;

    /** Identification: 0xRRrr00ed (major, minor, 0x00, 0xed). */
    public static final long ID = 0x00;
    public static final int ID_LOW = 0x00ed;
    /** Liveness check: reads back the bitwise NOT of what was written. */
    public static final long LIVENESS = 0x04;
    public static final long IRQ_STATUS = 0x24;
    /** Write-only: clears these bits of the interrupt status (needed with MSI too, or the next one is not raised). */
    public static final long IRQ_ACK = 0x64;
    public static final long DMA_SRC = 0x80;
    public static final long DMA_DST = 0x88;
    public static final long DMA_COUNT = 0x90;
    public static final long DMA_CMD = 0x98;
    /** DMA_CMD bits: start (cleared by the device when done), direction edu->RAM, raise IRQ_DMA when done. */
    public static final long CMD_START = 1, CMD_TO_RAM = 2, CMD_IRQ = 4;
    /** Interrupt status bit of a finished DMA. */
    public static final int IRQ_DMA = 0x100;

    /** The device-side buffer: 4096 bytes at this device address. */
    public static final long BUFFER = 0x40000;
    /**
     * Bytes per transfer. QEMU 7.2 aborts the whole VM on a transfer that ends exactly at the buffer's end (its
     * range check is off by one), so at most 4095; 2 KiB also makes "device transfers x 1024 = bytes copied" exact
     * for the whole-KiB copies a block device makes.
     */
    public static final long CHUNK = 2048;
    /** The device masks bus addresses to its dma_mask, 28 bits by default: IOVAs must stay below this. */
    public static final long DMA_LIMIT = 1L << 28;
}
