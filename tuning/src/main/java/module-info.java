/** The in-process load generator ({@code pmemblk bench}) and the CPU/DMA threshold autotuner ({@code pmemblk tune}). */
module io.pmemblk.tuning {
    requires transitive io.pmemblk.pmem;
    requires transitive io.pmemblk.settings;
    requires java.management; // CPU time of the submitting threads
    requires HdrHistogram; // no module name of its own: the automatic name from its jar

    exports io.pmemblk.tuning;
}
