package io.pmemblk.nbd;

import java.util.List;

/**
 * The dirty bitmaps a server offers as QEMU's {@code qemu:dirty-bitmap:NAME} metadata contexts (qemu
 * docs/interop/nbd.rst; nbd/server.c), read-only: a client selects and reads them, and nothing it sends decides
 * anything about them. Looked up by name for each reply, so a connection reads what the name holds now.
 */
public interface DirtyBitmapContexts {
    /** No bitmaps: only base:allocation is offered. */
    DirtyBitmapContexts NONE = new DirtyBitmapContexts() {
        @Override
        public List<String> names() {
            return List.of();
        }

        @Override
        public Bitmap find(String name) {
            return null;
        }
    };

    /** The names offered now (at the handshake). */
    List<String> names();

    /** The bitmap {@code name}, or null once there is none (its ranges then answer dirty: never a missed block). */
    Bitmap find(String name);

    /** One bitmap's bits by byte offset. */
    interface Bitmap {
        /** Whether the block holding byte {@code offset} is dirty. */
        boolean dirty(long offset);

        /** Where the run of blocks in {@code offset}'s state ends: the first byte after it, at most {@code limit}. */
        long runEnd(long offset, long limit);
    }
}
