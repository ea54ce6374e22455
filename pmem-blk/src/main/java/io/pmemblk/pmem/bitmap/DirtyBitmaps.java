package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;

import java.io.IOException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * A device's named dirty bitmaps: the active ones every WRITE, WRITE_ZEROES and TRIM marks, and the frozen ones
 * checkpoints left for a backup to read. Files in a {@link BitmapDirectory}:
 * <ul>
 *   <li>{@code NAME.pbm}: bitmap NAME, active;</li>
 *   <li>{@code NAME@G.pbm}: NAME as a checkpoint froze it, generation G (read-only, until removed);</li>
 *   <li>{@code NAME.next}: NAME's successor while a checkpoint or clear is under way.</li>
 * </ul>
 * A checkpoint creates the successor, swaps it in for the markers and waits for a grace period ({@link Grace}:
 * every batch that marked the old bitmap has persisted its bits and every write it marked has completed), then
 * renames old to frozen and successor to active, a directory sync between the two renames. A crash before the
 * first rename leaves {@code NAME.next} beside {@code NAME.pbm}: {@link #open} ORs the successor into NAME (the
 * checkpoint did not happen; nothing is lost, a block may be dirty in NAME that a finished checkpoint would have
 * left in the frozen one). A crash between the renames leaves {@code NAME@G.pbm} and {@code NAME.next}: the
 * checkpoint happened, and {@link #open} finishes it.
 *
 * <p>Management calls are serialised on this object; markers never take its lock.
 */
public final class DirtyBitmaps implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(DirtyBitmaps.class.getName());
    /** A bitmap's name: it becomes a file name and part of an NBD context name, so a plain word. */
    public static final Pattern NAME = Pattern.compile("[A-Za-z0-9_-]{1,64}");
    static final String ACTIVE = ".pbm", NEXT = ".next";
    private static final String FROZEN_MARK = "@";

    /** What {@link #list} reports of one bitmap. */
    public record Info(String name, boolean frozen, long generation, long granularity, long dirtyBlocks) {}

    private final BitmapDirectory dir;
    private final long deviceSize;
    private final Grace grace;
    /** Active bitmaps, as the markers see them: replaced whole (copy on write), never changed in place. */
    private volatile BitmapFile[] marking = new BitmapFile[0];
    private final Map<String, BitmapFile> active = new LinkedHashMap<>();
    private final Map<String, BitmapFile> frozen = new LinkedHashMap<>();
    /** Every bitmap by name, for readers (NBD block status): replaced whole at each change, read without a lock. */
    private volatile Map<String, BitmapFile> byName = Map.of();
    /** Set once a bit could not be made durable; from then on every marked write fails (EIO), as the region does. */
    private volatile String failure;

    private DirtyBitmaps(BitmapDirectory dir, long deviceSize, int stripes) {
        this.dir = dir;
        this.deviceSize = deviceSize;
        this.grace = new Grace(stripes);
    }

    /**
     * The bitmaps in {@code dir} for a device of {@code deviceSize} bytes, an interrupted checkpoint finished or
     * undone; each of {@code ensure} is created with {@code granularity} when missing, and an existing one of
     * another granularity is refused. A file whose header does not match this device is refused by name.
     * @param stripes grace counters: one per hardware queue keeps queues off each other's cache lines
     */
    public static DirtyBitmaps open(BitmapDirectory dir, long deviceSize, long granularity, List<String> ensure,
                                    int stripes) throws IOException {
        DirtyBitmaps b = new DirtyBitmaps(dir, deviceSize, stripes);
        try {
            b.recover();
            for (String f : dir.list(ACTIVE)) {
                String base = f.substring(0, f.length() - ACTIVE.length());
                BitmapFile file = dir.open(f);
                b.check(file, base);
                (base.contains(FROZEN_MARK) ? b.frozen : b.active).put(base, file);
            }
            for (String name : ensure) {
                checkName(name);
                BitmapFile f = b.active.get(name);
                if (f == null) {
                    b.add(name, granularity);
                } else if (f.header().granularity() != granularity) {
                    throw new IOException("bitmap '" + name + "' (" + f.region().path() + ") has a granularity of "
                            + f.header().granularity() + " bytes, bitmap.granularity is " + granularity + "; set"
                            + " bitmap.granularity=" + f.header().granularity() + ", or remove the bitmap to make it"
                            + " anew (pmemblk bitmap remove " + name + ")");
                }
            }
            b.publish();
            return b;
        } catch (IOException | RuntimeException e) {
            b.closeAll(e);
            throw e;
        }
    }

    /** Finishes or undoes the checkpoints a crash interrupted ({@code NAME.next} files). */
    private void recover() throws IOException {
        for (String next : dir.list(NEXT)) {
            String name = next.substring(0, next.length() - NEXT.length());
            if (dir.exists(name + ACTIVE)) {
                try (BitmapFile successor = dir.open(next); BitmapFile old = dir.open(name + ACTIVE)) {
                    check(successor, name);
                    check(old, name);
                    old.absorb(successor);
                }
                dir.remove(next);
                LOG.log(System.Logger.Level.WARNING, "bitmap ''{0}'': a checkpoint or clear was interrupted before"
                        + " it froze the bitmap; its successor''s bits were merged back, the bitmap stays as it was", name);
            } else {
                dir.rename(next, name + ACTIVE);
                LOG.log(System.Logger.Level.WARNING, "bitmap ''{0}'': a checkpoint was interrupted after it froze the"
                        + " bitmap; finished (the successor is active)", name);
            }
            dir.sync();
        }
    }

    private void check(BitmapFile f, String name) throws IOException {
        if (f.header().deviceSize() != deviceSize) {
            throw new IOException("bitmap '" + name + "' (" + f.region().path() + ") was made for a device of "
                    + f.header().deviceSize() + " bytes; this one has " + deviceSize + ": pmemblk does not"
                    + " reinterpret it. Remove it (rm " + f.region().path() + ") and take a full backup");
        }
    }

    /** Refuses a name that is not {@link #NAME}. */
    public static void checkName(String name) {
        if (name == null || !NAME.matcher(name).matches()) {
            throw new IllegalArgumentException("bitmap name '" + name + "'; allowed: 1 to 64 of A-Z a-z 0-9 _ -");
        }
    }

    /** Directory the files are in. */
    public BitmapDirectory directory() {
        return dir;
    }

    public long deviceSize() {
        return deviceSize;
    }

    /** Adds the active bitmap {@code name}, all clean: every write not completed when this returns marks it. */
    public synchronized void add(String name, long granularity) throws IOException {
        checkName(name);
        BitmapHeader.checkGranularity(granularity);
        if (active.containsKey(name)) {
            throw new IllegalArgumentException("bitmap '" + name + "' exists already");
        }
        // after the generations of NAME's frozen bitmaps still kept, so that its next checkpoint's name is new
        long generation = 1;
        for (String f : frozen.keySet()) {
            if (f.startsWith(name + FROZEN_MARK)) {
                generation = Math.max(generation, Long.parseLong(f.substring(name.length() + 1)) + 1);
            }
        }
        active.put(name, dir.create(name + ACTIVE, new BitmapHeader(deviceSize, granularity, generation)));
        publish();
        grace.await(); // a write still in flight that did not mark it has completed: a backup after this sees it
    }

    /** Removes an active bitmap (no write marks it from then on) or a frozen one ({@code NAME@G}). */
    public synchronized void remove(String name) throws IOException {
        BitmapFile f = frozen.remove(name);
        if (f == null) {
            f = active.remove(name);
            if (f == null) {
                throw new IllegalArgumentException(unknown(name));
            }
            publish();
            grace.await();
        }
        publish();
        f.close();
        dir.remove(name + ACTIVE);
        dir.sync();
    }

    /** Empties the active bitmap {@code name} atomically: each write is in the old one (dropped) or the new one. */
    public synchronized void clear(String name) throws IOException {
        BitmapFile old = swap(name);
        old.close();
        dir.rename(name + NEXT, name + ACTIVE);
        dir.sync();
    }

    /**
     * Freezes the active bitmap {@code name} and starts its successor: every write is in exactly one of them,
     * and every write in the frozen one has completed. Returns the frozen bitmap's name, {@code NAME@G}.
     */
    public synchronized String checkpoint(String name) throws IOException {
        BitmapFile old = swap(name);
        String frozenName = name + FROZEN_MARK + old.header().generation();
        dir.rename(name + ACTIVE, frozenName + ACTIVE);
        dir.sync(); // frozen before the successor takes the name: never two files at NAME.pbm's place in a crash
        dir.rename(name + NEXT, name + ACTIVE);
        dir.sync();
        frozen.put(frozenName, old);
        publish();
        return frozenName;
    }

    /** Creates {@code name}'s successor, swaps it in for the markers and waits out the grace period; returns the old. */
    private BitmapFile swap(String name) throws IOException {
        BitmapFile old = active.get(name);
        if (old == null) {
            throw new IllegalArgumentException(frozen.containsKey(name) ? "bitmap '" + name + "' is frozen (a"
                    + " checkpoint); allowed here: an active bitmap, " + active.keySet() : unknown(name));
        }
        if (dir.exists(name + NEXT)) {
            dir.remove(name + NEXT); // a successor this process failed to finish (ours alone: the directory is)
        }
        BitmapFile next = dir.create(name + NEXT, old.header().next());
        active.put(name, next);
        publish();
        grace.await();
        return old;
    }

    private String unknown(String name) {
        return "no bitmap named '" + name + "'; there are " + (byName.isEmpty() ? "none" : String.join(", ", names()));
    }

    /** Hands the markers the active set and the readers every name; called after each change. */
    private void publish() {
        marking = active.values().toArray(new BitmapFile[0]);
        Map<String, BitmapFile> all = new LinkedHashMap<>(active);
        all.putAll(frozen);
        byName = java.util.Collections.unmodifiableMap(all);
    }

    /** Every bitmap, active then frozen. */
    public synchronized List<Info> list() {
        List<Info> l = new ArrayList<>();
        active.forEach((n, f) -> l.add(info(n, false, f)));
        frozen.forEach((n, f) -> l.add(info(n, true, f)));
        return l;
    }

    private static Info info(String name, boolean frozen, BitmapFile f) {
        return new Info(name, frozen, f.header().generation(), f.header().granularity(), f.dirtyBlocks());
    }

    /** Names of every bitmap, active then frozen. */
    public List<String> names() {
        return List.copyOf(byName.keySet());
    }

    /**
     * The bitmap named {@code name} (active or frozen), or null: for reading its bits, without a lock. One removed
     * meanwhile is unmapped: reading it then throws IllegalStateException.
     */
    public BitmapFile find(String name) {
        return byName.get(name);
    }

    /** Whether an op changes data, so its blocks are dirty. */
    static boolean changes(Op op) {
        return op == Op.WRITE || op == Op.WRITE_ZEROES || op == Op.TRIM;
    }

    /** Whether a request's range is on the device: others are refused by the driver, and never marked. */
    private boolean onDevice(Request r) {
        return r.offset >= 0 && r.length > 0 && r.length <= deviceSize - r.offset;
    }

    /**
     * Marks the writes of {@code batch[0..count)} in every active bitmap, durably, and counts each in flight on
     * {@code stripe} until {@link #completed} with the token returned.
     * @return the token of the batch's writes, or -1 when the bits could not be made durable ({@link #failure()}):
     *         the writes must then not be passed on
     */
    int mark(int stripe, Request[] batch, int count) {
        int token = grace.enter(stripe);
        try {
            BitmapFile[] set = marking;
            for (BitmapFile b : set) {
                long lo = Long.MAX_VALUE, hi = -1;
                for (int i = 0; i < count; i++) {
                    Request r = batch[i];
                    if (changes(r.op) && onDevice(r) && !b.durablySet(r.offset, r.length)) {
                        b.set(r.offset, r.length);
                        lo = Math.min(lo, r.offset);
                        hi = Math.max(hi, r.offset + r.length);
                    }
                }
                if (hi >= 0) {
                    b.persist(lo, hi);
                    for (int i = 0; i < count; i++) {
                        Request r = batch[i];
                        if (changes(r.op) && onDevice(r)) {
                            b.published(r.offset, r.length);
                        }
                    }
                }
            }
            if (failure != null) {
                return -1;
            }
            int writes = 0;
            for (int i = 0; i < count; i++) {
                writes += changes(batch[i].op) ? 1 : 0;
            }
            grace.hold(token, writes);
            return token;
        } catch (IOException | RuntimeException e) {
            fail(e);
            return -1;
        } finally {
            grace.exit(token);
        }
    }

    /**
     * Marks one write about to be received straight into the device, durably, before its payload can reach it.
     * Not counted in flight: a checkpoint that runs before its dispatch finds it marked again in the successor
     * by {@link #mark} (in both bitmaps, never in neither).
     */
    String markInPlace(int stripe, long offset, long length) {
        int token = grace.enter(stripe);
        try {
            for (BitmapFile b : marking) {
                if (!b.durablySet(offset, length)) {
                    b.set(offset, length);
                    b.persist(offset, offset + length);
                    b.published(offset, length);
                }
            }
            return failure;
        } catch (IOException | RuntimeException e) {
            return fail(e);
        } finally {
            grace.exit(token);
        }
    }

    /** A write {@link #mark} counted in flight has completed. */
    void completed(int token) {
        grace.exit(token);
    }

    private String fail(Exception e) {
        String f = failure;
        if (f == null) {
            synchronized (grace) {
                if (failure == null) {
                    failure = "a dirty bitmap's bits could not be made durable (" + e + "): writes are refused (EIO)"
                            + " so that none reaches the device untracked; fix the storage under "
                            + dir.path() + " and restart";
                    LOG.log(System.Logger.Level.ERROR, failure);
                }
                f = failure;
            }
        }
        return f;
    }

    /** Why writes are refused, or null. */
    public String failure() {
        return failure;
    }

    @Override
    public synchronized void close() throws IOException {
        closeAll(null);
    }

    private void closeAll(Exception cause) throws IOException {
        IOException first = null;
        List<BitmapFile> all = new ArrayList<>(active.values());
        all.addAll(frozen.values());
        active.clear();
        frozen.clear();
        marking = new BitmapFile[0];
        byName = Map.of();
        for (BitmapFile f : all) {
            try {
                f.close();
            } catch (IOException e) {
                if (cause != null) {
                    cause.addSuppressed(e);
                } else if (first == null) {
                    first = e;
                } else {
                    first.addSuppressed(e);
                }
            }
        }
        try {
            dir.close();
        } catch (IOException e) {
            if (cause != null) {
                cause.addSuppressed(e);
            } else if (first == null) {
                first = e;
            }
        }
        if (first != null) {
            throw first;
        }
    }
}
