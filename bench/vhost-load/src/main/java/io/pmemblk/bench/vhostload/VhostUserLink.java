package io.pmemblk.bench.vhostload;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.UnixMessages;
import io.pmemblk.posix.Sockets;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;

import static io.pmemblk.vhost.protocol.VhostUserSpec.*;

/**
 * The control connection of a vhost-user-blk front end, as QEMU 7.2 drives one (qemu/qemu
 * {@code hw/block/vhost-user-blk.c} and {@code hw/virtio/vhost-user.c}): realize (features, protocol features,
 * queue count, owner, the config space), then the start of every ring over guest RAM in one sealed memfd, the
 * inflight region the back-end hands out, and one kick and one call eventfd per ring. Every reply is checked as
 * QEMU checks it; a read gives up after {@link #TIMEOUT_MS}, so a back-end that does not answer ends the run with
 * an error instead of hanging it. Nothing here is on the data path.
 */
final class VhostUserLink implements AutoCloseable {
    static final int TIMEOUT_MS = 10_000;
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

    private final int sock;
    private final Arena arena = Arena.ofConfined();
    private final MemorySegment buf = arena.allocate(HEADER_SIZE + MAX_PAYLOAD, 8);
    private int inflightFd = -1;
    long features;
    private long protocol;
    long capacitySectors;
    int segMax;
    long sizeMax;

    private VhostUserLink(int sock) {
        this.sock = sock;
    }

    /** Connects and realizes the device as QEMU does at {@code -device vhost-user-blk-pci}. */
    static VhostUserLink realize(Path socket, int queues) throws IOException {
        int fd = Sockets.unixStreamSocket();
        VhostUserLink l = new VhostUserLink(fd);
        try {
            Sockets.connect(fd, socket.toString());
            Sockets.receiveTimeout(fd, TIMEOUT_MS);
            l.realize(queues);
        } catch (IOException | RuntimeException e) {
            l.close();
            throw e;
        }
        return l;
    }

    private void realize(int queues) throws IOException {
        long offered = get(GET_FEATURES);
        if ((offered & bit(F_EVENT_IDX)) == 0 || (offered & bit(F_INDIRECT_DESC)) == 0
                || (offered & bit(F_PROTOCOL_FEATURES)) == 0) {
            throw new IOException("the back-end offers features 0x" + Long.toHexString(offered) + ": this load needs"
                    + " EVENT_IDX, INDIRECT_DESC and PROTOCOL_FEATURES, as a Linux guest behind QEMU negotiates them");
        }
        features = offered & (LINUX_BLK_FEATURES | RING_FEATURES);
        long protocol = get(GET_PROTOCOL_FEATURES);
        if ((protocol & bit(PF_MQ)) == 0 || (protocol & bit(PF_CONFIG)) == 0) {
            throw new IOException("the back-end offers protocol features 0x" + Long.toHexString(protocol)
                    + ": MQ and CONFIG are needed (QEMU's vhost-user-blk refuses a back-end without CONFIG)");
        }
        this.protocol = protocol & PROTOCOL;
        set(SET_PROTOCOL_FEATURES, this.protocol);
        long n = get(GET_QUEUE_NUM);
        if (n < queues) {
            throw new IOException("the back-end serves " + n + " queues, " + queues + " asked (vhost.queues)");
        }
        send(SET_OWNER, 0, arena.allocate(0));
        MemorySegment ask = arena.allocate(CONFIG_REGION + CFG_BYTES, 8);
        ask.set(ValueLayout.JAVA_INT, CONFIG_SIZE, CFG_BYTES);
        send(GET_CONFIG, 0, ask);
        MemorySegment cfg = reply(GET_CONFIG, new int[0]).asSlice(CONFIG_REGION);
        capacitySectors = cfg.get(ValueLayout.JAVA_LONG_UNALIGNED, CFG_CAPACITY);
        sizeMax = (features & bit(1)) != 0 ? Integer.toUnsignedLong(cfg.get(ValueLayout.JAVA_INT_UNALIGNED, CFG_SIZE_MAX)) : 0;
        segMax = (features & bit(2)) != 0 ? cfg.get(ValueLayout.JAVA_INT_UNALIGNED, CFG_SEG_MAX) : Integer.MAX_VALUE;
    }

    /**
     * The start QEMU sends when the guest driver sets DRIVER_OK: features, the inflight region, the memory table
     * (one region: all of {@code ram} at guest-physical 0), then each ring's size, base, addresses, kick and call,
     * and its enable; a GET_FEATURES round trip last, so every message has been handled when this returns.
     */
    void start(GuestRam ram, DriverRing[] rings, EventFd[] kicks, EventFd[] calls) throws IOException {
        set(SET_FEATURES, features);
        if ((protocol & bit(PF_INFLIGHT_SHMFD)) != 0) {
            inflight(rings);
        }
        MemorySegment table = arena.allocate(MEMORY_REGIONS + REGION_SIZE, 8);
        table.set(ValueLayout.JAVA_INT, MEMORY_NREGIONS, 1);
        table.set(ValueLayout.JAVA_INT, MEMORY_NREGIONS + 4, 0);
        table.set(ValueLayout.JAVA_LONG, MEMORY_REGIONS + REGION_GPA, 0);
        table.set(ValueLayout.JAVA_LONG, MEMORY_REGIONS + REGION_SIZE_FIELD, ram.size());
        table.set(ValueLayout.JAVA_LONG, MEMORY_REGIONS + REGION_UADDR, ram.userAddress(0));
        table.set(ValueLayout.JAVA_LONG, MEMORY_REGIONS + REGION_MMAP_OFFSET, 0);
        acked(SET_MEM_TABLE, table, ram.fd());
        for (int i = 0; i < rings.length; i++) {
            send(SET_VRING_NUM, 0, state(i, rings[i].size));
            send(SET_VRING_BASE, 0, state(i, 0));
            MemorySegment a = arena.allocate(ADDR_SIZE, 8);
            a.set(ValueLayout.JAVA_INT, ADDR_INDEX, i);
            a.set(ValueLayout.JAVA_LONG, ADDR_DESC, ram.userAddress(rings[i].descGpa));
            a.set(ValueLayout.JAVA_LONG, ADDR_USED, ram.userAddress(rings[i].usedGpa));
            a.set(ValueLayout.JAVA_LONG, ADDR_AVAIL, ram.userAddress(rings[i].availGpa));
            send(SET_VRING_ADDR, 0, a);
            set(SET_VRING_KICK, i, kicks[i].fd());
            set(SET_VRING_CALL, i, calls[i].fd());
        }
        for (int i = 0; i < rings.length; i++) {
            send(SET_VRING_ENABLE, 0, state(i, 1));
        }
        get(GET_FEATURES);
    }

    /** The inflight region QEMU asks the back-end for and hands back (its own restart bookkeeping). */
    private void inflight(DriverRing[] rings) throws IOException {
        MemorySegment inflight = arena.allocate(INFLIGHT_SIZE, 8);
        inflight.set(ValueLayout.JAVA_SHORT, INFLIGHT_NUM_QUEUES, (short) rings.length);
        inflight.set(ValueLayout.JAVA_SHORT, INFLIGHT_QUEUE_SIZE, (short) rings[0].size);
        send(GET_INFLIGHT_FD, 0, inflight);
        int[] fds = new int[1];
        MemorySegment region = reply(GET_INFLIGHT_FD, fds);
        inflightFd = fds[0];
        if (inflightFd < 0) {
            throw new IOException("GET_INFLIGHT_FD answered without a file descriptor");
        }
        acked(SET_INFLIGHT_FD, region, inflightFd);
    }

    private MemorySegment state(int index, int num) {
        MemorySegment p = arena.allocate(STATE_SIZE, 8);
        p.set(ValueLayout.JAVA_INT, STATE_INDEX, index);
        p.set(ValueLayout.JAVA_INT, STATE_NUM, num);
        return p;
    }

    private void send(int request, int flags, MemorySegment payload, int... fds) throws NativeException {
        long size = payload.byteSize();
        MemorySegment m = buf.asSlice(0, HEADER_SIZE + size);
        m.set(ValueLayout.JAVA_INT, HDR_REQUEST, request);
        m.set(ValueLayout.JAVA_INT, HDR_FLAGS, VERSION | flags);
        m.set(ValueLayout.JAVA_INT, HDR_SIZE, (int) size);
        MemorySegment.copy(payload, 0, m, HEADER_SIZE, size);
        UnixMessages.send(sock, m, fds);
    }

    private void set(int request, long value, int... fds) throws NativeException {
        MemorySegment p = arena.allocate(U64_SIZE, 8);
        p.set(ValueLayout.JAVA_LONG, 0, value);
        send(request, 0, p, fds);
    }

    private long get(int request) throws IOException {
        send(request, 0, arena.allocate(0));
        return u64(request, reply(request, new int[0]));
    }

    /** A message with NEED_REPLY where REPLY_ACK was agreed, and its ack; else sent as is, ordered by the next reply. */
    private void acked(int request, MemorySegment payload, int... fds) throws IOException {
        if ((protocol & bit(PF_REPLY_ACK)) == 0) {
            send(request, 0, payload, fds);
            return;
        }
        send(request, FLAG_NEED_REPLY, payload, fds);
        long r = u64(request, reply(request, new int[0]));
        if (r != 0) {
            throw new IOException("the back-end refused " + name(request) + " (REPLY_ACK " + r + "); its log says why");
        }
    }

    private static long u64(int request, MemorySegment p) throws IOException {
        if (p.byteSize() != U64_SIZE) {
            throw new IOException(name(request) + " answered " + p.byteSize() + " bytes, 8 expected");
        }
        return p.get(ValueLayout.JAVA_LONG_UNALIGNED, 0);
    }

    /** The reply to {@code request}: header checked as QEMU's vhost_user_read_header does, payload copied out. */
    private MemorySegment reply(int request, int[] fdsOut) throws IOException {
        MemorySegment h = arena.allocate(HEADER_SIZE, 8);
        receiveFully(h, fdsOut, request);
        int got = h.get(ValueLayout.JAVA_INT, HDR_REQUEST), flags = h.get(ValueLayout.JAVA_INT, HDR_FLAGS);
        int size = h.get(ValueLayout.JAVA_INT, HDR_SIZE);
        if (got != request || flags != REPLY_FLAGS || size < 0 || size > MAX_PAYLOAD) {
            throw new IOException("a reply to " + name(request) + " came as " + name(got) + ", flags 0x"
                    + Integer.toHexString(flags) + ", " + size + " bytes (expected flags 0x5, at most " + MAX_PAYLOAD + ")");
        }
        MemorySegment p = arena.allocate(Math.max(size, 1), 8).asSlice(0, size);
        receiveFully(p, new int[0], request);
        return p;
    }

    private void receiveFully(MemorySegment into, int[] fdsOut, int request) throws IOException {
        long got = 0;
        while (got < into.byteSize()) {
            int n = UnixMessages.receive(sock, into.asSlice(got), got == 0 ? fdsOut : new int[0]);
            if (n == 0) {
                throw new IOException("the back-end closed the connection instead of answering " + name(request));
            }
            got += n;
        }
    }

    @Override
    public void close() throws NativeException {
        if (inflightFd >= 0) {
            Libc.close(inflightFd);
            inflightFd = -1;
        }
        Libc.close(sock);
        arena.close();
    }
}
