package io.pmemblk.pmem.bitmap;

import io.pmemblk.pmem.CrashModel;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.Op;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A crash (kill -9 or power cut) at any point between batches: under {@link CrashModel} each page of the image
 * and of the bitmap file that was not made durable keeps its old or its new content, independently. Every block
 * whose content in the crashed image is not the old one must be dirty in the crashed bitmap. Nothing is ever
 * flushed here: the page cache may write the image's pages back whenever it likes, so the bits must be durable
 * first.
 */
class BitmapCrashTest {
    private static final int BLOCK = 4096;
    private static final long SIZE = 16 << 20;

    @TempDir
    Path dir;

    @Test
    void everyBlockThatReachedTheImageIsDirtyAfterACrash() throws Exception {
        CrashModel.Modelled data = CrashModel.open(dir.resolve("d.img"), SIZE, PmemRegion.Mapper.JAVA);
        Map<Path, CrashModel> bitmapModels = new HashMap<>();
        BitmapDirectory files = BitmapDirectory.open(dir.resolve("d.img.bitmaps"), "bitmap.dir", (p, size) -> {
            CrashModel.Modelled m = CrashModel.open(p, size, PmemRegion.Mapper.JAVA);
            bitmapModels.put(p, m.model());
            return m.region();
        });
        Random rnd = new Random(46);
        int crashes = 0;
        try (TrackedDevice d = new TrackedDevice(data.region(), files, BLOCK, List.of("b"), 1)) {
            CrashModel bits = bitmapModels.get(dir.resolve("d.img.bitmaps/b.pbm"));
            Op[] ops = {Op.WRITE, Op.WRITE, Op.WRITE, Op.WRITE};
            long[] offsets = new long[ops.length];
            for (int batch = 0; batch < 400; batch++) {
                for (int k = 0; k < ops.length; k++) offsets[k] = (long) rnd.nextInt((int) (SIZE / BLOCK)) * BLOCK;
                d.batch(0, ops, offsets, BLOCK, (byte) (1 + batch % 250));
                if (batch % 40 == 39) {
                    for (int seed = 0; seed < 4; seed++, crashes++) {
                        Random pick = new Random(batch * 31L + seed);
                        byte[] image = data.model().atomically(() -> data.model().crashImage(pick));
                        byte[] bitmap = bits.atomically(() -> bits.crashImage(pick));
                        check(image, bitmap, "crash " + crashes + " after batch " + batch);
                    }
                }
            }
        }
        assertThat(crashes).isEqualTo(40);
    }

    /** Every block of {@code image} that is not all zero (the new file's content) is dirty in {@code bitmap}. */
    private static void check(byte[] image, byte[] bitmap, String when) {
        ByteBuffer words = ByteBuffer.wrap(bitmap).order(ByteOrder.LITTLE_ENDIAN);
        int landed = 0;
        for (int b = 0; b < image.length / BLOCK; b++) {
            boolean written = false;
            for (int i = b * BLOCK; i < (b + 1) * BLOCK && !written; i++) written = image[i] != 0;
            if (written) {
                landed++;
                long word = words.getLong(BitmapHeader.HEADER_BYTES + 8 * (b / 64));
                assertThat((word >>> (b % 64)) & 1).as(when + ": block " + b + " reached the image, its bit did not"
                        + " reach the bitmap").isEqualTo(1L);
            }
        }
        assertThat(landed).as(when + ": blocks that reached the image").isPositive();
    }
}
