package io.pmemblk.bench.vhostload;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.vhost.driver.DriverRing;
import io.pmemblk.vhost.driver.FrontEnd;
import io.pmemblk.vhost.driver.MemfdGuestRam;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;

/**
 * The control connection of a vhost-user-blk front end, as QEMU 7.2 drives one (qemu/qemu
 * {@code hw/block/vhost-user-blk.c} and {@code hw/virtio/vhost-user.c}): realize (features, protocol features,
 * queue count, owner, the config space), then the start of every ring over guest RAM in one sealed memfd, the
 * inflight region the back-end hands out, and one kick and one call eventfd per ring, over the control connection
 * ({@link FrontEnd}: every reply checked as QEMU checks it, a back-end that does not answer an error instead of a
 * hang). Nothing here is on the data path.
 */
final class VhostUserLink implements AutoCloseable {
    /** What Linux's virtio_blk driver acks of a device's offer (drivers/block/virtio_blk.c, features[]). */
    private static final long LINUX_BLK_FEATURES = bit(1) | bit(2) | bit(4) | bit(5) | bit(6) | bit(9) | bit(10)
            | bit(11) | bit(12) | bit(13) | bit(14);
    /** The ring features Linux's virtio_ring keeps: INDIRECT_DESC, EVENT_IDX, VERSION_1; bit 30 is vhost-user's. */
    private static final long RING_FEATURES = bit(F_INDIRECT_DESC) | bit(F_EVENT_IDX) | bit(F_VERSION_1)
            | bit(F_PROTOCOL_FEATURES);
    /** The protocol features this front end speaks: several queues, acks, the config space, inflight tracking. */
    private static final long PROTOCOL = bit(PF_MQ) | bit(PF_REPLY_ACK) | bit(PF_CONFIG) | bit(PF_INFLIGHT_SHMFD);
    /** virtio_blk_config (virtio 1.2 section 5.2.4): capacity in sectors @0, size_max @8, seg_max @12. */
    private static final int CFG_CAPACITY = 0, CFG_SIZE_MAX = 8, CFG_SEG_MAX = 12, CFG_BYTES = 16;

    private final FrontEnd fe;
    private int inflightFd = -1;
    long features;
    private long protocol;
    long capacitySectors;
    int segMax;
    long sizeMax;

    private VhostUserLink(FrontEnd fe) {
        this.fe = fe;
    }

    /** Connects and realizes the device as QEMU does at {@code -device vhost-user-blk-pci}. */
    static VhostUserLink realize(Path socket, int queues) throws IOException {
        VhostUserLink l = new VhostUserLink(FrontEnd.connect(socket));
        try {
            l.realize(queues);
        } catch (IOException | RuntimeException e) {
            l.close();
            throw e;
        }
        return l;
    }

    private void realize(int queues) throws IOException {
        long offered = fe.get(GET_FEATURES);
        if ((offered & bit(F_EVENT_IDX)) == 0 || (offered & bit(F_INDIRECT_DESC)) == 0
                || (offered & bit(F_PROTOCOL_FEATURES)) == 0) {
            throw new IOException("the back-end offers features 0x" + Long.toHexString(offered) + ": this load needs"
                    + " EVENT_IDX, INDIRECT_DESC and PROTOCOL_FEATURES, as a Linux guest behind QEMU negotiates them");
        }
        features = offered & (LINUX_BLK_FEATURES | RING_FEATURES);
        long protocol = fe.get(GET_PROTOCOL_FEATURES);
        if ((protocol & bit(PF_MQ)) == 0 || (protocol & bit(PF_CONFIG)) == 0) {
            throw new IOException("the back-end offers protocol features 0x" + Long.toHexString(protocol)
                    + ": MQ and CONFIG are needed (QEMU's vhost-user-blk refuses a back-end without CONFIG)");
        }
        this.protocol = protocol & PROTOCOL;
        fe.set(SET_PROTOCOL_FEATURES, this.protocol);
        long n = fe.get(GET_QUEUE_NUM);
        if (n < queues) {
            throw new IOException("the back-end serves " + n + " queues, " + queues + " asked (vhost.queues)");
        }
        fe.send(SET_OWNER, 0, fe.empty());
        MemorySegment ask = fe.payload(CONFIG_REGION + CFG_BYTES);
        ask.set(ValueLayout.JAVA_INT, CONFIG_SIZE, CFG_BYTES);
        fe.send(GET_CONFIG, 0, ask);
        MemorySegment cfg = fe.reply(GET_CONFIG).payload().asSlice(CONFIG_REGION);
        capacitySectors = cfg.get(ValueLayout.JAVA_LONG_UNALIGNED, CFG_CAPACITY);
        sizeMax = (features & bit(1)) != 0 ? Integer.toUnsignedLong(cfg.get(ValueLayout.JAVA_INT_UNALIGNED, CFG_SIZE_MAX)) : 0;
        segMax = (features & bit(2)) != 0 ? cfg.get(ValueLayout.JAVA_INT_UNALIGNED, CFG_SEG_MAX) : Integer.MAX_VALUE;
    }

    /**
     * The start QEMU sends when the guest driver sets DRIVER_OK: features, the inflight region, the memory table
     * (one region: all of {@code ram} at guest-physical 0), then each ring's size, base, addresses, kick and call,
     * and its enable; a GET_FEATURES round trip last, so every message has been handled when this returns.
     */
    void start(MemfdGuestRam ram, DriverRing[] rings, EventFd[] kicks, EventFd[] calls) throws IOException {
        fe.set(SET_FEATURES, features);
        if ((protocol & bit(PF_INFLIGHT_SHMFD)) != 0) {
            inflight(rings);
        }
        acked(SET_MEM_TABLE, fe.memTable(0, ram.size(), ram.user(0), 0), ram.fd());
        for (int i = 0; i < rings.length; i++) {
            fe.send(SET_VRING_NUM, 0, fe.state(i, rings[i].size));
            fe.send(SET_VRING_BASE, 0, fe.state(i, 0));
            fe.send(SET_VRING_ADDR, 0, fe.vringAddr(i, rings[i].descUser(), rings[i].availUser(), rings[i].usedUser()));
            fe.set(SET_VRING_KICK, i, kicks[i].fd());
            fe.set(SET_VRING_CALL, i, calls[i].fd());
        }
        for (int i = 0; i < rings.length; i++) {
            fe.send(SET_VRING_ENABLE, 0, fe.state(i, 1));
        }
        fe.get(GET_FEATURES);
    }

    /** The inflight region QEMU asks the back-end for and hands back (its own restart bookkeeping). */
    private void inflight(DriverRing[] rings) throws IOException {
        MemorySegment inflight = fe.payload(INFLIGHT_SIZE);
        inflight.set(ValueLayout.JAVA_SHORT, INFLIGHT_NUM_QUEUES, (short) rings.length);
        inflight.set(ValueLayout.JAVA_SHORT, INFLIGHT_QUEUE_SIZE, (short) rings[0].size);
        fe.send(GET_INFLIGHT_FD, 0, inflight);
        int[] fds = new int[1];
        MemorySegment region = fe.reply(GET_INFLIGHT_FD, fds).payload();
        inflightFd = fds[0];
        if (inflightFd < 0) {
            throw new IOException("GET_INFLIGHT_FD answered without a file descriptor");
        }
        acked(SET_INFLIGHT_FD, region, inflightFd);
    }

    /** A message with NEED_REPLY where REPLY_ACK was agreed, and its ack; else sent as is, ordered by the next reply. */
    private void acked(int request, MemorySegment payload, int... fds) throws IOException {
        if ((protocol & bit(PF_REPLY_ACK)) == 0) {
            fe.send(request, 0, payload, fds);
            return;
        }
        long r = fe.acked(request, payload, fds);
        if (r != 0) {
            throw new IOException("the back-end refused " + name(request) + " (REPLY_ACK " + r + "); its log says why");
        }
    }

    @Override
    public void close() throws NativeException {
        if (inflightFd >= 0) {
            Libc.close(inflightFd);
            inflightFd = -1;
        }
        fe.close();
    }
}
