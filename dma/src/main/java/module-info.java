/**
 * Copy engines: the I/OAT v3 channel driver over an {@link io.pmemblk.dma.Mmio} register window, the software
 * I/OAT device behind the same registers, and the IOVA space both translate through. Pure Java today: no
 * native access (a VFIO backend will bring it, through its own small native class).
 */
module io.pmemblk.dma {
    requires java.management; // the soft device reports its engine threads' CPU time
    exports io.pmemblk.dma;
    exports io.pmemblk.dma.ioat;
    exports io.pmemblk.dma.soft;
}
