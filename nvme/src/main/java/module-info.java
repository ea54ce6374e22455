/** The NVMe/TCP target (NVMe/TCP transport 1.0, NVMe over Fabrics 1.1, NVMe base 1.3 subset) over the block layer. */
module io.pmemblk.nvme {
    requires transitive io.pmemblk.queueing;

    exports io.pmemblk.nvme;
}
