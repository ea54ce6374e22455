package io.pmemblk.vhost.blk;

/**
 * virtio-blk's wire constants, from the header QEMU 7.2 copies (qemu/qemu
 * {@code include/standard-headers/linux/virtio_blk.h}, = torvalds/linux {@code include/uapi/linux/virtio_blk.h};
 * virtio 1.2 section 5.2).
 */
public final class VirtioBlk {
    private VirtioBlk() {}

    public static final int SECTOR = 512;

    // Feature bits
    public static final int F_SIZE_MAX = 1, F_SEG_MAX = 2, F_GEOMETRY = 4, F_RO = 5, F_BLK_SIZE = 6, F_FLUSH = 9,
            F_TOPOLOGY = 10, F_CONFIG_WCE = 11, F_MQ = 12, F_DISCARD = 13, F_WRITE_ZEROES = 14;

    // struct virtio_blk_outhdr: u32 type @0, u32 ioprio @4, u64 sector @8
    public static final int OUTHDR_BYTES = 16;
    public static final long OUTHDR_TYPE = 0, OUTHDR_SECTOR = 8;
    public static final int T_IN = 0, T_OUT = 1, T_FLUSH = 4, T_GET_ID = 8, T_DISCARD = 11, T_WRITE_ZEROES = 13;

    // struct virtio_blk_discard_write_zeroes: u64 sector @0, u32 num_sectors @8, u32 flags @12
    public static final int SEGMENT_BYTES = 16;
    public static final long SEGMENT_SECTOR = 0, SEGMENT_NUM_SECTORS = 8, SEGMENT_FLAGS = 12;
    public static final int WRITE_ZEROES_FLAG_UNMAP = 1;

    /** Status byte, the chain's last device-writable byte. */
    public static final byte S_OK = 0, S_IOERR = 1, S_UNSUPP = 2;

    /** GET_ID's buffer: VIRTIO_BLK_ID_BYTES, not necessarily NUL-terminated. */
    public static final int ID_BYTES = 20;
}
