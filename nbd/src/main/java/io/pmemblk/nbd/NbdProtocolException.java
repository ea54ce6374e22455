package io.pmemblk.nbd;

import java.io.IOException;

/** The peer broke a MUST of proto.md (bad magic, unknown client flag, oversized option...): close its connection. */
final class NbdProtocolException extends IOException {
    NbdProtocolException(String message) {
        super(message);
    }
}
