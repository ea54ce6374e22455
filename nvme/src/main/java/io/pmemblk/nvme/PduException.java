package io.pmemblk.nvme;

/**
 * A fatal transport error (NVMe/TCP 1.0 section 3.6.2.9): the connection answers with a C2HTermReq carrying
 * {@code fes} and {@code fei} (for an invalid header field, the byte offset of the field) and closes.
 */
final class PduException extends Exception {
    final int fes;
    final int fei;

    PduException(int fes, int fei, String message) {
        super(message, null, false, false);
        this.fes = fes;
        this.fei = fei;
    }
}
