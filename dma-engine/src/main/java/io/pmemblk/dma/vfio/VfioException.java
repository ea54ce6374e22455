package io.pmemblk.dma.vfio;

import java.io.IOException;

/** A VFIO step that failed, with what to do about it in the message. */
public final class VfioException extends IOException {
    private static final long serialVersionUID = 1L;

    public VfioException(String message) {
        super(message);
    }

    public VfioException(String message, Throwable cause) {
        super(message, cause);
    }
}
