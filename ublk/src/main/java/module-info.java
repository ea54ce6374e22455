/**
 * The ublk frontend: {@code /dev/ublkbN} block devices whose requests the kernel's ublk driver hands to this
 * process through io_uring URING_CMDs, served on the block layer. Needs no native access of its own: libc comes
 * from {@code io.pmemblk.posix}, the rings from {@code io.pmemblk.uring}.
 */
module io.pmemblk.ublk {
    requires transitive io.pmemblk.queueing;
    requires io.pmemblk.posix;
    requires io.pmemblk.uring;

    exports io.pmemblk.ublk;
}
