package io.pmemblk.tuning;

import io.pmemblk.queueing.Route;
import io.pmemblk.settings.Sizes;
import org.jfree.chart.ChartRenderingInfo;
import org.jfree.chart.JFreeChart;
import org.jfree.chart.LegendItemCollection;
import org.jfree.chart.axis.LogAxis;
import org.jfree.chart.axis.NumberAxis;
import org.jfree.chart.axis.NumberTickUnit;
import org.jfree.chart.block.RectangleConstraint;
import org.jfree.chart.plot.CombinedDomainXYPlot;
import org.jfree.chart.plot.ValueMarker;
import org.jfree.chart.plot.XYPlot;
import org.jfree.chart.renderer.xy.XYLineAndShapeRenderer;
import org.jfree.chart.title.TextTitle;
import org.jfree.chart.ui.RectangleAnchor;
import org.jfree.chart.ui.RectangleEdge;
import org.jfree.chart.ui.TextAnchor;
import org.jfree.data.xy.XYSeries;
import org.jfree.data.xy.XYSeriesCollection;

import javax.imageio.ImageIO;
import java.awt.BasicStroke;
import java.awt.Color;
import java.awt.Font;
import java.awt.Graphics2D;
import java.awt.RenderingHints;
import java.awt.geom.Rectangle2D;
import java.awt.image.BufferedImage;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.text.FieldPosition;
import java.text.NumberFormat;
import java.text.ParsePosition;
import java.util.ArrayList;
import java.util.List;

/**
 * {@code pmemblk tune --chart}: what the sweep measured, as a picture. Two columns (reads, writes), each with
 * throughput above and CPU time per GiB of the submitting threads below, against request size on a log scale;
 * one line per route (CPU blue, DMA orange) and queue shape (1x1 dashed, the deep queue solid); the crossover
 * {@link Crossover} chose as a red vertical line in every panel, or the title saying DMA never won.
 * Drawn off screen (headless AWT), so it needs fonts (fontconfig) but no display.
 */
public final class CrossoverChart {
    public static final int WIDTH = 1600, HEIGHT = 1000;
    static final Color CPU = new Color(0x1f, 0x77, 0xb4);
    static final Color DMA = new Color(0xff, 0x7f, 0x0e);
    static final Color CROSSOVER = new Color(0xd6, 0x27, 0x28);
    private static final int HEADER = 90;

    private CrossoverChart() {}

    /** What was drawn where: the image, each panel's data area, and the crossover's x in it in pixels (-1: none). */
    record Drawn(BufferedImage image, List<Rectangle2D> dataAreas, List<Integer> crossoverX) {}

    /** Draws {@code report} into {@code png}; {@code about} is a line under the title (engine, date, repeats). */
    public static void write(Autotuner.Report report, String about, Path png) throws IOException {
        BufferedImage image = draw(report, about).image();
        Path tmp = Files.createTempFile(png.toAbsolutePath().getParent(), ".pmemblk-chart", ".png");
        try {
            if (!ImageIO.write(image, "png", tmp.toFile())) {
                throw new IOException("no PNG writer in this JDK");
            }
            Files.move(tmp, png, java.nio.file.StandardCopyOption.REPLACE_EXISTING,
                    java.nio.file.StandardCopyOption.ATOMIC_MOVE);
        } finally {
            Files.deleteIfExists(tmp);
        }
    }

    static Drawn draw(Autotuner.Report report, String about) {
        BufferedImage image = new BufferedImage(WIDTH, HEIGHT, BufferedImage.TYPE_INT_RGB);
        Graphics2D g = image.createGraphics();
        try {
            g.setRenderingHint(RenderingHints.KEY_ANTIALIASING, RenderingHints.VALUE_ANTIALIAS_ON);
            g.setColor(Color.WHITE);
            g.fillRect(0, 0, WIDTH, HEIGHT);
            Crossover.Result r = report.result();
            String verdict = r.off() ? "DMA never matched the CPU: route.dma.min-bytes=off"
                    : "crossover " + Sizes.format(r.threshold()) + ": route.dma.min-bytes=" + Sizes.format(r.threshold());
            header(g, "pmemblk tune: CPU vs DMA by request size. " + verdict, Font.BOLD, 22, 8);
            header(g, about, Font.PLAIN, 14, 44);
            header(g, r.explanation() + (r.noisy() ? " (noisy: within the repeats' spread)" : ""), Font.PLAIN, 14, 64);
            List<Rectangle2D> areas = new ArrayList<>();
            List<Integer> xs = new ArrayList<>();
            for (int col = 0; col < 2; col++) {
                boolean write = col == 1;
                JFreeChart chart = column(report, write);
                ChartRenderingInfo info = new ChartRenderingInfo();
                Rectangle2D area = new Rectangle2D.Double(col * WIDTH / 2.0, HEADER, WIDTH / 2.0, HEIGHT - HEADER);
                chart.draw(g, area, info);
                CombinedDomainXYPlot plot = (CombinedDomainXYPlot) chart.getXYPlot();
                for (int i = 0; i < info.getPlotInfo().getSubplotCount(); i++) {
                    Rectangle2D data = info.getPlotInfo().getSubplotInfo(i).getDataArea();
                    areas.add(data);
                    xs.add(r.off() ? -1
                            : (int) Math.round(plot.getDomainAxis().valueToJava2D(r.threshold(), data, RectangleEdge.BOTTOM)));
                }
            }
            return new Drawn(image, areas, xs);
        } finally {
            g.dispose();
        }
    }

    /** A line of the header, centred; a title lays its text out in arrange(), which must come before draw(). */
    private static void header(Graphics2D g, String text, int style, int points, int y) {
        TextTitle t = new TextTitle(text, new Font(Font.SANS_SERIF, style, points));
        Rectangle2D area = new Rectangle2D.Double(0, y, WIDTH, points * 1.6);
        t.arrange(g, RectangleConstraint.NONE.toFixedWidth(area.getWidth()));
        t.draw(g, area);
    }

    /** One direction: throughput over CPU per GiB, sharing the size axis. */
    private static JFreeChart column(Autotuner.Report report, boolean write) {
        LogAxis size = new LogAxis("request size");
        size.setBase(2);
        size.setTickUnit(new NumberTickUnit(1)); // one tick per power of two: 4K, 8K, ... 2M
        size.setNumberFormatOverride(new SizeFormat());
        size.setMinorTickCount(0);
        long min = report.rows().stream().mapToLong(Autotuner.Row::size).min().orElse(4096);
        long max = report.rows().stream().mapToLong(Autotuner.Row::size).max().orElse(2 << 20);
        size.setRange(min / 1.25, max * 1.25);
        CombinedDomainXYPlot plot = new CombinedDomainXYPlot(size);
        plot.setGap(12);
        XYPlot throughput = panel(report, write, true, "MiB/s");
        plot.add(throughput, 3);
        plot.add(panel(report, write, false, "CPU s per GiB (submitting threads)"), 2);
        // the legend once: both panels have the same four lines
        LegendItemCollection legend = throughput.getRenderer().getLegendItems();
        plot.setFixedLegendItems(legend);
        Crossover.Result r = report.result();
        if (!r.off()) {
            for (XYPlot p : List.of(plot.getSubplots().get(0), plot.getSubplots().get(1))) {
                ValueMarker m = new ValueMarker(r.threshold(), CROSSOVER, new BasicStroke(3f));
                if (p == throughput) {
                    m.setLabel("crossover " + Sizes.format(r.threshold()));
                    m.setLabelFont(new Font(Font.SANS_SERIF, Font.BOLD, 14));
                    m.setLabelPaint(CROSSOVER);
                    m.setLabelBackgroundColor(Color.WHITE);
                    // the label on the side of the line with room for it: right of it in the left half of the axis
                    boolean leftHalf = r.threshold() < Math.sqrt((double) min * max);
                    m.setLabelAnchor(leftHalf ? RectangleAnchor.TOP_RIGHT : RectangleAnchor.TOP_LEFT);
                    m.setLabelTextAnchor(leftHalf ? TextAnchor.TOP_LEFT : TextAnchor.TOP_RIGHT);
                }
                p.addDomainMarker(m);
            }
        }
        JFreeChart chart = new JFreeChart(write ? "writes" : "reads", new Font(Font.SANS_SERIF, Font.BOLD, 18), plot, true);
        chart.setBackgroundPaint(Color.WHITE);
        return chart;
    }

    private static XYPlot panel(Autotuner.Report report, boolean write, boolean throughput, String label) {
        XYSeriesCollection data = new XYSeriesCollection();
        XYLineAndShapeRenderer lines = new XYLineAndShapeRenderer(true, true);
        List<int[]> shapes = new ArrayList<>();
        for (Autotuner.Row row : report.rows()) {
            if (shapes.stream().noneMatch(s -> s[0] == row.jobs() && s[1] == row.depth())) {
                shapes.add(new int[]{row.jobs(), row.depth()});
            }
        }
        for (int[] shape : shapes) {
            boolean shallow = shape[0] == 1 && shape[1] == 1;
            for (Route route : Route.values()) {
                XYSeries s = new XYSeries(route.label().toUpperCase(java.util.Locale.ROOT) + " " + shape[0] + "x" + shape[1]);
                for (Autotuner.Row row : report.rows()) {
                    if (row.write() == write && row.jobs() == shape[0] && row.depth() == shape[1]) {
                        Autotuner.Sample sample = route == Route.CPU ? row.cpu() : row.dma();
                        s.add(row.size(), throughput ? sample.mibPerSec() : sample.submitSecondsPerGiB());
                    }
                }
                int i = data.getSeriesCount();
                data.addSeries(s);
                lines.setSeriesPaint(i, route == Route.CPU ? CPU : DMA);
                lines.setSeriesStroke(i, shallow
                        ? new BasicStroke(2f, BasicStroke.CAP_BUTT, BasicStroke.JOIN_MITER, 10f, new float[]{8f, 6f}, 0f)
                        : new BasicStroke(2.5f));
            }
        }
        NumberAxis y = new NumberAxis(label);
        y.setAutoRangeIncludesZero(true);
        XYPlot plot = new XYPlot(data, null, y, lines);
        plot.setBackgroundPaint(Color.WHITE);
        plot.setDomainGridlinePaint(Color.LIGHT_GRAY);
        plot.setRangeGridlinePaint(Color.LIGHT_GRAY);
        return plot;
    }

    /** Tick labels of the size axis as the settings write sizes (4K, 256K, 2M). */
    private static final class SizeFormat extends NumberFormat {
        @Override
        public StringBuffer format(double number, StringBuffer to, FieldPosition pos) {
            return to.append(Sizes.format(Math.round(number)));
        }

        @Override
        public StringBuffer format(long number, StringBuffer to, FieldPosition pos) {
            return to.append(Sizes.format(number));
        }

        @Override
        public Number parse(String source, ParsePosition pos) {
            throw new UnsupportedOperationException("labels only");
        }
    }
}
