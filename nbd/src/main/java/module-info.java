/** The NBD frontend (fixed newstyle handshake, transmission, structured replies) over the block layer. */
module io.pmemblk.nbd {
    requires transitive io.pmemblk.queueing;
    requires io.pmemblk.posix; // FIONREAD: whether a socket read would block

    exports io.pmemblk.nbd;
    exports io.pmemblk.nbd.tls;
}
