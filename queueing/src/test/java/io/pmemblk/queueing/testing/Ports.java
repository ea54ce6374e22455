package io.pmemblk.queueing.testing;

import java.io.IOException;
import java.net.ServerSocket;

/** Tests' TCP ports for a server to listen on. */
public final class Ports {
    private Ports() {
    }

    /** A TCP port free right now (the server under test binds it a moment later). */
    public static int freeTcpPort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        }
    }
}
