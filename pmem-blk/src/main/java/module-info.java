/**
 * The persistent-memory device: the mapped region (libpmem or the JDK's file mapping), the block driver that
 * routes each copy to the CPU or a DMA channel, and persistence. Binds libpmem, so it needs native access.
 */
module io.pmemblk.pmem {
    requires transitive io.pmemblk.queueing;
    requires transitive io.pmemblk.dma;
    requires io.pmemblk.posix;

    exports io.pmemblk.pmem;
    exports io.pmemblk.pmem.btt;
    exports io.pmemblk.pmem.bitmap;
}
