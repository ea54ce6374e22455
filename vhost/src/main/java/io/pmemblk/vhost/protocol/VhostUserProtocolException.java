package io.pmemblk.vhost.protocol;

import java.io.IOException;

/**
 * The front-end broke the protocol in a way the back-end cannot answer (a header or payload of the wrong size, too
 * many descriptors, an unknown request that may want a reply): the connection is closed, and the message says what
 * was wrong and what is allowed.
 */
public final class VhostUserProtocolException extends IOException {
    private static final long serialVersionUID = 1L;

    public VhostUserProtocolException(String message) {
        super(message);
    }
}
