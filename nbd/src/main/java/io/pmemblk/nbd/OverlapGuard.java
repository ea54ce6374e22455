package io.pmemblk.nbd;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;

/**
 * The byte ranges of one connection's requests that have not been replied to yet, so that a request overlapping
 * one of them can wait for that reply before it is even acquired ({@link RequestReader}).
 *
 * <p>Why: the protocol lets a server answer overlapping requests in any order, but the NBD project's own test
 * client ({@code nbd-tester-client -l -i}) and clients that reason the same way take a READ's data to be what the
 * WRITEs answered before it wrote, and nothing the WRITEs answered after it. Here a WRITE's payload may be received
 * straight into the device before an earlier READ in the same batch has run, and a READ's data may be sent straight
 * out of the device when its reply is written, after a later WRITE ran. Waiting for the earlier reply makes
 * overlapping requests run and answer in request order; the rest of a batch keeps its freedom.
 *
 * <p>Only overlaps where one side changes data count (a READ beside a READ is no hazard). Cost when nothing
 * overlaps: a READ with no unreplied WRITE-like request listed scans nothing; otherwise one pass over the
 * connection's unreplied requests (at most its queue depth), which also drops the replied ones. No allocation.
 *
 * <p>Threads: the reader registers and scans ({@link #register}, {@link #overlaps}); whichever thread releases a
 * request after its reply (or without one, on teardown) calls {@link #replied} before giving the tag back. The
 * reader's waiting is {@link ReplyRing#awaitReplies}, under the ring's monitor, which the releasing side takes
 * right after {@link #replied}.
 */
final class OverlapGuard {
    private static final VarHandle LIVE = MethodHandles.arrayElementVarHandle(int[].class);

    /** By tag: 1 from register until replied (release/acquire ordered: the only field two threads touch). */
    private final int[] live;
    /** By tag, the reader's only: the range [from, end) and whether the request changes data. */
    private final long[] from;
    private final long[] end;
    private final boolean[] modifies;
    /** The reader's list of tags registered and not yet seen replied; {@code listed[tag]}: the tag is in it. */
    private final int[] list;
    private final boolean[] listed;
    private int count;
    /** Listed tags that change data: a READ needs no scan while this is 0. */
    private int listedModifying;
    /** Requests that waited for an overlapping reply (tests and logs). */
    private long waits;

    OverlapGuard(int depth) {
        live = new int[depth];
        from = new long[depth];
        end = new long[depth];
        modifies = new boolean[depth];
        list = new int[depth];
        listed = new boolean[depth];
    }

    /** Reader: request {@code tag}, not yet dispatched, covers [offset, offset + length). */
    void register(int tag, long offset, long length, boolean changesData) {
        from[tag] = offset;
        end[tag] = offset + length;
        if (listed[tag]) {
            // replied and acquired again before a scan dropped it: it stays listed, as what it is now
            if (modifies[tag] != changesData) {
                listedModifying += changesData ? 1 : -1;
            }
        } else {
            listed[tag] = true;
            list[count++] = tag;
            if (changesData) {
                listedModifying++;
            }
        }
        modifies[tag] = changesData;
        LIVE.setRelease(live, tag, 1);
    }

    /** Any thread, before the request's tag is given back: its reply has gone (or never will). */
    void replied(int tag) {
        LIVE.setRelease(live, tag, 0);
    }

    /**
     * Reader (or under the ring's monitor on its behalf): whether [offset, offset + length) overlaps an unreplied
     * request where either side changes data. Drops the replied tags it passes.
     */
    boolean overlaps(long offset, long length, boolean changesData) {
        // a READ among READs decides here: small enough to inline into the reader's loop, the scan is not
        return (changesData || listedModifying != 0) && scan(offset, offset + length, changesData);
    }

    private boolean scan(long offset, long e, boolean changesData) {
        int i = 0;
        while (i < count) {
            int t = list[i];
            if ((int) LIVE.getAcquire(live, t) == 0) {
                listed[t] = false;
                if (modifies[t]) {
                    listedModifying--;
                }
                list[i] = list[--count];
                continue;
            }
            if ((changesData || modifies[t]) && from[t] < e && offset < end[t]) {
                return true;
            }
            i++;
        }
        return false;
    }

    /** Reader: a request is about to wait for an overlapping reply. */
    void waited() {
        waits++;
    }

    /** Requests that waited so far (reader thread, or after it stopped). */
    long waits() {
        return waits;
    }
}
