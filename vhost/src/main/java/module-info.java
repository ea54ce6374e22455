/**
 * The vhost-user-blk frontend: QEMU shares guest RAM over a unix socket, the guest's virtio-blk requests are
 * descriptor chains in that RAM, and the one data copy is guest RAM <-> pmem, by the CPU or by the DMA engine.
 */
module io.pmemblk.vhost {
    requires transitive io.pmemblk.queueing;
    requires transitive io.pmemblk.posix; // SCM_RIGHTS, eventfd, MAP_SHARED mappings; TrustedDirectory in the API
    requires io.pmemblk.vhost.driver; // the split ring's and vhost-user's layouts (io.pmemblk.vhost.spec)

    exports io.pmemblk.vhost;
}
