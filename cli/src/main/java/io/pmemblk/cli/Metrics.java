package io.pmemblk.cli;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.LatencyBuckets;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Route;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.ublk.UblkDevice;
import io.prometheus.metrics.core.metrics.CounterWithCallback;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.exporter.httpserver.HTTPServer;
import io.prometheus.metrics.model.registry.Collector;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import io.prometheus.metrics.model.snapshots.ClassicHistogramBuckets;
import io.prometheus.metrics.model.snapshots.HistogramSnapshot;
import io.prometheus.metrics.model.snapshots.Labels;
import io.prometheus.metrics.model.snapshots.MetricSnapshot;

import java.io.IOException;

/**
 * Prometheus metrics at http://127.0.0.1:PORT/metrics. The hot path only bumps plain adders
 * ({@link CopyStats}, the queues' counters); these callbacks read them when a scrape comes.
 */
public final class Metrics implements AutoCloseable {
    private final HTTPServer server;
    private final PrometheusRegistry registry;

    private Metrics(HTTPServer server, PrometheusRegistry registry) {
        this.server = server;
        this.registry = registry;
    }

    public static PrometheusRegistry registry(Device device) {
        PrometheusRegistry registry = new PrometheusRegistry();
        CopyStats stats = device.stats();
        BlockLayer layer = device.layer();
        byRouteAndDirection(registry, "pmemblk_copy_bytes_total",
                "Bytes copied into (write) or out of (read) persistent memory, by route", stats::bytes);
        byRouteAndDirection(registry, "pmemblk_copy_ops_total",
                "Requests whose data was copied, by route and direction", stats::ops);
        if (device.driver().engine() != null && device.driver().engine().deviceTransfers() >= 0) {
            io.pmemblk.dma.DmaEngine engine = device.driver().engine();
            CounterWithCallback.builder().name("pmemblk_dma_device_transfers_total")
                    .help("Transfers the DMA device reported finished (edu: the completion interrupts it raised)")
                    .callback(cb -> cb.call(engine.deviceTransfers())).register(registry);
        }
        CounterWithCallback.builder().name("pmemblk_dma_errors_total")
                .help("DMA channel halts (descriptor errors)")
                .callback(cb -> cb.call(stats.dmaErrors())).register(registry);
        CounterWithCallback.builder().name("pmemblk_dma_fallbacks_total")
                .help("Requests completed by the CPU after their DMA copy failed")
                .callback(cb -> cb.call(stats.dmaFallbacks())).register(registry);
        CounterWithCallback.builder().name("pmemblk_mapping_faults_total")
                .help("Requests answered EIO because the mapping could not be accessed: the backing file truncated"
                        + " under the server, a known bad block, or a machine check on a poisoned line")
                .callback(cb -> cb.call(stats.mappingFaults())).register(registry);
        CounterWithCallback.builder().name("pmemblk_queue_requests_total")
                .help("Requests dispatched, by hardware queue")
                .labelNames("queue")
                .callback(cb -> {
                    for (int i = 0; i < layer.queueCount(); i++) {
                        cb.call(layer.queue(i).requestsTotal(), Integer.toString(i));
                    }
                }).register(registry);
        GaugeWithCallback.builder().name("pmemblk_queue_inflight")
                .help("Requests holding a tag, by hardware queue")
                .labelNames("queue")
                .callback(cb -> {
                    for (int i = 0; i < layer.queueCount(); i++) {
                        HardwareQueue q = layer.queue(i);
                        cb.call(q.inflight(), Integer.toString(i));
                    }
                }).register(registry);
        registry.register(new Collector() {
            @Override
            public MetricSnapshot collect() {
                return requestLatency(layer);
            }

            @Override
            public String getPrometheusName() {
                return "pmemblk_request_duration_seconds";
            }
        });
        io.pmemblk.pmem.PmemRegion region = device.region();
        GaugeWithCallback.builder().name("pmemblk_writeback_failed")
                .help("1 once a write-back of the backing file failed: FLUSH, FUA and writes answer EIO until the"
                        + " server is restarted after the storage is fixed (the log says what failed)")
                .callback(cb -> cb.call(region.writeBack().writeBackFailed() ? 1 : 0)).register(registry);
        CounterWithCallback.builder().name("pmemblk_writeback_refused_requests_total")
                .help("FLUSH, FUA and write requests answered EIO because a write-back failed")
                .callback(cb -> cb.call(region.writeBack().refusedRequests())).register(registry);
        GaugeWithCallback.builder().name("pmemblk_device_bytes")
                .help("Size of the exported device")
                .callback(cb -> cb.call(device.region().size())).register(registry);
        return registry;
    }

    /** A count of {@link CopyStats} by route and direction, as {@code bytes} and {@code ops} keep theirs. */
    private interface ByRoute {
        long count(Route route, boolean write);
    }

    /** A counter labelled by route and direction (read, write), read from {@code count} at each scrape. */
    private static void byRouteAndDirection(PrometheusRegistry registry, String name, String help, ByRoute count) {
        CounterWithCallback.builder().name(name).help(help)
                .labelNames("route", "dir")
                .callback(cb -> {
                    for (Route r : Route.values()) {
                        cb.call(count.count(r, false), r.label(), "read");
                        cb.call(count.count(r, true), r.label(), "write");
                    }
                }).register(registry);
    }

    /**
     * Request latency by operation, summed over the hardware queues, from their lock-free log2 buckets
     * (from tag acquire to completion).
     */
    static HistogramSnapshot requestLatency(BlockLayer layer) {
        HistogramSnapshot.Builder b = HistogramSnapshot.builder().name("pmemblk_request_duration_seconds")
                .help("Block request latency from tag acquire to completion, by operation");
        for (Op op : Op.values()) {
            long[] counts = null;
            double sum = 0;
            double[] bounds = null;
            for (int i = 0; i < layer.queueCount(); i++) {
                LatencyBuckets.Snapshot snap = layer.queue(i).latency(op).snapshot();
                long[] c = snap.bucketCounts();
                if (counts == null) {
                    counts = new long[c.length];
                    bounds = snap.upperBoundsSeconds();
                }
                for (int j = 0; j < c.length; j++) {
                    counts[j] += c[j];
                }
                sum += snap.sumSeconds();
            }
            b.dataPoint(HistogramSnapshot.HistogramDataPointSnapshot.builder()
                    .labels(Labels.of("op", op.name().toLowerCase(java.util.Locale.ROOT)))
                    .classicHistogramBuckets(ClassicHistogramBuckets.of(bounds, counts))
                    .sum(sum).build());
        }
        return b.build();
    }

    public static Metrics start(Device device, int port) throws IOException {
        PrometheusRegistry registry = registry(device);
        HTTPServer server = HTTPServer.builder().hostname("127.0.0.1").port(port)
                .registry(registry).buildAndStart();
        return new Metrics(server, registry);
    }

    /** Adds the ublk frontend's counters, once its device exists (beside the NBD server's and the queues'). */
    public void addUblk(UblkDevice ublk) {
        CounterWithCallback.builder().name("pmemblk_ublk_requests_total")
                .help("Requests the kernel handed to the ublk frontend (/dev/ublkbN), by ublk queue")
                .labelNames("queue")
                .callback(cb -> {
                    for (int q = 0; q < ublk.queueCount(); q++) {
                        cb.call(ublk.requests(q), Integer.toString(q));
                    }
                }).register(registry);
    }

    /** Adds the vhost-user-blk frontend's counter of front-end connections (accepted and refused). */
    public void addVhost(io.pmemblk.vhost.VhostUserBlkServer vhost) {
        CounterWithCallback.builder().name("pmemblk_vhost_connections_total")
                .help("Front-end (QEMU) connections to the vhost-user-blk socket, the refused ones included")
                .callback(cb -> cb.call(vhost.connectionsSeen())).register(registry);
    }

    public int port() {
        return server.getPort();
    }

    @Override
    public void close() {
        server.close();
    }
}
