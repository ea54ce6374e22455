/** The io_uring ring benchmark (scripts/bench-uring). */
module io.pmemblk.bench.ring {
    requires io.pmemblk.uring;
    requires io.pmemblk.posix;
}
