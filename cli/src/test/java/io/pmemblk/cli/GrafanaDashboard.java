package io.pmemblk.cli;

import tools.jackson.databind.JsonNode;
import tools.jackson.databind.json.JsonMapper;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/** The dashboard shipped in packaging/grafana, read for its tests: its panels and their PromQL. */
final class GrafanaDashboard {
    static final Path FILE = Path.of("..", "packaging", "grafana", "pmemblk.json");
    private static final Pattern METRIC = Pattern.compile("\\b(pmemblk_[a-z0-9_]+)\\b(\\{[^}]*})?");
    private static final Pattern BY = Pattern.compile("\\bby\\s*\\(([^)]*)\\)");
    private static final Pattern MATCHER = Pattern.compile("([a-zA-Z_][a-zA-Z0-9_]*)\\s*(=~|!~|!=|=)");

    /** One query of a panel. */
    record Query(String panel, String expr) {
        /** The metric names the query reads. */
        Set<String> metrics() {
            Set<String> out = new LinkedHashSet<>();
            Matcher m = METRIC.matcher(expr);
            while (m.find()) {
                out.add(m.group(1));
            }
            return out;
        }

        /** Label names in the selectors of {@code metric}. */
        Set<String> selectorLabels(String metric) {
            Set<String> out = new LinkedHashSet<>();
            Matcher m = METRIC.matcher(expr);
            while (m.find()) {
                if (m.group(1).equals(metric) && m.group(2) != null) {
                    Matcher l = MATCHER.matcher(m.group(2));
                    while (l.find()) {
                        out.add(l.group(1));
                    }
                }
            }
            return out;
        }

        /** Label names grouped by, in every {@code by (...)}. */
        Set<String> byLabels() {
            Set<String> out = new LinkedHashSet<>();
            Matcher m = BY.matcher(expr);
            while (m.find()) {
                for (String l : m.group(1).split(",")) {
                    if (!l.isBlank()) {
                        out.add(l.trim());
                    }
                }
            }
            return out;
        }

        /** As Prometheus would get it from Grafana: its variables replaced. */
        String forPrometheus(String rateInterval) {
            return expr.replace("$__rate_interval", rateInterval).replace("$instance", ".*");
        }
    }

    final JsonNode root;

    GrafanaDashboard(String json) {
        this.root = JsonMapper.builder().build().readTree(json);
    }

    static GrafanaDashboard read() throws IOException {
        return new GrafanaDashboard(Files.readString(FILE));
    }

    /** Every panel, rows' nested ones included (rows themselves too). */
    List<JsonNode> panels() {
        List<JsonNode> out = new ArrayList<>();
        for (JsonNode p : root.path("panels")) {
            out.add(p);
            for (JsonNode q : p.path("panels")) {
                out.add(q);
            }
        }
        return out;
    }

    List<Query> queries() {
        List<Query> out = new ArrayList<>();
        for (JsonNode p : panels()) {
            for (JsonNode t : p.path("targets")) {
                out.add(new Query(p.path("title").asString(), t.path("expr").asString()));
            }
        }
        return out;
    }
}
