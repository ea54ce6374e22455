package io.pmemblk.vhost.memory;

import java.lang.foreign.MemorySegment;

/**
 * Receives the pieces {@link GuestMemory#scatter} splits a guest-physical range into, one per region it touches,
 * in address order. A piece is named by its region's whole mapping and an offset into it rather than by a slice,
 * so a caller that only reads a header or writes a status byte slices nothing (nothing is allocated per piece).
 */
@FunctionalInterface
public interface ScatterSink {
    /**
     * @param mapping the region's mapping (byte 0 = the region's first byte)
     * @param offset  where the piece starts in {@code mapping}
     * @param length  bytes of the piece, at least 1
     * @param iova    the DMA engine's address of the piece's first byte, or {@code Request.NO_IOVA} (-1)
     */
    void piece(MemorySegment mapping, long offset, long length, long iova);
}
