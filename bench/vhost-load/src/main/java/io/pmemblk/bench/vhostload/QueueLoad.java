package io.pmemblk.bench.vhostload;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.NativeException;
import io.pmemblk.vhost.driver.DriverRing;
import io.pmemblk.vhost.driver.MemfdGuestRam;
import io.pmemblk.vhost.spec.Le;
import io.pmemblk.vhost.spec.SplitRingLayout;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * One fio job on one virtqueue, as a Linux guest's virtio-blk driver carries it: {@code depth} requests kept in
 * flight, each a chain header / data / status through an indirect table (Linux's virtio_ring goes indirect for
 * every chain of more than one buffer once INDIRECT_DESC is agreed), data in page-sized pieces a page apart (a
 * guest's pages are not contiguous, and its block layer has already joined those that are: pieces back to back
 * would let the server join them into one and measure a request no guest sends) and a request larger than seg_max
 * pieces split in several, as the guest's block layer splits it.
 * Completions come by the call eventfd with EVENT_IDX: after each pass over the used ring used_event is moved past
 * it and the ring checked again before waiting, as {@code virtblk_done} does. Everything a request needs is laid out
 * once; the loop allocates nothing.
 *
 * <p>Accounting: a request counts only when every piece of it came back in the used ring once, with status OK (the
 * status byte is poisoned before each submission). With {@code verify}, each write's data is stamped
 * ({@link SectorStamp}) and read back into a poisoned buffer before the slot takes its next request, and every read
 * is checked against the stamps: a request the server did not do correctly is an error, not throughput.
 */
final class QueueLoad implements Runnable {
    /** The status byte before the device writes it: no virtio-blk status has this value. */
    private static final byte POISON = (byte) 0xee;
    private static final int PAGE = 4096, META = 64, HEADER_BYTES = 16, STATUS_AT = 16;
    /** virtio-blk request types (virtio 1.2 section 5.2.6). */
    private static final int T_IN = 0, T_OUT = 1;
    /** Without a completion for this long the server is taken as stuck: the run fails instead of hanging. */
    static final long STALL_NANOS = 10_000_000_000L;

    private final DriverRing ring;
    private final EventFd kick, call;
    /** All of guest RAM: every address below is an offset in it (a guest-physical address), so no slice is made. */
    private final MemorySegment mem;
    private final Job job;
    private final boolean verify, once;
    private final Shape shape;
    private final long metaGpa, tableGpa, dataGpa, dataStride, pieceStride;
    private final long spanStartSector, blocks;
    private final int[] pending;
    private final boolean[] checking;
    /** Per slot: 1 when its data pieces are laid out for a write (device-readable), 0 for a read, -1 not yet. */
    private final int[] laidOutFor;
    private final long[] sector, gen;
    private long cursor, generation, random;
    private volatile long deadline = Long.MAX_VALUE;
    private boolean stopping;
    private int ioInFlight;

    long ios, bytes, errors;
    String firstError;

    /**
     * How a request of the job is cut: data in pieces of {@code piece} bytes (a page, or size_max when smaller),
     * {@code perChain} of them per chain (seg_max), {@code chains} chains per request.
     */
    record Shape(int piece, int pieces, int perChain, int chains, long tableStride) {
        static Shape of(Job job, int segMax, long sizeMax) {
            int piece = (int) Math.max(SectorStamp.SECTOR, (sizeMax > 0 ? Math.min(PAGE, sizeMax) : PAGE) & ~511L);
            int pieces = (job.bytes() + piece - 1) / piece;
            int chains = (pieces + segMax - 1) / segMax;
            int perChain = (pieces + chains - 1) / chains;
            return new Shape(piece, pieces, perChain, chains, (SplitRingLayout.DESC_BYTES * (2L + perChain) + 63) & ~63L);
        }

        int piecesOf(int chain) {
            return Math.min(perChain, pieces - chain * perChain);
        }

        /** From one piece to the next in guest RAM: the piece's pages and one page between. */
        long pieceStride() {
            return pages(piece) + PAGE;
        }

        /** A slot's data area. */
        long dataStride() {
            return pieces * pieceStride();
        }
    }

    private static long pages(long n) {
        return (n + PAGE - 1) & ~(long) (PAGE - 1);
    }

    /** The guest RAM a queue of this job needs after its ring (see the constructor). */
    static long bytes(Job job, int ringSize, int segMax, long sizeMax) {
        Shape s = Shape.of(job, segMax, sizeMax);
        return pages((long) META * ringSize) + pages(ringSize * s.tableStride()) + job.depth() * s.dataStride();
    }

    /**
     * Job {@code index} of {@code job} on {@code ring}, its requests laid out in guest RAM from {@code base} on;
     * {@code capacitySectors} the disk's; {@code once}: one sequential pass over the job's span, then done (the
     * prefill).
     */
    QueueLoad(MemfdGuestRam ram, DriverRing ring, long base, EventFd kick, EventFd call, Job job, int index,
              long capacitySectors, int segMax, long sizeMax, boolean verify, boolean once) {
        this.mem = ram.at(0, ram.size());
        this.ring = ring;
        this.kick = kick;
        this.call = call;
        this.job = job;
        this.verify = verify;
        this.once = once;
        shape = Shape.of(job, segMax, sizeMax);
        int heads = job.depth() * shape.chains();
        if (heads > ring.size) {
            throw new IllegalArgumentException("job " + job.name() + " keeps " + heads + " chains in flight per queue ("
                    + job.depth() + " requests of " + shape.chains() + " chains at seg_max " + segMax + "); the ring holds "
                    + ring.size + ": allowed qd up to " + ring.size / shape.chains());
        }
        long spanBytes = capacitySectors * SectorStamp.SECTOR / job.jobs();
        blocks = spanBytes / job.bytes();
        long least = verify ? job.depth() : 1;
        if (blocks < least) {
            throw new IllegalArgumentException("job " + job.name() + ": a span of " + spanBytes + " bytes holds "
                    + blocks + " requests of " + job.bytes() + " bytes; at least " + least + " needed"
                    + (verify ? " (verify gives each request in flight blocks of its own)" : ""));
        }
        spanStartSector = index * (blocks * job.bytes() / SectorStamp.SECTOR);
        metaGpa = base;
        tableGpa = metaGpa + pages((long) META * ring.size);
        dataGpa = tableGpa + pages(ring.size * shape.tableStride());
        dataStride = shape.dataStride();
        pieceStride = shape.pieceStride();
        pending = new int[job.depth()];
        checking = new boolean[job.depth()];
        laidOutFor = new int[job.depth()];
        sector = new long[job.depth()];
        gen = new long[job.depth()];
        random = 0x9E3779B97F4A7C15L * (index + 1) ^ System.nanoTime();
        for (int s = 0; s < job.depth(); s++) {
            layOut(s);
        }
    }

    /** Where piece {@code p} of slot {@code s}'s data lies. */
    private long piece(int s, int p) {
        return dataGpa + s * dataStride + p * pieceStride;
    }

    /** The bytes of piece {@code p} (the last may be short). */
    private long pieceBytes(int p) {
        return Math.min(shape.piece(), job.bytes() - (long) p * shape.piece());
    }

    /** The first sector of piece {@code p} of slot {@code s}'s request. */
    private long pieceSector(int s, int p) {
        return sector[s] + (long) p * shape.piece() / SectorStamp.SECTOR;
    }

    /** Fills slot {@code s}'s data, piece by piece, with {@code b}. */
    private void fillData(int s, byte b) {
        for (int p = 0; p < shape.pieces(); p++) {
            mem.asSlice(piece(s, p), pieceBytes(p)).fill(b);
        }
    }

    private long table(int head) {
        return tableGpa + head * shape.tableStride();
    }

    /** Slot {@code s}'s chains: ring descriptor h -> an indirect table of header, pieces, status. */
    private void layOut(int s) {
        for (int k = 0; k < shape.chains(); k++) {
            int h = s * shape.chains() + k, n = shape.piecesOf(k);
            long meta = metaGpa + (long) META * h, t = table(h);
            DriverRing.desc(mem, t, meta, HEADER_BYTES, SplitRingLayout.F_NEXT, 1);
            for (int p = 0; p < n; p++) {
                int q = k * shape.perChain() + p;
                DriverRing.desc(mem, t + (long) SplitRingLayout.DESC_BYTES * (1 + p), piece(s, q), pieceBytes(q),
                        SplitRingLayout.F_NEXT, 2 + p);
            }
            DriverRing.desc(mem, t + (long) SplitRingLayout.DESC_BYTES * (1 + n), meta + STATUS_AT, 1, SplitRingLayout.F_WRITE, 0);
            ring.indirect(h, t, n + 2);
        }
        laidOutFor[s] = -1;
    }

    /** Sets slot {@code s}'s data pieces device-readable (a write) or writable (a read); rewritten only on a change. */
    private void direction(int s, boolean write) {
        int want = write ? 1 : 0;
        if (laidOutFor[s] == want) {
            return;
        }
        laidOutFor[s] = want;
        short flags = (short) (SplitRingLayout.F_NEXT | (write ? 0 : SplitRingLayout.F_WRITE));
        for (int k = 0; k < shape.chains(); k++) {
            long t = table(s * shape.chains() + k);
            for (int p = 1; p <= shape.piecesOf(k); p++) {
                mem.set(Le.U16_UNALIGNED, t + (long) SplitRingLayout.DESC_BYTES * p + SplitRingLayout.DESC_FLAGS, flags);
            }
        }
    }

    /** Stops taking new requests at {@code deadlineNanos} (System.nanoTime); what is in flight then finishes. */
    void until(long deadlineNanos) {
        deadline = deadlineNanos;
    }

    @Override
    public void run() {
        try {
            for (int s = 0; s < job.depth() && !stopping; s++) {
                next(s);
            }
            kickIfAsked();
            long lastProgress = System.nanoTime();
            while (ioInFlight > 0) {
                if (reap()) {
                    lastProgress = System.nanoTime();
                    kickIfAsked();
                }
                if (ioInFlight == 0 || ring.armInterrupt()) {
                    continue;
                }
                if (call.await(1000)) {
                    call.drain();
                } else if (System.nanoTime() - lastProgress > STALL_NANOS) {
                    error("no completion for " + STALL_NANOS / 1_000_000_000L + " s with " + ioInFlight
                            + " requests in flight: the server stalled");
                    return;
                }
            }
        } catch (NativeException | RuntimeException e) {
            error("the load failed: " + e);
        }
    }

    private void kickIfAsked() {
        if (ring.publish()) {
            kick.signal();
        }
    }

    /** Takes every used entry; whether there was one. */
    private boolean reap() {
        boolean any = false;
        while (ring.hasUsed()) {
            any = true;
            int h = ring.usedId();
            ring.next();
            int s = h / shape.chains();
            if (h < 0 || s >= job.depth() || pending[s] == 0) {
                error("head " + h + " answered but not in flight (or answered twice)");
                stopping = true;
                continue;
            }
            byte status = mem.get(ValueLayout.JAVA_BYTE, metaGpa + (long) META * h + STATUS_AT);
            if (status != 0) {
                error("a " + (laidOutFor[s] == 1 ? "write" : "read") + " at sector " + sector[s] + " answered status "
                        + (status & 0xff) + (status == POISON ? " (the server never wrote it)" : ""));
            }
            if (--pending[s] == 0) {
                ioInFlight--;
                done(s);
            }
        }
        return any;
    }

    private void done(int s) {
        if (checking[s]) {
            checking[s] = false;
            check(s, gen[s]);
        } else {
            ios++;
            bytes += job.bytes();
            if (verify && job.write()) {
                fillData(s, (byte) 0);
                checking[s] = true;
                submit(s, false);
                return;
            }
            if (verify) {
                check(s, -1);
            }
        }
        if (!once && System.nanoTime() - deadline > 0) {
            stopping = true;
        }
        if (!stopping) {
            next(s);
        }
    }

    private void check(int s, long g) {
        for (int p = 0; p < shape.pieces(); p++) {
            String wrong = SectorStamp.check(mem, piece(s, p), pieceBytes(p), pieceSector(s, p), g);
            if (wrong != null) {
                error("verify: " + wrong);
                return;
            }
        }
    }

    /** Slot {@code s}'s next request of the job: where, what, then submitted. */
    private void next(int s) {
        long block;
        if (verify) {
            // each slot its own blocks (s, s + depth, ...): a read-back sees no other slot's write
            long r = job.random() ? (random = xorshift(random)) >>> 1 : cursor++;
            block = (r % (blocks / job.depth())) * job.depth() + s;
        } else if (job.random()) {
            block = ((random = xorshift(random)) >>> 1) % blocks;
        } else {
            if (once && cursor >= blocks) {
                stopping = true;
                return;
            }
            block = cursor++ % blocks;
        }
        sector[s] = spanStartSector + block * (job.bytes() / SectorStamp.SECTOR);
        if (job.write() && (verify || once)) {
            gen[s] = once ? 0 : ++generation;
            for (int p = 0; p < shape.pieces(); p++) {
                SectorStamp.stamp(mem, piece(s, p), pieceBytes(p), pieceSector(s, p), gen[s]);
            }
        } else if (verify) {
            fillData(s, POISON); // a read never done cannot pass
        }
        submit(s, job.write());
    }

    private void submit(int s, boolean write) {
        direction(s, write);
        int type = write ? T_OUT : T_IN;
        for (int k = 0; k < shape.chains(); k++) {
            int h = s * shape.chains() + k;
            long meta = metaGpa + (long) META * h;
            mem.set(Le.U32_UNALIGNED, meta, type);
            mem.set(Le.U64_UNALIGNED, meta + 8, sector[s] + (long) k * shape.perChain() * shape.piece() / SectorStamp.SECTOR);
            mem.set(ValueLayout.JAVA_BYTE, meta + STATUS_AT, POISON);
            ring.add(h);
        }
        pending[s] = shape.chains();
        ioInFlight++;
    }

    private static long xorshift(long x) {
        x ^= x << 13;
        x ^= x >>> 7;
        x ^= x << 17;
        return x;
    }

    private void error(String what) {
        errors++;
        if (firstError == null) {
            firstError = what;
        }
    }
}
