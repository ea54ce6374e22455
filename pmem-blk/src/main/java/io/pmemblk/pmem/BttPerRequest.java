package io.pmemblk.pmem;

import io.pmemblk.queueing.Request;

/**
 * A request's state on the BTT layout, hung off its {@link PerRequest} ({@link PerRequest#btt}): made once per
 * tag, reused. The raw layout never makes one.
 */
final class BttPerRequest {
    /**
     * The grouped writes ({@link BttCpuRequests#writes}, on the dispatching thread; {@link BttDmaWrites#dmaWrites},
     * also on the completion thread, before its drop of {@link PerRequest#outstanding}): the first failure of one
     * of the request's sectors, and pieces not covering its length (EINVAL).
     */
    Throwable failure;
    boolean invalid;
    /** The status of a READ run on one lane ({@link BttCpuRequests#reads}), until its completion. */
    int status;
    /**
     * The DMA route ({@link BttDmaWrites#dmaWrites}): some sector's group was stored by the CPU after the device
     * failed; sectors placed in groups (each holds a share of {@link PerRequest#outstanding}); the next request to
     * complete once a group's lanes are given back. Written by the dispatcher and the completion thread, each
     * before its drop of the count, read by whoever drops it to zero.
     */
    boolean redone;
    int added;
    Request next;
    /** A DMA READ's copies; made on the tag's first one. */
    private BttDmaReads.ReadCopies reads;

    /** r's BTT state, made on its tag's first use. */
    static BttPerRequest of(Request r) {
        return PerRequest.of(r).btt();
    }

    BttDmaReads.ReadCopies reads() {
        BttDmaReads.ReadCopies c = reads;
        if (c == null) {
            c = reads = new BttDmaReads.ReadCopies();
        }
        return c;
    }
}
