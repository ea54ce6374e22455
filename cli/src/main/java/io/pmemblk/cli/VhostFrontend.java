package io.pmemblk.cli;

import io.pmemblk.posix.TrustedDirectory;
import io.pmemblk.posix.TrustedPath;
import io.pmemblk.settings.Keys;
import io.pmemblk.settings.Settings;
import io.pmemblk.vhost.VhostUserBlkConfig;
import io.pmemblk.vhost.VhostUserBlkServer;

import java.io.IOException;

/**
 * The vhost-user-blk frontend as the settings describe it, built the way the NBD and ublk configs are:
 * {@code vhost.socket} (empty: off), {@code vhost.queues}, {@code vhost.queue-size}, {@code vhost.busy-poll}.
 */
final class VhostFrontend {
    private VhostFrontend() {}

    /** The server's config, or null when vhost.socket is empty. */
    static VhostUserBlkConfig config(Settings s) {
        if (s.get(Keys.VHOST_SOCKET) == null) {
            return null;
        }
        return new VhostUserBlkConfig(s.get(Keys.VHOST_SOCKET), s.get(Keys.VHOST_QUEUES),
                s.get(Keys.VHOST_QUEUE_SIZE), s.get(Keys.VHOST_BUSY_POLL) * 1000L,
                s.get(Keys.VHOST_COALESCE) * 1000L);
    }

    /**
     * The server for {@code device}, its socket bound in {@code dir} (taken over) for its owner or vhost.socket-group, the guest's write cache mode
     * recorded beside the socket for the device's path: a server started after this one serves the mode the guest
     * set, which QEMU does not send again when it reconnects.
     */
    static VhostUserBlkServer server(Settings s, VhostUserBlkConfig config, Device device, TrustedDirectory dir) {
        return new VhostUserBlkServer(config, device.layer()).socketDirectory(dir)
                .socketGroup(s.get(Keys.VHOST_SOCKET_GROUP))
                .recordWriteCache(device.region().path().toAbsolutePath().toString());
    }

    /**
     * vhost.socket's directory, checked and held open before the device is opened or created (null when off):
     * a path that cannot work is refused before anything exists, and the socket lands in the directory checked now.
     */
    static TrustedDirectory socketDirectory(Settings s) throws IOException {
        return s.get(Keys.VHOST_SOCKET) == null ? null
                : TrustedPath.ofThisProcess().openParentOf(s.get(Keys.VHOST_SOCKET), "vhost.socket");
    }
}
