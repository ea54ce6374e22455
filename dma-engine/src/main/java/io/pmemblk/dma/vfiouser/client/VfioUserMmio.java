package io.pmemblk.dma.vfiouser.client;

import io.pmemblk.dma.Mmio;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A device region (BAR0, or configuration space) reached through a vfio-user connection: each access one
 * REGION_READ or REGION_WRITE of its width, in program order (the server handles commands in order), so the
 * {@link Mmio} ordering contract holds: the socket write of a REGION_WRITE comes after every store the caller made
 * before it (a syscall is a full barrier), and a REGION_READ's reply is read after the server did what it reports.
 *
 * <p>{@code posted}: writes go with No_reply, as PCI memory writes are posted (the doorbell costs one sendmsg,
 * not a round trip); configuration space is not posted, as PCI config writes are not.
 *
 * <p>A device that is gone answers as a removed PCI device does: reads return all ones, writes are dropped (no
 * exception in the middle of a driver's register sequence; the engine learns of the loss from the connection
 * and stops the channels itself). A read or write the device refuses (an error reply) is answered so too, and
 * counted.
 */
public final class VfioUserMmio implements Mmio {
    private final VfioUserConnection connection;
    private final int region;
    private final long size;
    private final boolean posted;
    private final AtomicLong failed = new AtomicLong();

    public VfioUserMmio(VfioUserConnection connection, int region, long size, boolean posted) {
        this.connection = connection;
        this.region = region;
        this.size = size;
        this.posted = posted;
    }

    /** Accesses that failed (refused, or the device gone) and read as all ones or were dropped. */
    public long failedAccesses() {
        return failed.get();
    }

    private void check(long offset, int width) {
        if (offset < 0 || offset > size - width || (offset & (width - 1)) != 0) {
            throw new IllegalArgumentException(width + "-byte access at 0x" + Long.toHexString(offset) + " of region "
                    + region + " (" + size + " bytes): allowed: naturally aligned, inside the region");
        }
    }

    private long read(long offset, int width) {
        check(offset, width);
        try {
            return connection.regionRead(region, offset, width);
        } catch (VfioUserException e) {
            failed.incrementAndGet();
            return width == 8 ? -1L : (1L << (width * 8)) - 1;
        }
    }

    private void write(long offset, int width, long value) {
        check(offset, width);
        try {
            connection.regionWrite(region, offset, width, value, posted);
        } catch (VfioUserException e) {
            failed.incrementAndGet();
        }
    }

    @Override
    public int read8(long offset) {
        return (int) read(offset, 1);
    }

    @Override
    public int read16(long offset) {
        return (int) read(offset, 2);
    }

    @Override
    public int read32(long offset) {
        return (int) read(offset, 4);
    }

    @Override
    public long read64(long offset) {
        return read(offset, 8);
    }

    @Override
    public void write8(long offset, int value) {
        write(offset, 1, value & 0xffL);
    }

    @Override
    public void write16(long offset, int value) {
        write(offset, 2, value & 0xffffL);
    }

    @Override
    public void write32(long offset, int value) {
        write(offset, 4, value & 0xffff_ffffL);
    }

    @Override
    public void write64(long offset, long value) {
        write(offset, 8, value);
    }
}
