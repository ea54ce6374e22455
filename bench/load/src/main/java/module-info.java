/**
 * The in-process load generator ({@code pmemblk bench}, and the probe of {@code pmemblk tune}): fio's shape on
 * the frontend seam, with no protocol in the way.
 */
module io.pmemblk.bench.load {
    requires transitive io.pmemblk.queueing;
    requires java.management; // CPU time of the submitting threads
    requires HdrHistogram;    // no module name of its own: the automatic name from its jar

    exports io.pmemblk.bench.load;
}
