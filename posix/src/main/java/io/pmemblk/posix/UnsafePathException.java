package io.pmemblk.posix;

import java.io.IOException;

/** A path pmemblk will not use because another user could change what it names; the message says how to fix it. */
public final class UnsafePathException extends IOException {
    private static final long serialVersionUID = 1L;

    public UnsafePathException(String message) {
        super(message);
    }
}
