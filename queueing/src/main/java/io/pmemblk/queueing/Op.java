package io.pmemblk.queueing;

/** What a request asks of the device. Frontend-neutral: NBD and ublk commands both map onto these. */
public enum Op {
    READ, WRITE, FLUSH, TRIM, WRITE_ZEROES, CACHE;

    public boolean carriesData() {
        return this == READ || this == WRITE;
    }
}
