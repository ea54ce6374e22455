package io.pmemblk.dma.vfio;

import static io.pmemblk.dma.vfio.VfioAbi.GROUP_GET_DEVICE_FD;
import static io.pmemblk.dma.vfio.VfioAbi.GROUP_UNSET_CONTAINER;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;

/** An IOMMU group attached to a {@link VfioContainer}; owns the device fds opened through it. */
public final class VfioGroup {
    private final VfioContainer container;
    private final int number;
    private final int fd;
    private final List<VfioDevice> devices = new ArrayList<>();
    boolean attached;
    private boolean closed;

    VfioGroup(VfioContainer container, int number, int fd) {
        this.container = container;
        this.number = number;
        this.fd = fd;
    }

    public int number() {
        return number;
    }

    public VfioContainer container() {
        return container;
    }

    /** VFIO_GROUP_GET_DEVICE_FD for {@code address} ("dddd:bb:dd.f"). */
    public VfioDevice device(String address) throws VfioException {
        int dfd;
        try (Arena a = Arena.ofConfined()) {
            dfd = Libc.ioctl(fd, GROUP_GET_DEVICE_FD, a.allocateFrom(address), "VFIO_GROUP_GET_DEVICE_FD");
        } catch (NativeException e) {
            throw new VfioException("cannot open device " + address + " in IOMMU group " + number + ": " + e.getMessage(), e);
        }
        VfioDevice d;
        try {
            d = new VfioDevice(address, dfd);
        } catch (VfioException | RuntimeException e) {
            try {
                Libc.close(dfd);
            } catch (NativeException suppressed) {
                e.addSuppressed(suppressed);
            }
            throw e;
        }
        devices.add(d);
        return d;
    }

    /** Closes the devices, detaches from the container, closes the group fd. Idempotent. */
    synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        Teardown t = new Teardown();
        t.each(devices.reversed(), VfioDevice::close);
        if (attached) {
            t.step(() -> Libc.ioctl(fd, GROUP_UNSET_CONTAINER, 0L, "VFIO_GROUP_UNSET_CONTAINER"));
        }
        t.closeFd(fd);
        t.finish();
    }
}
