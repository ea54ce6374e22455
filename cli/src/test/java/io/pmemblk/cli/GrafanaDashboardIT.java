package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;

import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The dashboard's queries against what a running server exports: every metric and label they name is in its
 * /metrics (a renamed metric breaks panels silently otherwise), and a real Prometheus (Debian's) that scrapes the
 * server under fio load evaluates every panel's query, as Grafana would send it, to a non-empty result.
 */
class GrafanaDashboardIT {
    private static final Duration WAIT = Duration.ofSeconds(60);
    private static final Pattern SERIES = Pattern.compile("^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{([^}]*)})? ");
    private static final Pattern LABEL = Pattern.compile("([a-zA-Z_][a-zA-Z0-9_]*)=\"");
    /** Labels Prometheus adds when it scrapes, and the histogram's bucket bound. */
    private static final Set<String> SCRAPE_LABELS = Set.of("instance", "job");

    @TempDir
    Path dir;

    private final HttpClient http = HttpClient.newHttpClient();

    private String get(String url) throws Exception {
        HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create(url)).timeout(Duration.ofSeconds(10)).build(),
                HttpResponse.BodyHandlers.ofString());
        assertThat(r.statusCode()).as("%s: %s", url, r.body()).isEqualTo(200);
        return r.body();
    }

    /** Metric name -> label names, from the text exposition. */
    static Map<String, Set<String>> series(String exposition) {
        Map<String, Set<String>> out = new HashMap<>();
        for (String line : exposition.split("\n")) {
            Matcher m = SERIES.matcher(line);
            if (line.startsWith("#") || !m.find()) {
                continue;
            }
            Set<String> labels = out.computeIfAbsent(m.group(1), k -> new HashSet<>());
            if (m.group(3) != null) {
                Matcher l = LABEL.matcher(m.group(3));
                while (l.find()) {
                    labels.add(l.group(1));
                }
            }
        }
        return out;
    }

    @Test
    void everyQueryNamesWhatTheServerExportsAndPrometheusEvaluatesIt() throws Exception {
        int metricsPort = freeTcpPort(), promPort = freeTcpPort();
        try (ServerProcess s = ServerProcess.start(dir, "pmem.path=" + dir.resolve("p.img"), "pmem.size=128M",
                "nbd.socket=" + dir.resolve("s"), "nbd.port=0", "dma.engine=soft", "route.dma.bounce=true", "route.dma.min-bytes=64K",
                "metrics.port=" + metricsPort, "queue.buffer-bytes=32M")) {
            Map<String, Set<String>> exported = series(get("http://127.0.0.1:" + metricsPort + "/metrics"));
            List<GrafanaDashboard.Query> queries = GrafanaDashboard.read().queries();
            assertThat(queries).hasSizeGreaterThan(10);
            for (GrafanaDashboard.Query q : queries) {
                assertThat(q.metrics()).as("%s: %s", q.panel(), q.expr()).isNotEmpty();
                Set<String> labelsOfItsMetrics = new HashSet<>();
                for (String metric : q.metrics()) {
                    assertThat(exported).as("panel '%s' reads %s", q.panel(), metric).containsKey(metric);
                    labelsOfItsMetrics.addAll(exported.get(metric));
                    for (String label : q.selectorLabels(metric)) {
                        if (!SCRAPE_LABELS.contains(label)) {
                            assertThat(exported.get(metric)).as("panel '%s': %s has label %s", q.panel(), metric, label)
                                    .contains(label);
                        }
                    }
                }
                for (String label : q.byLabels()) {
                    if (!SCRAPE_LABELS.contains(label)) {
                        assertThat(labelsOfItsMetrics).as("panel '%s' groups by %s", q.panel(), label).contains(label);
                    }
                }
            }

            Path config = dir.resolve("prometheus.yml");
            Files.writeString(config, """
                    global:
                      scrape_interval: 1s
                      evaluation_interval: 1s
                    scrape_configs:
                      - job_name: pmemblk
                        static_configs:
                          - targets: ['127.0.0.1:%d']
                    """.formatted(metricsPort));
            Path promLog = dir.resolve("prometheus.log");
            Process prom = new ProcessBuilder("prometheus", "--config.file=" + config,
                    "--storage.tsdb.path=" + dir.resolve("tsdb"), "--web.listen-address=127.0.0.1:" + promPort,
                    "--log.level=warn").redirectErrorStream(true).redirectOutput(promLog.toFile()).start();
            Process fio = null;
            try {
                String api = "http://127.0.0.1:" + promPort;
                // load on both routes while Prometheus scrapes, so rates, quantiles and the DMA share have values
                fio = new ProcessBuilder("fio", "--name=dash", "--ioengine=nbd", "--uri=" + s.unixUri(), "--rw=randrw",
                        "--bsrange=4k-1m", "--size=96m", "--iodepth=8", "--time_based", "--runtime=20")
                        .redirectErrorStream(true).redirectOutput(dir.resolve("fio.out").toFile()).start();
                JsonNode ready = null;
                long deadline = System.nanoTime() + WAIT.toNanos();
                while (ready == null) {
                    assertThat(prom.isAlive()).as("prometheus: %s", Files.exists(promLog) ? Files.readString(promLog) : "").isTrue();
                    assertThat(System.nanoTime()).as("Prometheus had 3 scrapes of pmemblk under load within %s", WAIT)
                            .isLessThan(deadline);
                    try {
                        // Until /-/ready says 200, Prometheus answers queries with a plain-text 503 (its TSDB is
                        // still opening), which is no JSON to read
                        if (http.send(HttpRequest.newBuilder(URI.create(api + "/-/ready")).timeout(Duration.ofSeconds(10))
                                .build(), HttpResponse.BodyHandlers.discarding()).statusCode() == 200) {
                            JsonNode r = query(api, "sum(rate(pmemblk_copy_bytes_total{route=\"dma\"}[10s])) > 0");
                            ready = r.path("data").path("result").isEmpty() ? null : r;
                        }
                    } catch (java.io.IOException notYetListening) {
                        // Prometheus is still starting
                    }
                    if (ready == null) {
                        LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(200)); // between two queries
                    }
                }
                for (GrafanaDashboard.Query q : queries) {
                    JsonNode r = query(api, q.forPrometheus("10s"));
                    assertThat(r.path("status").asString()).as("%s: %s", q.panel(), r).isEqualTo("success");
                    assertThat(r.path("data").path("result").isEmpty()).as("panel '%s' (%s) has data: %s", q.panel(),
                            q.expr(), r).isFalse();
                }
                // the first numbers an operator reads are real, not NaN or 0
                for (String panel : List.of("IOPS", "Throughput", "DMA share of bytes")) {
                    GrafanaDashboard.Query q = queries.stream().filter(x -> x.panel().equals(panel)).findFirst().orElseThrow();
                    double v = query(api, q.forPrometheus("10s")).path("data").path("result").get(0).path("value").get(1)
                            .asDouble();
                    assertThat(v).as(panel).isPositive();
                }
            } finally {
                if (fio != null) {
                    fio.destroyForcibly();
                    fio.waitFor(30, TimeUnit.SECONDS);
                }
                prom.destroy();
                if (!prom.waitFor(30, TimeUnit.SECONDS)) {
                    prom.destroyForcibly();
                }
            }
            assertThat(s.terminate()).isZero();
        }
    }

    /** An instant query; a PromQL error is status "error" with HTTP 400, returned for the assertion to show. */
    private JsonNode query(String api, String promql) throws Exception {
        HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create(api + "/api/v1/query?query="
                + URLEncoder.encode(promql, StandardCharsets.UTF_8))).timeout(Duration.ofSeconds(10)).build(),
                HttpResponse.BodyHandlers.ofString());
        return JsonMapper.builder().build().readTree(r.body());
    }
}
