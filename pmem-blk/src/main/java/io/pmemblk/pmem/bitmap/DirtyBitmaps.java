package io.pmemblk.pmem.bitmap;

import java.io.IOException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;

/**
 * A device's named dirty bitmaps: the active ones every WRITE, WRITE_ZEROES and TRIM marks, and the frozen ones
 * checkpoints left for a backup to read. Files in a {@link BitmapDirectory}:
 * <ul>
 *   <li>{@code NAME.pbm}: bitmap NAME, active;</li>
 *   <li>{@code NAME@G.pbm}: NAME as a checkpoint froze it, generation G (read-only, until removed);</li>
 *   <li>{@code NAME.next}: NAME's successor while a checkpoint or clear is under way.</li>
 * </ul>
 * A checkpoint creates the successor, swaps it in for the markers ({@link WriteMarker}) and waits until every
 * marker that read the old set is done and every write that marked it has completed, then renames old to frozen
 * and successor to active, a directory sync between the two renames. That wait is bounded ({@link #SETTLE}): when
 * a write never completes, the successor's bits are merged back into the bitmap, which stays active as it was, and
 * the checkpoint fails naming the write. A crash before the
 * first rename leaves {@code NAME.next} beside {@code NAME.pbm}: {@link #open} ORs the successor into NAME (the
 * checkpoint did not happen; nothing is lost, a block may be dirty in NAME that a finished checkpoint would have
 * left in the frozen one). A crash between the renames leaves {@code NAME@G.pbm} and {@code NAME.next}: the
 * checkpoint happened, and {@link #open} finishes it.
 *
 * <p>Management calls are serialised on this object; markers never take its lock. Marking is {@link WriteMarker}'s.
 */
public final class DirtyBitmaps implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(DirtyBitmaps.class.getName());
    /** A bitmap's name: it becomes a file name and part of an NBD context name, so a plain word. */
    public static final Pattern NAME = Pattern.compile("[A-Za-z0-9_-]{1,64}");
    static final String ACTIVE = ".pbm", NEXT = ".next";
    private static final String FROZEN_MARK = "@";

    /** What {@link #list} reports of one bitmap. */
    public record Info(String name, boolean frozen, long generation, long granularity, long dirtyBlocks) {}

    /** How long a swap waits for the markers and the writes of the old set before it gives up. */
    static final long SETTLE = TimeUnit.SECONDS.toNanos(30);

    private final BitmapDirectory dir;
    private final long deviceSize;
    private final WriteMarker marker;
    private final long settleNanos;
    private final Map<String, BitmapFile> active = new LinkedHashMap<>();
    private final Map<String, BitmapFile> frozen = new LinkedHashMap<>();
    /** Every bitmap by name, for readers (NBD block status): replaced whole at each change, read without a lock. */
    private volatile Map<String, BitmapFile> byName = Map.of();
    /**
     * Bitmaps swapped out whose markers did not finish within the wait: still mapped (a marker may store into
     * them), closed with the rest. Their names' successors were not merged back: see {@link #unmerged}.
     */
    private final List<BitmapFile> retired = new ArrayList<>();
    /** Names whose {@code NAME.next} holds bits not merged back (a failed swap's undo): the next start merges them. */
    private final List<String> unmerged = new ArrayList<>();

    private DirtyBitmaps(BitmapDirectory dir, long deviceSize, int stripes, long settleNanos) {
        this.dir = dir;
        this.deviceSize = deviceSize;
        this.marker = new WriteMarker(stripes, deviceSize, dir.path().toString());
        this.settleNanos = settleNanos;
    }

    /**
     * The bitmaps in {@code dir} for a device of {@code deviceSize} bytes, an interrupted checkpoint finished or
     * undone; each of {@code ensure} is created with {@code granularity} when missing, and an existing one of
     * another granularity is refused. A file whose header does not match this device is refused by name.
     * @param stripes grace counters: one per hardware queue keeps queues off each other's cache lines
     */
    public static DirtyBitmaps open(BitmapDirectory dir, long deviceSize, long granularity, List<String> ensure,
                                    int stripes) throws IOException {
        return open(dir, deviceSize, granularity, ensure, stripes, SETTLE);
    }

    /** As {@link #open(BitmapDirectory, long, long, List, int)}; a swap waits at most {@code settleNanos}. */
    static DirtyBitmaps open(BitmapDirectory dir, long deviceSize, long granularity, List<String> ensure,
                             int stripes, long settleNanos) throws IOException {
        DirtyBitmaps b = new DirtyBitmaps(dir, deviceSize, stripes, settleNanos);
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
        BitmapFile f = dir.create(name + ACTIVE, new BitmapHeader(deviceSize, granularity, generation));
        active.put(name, f);
        publish();
        try {
            // a write still in flight that did not mark it has completed: a backup after this sees it
            settle("add '" + name + "'");
        } catch (IOException stuck) {
            active.remove(name);
            publish();
            drop(f, name + ACTIVE, stuck);
            throw stuck;
        }
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
            try {
                marker.awaitMarkers("remove '" + name + "'", System.nanoTime() + settleNanos);
            } catch (IOException stuck) {
                active.put(name, f); // a marker may still store into it: it stays, as it was
                publish();
                throw stuck;
            }
        }
        publish();
        f.close();
        dir.remove(name + ACTIVE);
        dir.sync();
    }

    /** Empties the active bitmap {@code name} atomically: each write is in the old one (dropped) or the new one. */
    public synchronized void clear(String name) throws IOException {
        BitmapFile old = swap(name, "clear '" + name + "'");
        old.close();
        dir.rename(name + NEXT, name + ACTIVE);
        dir.sync();
    }

    /**
     * Freezes the active bitmap {@code name} and starts its successor: every write is in exactly one of them,
     * and every write in the frozen one has completed. Returns the frozen bitmap's name, {@code NAME@G}.
     * @throws IOException when a write that marked it does not complete within the wait: the bitmap is then
     *         active as before (the message names the write)
     */
    public synchronized String checkpoint(String name) throws IOException {
        BitmapFile old = swap(name, "checkpoint '" + name + "'");
        String frozenName = name + FROZEN_MARK + old.header().generation();
        dir.rename(name + ACTIVE, frozenName + ACTIVE);
        dir.sync(); // frozen before the successor takes the name: never two files at NAME.pbm's place in a crash
        dir.rename(name + NEXT, name + ACTIVE);
        dir.sync();
        frozen.put(frozenName, old);
        publish();
        return frozenName;
    }

    /**
     * Creates {@code name}'s successor, swaps it in for the markers and waits until the old one's markers are done
     * and its writes have completed; returns the old. When they do not within the wait, undoes the swap: the
     * successor's bits are merged back into the old bitmap, active again, and the successor is removed.
     */
    private BitmapFile swap(String name, String what) throws IOException {
        BitmapFile old = active.get(name);
        if (old == null) {
            throw new IllegalArgumentException(frozen.containsKey(name) ? "bitmap '" + name + "' is frozen (a"
                    + " checkpoint); allowed here: an active bitmap, " + active.keySet() : unknown(name));
        }
        if (unmerged.contains(name)) {
            throw new IOException(what + ": " + name + NEXT + " holds bits of an undone swap not yet merged"
                    + " back (its markers were stuck); restart pmemblk, which merges them, then retry");
        }
        if (dir.exists(name + NEXT)) {
            dir.remove(name + NEXT); // a successor this process failed to create (ours alone: the directory is)
        }
        BitmapFile next = dir.create(name + NEXT, old.header().next());
        active.put(name, next);
        publish();
        try {
            settle(what);
            return old;
        } catch (IOException stuck) {
            active.put(name, old);
            publish();
            try {
                marker.awaitMarkers(what + ", undoing it", System.nanoTime() + settleNanos);
                old.absorb(next); // every write that marked the successor is then in the bitmap: none in neither
            } catch (IOException e) {
                stuck.addSuppressed(e);
                retired.add(next);
                unmerged.add(name);
                throw stuck;
            }
            drop(next, name + NEXT, stuck);
            throw stuck;
        }
    }

    /** Waits until the markers of the set before the last {@link #publish} are done and its writes have completed. */
    private void settle(String what) throws IOException {
        long deadline = System.nanoTime() + settleNanos;
        marker.awaitMarkers(what, deadline);
        marker.awaitWrites(what, deadline);
    }

    /**
     * Removes a bitmap no longer published, once no marker can store into it (else it stays mapped, retired);
     * a failure is added to {@code cause}.
     */
    private void drop(BitmapFile f, String file, IOException cause) {
        try {
            marker.awaitMarkers("removing " + file, System.nanoTime() + settleNanos);
        } catch (IOException e) {
            cause.addSuppressed(e);
            retired.add(f);
            return;
        }
        try {
            f.close();
            dir.remove(file);
            dir.sync();
        } catch (IOException e) {
            cause.addSuppressed(e);
        }
    }

    private String unknown(String name) {
        return "no bitmap named '" + name + "'; there are " + (byName.isEmpty() ? "none" : String.join(", ", names()));
    }

    /** Hands the markers the active set and the readers every name; called after each change. */
    private void publish() {
        marker.publish(active.values().toArray(new BitmapFile[0]));
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

    /** Marks the writes: the tracking layer's side. */
    WriteMarker marker() {
        return marker;
    }

    /** Why writes are refused (a bit could not be made durable), or null. */
    public String failure() {
        return marker.failure();
    }

    @Override
    public synchronized void close() throws IOException {
        closeAll(null);
    }

    private void closeAll(Exception cause) throws IOException {
        IOException first = null;
        List<BitmapFile> all = new ArrayList<>(active.values());
        all.addAll(frozen.values());
        all.addAll(retired);
        active.clear();
        frozen.clear();
        retired.clear();
        marker.publish(new BitmapFile[0]);
        byName = Map.of();
        for (BitmapFile f : all) {
            try {
                f.close();
            } catch (IOException e) {
                first = collect(first, cause, e);
            }
        }
        try {
            dir.close();
        } catch (IOException e) {
            first = collect(first, cause, e); // after a file's failure too: suppressed by it, never dropped
        }
        if (first != null) {
            throw first;
        }
    }

    /** A close's failure: suppressed by {@code cause} when closing for one, else the first thrown, the rest its suppressed. */
    private static IOException collect(IOException first, Exception cause, IOException e) {
        if (cause != null) {
            cause.addSuppressed(e);
            return first;
        }
        if (first == null) {
            return e;
        }
        first.addSuppressed(e);
        return first;
    }
}
