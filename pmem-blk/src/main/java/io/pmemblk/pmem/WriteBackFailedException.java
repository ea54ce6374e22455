package io.pmemblk.pmem;

import java.io.IOException;

/**
 * The region's write-back to its storage has failed (an msync answered an error), now or earlier in this
 * process: nothing written since can be promised durable. Linux reports a write-back error once per file and
 * marks the pages clean, so a later msync would answer OK without having written them: the failure is kept
 * ({@link WriteBack#writeBackFailure()}) and every FLUSH, FUA and write fails with it until the server restarts.
 */
public final class WriteBackFailedException extends IOException {
    private static final long serialVersionUID = 1L;

    WriteBackFailedException(String message, Throwable cause) {
        super(message, cause);
    }
}
