/** The in-process load generator ({@code pmemblk bench}) and the CPU/DMA threshold autotuner ({@code pmemblk tune}) with its chart. */
module io.pmemblk.tuning {
    requires transitive io.pmemblk.pmem;
    requires transitive io.pmemblk.settings;
    requires java.management; // CPU time of the submitting threads
    requires HdrHistogram; // no module name of its own: the automatic name from its jar
    requires org.jfree.jfreechart; // tune --chart (an automatic module, named in its manifest)
    requires java.desktop;         // AWT off screen and ImageIO, for the chart's PNG

    exports io.pmemblk.tuning;
}
