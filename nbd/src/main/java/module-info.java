/** The NBD frontend (fixed newstyle handshake, transmission, structured replies) over the block layer. */
module io.pmemblk.nbd {
    requires transitive io.pmemblk.queueing;
    requires io.pmemblk.posix; // FIONREAD: whether a socket read would block
    requires jdk.net; // SO_PEERCRED: a unix peer's uid, for the per-peer handshake limit

    exports io.pmemblk.nbd;
    exports io.pmemblk.nbd.tls;
}
