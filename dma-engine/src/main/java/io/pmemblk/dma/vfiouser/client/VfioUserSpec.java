package io.pmemblk.dma.vfiouser.client;

/**
 * The vfio-user protocol as the client side uses it, written once. Source: QEMU 10.2.2
 * {@code docs/interop/vfio-user.rst} (section names quoted below), checked against libvfio-user efd091b
 * {@code include/vfio-user.h}. All fields are in host byte order (x86-64: little-endian), offsets count from the
 * end of the 16-byte header unless said otherwise. The structs that vfio-user borrows from
 * {@code <linux/vfio.h>} (region info, IRQ info, IRQ set) and their flags and indexes are
 * {@link io.pmemblk.dma.vfio.VfioAbi}'s.
 */
public final class VfioUserSpec {
    private VfioUserSpec() {}

    /** "VFIO_USER_VERSION": the version this client proposes (libvfio-user speaks 0.2; QEMU proposes 0.1). */
    public static final int VERSION_MAJOR = 0, VERSION_MINOR = 2;

    // "Commands" table
    public static final int VERSION = 1, DMA_MAP = 2, DMA_UNMAP = 3, DEVICE_GET_INFO = 4, DEVICE_GET_REGION_INFO = 5,
            DEVICE_GET_REGION_IO_FDS = 6, DEVICE_GET_IRQ_INFO = 7, DEVICE_SET_IRQS = 8, REGION_READ = 9,
            REGION_WRITE = 10, DMA_READ = 11, DMA_WRITE = 12, DEVICE_RESET = 13, REGION_WRITE_MULTI = 15,
            DEVICE_FEATURE = 16, MIG_DATA_READ = 17, MIG_DATA_WRITE = 18;

    /** A command's name for errors and logs. */
    public static String commandName(int command) {
        return switch (command) {
            case VERSION -> "VERSION";
            case DMA_MAP -> "DMA_MAP";
            case DMA_UNMAP -> "DMA_UNMAP";
            case DEVICE_GET_INFO -> "DEVICE_GET_INFO";
            case DEVICE_GET_REGION_INFO -> "DEVICE_GET_REGION_INFO";
            case DEVICE_GET_REGION_IO_FDS -> "DEVICE_GET_REGION_IO_FDS";
            case DEVICE_GET_IRQ_INFO -> "DEVICE_GET_IRQ_INFO";
            case DEVICE_SET_IRQS -> "DEVICE_SET_IRQS";
            case REGION_READ -> "REGION_READ";
            case REGION_WRITE -> "REGION_WRITE";
            case DMA_READ -> "DMA_READ";
            case DMA_WRITE -> "DMA_WRITE";
            case DEVICE_RESET -> "DEVICE_RESET";
            case REGION_WRITE_MULTI -> "REGION_WRITE_MULTI";
            case DEVICE_FEATURE -> "DEVICE_FEATURE";
            default -> "command " + command;
        };
    }

    // "Header": msg_id u16@0, command u16@2, size u32@4 (whole message, header included), flags u32@8, error u32@12
    public static final int HEADER = 16;
    public static final int H_MSG_ID = 0, H_COMMAND = 2, H_SIZE = 4, H_FLAGS = 8, H_ERROR = 12;
    /** Flags: type in bits 0-3 (0 command, 1 reply), No_reply bit 4, Error bit 5. */
    public static final int FLAG_TYPE_MASK = 0xf, TYPE_COMMAND = 0, TYPE_REPLY = 1, FLAG_NO_REPLY = 0x10, FLAG_ERROR = 0x20;

    // "VFIO_USER_VERSION" request and reply: major u16@0, minor u16@2, JSON capabilities (NUL-terminated)@4
    public static final int V_MAJOR = 0, V_MINOR = 2, V_DATA = 4;
    /** "max_data_xfer_size" when the peer names none (1 MiB). */
    public static final int DEFAULT_MAX_DATA_XFER = 1 << 20;

    // "VFIO_USER_DMA_MAP": argsz u32@0, flags u32@4 (bit 0 readable, bit 1 writeable), offset u64@8 (file offset
    // of the fd sent with it), address u64@16 (the DMA address), size u64@24; 32 bytes; no reply payload
    public static final int MAP_ARGSZ = 0, MAP_FLAGS = 4, MAP_OFFSET = 8, MAP_ADDRESS = 16, MAP_SIZE = 24, MAP_BYTES = 32;
    public static final int MAP_READ = 1, MAP_WRITE = 2;
    // "VFIO_USER_DMA_UNMAP": argsz u32@0, flags u32@4, address u64@8, size u64@16; 24 bytes
    public static final int UNMAP_ARGSZ = 0, UNMAP_FLAGS = 4, UNMAP_ADDRESS = 8, UNMAP_SIZE = 16, UNMAP_BYTES = 24;

    // "VFIO_USER_DEVICE_GET_INFO": argsz u32@0, flags u32@4, num_regions u32@8, num_irqs u32@12; 16 bytes
    public static final int INFO_ARGSZ = 0, INFO_FLAGS = 4, INFO_NUM_REGIONS = 8, INFO_NUM_IRQS = 12, INFO_BYTES = 16;

    // "VFIO_USER_DEVICE_GET_REGION_INFO": argsz u32@0, flags u32@4, index u32@8, cap_offset u32@12, size u64@16,
    // offset u64@24; 32 bytes, then capabilities (cap_offset counts from the struct's start)
    public static final int RI_ARGSZ = 0, RI_FLAGS = 4, RI_INDEX = 8, RI_CAP_OFFSET = 12, RI_SIZE = 16, RI_OFFSET = 24,
            RI_BYTES = 32;
    /** VFIO_REGION_INFO_FLAG_CAPS ("Reply" flags bit 3). */
    public static final int RI_FLAG_CAPS = 8;
    /** VFIO_REGION_INFO_CAP_SPARSE_MMAP ({@code <linux/vfio.h>}): id 1; areas {offset u64, size u64} after nr_areas u32, pad u32. */
    public static final int CAP_SPARSE_MMAP = 1;
    /** How much region info (capabilities included) this client asks for at most. */
    public static final int RI_ARGSZ_ASKED = 1024;

    // "VFIO_USER_DEVICE_GET_IRQ_INFO": argsz u32@0, flags u32@4, index u32@8, count u32@12; 16 bytes
    public static final int IRQ_ARGSZ = 0, IRQ_FLAGS = 4, IRQ_INDEX = 8, IRQ_COUNT = 12, IRQ_BYTES = 16;

    // "VFIO_USER_DEVICE_SET_IRQS": argsz u32@0, flags u32@4, index u32@8, start u32@12, count u32@16; 20 bytes
    // (eventfds travel as SCM_RIGHTS, not in data[])
    public static final int SET_ARGSZ = 0, SET_FLAGS = 4, SET_INDEX = 8, SET_START = 12, SET_COUNT = 16, SET_BYTES = 20;

    // "VFIO_USER_REGION_READ" / "VFIO_USER_REGION_WRITE": offset u64@0, region u32@8, count u32@12, data@16
    // (write request, read reply)
    public static final int RW_OFFSET = 0, RW_REGION = 8, RW_COUNT = 12, RW_DATA = 16;

    // "VFIO_USER_DMA_READ" / "VFIO_USER_DMA_WRITE" (server -> client): address u64@0, count u64@8, data@16
    // (DMA_WRITE request, DMA_READ reply). DMA_WRITE's reply: address u64@0, count u32@8.
    public static final int DMA_ADDRESS = 0, DMA_COUNT = 8, DMA_DATA = 16, DMA_WRITE_REPLY_BYTES = 12;

    /** PCI configuration space (PCI Local Bus 3.0 §6.1): vendor u16@0, device u16@2, command u16@4, class code 3 bytes@9. */
    public static final int PCI_VENDOR_ID = 0x00, PCI_DEVICE_ID = 0x02, PCI_CLASS_PROG = 0x09;
}
