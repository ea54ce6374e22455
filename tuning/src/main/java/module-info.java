/**
 * The CPU/DMA threshold autotuner ({@code pmemblk tune}), by size and by segments, with its chart; it measures
 * through the load generator of {@code bench/load}.
 */
module io.pmemblk.tuning {
    requires transitive io.pmemblk.pmem;
    requires transitive io.pmemblk.settings;
    requires transitive io.pmemblk.bench.load;
    requires java.management; // CPU time of the probing thread
    requires org.jfree.jfreechart; // tune --chart (an automatic module, named in its manifest)
    requires java.desktop;         // AWT off screen and ImageIO, for the chart's PNG

    exports io.pmemblk.tuning;
}
