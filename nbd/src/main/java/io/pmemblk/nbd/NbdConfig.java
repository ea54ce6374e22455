package io.pmemblk.nbd;

import java.nio.file.Path;
import java.util.Objects;

/**
 * What the NBD frontend serves and where.
 *
 * @param exportName      name of the one export; it is also reachable by the empty (default) name
 * @param unixSocket      path of a unix socket to listen on, or null for none
 * @param bindHost        host/address for TCP (e.g. 127.0.0.1)
 * @param tcpPort         TCP port, 0 for no TCP listener
 * @param maxRequestBytes largest READ/WRITE payload accepted, advertised as the maximum block size (32 MiB)
 * @param maxConnections  connections served at once; further ones are closed on accept
 * @param description     human-readable text for NBD_INFO_DESCRIPTION and NBD_OPT_LIST ("" for none)
 */
public record NbdConfig(String exportName, Path unixSocket, String bindHost, int tcpPort, int maxRequestBytes,
                        int maxConnections, String description) {
    public static final int DEFAULT_MAX_REQUEST_BYTES = 32 << 20;
    public static final int DEFAULT_TCP_PORT = 10809;

    public NbdConfig {
        Objects.requireNonNull(exportName, "exportName");
        Objects.requireNonNull(bindHost, "bindHost");
        description = description == null ? "" : description;
        if (exportName.getBytes(java.nio.charset.StandardCharsets.UTF_8).length > NbdProtocol.MAX_STRING_BYTES
                || description.getBytes(java.nio.charset.StandardCharsets.UTF_8).length > NbdProtocol.MAX_STRING_BYTES) {
            throw new IllegalArgumentException("export name and description must be at most "
                    + NbdProtocol.MAX_STRING_BYTES + " bytes of UTF-8 (proto.md strings)");
        }
        if (tcpPort < 0 || tcpPort > 65535) {
            throw new IllegalArgumentException("tcpPort " + tcpPort + " is not 0 (no TCP) or a port 1..65535");
        }
        if (unixSocket == null && tcpPort == 0) {
            throw new IllegalArgumentException("nothing to listen on: give a unix socket path or a TCP port");
        }
        if (maxRequestBytes < 4096) {
            throw new IllegalArgumentException("maxRequestBytes " + maxRequestBytes
                    + " is below the preferred block size 4096");
        }
        if (maxConnections < 1) {
            throw new IllegalArgumentException("maxConnections " + maxConnections + " must be >= 1");
        }
    }

    /** A unix-socket-only export with the defaults (32 MiB requests, 64 connections). */
    public static NbdConfig unix(String exportName, Path socket) {
        return new NbdConfig(exportName, socket, "127.0.0.1", 0, DEFAULT_MAX_REQUEST_BYTES, 64, "");
    }
}
