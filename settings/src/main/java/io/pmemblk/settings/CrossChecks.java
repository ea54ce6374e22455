package io.pmemblk.settings;

import io.pmemblk.settings.Keys.DmaEngineKind;
import io.pmemblk.settings.Keys.Layout;
import io.pmemblk.settings.Keys.TlsMode;

import java.nio.file.Path;
import java.util.List;

import static io.pmemblk.settings.Keys.DMA_CHANNELS;
import static io.pmemblk.settings.Keys.DMA_ENGINE;
import static io.pmemblk.settings.Keys.DMA_VFIO_USER_SOCKET;
import static io.pmemblk.settings.Keys.METRICS_PORT;
import static io.pmemblk.settings.Keys.NBD_PORT;
import static io.pmemblk.settings.Keys.NBD_SOCKET;
import static io.pmemblk.settings.Keys.NBD_TLS;
import static io.pmemblk.settings.Keys.NBD_TLS_CERTIFICATE;
import static io.pmemblk.settings.Keys.NBD_TLS_KEY;
import static io.pmemblk.settings.Keys.NBD_TLS_VERIFY_CLIENTS;
import static io.pmemblk.settings.Keys.NVME_LISTEN;
import static io.pmemblk.settings.Keys.PMEM_LAYOUT;
import static io.pmemblk.settings.Keys.PMEM_PATH;
import static io.pmemblk.settings.Keys.PMEM_SECTOR_SIZE;
import static io.pmemblk.settings.Keys.QUEUES;
import static io.pmemblk.settings.Keys.QUEUE_DEPTH;
import static io.pmemblk.settings.Keys.UBLK_BLOCK_SIZE;
import static io.pmemblk.settings.Keys.UBLK_DEPTH;
import static io.pmemblk.settings.Keys.UBLK_QUEUES;
import static io.pmemblk.settings.Keys.VHOST_SOCKET;

/**
 * The checks of keys against each other, after each key's own value was found allowed: a combination that
 * could not serve (no listener, one socket for two servers, TLS without a certificate, ...) is refused with what
 * was set, why it cannot be, and what is allowed.
 */
final class CrossChecks {
    private CrossChecks() {}

    /**
     * The file {@code p} names as far as its text tells: absolute, with "." dropped (Path.of already folds "//");
     * ".." is kept, as it climbs out of a symbolic link, not back to where the text says. Null stays null.
     */
    private static Path sameFile(Path p) {
        if (p == null) {
            return null;
        }
        Path abs = p.toAbsolutePath(), out = abs.getRoot();
        for (Path name : abs) {
            out = name.toString().equals(".") ? out : out.resolve(name);
        }
        return out;
    }

    static void check(Settings s) throws SettingsException {
        if (s.get(NBD_SOCKET) == null && s.get(NBD_PORT) == 0 && s.get(VHOST_SOCKET) == null && s.get(NVME_LISTEN) == null) {
            throw new SettingsException("nbd.socket is empty and nbd.port=0: no listener would be left;"
                    + " allowed: a socket path, a TCP port, or both (or a vhost.socket, or nvme.listen)");
        }
        // By the file they name, not their spelling (/run/./s is /run/s), and a socket is never the image: each
        // was found only at listen, after pmem.path was opened (a new one created and left behind), with exit 1.
        Path image = sameFile(s.get(PMEM_PATH)), nbd = sameFile(s.get(NBD_SOCKET)), vhost = sameFile(s.get(VHOST_SOCKET));
        if (vhost != null && vhost.equals(nbd)) {
            throw new SettingsException("vhost.socket: '" + s.text(VHOST_SOCKET) + "' is not allowed: it is also"
                    + " nbd.socket; allowed: another path, or empty (off)");
        }
        for (Key<Path> socket : List.of(NBD_SOCKET, VHOST_SOCKET)) {
            if (image != null && image.equals(sameFile(s.get(socket)))) {
                throw new SettingsException(socket.name() + ": '" + s.text(socket) + "' is not allowed: it is also"
                        + " pmem.path; allowed: another path, or empty (off)");
            }
        }
        if (s.get(NBD_TLS) != TlsMode.OFF && (s.get(NBD_TLS_CERTIFICATE) == null || s.get(NBD_TLS_KEY) == null)) {
            throw new SettingsException("nbd.tls: '" + s.text(NBD_TLS) + "' needs nbd.tls.certificate and nbd.tls.key;"
                    + " allowed: PEM files (e.g. made with openssl or certtool), or nbd.tls=off");
        }
        if (s.get(NBD_TLS) == TlsMode.OFF && s.get(NBD_TLS_VERIFY_CLIENTS) != null) {
            throw new SettingsException("nbd.tls.verify-clients: '" + s.text(NBD_TLS_VERIFY_CLIENTS) + "' is not allowed"
                    + " with nbd.tls=off: no client would ever be asked for a certificate; allowed: off, or set"
                    + " nbd.tls=require");
        }
        if (s.get(UBLK_QUEUES) > s.get(QUEUES)) {
            throw new SettingsException("ublk.queues: '" + s.text(UBLK_QUEUES) + "' is not allowed with queues="
                    + s.get(QUEUES) + ": ublk queue i is served on hardware queue i; allowed: auto or 1.." + s.get(QUEUES));
        }
        if (s.get(UBLK_DEPTH) > s.get(QUEUE_DEPTH)) {
            throw new SettingsException("ublk.depth: '" + s.text(UBLK_DEPTH) + "' is not allowed with queue.depth="
                    + s.get(QUEUE_DEPTH) + ": each ublk tag needs a tag of its hardware queue; allowed: auto or 1.."
                    + s.get(QUEUE_DEPTH));
        }
        if (s.get(PMEM_LAYOUT) == Layout.RAW && s.get(PMEM_SECTOR_SIZE) != 4096) {
            throw new SettingsException("pmem.sector-size: '" + s.text(PMEM_SECTOR_SIZE) + "' is not allowed with"
                    + " pmem.layout=raw: a raw device has no sector of its own; allowed: 4096 (the default), or set"
                    + " pmem.layout=btt");
        }
        if (s.get(PMEM_LAYOUT) == Layout.BTT && s.get(UBLK_BLOCK_SIZE) < s.get(PMEM_SECTOR_SIZE)) {
            throw new SettingsException("ublk.block-size: '" + s.text(UBLK_BLOCK_SIZE) + "' is not allowed with"
                    + " pmem.layout=btt and pmem.sector-size=" + s.get(PMEM_SECTOR_SIZE) + ": the BTT writes whole"
                    + " sectors; allowed: a ublk.block-size of at least pmem.sector-size");
        }
        if (s.get(DMA_ENGINE) == DmaEngineKind.VFIO_USER && s.get(DMA_VFIO_USER_SOCKET) == null) {
            throw new SettingsException("dma.engine=vfio-user needs dma.vfio-user.socket: the socket of the device"
                    + " process (pmemblk dma-device --socket PATH); allowed: its path, or another dma.engine");
        }
        if (s.get(DMA_ENGINE) != DmaEngineKind.VFIO_USER && s.get(DMA_VFIO_USER_SOCKET) != null) {
            throw new SettingsException("dma.vfio-user.socket: '" + s.text(DMA_VFIO_USER_SOCKET) + "' is not allowed with"
                    + " dma.engine=" + s.text(DMA_ENGINE) + ": nothing would use it; allowed: empty, or set"
                    + " dma.engine=vfio-user");
        }
        // As dma.vfio-user.socket above: only the soft engine makes channels by this count (vfio's are its devices,
        // vfio-user's the device process's --channels), and the count was taken without a word for the others, a
        // user who left dma.engine out believing the copies offloaded.
        if (s.get(DMA_ENGINE) != DmaEngineKind.SOFT && s.get(DMA_CHANNELS) != 1) {
            throw new SettingsException("dma.channels: '" + s.text(DMA_CHANNELS) + "' is not allowed with"
                    + " dma.engine=" + s.text(DMA_ENGINE) + ": only dma.engine=soft makes channels by this count"
                    + " (vfio drives every channel of dma.vfio.devices, vfio-user those pmemblk dma-device --channels"
                    + " made); allowed: 1 (the default), or dma.engine=soft");
        }
        int metrics = s.get(METRICS_PORT);
        if (metrics != 0 && metrics == s.get(NBD_PORT)) {
            throw new SettingsException("metrics.port: '" + metrics + "' is not allowed: it is also nbd.port;"
                    + " allowed: another port, or 0 (off)");
        }
        // As metrics.port above, by the port alone: the NVMe/TCP listener binds after the device is opened (and
        // pmem.path created), so a clash found there stopped serve with exit 1 and a new image left behind.
        if (s.get(NVME_LISTEN) != null) {
            int nvme = s.get(NVME_LISTEN).getPort();
            String other = nvme == s.get(NBD_PORT) ? "nbd.port" : nvme == metrics ? "metrics.port" : null;
            if (other != null) {
                throw new SettingsException("nvme.listen: '" + s.text(NVME_LISTEN) + "' is not allowed: its port is also "
                        + other + "; allowed: another port, or empty (off)");
            }
        }
    }
}
