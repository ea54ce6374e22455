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
        /**
         * The run of blocks in the state of the one holding byte {@code offset}: the first byte after it (above
         * {@code offset}, at most {@code limit}), negated when the run is dirty. One call, so that the state and the
         * length come from one read of the bitmap while writes mark it.
         */
        long run(long offset, long limit);
    }
}
