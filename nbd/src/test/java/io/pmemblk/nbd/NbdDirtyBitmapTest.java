package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.nbd.testing.NbdTestClient;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The qemu:dirty-bitmap contexts on the wire, as QEMU's server answers them (nbd/server.c): listed by namespace,
 * selected by full name, block status a chunk per context with the bitmap's runs from the request's offset.
 */
@Timeout(60)
class NbdDirtyBitmapTest extends ServedExportTest {
    static final long G = 64 << 10;

    /** Bits by block, for the wire tests (the real bitmaps are pmem-blk's, beyond this module). */
    record Bits(BitSet set) implements DirtyBitmapContexts.Bitmap {
        @Override
        public long run(long offset, long limit) {
            int b = (int) (offset / G);
            int next = set.get(b) ? set.nextClearBit(b) : set.nextSetBit(b);
            long end = next < 0 ? limit : Math.min(limit, next * G);
            return set.get(b) ? -end : end;
        }
    }

    final Map<String, Bits> bitmaps = Map.of("b", new Bits(BitSet.valueOf(new long[] {0b1011})),
            "c", new Bits(BitSet.valueOf(new long[] {0b0110})));

    @BeforeEach
    void start() throws IOException {
        serve("nbd.sock", 1, "", s -> s.dirtyBitmaps(new DirtyBitmapContexts() {
            @Override
            public List<String> names() {
                return List.of("b", "c");
            }

            @Override
            public Bitmap find(String name) {
                return bitmaps.get(name);
            }
        }));
    }

    /** The contexts of META_CONTEXT replies (id, name), the ACK checked. */
    static List<String> contexts(List<NbdTestClient.OptionReply> replies) {
        List<String> l = new ArrayList<>();
        for (NbdTestClient.OptionReply r : replies) {
            if (r.type() == REP_META_CONTEXT) {
                ByteBuffer d = ByteBuffer.wrap(r.data());
                l.add(d.getInt() + " " + new String(r.data(), 4, r.data().length - 4, StandardCharsets.UTF_8));
            } else {
                assertEquals(REP_ACK, r.type());
            }
        }
        return l;
    }

    @Test
    void bitmapsAreListedByNamespaceSelectedByNameAndAnsweredRunByRun() throws IOException {
        try (NbdTestClient c = new NbdTestClient(socket)) {
            c.greet(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
            c.option(OPT_STRUCTURED_REPLY, new byte[0]);
            assertEquals(REP_ACK, c.optionReply().type());
            c.option(OPT_LIST_META_CONTEXT, NbdTestClient.metaData(EXPORT));
            assertEquals(List.of("0 base:allocation", "0 qemu:dirty-bitmap:b", "0 qemu:dirty-bitmap:c"),
                    contexts(c.optionReplies()), "LIST without a query: everything");
            c.option(OPT_LIST_META_CONTEXT, NbdTestClient.metaData(EXPORT, "qemu:"));
            assertEquals(List.of("0 qemu:dirty-bitmap:b", "0 qemu:dirty-bitmap:c"), contexts(c.optionReplies()));
            c.option(OPT_LIST_META_CONTEXT, NbdTestClient.metaData(EXPORT, "qemu:dirty-bitmap:"));
            assertEquals(List.of("0 qemu:dirty-bitmap:b", "0 qemu:dirty-bitmap:c"), contexts(c.optionReplies()));
            c.option(OPT_SET_META_CONTEXT, NbdTestClient.metaData(EXPORT, "qemu:", "qemu:dirty-bitmap:nope"));
            assertEquals(List.of(), contexts(c.optionReplies()), "SET takes full names of bitmaps that exist");
            c.option(OPT_SET_META_CONTEXT, NbdTestClient.metaData(EXPORT, "qemu:dirty-bitmap:c", META_BASE_ALLOCATION));
            assertEquals(List.of("1 base:allocation", "2 qemu:dirty-bitmap:c"), contexts(c.optionReplies()));
            c.option(OPT_GO, NbdTestClient.infoData(EXPORT));
            assertEquals(REP_ACK, c.optionReplies().getLast().type());
            c.structured = true;

            // c: blocks 1 and 2 dirty. From the middle of block 0 to the middle of block 4:
            c.request(0, CMD_BLOCK_STATUS, 7, G / 2, 4 * G, null);
            c.flush();
            NbdTestClient.Reply base = c.reply();
            assertFalse(base.done(), "base:allocation's chunk is not the last");
            assertEquals(1, ByteBuffer.wrap(base.data()).getInt(), "base:allocation's id");
            NbdTestClient.Reply bits = c.reply();
            assertTrue(bits.done());
            ByteBuffer p = ByteBuffer.wrap(bits.data());
            assertEquals(4 + 3 * 8, bits.data().length, "id + three extents");
            assertEquals(2, p.getInt(), "qemu:dirty-bitmap:c's id");
            assertEquals(List.of(G / 2, 0L, 2 * G, (long) STATE_DIRTY, G + G / 2, 0L),
                    List.of((long) p.getInt(), (long) p.getInt(), (long) p.getInt(), (long) p.getInt(),
                            (long) p.getInt(), (long) p.getInt()), "clean to block 1, dirty 1-2, clean to the end");

            c.request(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 8, G, 4 * G, null);
            c.flush();
            c.reply();
            NbdTestClient.Reply one = c.reply();
            assertEquals(4 + 8, one.data().length, "REQ_ONE: one extent");
            assertEquals(2 * G, Integer.toUnsignedLong(ByteBuffer.wrap(one.data()).getInt(4)));
            assertEquals(STATE_DIRTY, ByteBuffer.wrap(one.data()).getInt(8));
        }
    }
}
