package io.pmemblk.cli;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.vfiouser.client.VfioUserEngine;
import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.vfio.VfioEngine;
import io.pmemblk.pmem.BttRegion;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.LayoutRecord;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.Routing;
import io.pmemblk.pmem.bitmap.BitmapDirectory;
import io.pmemblk.pmem.bitmap.DirtyBitmaps;
import io.pmemblk.pmem.bitmap.TrackingDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.posix.TrustedPath;
import io.pmemblk.settings.DefaultPaths;
import io.pmemblk.settings.Keys;
import io.pmemblk.settings.Settings;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;

/**
 * The block device assembled from settings: the pmem region, its driver and the multi-queue block layer in
 * front of it. Owns all three; {@link #close()} drains, persists and unmaps, in that order.
 */
public final class Device implements AutoCloseable {
    private final Settings settings;
    private final PmemRegion region;
    private final PmemBlockDriver driver;
    private final BlockLayer layer;
    /** The dirty bitmaps and the layer that marks them, over the driver; null with bitmap.dir=off. */
    private final DirtyBitmaps bitmaps;
    private final CopyStats stats = new CopyStats();
    private boolean closed;

    private Device(Settings settings) throws IOException {
        this.settings = settings;
        // A VFIO device first: a machine without one is told so before the backing file is created.
        DmaEngine vfio = switch (settings.get(Keys.DMA_ENGINE)) {
            case VFIO -> VfioEngine.open(settings.get(Keys.DMA_VFIO_DEVICES), settings.get(Keys.DMA_RING_SIZE));
            // the device process's socket: it answers (or the start fails naming it) before the file is created
            case VFIO_USER -> VfioUserEngine.open(settings.get(Keys.DMA_VFIO_USER_SOCKET).toString(),
                    settings.get(Keys.DMA_RING_SIZE));
            default -> null;
        };
        boolean btt = settings.get(Keys.PMEM_LAYOUT) == Keys.Layout.BTT;
        try {
            Path path = trustedPmemPath(settings);
            this.region = btt ? openBttRegion(settings, path) : PmemRegion.open(path, settings.get(Keys.PMEM_SIZE),
                    settings.get(Keys.PMEM_RESIZE),
                    PmemRegion.Mapper.valueOf(settings.get(Keys.PMEM_MAPPER).name()));
        } catch (IOException | RuntimeException e) {
            if (vfio != null) {
                vfio.close();
            }
            throw e;
        }
        DmaEngine engine = vfio;
        DirtyBitmaps bitmaps = null;
        try {
            // The layout is the operator's setting and pmemblk's record, never a sniff of the bytes a client wrote:
            // a raw device serves raw whatever it holds, unless pmemblk recorded a BTT on it (docs/btt.md).
            LayoutRecord record = LayoutRecord.of(region, layoutRecords());
            if (!btt) {
                BttRegion.checkRaw(region, record);
            }
            if (settings.get(Keys.DMA_ENGINE) == Keys.DmaEngineKind.SOFT) {
                // No setting injects faults; an end-to-end test puts a SoftFaults provider on the class path.
                engine = DmaEngine.soft(new IovaSpace(), settings.get(Keys.DMA_CHANNELS),
                        settings.get(Keys.DMA_RING_SIZE), DmaEngine.SOFT_XFERCAP_LOG2, SoftFaults.installed());
            }
            this.driver = btt ? PmemBlockDriver.onBtt(region, stats, openBtt(settings, region, record),
                    engine, LiveSettings.routing(settings))
                    : new PmemBlockDriver(region, stats, engine, LiveSettings.routing(settings));
            // Every frontend's requests pass through the tracking layer when there are bitmaps to mark.
            bitmaps = openBitmaps(settings, driver.size());
            // ublk queue i takes tags of its own on hardware queue i, so it never waits behind NBD connections.
            boolean ublk = settings.get(Keys.UBLK_ENABLED);
            this.layer = new BlockLayer(bitmaps == null ? driver : new TrackingDriver(driver, bitmaps),
                    settings.get(Keys.QUEUES), settings.get(Keys.QUEUE_DEPTH),
                    settings.get(Keys.QUEUE_BUFFER_BYTES), Keys.MAX_REQUEST_BYTES,
                    ublk ? settings.ublkDepth() : 0, ublk ? settings.ublkQueues() : 0);
        } catch (IOException | RuntimeException e) {
            if (bitmaps != null) {
                try {
                    bitmaps.close();
                } catch (IOException suppressed) {
                    e.addSuppressed(suppressed);
                }
            }
            if (engine != null) {
                engine.close();
            }
            region.close();
            // The kernel's refusal to pin the region for DMA (fsdax, page cache) carries the fix in its cause.
            if (e instanceof IllegalStateException && e.getCause() instanceof io.pmemblk.dma.vfio.VfioException v) {
                throw v;
            }
            throw e;
        }
        this.bitmaps = bitmaps;
    }

    /** The bitmaps of bitmap.dir (null when off), mapped as pmem.path is; files that do not fit the device refused. */
    private static DirtyBitmaps openBitmaps(Settings settings, long deviceSize) throws IOException {
        Path dir = settings.bitmapDir(layoutRecords());
        if (dir == null) {
            return null;
        }
        BitmapDirectory files = BitmapDirectory.open(dir, "bitmap.dir",
                PmemRegion.Mapper.valueOf(settings.get(Keys.PMEM_MAPPER).name()));
        return DirtyBitmaps.open(files, deviceSize, settings.get(Keys.BITMAP_GRANULARITY),
                settings.get(Keys.BITMAP_NAMES), settings.get(Keys.QUEUES));
    }

    /**
     * The BTT of {@code region}: a file this start created is formatted (and recorded), as the raw layout creates
     * its file: nothing in it could be a client's. An existing one is opened as its record says
     * ({@link BttRegion#open}: a recorded BTT, an unfinished format, or, unrecorded, only a complete BTT), and
     * keeps the size it was formatted with.
     */
    private static io.pmemblk.pmem.btt.Btt openBtt(Settings settings, PmemRegion region, LayoutRecord record)
            throws IOException {
        if (region.created()) {
            BttRegion.format(region, record, settings.get(Keys.PMEM_SECTOR_SIZE));
            System.getLogger(Device.class.getName()).log(System.Logger.Level.INFO, region.path() + " did not exist:"
                    + " created with a BTT of " + settings.get(Keys.PMEM_SECTOR_SIZE) + "-byte sectors, recorded in "
                    + record.path());
        }
        return BttRegion.open(region, record, bttLanes(settings),
                settings.source(Keys.PMEM_SECTOR_SIZE).equals("default") ? 0 : settings.get(Keys.PMEM_SECTOR_SIZE),
                io.pmemblk.pmem.btt.Btt.GROUP_BLOCKS);
    }

    /**
     * Where the layout records of device-DAX nodes live ({@link LayoutRecord}): pmemblk's state directory, the one
     * {@code pmem.path=auto} uses (/var/lib/pmemblk as root, the systemd unit's StateDirectory; the XDG data
     * directory otherwise). A regular file's record is beside it.
     */
    static Path layoutRecords() {
        return DefaultPaths.pmemPath(io.pmemblk.posix.Libc.geteuid(), System.getenv()).getParent();
    }

    /**
     * The region of a BTT. A file that does not exist yet is created with pmem.size ({@link #openBtt} formats it);
     * an existing one keeps the size it was formatted with.
     */
    private static PmemRegion openBttRegion(Settings settings, Path path) throws IOException {
        if (settings.get(Keys.PMEM_RESIZE)) {
            throw new IOException("pmem.resize=true is not allowed with pmem.layout=btt: a BTT's arenas are laid out"
                    + " for the size it was formatted with; allowed: pmem.resize=false (format again to change the size)");
        }
        PmemRegion.Mapper mapper = PmemRegion.Mapper.valueOf(settings.get(Keys.PMEM_MAPPER).name());
        if (!Files.exists(path, LinkOption.NOFOLLOW_LINKS)) {
            long size = settings.get(Keys.PMEM_SIZE);
            if (size < BTT_LEAST) {
                throw new IOException("pmem.size: '" + settings.text(Keys.PMEM_SIZE) + "' is too small for a BTT;"
                        + " allowed: at least " + BTT_LEAST + " bytes (16M + 8K: a pool header and one arena)");
            }
            return PmemRegion.open(path, size, false, mapper);
        }
        return PmemRegion.open(path, Files.isRegularFile(path) ? Files.size(path) : 0, false, mapper);
    }

    /** A pool header and one 16 MiB arena: the smallest BTT. */
    private static final long BTT_LEAST = 8192 + (16 << 20);

    /**
     * Lanes of the BTT: one per caller that may dispatch at once, which is a thread per connection or ublk/vhost
     * queue, not a hardware queue; twice the CPUs (at least the queues) covers the threads that run at once, and a
     * writer scans every lane's read-tracking slot, so not more. At most 256, the BTT's free blocks per arena.
     */
    static int bttLanes(Settings settings) {
        return Math.min(256, Math.max(settings.get(Keys.QUEUES), 2 * Runtime.getRuntime().availableProcessors()));
    }

    /**
     * pmem.path to open. {@link PmemRegion#open} checks it as OpenSSH checks its files ({@link TrustedPath}) in
     * the same walk that opens or creates it. With {@code auto}, an image at the pre-issue-15 default is not left
     * behind for a new empty one: start-up stops and says how to move it or keep using it.
     */
    static Path trustedPmemPath(Settings settings) throws IOException {
        Path path = settings.get(Keys.PMEM_PATH);
        if (settings.text(Keys.PMEM_PATH).equalsIgnoreCase("auto") && !path.equals(DefaultPaths.OLD_PMEM_PATH)
                && !Files.exists(path, LinkOption.NOFOLLOW_LINKS)
                && Files.exists(DefaultPaths.OLD_PMEM_PATH, LinkOption.NOFOLLOW_LINKS)) {
            throw new IOException("pmem.path: the default moved from " + DefaultPaths.OLD_PMEM_PATH + " (where other"
                    + " users can create the directory first) to " + path + ", and a device image is at the old place."
                    + " Move it: mkdir -p -m 0700 " + path.getParent() + " && mv " + DefaultPaths.OLD_PMEM_PATH + " "
                    + path + "; or, outside the systemd unit, keep it where it is with --set pmem.path="
                    + DefaultPaths.OLD_PMEM_PATH + " (the unit's PrivateTmp=yes gives the service a private /var/tmp"
                    + " that systemd deletes when it stops: there, move it)");
        }
        return path;
    }

    public static Device open(Settings settings) throws IOException {
        return new Device(settings);
    }

    public Settings settings() {
        return settings;
    }

    public PmemRegion region() {
        return region;
    }

    public PmemBlockDriver driver() {
        return driver;
    }

    public BlockLayer layer() {
        return layer;
    }

    /** The dirty bitmaps, or null with bitmap.dir=off. */
    public DirtyBitmaps bitmaps() {
        return bitmaps;
    }

    public CopyStats stats() {
        return stats;
    }

    /** Sends every request to one route (bench, tune); false when that route is not available. */
    public boolean forceRoute(io.pmemblk.queueing.Route route) {
        return driver.force(route);
    }

    /**
     * Routes the pool-buffer requests of an in-process user (pmemblk bench) by the thresholds, as caller memory
     * is: it fills and reads the buffers itself, with no kernel copy in front, so they are the vhost-user path
     * and DMA takes the one copy off the CPU (route.dma.bounce is about served NBD/ublk requests).
     */
    public void routeInProcess() {
        Routing r = driver.routing();
        driver.routing(new Routing(r.minBytes(), r.minSegments(), true));
    }

    /** CPU time consumed so far by the DMA engine's own threads (0 without an engine). */
    public long dmaEngineCpuNanos() {
        return driver.engineCpuNanos();
    }

    /**
     * Waits (bounded) for in-flight requests, persists everything and releases the mapping. Idempotent.
     * @return false when some request was still in flight at the deadline (the data is persisted anyway)
     */
    public synchronized boolean close(long drainMillis) throws IOException {
        if (closed) {
            return true;
        }
        closed = true;
        boolean idle;
        try {
            idle = layer.awaitIdle(drainMillis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            idle = false;
        }
        try {
            driver.persistAll();
        } finally {
            // The driver first: its DMA engine drains before the buffer pools it copies from are freed.
            try {
                driver.close();
            } finally {
                try {
                    layer.close();
                } finally {
                    if (bitmaps != null) {
                        bitmaps.close();
                    }
                }
            }
        }
        return idle;
    }

    @Override
    public void close() throws IOException {
        close(10_000);
    }
}
