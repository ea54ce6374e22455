package io.pmemblk.cli;

import io.pmemblk.nbd.DirtyBitmapContexts;
import io.pmemblk.pmem.bitmap.BitmapFile;
import io.pmemblk.pmem.bitmap.DirtyBitmaps;

import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/** The device's dirty bitmaps as NBD's qemu:dirty-bitmap contexts: read by name, each reply's lookup lock-free. */
final class BitmapContexts implements DirtyBitmapContexts {
    private final DirtyBitmaps bitmaps;
    /** One view per bitmap file, made on its first read: a block status reply allocates nothing after that. */
    private final Map<BitmapFile, Bitmap> views = new ConcurrentHashMap<>();

    BitmapContexts(DirtyBitmaps bitmaps) {
        this.bitmaps = bitmaps;
    }

    @Override
    public List<String> names() {
        return bitmaps.names();
    }

    @Override
    public Bitmap find(String name) {
        BitmapFile f = bitmaps.find(name);
        return f == null ? null : views.computeIfAbsent(f, View::new);
    }

    /** A bitmap removed while read is unmapped: its ranges then answer dirty, which never misses a block. */
    private record View(BitmapFile file) implements Bitmap {
        @Override
        public long run(long offset, long limit) {
            try {
                return file.runAt(offset, limit);
            } catch (IllegalStateException gone) {
                return -limit;
            }
        }
    }
}
