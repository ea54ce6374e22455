package io.pmemblk.dma.edu;

import io.pmemblk.dma.IovaSpace;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * The end-to-end proof on an edu device ({@code pmemblk dma check} on a VFIO one, EduChannelTest on the software
 * model): a copy RAM -> edu -> RAM of one page matches, then a DMA to an IOVA that was just unmapped moves no
 * byte, because the IOMMU (or the model's IovaSpace) refuses it; the device reports the transfer done anyway.
 */
public final class EduSelfTest {
    private EduSelfTest() {}

    static final int PAGE = 4096;

    /**
     * @param transfers     the device's transfers the copy took (two per {@link EduSpec#CHUNK})
     * @param copied        the page came back as it went out
     * @param copyFinished  every transfer of the copy finished in time (if not, the rest was not run)
     * @param unmappedIova  where the refused DMA was aimed
     * @param refusedDone   what the device reported for it
     * @param bytesChanged  bytes of the unmapped page that changed anyway: 0 when the IOMMU held
     */
    public record Result(long transfers, boolean copied, boolean copyFinished, long unmappedIova, boolean refusedDone,
                         long bytesChanged) {
        public boolean passed() {
            return copyFinished && copied && bytesChanged == 0;
        }
    }

    /** Runs both checks with buffers from {@code arena}, mapped into {@code space} (and unmapped again). */
    public static Result run(EduDevice edu, IovaSpace space, Arena arena, long timeoutNanos) throws InterruptedException {
        MemorySegment src = arena.allocate(PAGE, PAGE);
        MemorySegment dst = arena.allocate(PAGE, PAGE);
        for (int i = 0; i < PAGE; i++) {
            src.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 7 + 3));
        }
        long srcIova = space.map(src);
        long dstIova = space.map(dst);
        try {
            for (long off = 0; off < PAGE; off += EduSpec.CHUNK) {
                if (!edu.transfer(srcIova + off, EduSpec.CHUNK, false, timeoutNanos)
                        || !edu.transfer(dstIova + off, EduSpec.CHUNK, true, timeoutNanos)) {
                    return new Result(edu.transfers(), false, false, 0, false, 0);
                }
            }
            long copyTransfers = edu.transfers();
            boolean copied = src.mismatch(dst) == -1;
            // The IOMMU proof: the device is told to write where nothing is mapped any more.
            long unmapped = dstIova;
            space.unmap(dstIova);
            dstIova = -1;
            dst.fill((byte) 0xee);
            boolean done = edu.transfer(unmapped, EduSpec.CHUNK, true, timeoutNanos);
            long changed = 0;
            for (int i = 0; i < PAGE; i++) {
                changed += dst.get(ValueLayout.JAVA_BYTE, i) != (byte) 0xee ? 1 : 0;
            }
            return new Result(copyTransfers, copied, true, unmapped, done, changed);
        } finally {
            space.unmap(srcIova);
            if (dstIova >= 0) {
                space.unmap(dstIova);
            }
        }
    }
}
