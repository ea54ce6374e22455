package io.pmemblk.nvme;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * Namespace 1: the whole device. Its identifiers (NGUID, EUI64, UUID) are derived from the configured serial, so
 * a host sees the same namespace after a server restart and multipath groups paths by them (NVMe base 1.4
 * 7.11: NGUID/UUID must not change for the life of the namespace).
 * @param blocks         NSZE in logical blocks
 * @param blockSize      the LBA data size, a power of two >= 512
 * @param volatileCache  VWC: a write is NOT durable at completion (page-cache mapping), so Flush and FUA mean
 *                       something; false only where every write is persistent when it completes (real pmem)
 */
record Namespace(long blocks, int blockSize, boolean volatileCache, byte[] nguid, byte[] eui64, byte[] uuid) {
    static Namespace of(long deviceBytes, int minimumBlockSize, boolean volatileCache, String serial) {
        int bs = Math.max(512, minimumBlockSize);
        if (Integer.bitCount(bs) != 1) {
            throw new IllegalArgumentException("block size " + bs + ": NVMe LBA sizes are powers of two");
        }
        byte[] h;
        try {
            h = MessageDigest.getInstance("SHA-256").digest(("pmemblk-nvme-ns1:" + serial).getBytes(StandardCharsets.UTF_8));
        } catch (NoSuchAlgorithmException e) {
            throw new AssertionError("SHA-256 is in every JDK", e);
        }
        byte[] nguid = java.util.Arrays.copyOfRange(h, 0, 16);
        byte[] eui = java.util.Arrays.copyOfRange(h, 16, 24);
        byte[] uuid = java.util.Arrays.copyOfRange(h, 8, 24);
        uuid[6] = (byte) ((uuid[6] & 0x0F) | 0x50); // RFC 4122 name-based (version 5 style) and variant bits
        uuid[8] = (byte) ((uuid[8] & 0x3F) | 0x80);
        return new Namespace(deviceBytes / bs, bs, volatileCache, nguid, eui, uuid);
    }

    int lbaShift() {
        return Integer.numberOfTrailingZeros(blockSize);
    }
}
