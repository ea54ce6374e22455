package io.pmemblk.cli;

import com.networknt.schema.Error;
import com.networknt.schema.InputFormat;
import com.networknt.schema.Schema;
import com.networknt.schema.SchemaRegistry;
import com.networknt.schema.SpecificationVersion;
import org.junit.jupiter.api.Test;
import tools.jackson.databind.JsonNode;

import java.awt.Rectangle;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The Grafana dashboard in packaging/grafana against a dashboard schema (draft-07, after Grafana's dashboard kind)
 * and the rules the schema cannot say: unique panel ids, panels that do not overlap on the 24-column grid, every
 * query on the dashboard's Prometheus variable, and the panels an operator wants first. The metric names are
 * checked against a running server in {@link GrafanaDashboardIT}.
 */
class GrafanaDashboardTest {
    static Schema schema() throws Exception {
        try (InputStream in = GrafanaDashboardTest.class.getResourceAsStream("/grafana/dashboard.schema.json")) {
            String text = new String(in.readAllBytes(), StandardCharsets.UTF_8);
            return SchemaRegistry.withDefaultDialect(SpecificationVersion.DRAFT_7).getSchema(text, InputFormat.JSON);
        }
    }

    @Test
    void theDashboardMatchesTheSchema() throws Exception {
        List<Error> errors = schema().validate(Files.readString(GrafanaDashboard.FILE), InputFormat.JSON);
        assertThat(errors).as("%s", errors).isEmpty();
    }

    /** The schema does reject what Grafana would not load: a control that it is not vacuous. */
    @Test
    void theSchemaRejectsBrokenDashboards() throws Exception {
        String good = Files.readString(GrafanaDashboard.FILE);
        Schema schema = schema();
        String[][] breaks = {
                {"\"w\": 12", "\"w\": 25"},                       // wider than the grid
                {"\"refId\": \"A\"", "\"refid\": \"A\""},         // a query without its refId
                {"\"type\": \"timeseries\"", "\"type\": \"timeserie\""}, // no such panel plugin
                {"\"schemaVersion\": 39", "\"schemaversion\": 39"},
        };
        for (String[] b : breaks) {
            assertThat(good).contains(b[0]);
            assertThat(schema.validate(good.replaceFirst(java.util.regex.Pattern.quote(b[0]), b[1]), InputFormat.JSON))
                    .as("%s -> %s", b[0], b[1]).isNotEmpty();
        }
    }

    @Test
    void panelIdsAreUniqueAndPanelsDoNotOverlapOnTheGrid() throws Exception {
        GrafanaDashboard d = GrafanaDashboard.read();
        Set<Integer> ids = new HashSet<>();
        List<Rectangle> placed = new ArrayList<>();
        for (JsonNode p : d.panels()) {
            assertThat(ids.add(p.path("id").asInt())).as("panel id %s is unique", p.path("id")).isTrue();
            JsonNode g = p.path("gridPos");
            Rectangle r = new Rectangle(g.path("x").asInt(), g.path("y").asInt(), g.path("w").asInt(), g.path("h").asInt());
            assertThat(r.x + r.width).as("%s fits in 24 columns", p.path("title")).isLessThanOrEqualTo(24);
            for (Rectangle o : placed) {
                assertThat(r.intersects(o)).as("%s overlaps a panel at %s", p.path("title"), o).isFalse();
            }
            placed.add(r);
        }
    }

    @Test
    void everyQueryUsesTheDatasourceVariableAndTheInstanceFilter() throws Exception {
        GrafanaDashboard d = GrafanaDashboard.read();
        assertThat(d.root.path("templating").path("list").findValuesAsString("name")).contains("datasource", "instance");
        for (JsonNode p : d.panels()) {
            if (p.path("type").asString().equals("row")) {
                continue;
            }
            for (JsonNode t : p.path("targets")) {
                assertThat(t.path("datasource").path("uid").asString()).as(p.path("title").asString()).isEqualTo("${datasource}");
                for (String metric : new GrafanaDashboard.Query(p.path("title").asString(), t.path("expr").asString()).metrics()) {
                    assertThat(t.path("expr").asString()).as("%s filters %s on $instance", p.path("title"), metric)
                            .containsPattern(java.util.regex.Pattern.quote(metric) + "\\{[^}]*instance=~\"\\$instance\"");
                }
            }
        }
    }

    /** What the issue asks for first: IOPS and MiB/s by route and op, latency percentiles, queue depth, DMA health. */
    @Test
    void thePanelsAnOperatorWantsFirstAreThere() throws Exception {
        List<GrafanaDashboard.Query> q = GrafanaDashboard.read().queries();
        assertThat(q).anySatisfy(x -> assertThat(x.expr()).contains("pmemblk_copy_ops_total").contains("by (route, dir)"));
        assertThat(q).anySatisfy(x -> assertThat(x.expr()).contains("pmemblk_copy_bytes_total").contains("by (route, dir)"));
        assertThat(q).anySatisfy(x -> assertThat(x.expr()).contains("pmemblk_request_duration_seconds_count").contains("by (op)"));
        for (String quantile : new String[]{"0.5", "0.99", "0.999"}) {
            assertThat(q).anySatisfy(x -> assertThat(x.expr())
                    .startsWith("histogram_quantile(" + quantile + ", sum by (le, op) (rate(pmemblk_request_duration_seconds_bucket"));
        }
        assertThat(q).anySatisfy(x -> assertThat(x.expr()).contains("pmemblk_queue_inflight").contains("by (queue)"));
        assertThat(q).anySatisfy(x -> assertThat(x.expr()).contains("pmemblk_dma_errors_total"));
        assertThat(q).anySatisfy(x -> assertThat(x.expr()).contains("pmemblk_dma_fallbacks_total"));
    }
}
