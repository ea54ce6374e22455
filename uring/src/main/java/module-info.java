/**
 * An io_uring ring driven by hand (no liburing, no JNI): setup, mmapped SQ/CQ/SQE areas, batched submission,
 * completion reaping. Needs no native access: the three system calls and the ring mappings come from
 * {@code io.pmemblk.posix}.
 */
module io.pmemblk.uring {
    requires io.pmemblk.posix;
    exports io.pmemblk.uring;
}
