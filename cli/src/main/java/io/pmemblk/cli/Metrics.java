package io.pmemblk.cli;

import io.pmemblk.block.BlockLayer;
import io.pmemblk.block.HardwareQueue;
import io.pmemblk.block.Route;
import io.pmemblk.pmem.CopyStats;
import io.prometheus.metrics.core.metrics.CounterWithCallback;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.exporter.httpserver.HTTPServer;
import io.prometheus.metrics.model.registry.PrometheusRegistry;

import java.io.IOException;

/**
 * Prometheus metrics at http://127.0.0.1:PORT/metrics. The hot path only bumps plain adders
 * ({@link CopyStats}, the queues' counters); these callbacks read them when a scrape comes.
 */
public final class Metrics implements AutoCloseable {
    private final HTTPServer server;

    private Metrics(HTTPServer server) {
        this.server = server;
    }

    public static PrometheusRegistry registry(Device device) {
        PrometheusRegistry registry = new PrometheusRegistry();
        CopyStats stats = device.stats();
        BlockLayer layer = device.layer();
        CounterWithCallback.builder().name("pmemblk_copy_bytes_total")
                .help("Bytes copied into (write) or out of (read) persistent memory, by route")
                .labelNames("route", "dir")
                .callback(cb -> {
                    for (Route r : Route.values()) {
                        cb.call(stats.bytes(r, false), r.label(), "read");
                        cb.call(stats.bytes(r, true), r.label(), "write");
                    }
                }).register(registry);
        CounterWithCallback.builder().name("pmemblk_copy_ops_total")
                .help("Requests whose data was copied, by route and direction")
                .labelNames("route", "dir")
                .callback(cb -> {
                    for (Route r : Route.values()) {
                        cb.call(stats.ops(r, false), r.label(), "read");
                        cb.call(stats.ops(r, true), r.label(), "write");
                    }
                }).register(registry);
        CounterWithCallback.builder().name("pmemblk_dma_errors_total")
                .help("DMA channel halts (descriptor errors)")
                .callback(cb -> cb.call(stats.dmaErrors())).register(registry);
        CounterWithCallback.builder().name("pmemblk_dma_fallbacks_total")
                .help("Requests completed by the CPU after their DMA copy failed")
                .callback(cb -> cb.call(stats.dmaFallbacks())).register(registry);
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
        GaugeWithCallback.builder().name("pmemblk_device_bytes")
                .help("Size of the exported device")
                .callback(cb -> cb.call(device.region().size())).register(registry);
        return registry;
    }

    public static Metrics start(Device device, int port) throws IOException {
        HTTPServer server = HTTPServer.builder().hostname("127.0.0.1").port(port)
                .registry(registry(device)).buildAndStart();
        return new Metrics(server);
    }

    public int port() {
        return server.getPort();
    }

    @Override
    public void close() {
        server.close();
    }
}
