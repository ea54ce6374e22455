package io.pmemblk.pmem;

import io.pmemblk.queueing.Op;

import java.io.IOException;
import java.nio.file.Path;

/**
 * The persistence record for frontends' tests in other modules (shipped in pmem's test jar): a region whose
 * persistence steps are recorded, the frontend's own submissions and acknowledgements in the same sequence, and
 * {@link DurabilityCheck}'s verdict. A frontend records a request as submitted once its data is in place (or
 * earlier: stores the record cannot see, the kernel's, must come after it) and as acknowledged when its answer
 * may leave (for ublk, before the COMMIT).
 */
public final class PersistenceRecorder {
    private final PmemRegion region;
    private final RecordingPersistence record;

    private PersistenceRecorder(PmemRegion region, RecordingPersistence record) {
        this.region = region;
        this.record = record;
    }

    public static PersistenceRecorder open(Path file, long size, PmemRegion.Mapper mapper) throws IOException {
        RegionPorts.Opened<RecordingPersistence> o = RegionPorts.open(file, size, mapper, RecordingPersistence::new);
        return new PersistenceRecorder(o.region(), o.port());
    }

    public PmemRegion region() {
        return region;
    }

    public void submitted(long id, Op op, boolean fua, long offset, long length) {
        record.submitted(id, describe(op, fua, offset, length), region.memory().address() + offset, length);
    }

    public void acknowledged(long id, Op op, boolean fua, long offset, long length, int status) {
        record.acknowledged(id, describe(op, fua, offset, length) + " status " + status,
                region.memory().address() + offset, length);
    }

    private static String describe(Op op, boolean fua, long offset, long length) {
        return op + (fua ? " FUA" : "") + " off " + offset + " len " + length;
    }

    /** What was checked: FUA writes, FLUSHes, writes a FLUSH covered. */
    public record Verdict(int fuaWrites, int flushes, int writesCoveredByFlushes) {}

    /** @throws AssertionError naming the first acknowledged promise whose bytes were not persisted before the ack */
    public Verdict verify() {
        DurabilityCheck.Checked c = new DurabilityCheck(record.events(), region.isPmem()).verify();
        return new Verdict(c.fuaWrites(), c.flushes(), c.writesCoveredByFlushes());
    }

    /** How many persistence steps of a kind ("COPY", "WRITE_BACK", "SYNC", ...) were recorded. */
    public long count(String kind) {
        RecordingPersistence.Kind k = RecordingPersistence.Kind.valueOf(kind);
        return record.events().stream().filter(e -> e.kind() == k).count();
    }
}
