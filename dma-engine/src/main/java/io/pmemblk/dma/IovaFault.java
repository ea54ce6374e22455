package io.pmemblk.dma;

/** A device-side address that does not resolve: the range is not fully inside one registered region. */
public final class IovaFault extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final long iova;
    private final long length;

    public IovaFault(long iova, long length, String why) {
        super("IOVA range 0x" + Long.toHexString(iova) + "+" + length + " " + why);
        this.iova = iova;
        this.length = length;
    }

    public long iova() {
        return iova;
    }

    public long length() {
        return length;
    }
}
