/** The multi-queue block layer: hardware queues, tags, registered buffer pools, batched dispatch. Pure Java. */
module io.pmemblk.queueing {
    exports io.pmemblk.queueing;
    exports io.pmemblk.queueing.log; // rate-limited lines: frontends' refusals, the driver's faults; accept loops' failures
}
