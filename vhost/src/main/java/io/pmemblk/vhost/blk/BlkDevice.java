package io.pmemblk.vhost.blk;

import java.nio.charset.StandardCharsets;

/**
 * What the guest is told about the disk, fixed for a connection.
 *
 * @param capacitySectors size in 512-byte sectors (virtio-blk counts in 512-byte units whatever blk_size is)
 * @param blkSize         logical block size: a power of two from 512 to 64 KiB; requests must be aligned to it
 * @param serial          GET_ID's answer: at most {@link VirtioBlk#ID_BYTES} bytes of ASCII, NUL-padded on the wire
 */
public record BlkDevice(long capacitySectors, int blkSize, boolean readOnly, boolean canDiscard, boolean canZero,
                        String serial) {
    public BlkDevice {
        if (capacitySectors < 0) {
            throw new IllegalArgumentException("capacity " + capacitySectors + " sectors: must be >= 0");
        }
        if (blkSize < 512 || blkSize > 65536 || Integer.bitCount(blkSize) != 1) {
            throw new IllegalArgumentException("block size " + blkSize + ": allowed a power of two from 512 to 65536");
        }
        byte[] id = serial.getBytes(StandardCharsets.US_ASCII);
        if (id.length > VirtioBlk.ID_BYTES || !serial.chars().allMatch(c -> c >= 0x20 && c < 0x7f)) {
            throw new IllegalArgumentException("serial \"" + serial + "\": allowed at most " + VirtioBlk.ID_BYTES
                    + " printable ASCII characters (virtio-blk GET_ID)");
        }
    }

    /** A device of {@code bytes} in 512-byte blocks (a partial last sector is not offered). */
    public static BlkDevice of(long bytes, boolean readOnly, boolean canDiscard, boolean canZero, String serial) {
        return of(bytes, VirtioBlk.SECTOR, readOnly, canDiscard, canZero, serial);
    }

    /**
     * A device of {@code bytes} (a multiple of {@code blkSize} is used; a partial last block is not offered)
     * whose requests are aligned to {@code blkSize}: 512, or a larger driver minimum (a BTT's 4 KiB sector).
     */
    public static BlkDevice of(long bytes, int blkSize, boolean readOnly, boolean canDiscard, boolean canZero,
                               String serial) {
        int blk = Math.max(VirtioBlk.SECTOR, blkSize);
        return new BlkDevice(bytes / blk * (blk / VirtioBlk.SECTOR), blk, readOnly, canDiscard, canZero, serial);
    }
}
