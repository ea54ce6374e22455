/** The multi-queue block layer: hardware queues, tags, registered buffer pools, batched dispatch. Pure Java. */
module io.pmemblk.queueing {
    exports io.pmemblk.queueing;
    exports io.pmemblk.queueing.refusal; // the frontends' rate-limited refusal lines
}
