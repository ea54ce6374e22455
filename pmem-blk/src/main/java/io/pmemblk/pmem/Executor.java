package io.pmemblk.pmem;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.Request;

import java.io.IOException;

/**
 * How the driver executes requests on one layout of the region: raw ({@link RawExecutor}) or a BTT
 * ({@link BttExecutor}).
 */
interface Executor {
    /** As {@link BlockDriver#queueRequests}: every request completed exactly once, a batch's Error rethrown after. */
    void queueRequests(int hwq, Request[] batch, int count);

    /**
     * {@code copies} copies placed on the DMA route have been reported ({@code ctx} as placed) with {@code status}
     * (0: done), on a channel's completion thread: one, or a run the channel moved as one. Nothing escapes but an
     * Error, and that only after its request is completed.
     */
    void dmaCompleted(Object ctx, int status, int copies);

    /** Executes r by the CPU: the status to complete it with (what it throws: EIO, {@link Completions#completeFailed}). */
    int execute(Request r) throws IOException;

    /** After the DMA engine is closed (every copy reported), before the region is unmapped. */
    void engineClosed() throws IOException;
}
