package io.pmemblk.vhost;

import java.io.IOException;

/**
 * The write cache mode (virtio_blk_config.wce) of the disk one server serves: the server's, not a connection's.
 * QEMU 7.2 reads the config once, at realize, and sends no SET_CONFIG when it reconnects ({@code reconnect=1}):
 * its guest keeps the mode it set, so the server must keep it too, across every front-end connection and, through
 * its {@link WriteCacheRecord}, across a restart. Write-through (wce 0) means the guest sends no FLUSH and takes
 * every completed write as durable.
 *
 * <p>Read on every ring start and config read (a volatile read); changed only by SET_CONFIG, one session at a
 * time. A change to write-through takes effect before it is recorded, a change to writeback only after: whatever
 * fails in between, the server is never less durable than the guest was told.
 */
public final class WriteCacheMode {
    private final WriteCacheRecord record;
    private volatile boolean writeback;

    private WriteCacheMode(WriteCacheRecord record, boolean writeback) {
        this.record = record;
        this.writeback = writeback;
    }

    /** Writeback (a fresh disk), kept while this server runs, recorded nowhere: for tests and embedders. */
    public static WriteCacheMode unrecorded() {
        return new WriteCacheMode(null, true);
    }

    /** The mode {@code record} holds (writeback when there is none; write-through when it cannot be read). */
    public static WriteCacheMode recorded(WriteCacheRecord record) {
        return new WriteCacheMode(record, record.load());
    }

    /** Whether the cache is on (wce 1): the guest sends FLUSH for what must be durable. */
    public boolean writeback() {
        return writeback;
    }

    /**
     * The guest's SET_CONFIG: {@code on} is the new wce. Returns once the mode is in force and recorded durably.
     * @throws IOException when it could not be recorded: then the mode is write-through if either the old or the
     *         new one was, and the caller refuses the change (QEMU then keeps the guest's old mode)
     */
    public synchronized void set(boolean on) throws IOException {
        if (!on) {
            writeback = false; // the rings go write-through at once; recording it only makes it last
        }
        if (record != null) {
            record.store(on);
        }
        writeback = on;
    }

    /** Where the mode is recorded, for the log; null when it is not. */
    public String recordedAt() {
        return record == null ? null : record.toString();
    }
}
