/**
 * Copy engines: the I/OAT v3 channel driver over an {@link io.pmemblk.dma.Mmio} register window, the software
 * I/OAT device behind the same registers, the IOVA space both translate through, and the VFIO layer that puts a
 * real PCI device (I/OAT, or QEMU's edu) behind them; and the software device served to other processes over
 * vfio-user. Its ioctls, mmaps and eventfds go through io.pmemblk.posix (Libc, FileIo); its one native binding of
 * its own is libvfio-user ({@code io.pmemblk.dma.vfiouser.device.LibVfioUser}), which loads that library and so
 * needs this module's own native-access grant (the parent pom's pmemblk.jvm.native-modules).
 */
module io.pmemblk.dma {
    requires java.management; // the soft device reports its engine threads' CPU time
    requires io.pmemblk.posix;
    exports io.pmemblk.dma;
    exports io.pmemblk.dma.ioat;
    exports io.pmemblk.dma.soft;
    exports io.pmemblk.dma.edu;
    exports io.pmemblk.dma.vfio;
    exports io.pmemblk.dma.vfiouser.client;
    exports io.pmemblk.dma.vfiouser.device;

    // Faults for the software device come only from a provider a test puts on the module path (SoftFaults).
    uses io.pmemblk.dma.soft.SoftFaults;
}
