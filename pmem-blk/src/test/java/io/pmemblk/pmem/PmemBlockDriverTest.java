package io.pmemblk.pmem;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicInteger;

import static org.assertj.core.api.Assertions.assertThat;

class PmemBlockDriverTest {
    static final int SIZE = 4 << 20;
    @TempDir
    Path dir;
    PmemDevices device;
    PmemBlockDriver driver;
    BlockLayer layer;
    HardwareQueue q;

    @BeforeEach
    void setUp() throws IOException {
        use(PmemDevices.on(dir.resolve("d.img"), SIZE).open());
    }

    private void use(PmemDevices d) {
        device = d;
        driver = d.driver();
        layer = d.layer();
        q = d.queue(0);
    }

    /** The device again over the same file, its in-place views made in windows of {@code 1 << shift} bytes. */
    private void openWithWindows(int shift) throws Exception {
        device.close();
        use(PmemDevices.on(dir.resolve("d.img"), SIZE).windowShift(shift).open());
    }

    @AfterEach
    void tearDown() throws Exception {
        device.close();
    }

    private int run(Op op, long off, int len, byte fill, byte[] out) throws InterruptedException {
        return InlineRequests.run(q, op, off, len, fill, false, out);
    }

    @Test
    void writeThenReadAcrossSegments() throws Exception {
        int len = 300_000; // three 128 KiB chunks
        assertThat(run(Op.WRITE, 4096, len, (byte) 0x5a, null)).isZero();
        byte[] out = new byte[len];
        assertThat(run(Op.READ, 4096, len, (byte) 0, out)).isZero();
        for (byte b : out) assertThat(b).isEqualTo((byte) 0x5a);
    }

    @Test
    void boundsAreCheckedWithTheErrnoEachOperationOwes() throws Exception {
        assertThat(run(Op.WRITE, SIZE - 512, 1024, (byte) 1, null)).isEqualTo(Status.ENOSPC);
        assertThat(run(Op.READ, SIZE - 512, 1024, (byte) 0, null)).isEqualTo(Status.EINVAL);
        assertThat(run(Op.TRIM, SIZE, 1, (byte) 0, null)).isEqualTo(Status.EINVAL);
        assertThat(run(Op.WRITE_ZEROES, Long.MAX_VALUE - 10, 100, (byte) 0, null)).isEqualTo(Status.ENOSPC);
        assertThat(run(Op.READ, -1, 10, (byte) 0, null)).isEqualTo(Status.EINVAL);
        // the last byte is writable, nothing past it was touched
        assertThat(run(Op.WRITE, SIZE - 1, 1, (byte) 7, null)).isZero();
        assertThat(driver.region().size()).isEqualTo(SIZE);
    }

    @Test
    void writeZeroesAndTrimReadBackAsZero() throws Exception {
        run(Op.WRITE, 0, 65536, (byte) 3, null);
        assertThat(run(Op.WRITE_ZEROES, 1000, 5000, (byte) 0, null)).isZero();
        assertThat(run(Op.TRIM, 20000, 100, (byte) 0, null)).isZero();
        byte[] out = new byte[65536];
        run(Op.READ, 0, 65536, (byte) 0, out);
        for (int i = 0; i < out.length; i++) {
            boolean zeroed = (i >= 1000 && i < 6000) || (i >= 20000 && i < 20100);
            assertThat(out[i]).as("byte %d", i).isEqualTo(zeroed ? (byte) 0 : (byte) 3);
        }
    }

    @Test
    void aFrontendThatSendsItselfGetsViewsOfTheMappingInsteadOfACopy() throws Exception {
        openWithWindows(16); // 64 KiB windows, so a request can straddle two
        run(Op.WRITE, 0, 262144, (byte) 0x11, null);
        run(Op.WRITE, 65536 - 100, 300, (byte) 0x22, null);
        for (long off : new long[]{0, 65536 - 100, 65536 + 5}) {
            Request r = q.acquire(300);
            r.op = Op.READ;
            r.offset = off;
            r.sinkReadsDevice = true;
            AtomicInteger status = new AtomicInteger(-1);
            r.completion = req -> status.set(req.status());
            q.dispatch(new Request[]{r}, 1);
            assertThat(status.get()).isZero();
            int n = r.dataBufferCount();
            assertThat(n).as("straddles a window at %d", off).isEqualTo(off == 65536 - 100 ? 2 : 1);
            byte[] got = new byte[300];
            int pos = 0;
            for (int i = 0; i < n; i++) {
                ByteBuffer b = r.dataBuffers()[i];
                int k = b.remaining();
                b.get(got, pos, k);
                pos += k;
            }
            assertThat(pos).isEqualTo(300);
            for (int i = 0; i < 300; i++) {
                long at = off + i;
                byte expected = at >= 65536 - 100 && at < 65536 + 200 ? (byte) 0x22 : (byte) 0x11;
                assertThat(got[i]).as("byte at %d", at).isEqualTo(expected);
            }
            r.release();
        }
        // the next user of a tag gets its own buffers back, not the views
        Request r = q.acquire(4096);
        assertThat(r.dataBufferCount()).isEqualTo(r.segments());
        r.release();
    }

    @Test
    void aWriteReceivedInPlaceLandsWithoutBuffersAndOutOfRangeOnesAreNotOffered() throws Exception {
        openWithWindows(16);
        assertThat(driver.receivesInPlace(SIZE - 100, 200)).as("past the end: the normal path answers ENOSPC").isFalse();
        assertThat(driver.receivesInPlace(65536 - 10, 300)).isTrue();
        int freeBefore = q.pool().freeChunks();
        Request r = q.acquire(0);
        r.op = Op.WRITE;
        r.offset = 65536 - 10; // straddles two 64 KiB windows
        r.length = 300;
        r.fua = true;
        driver.receiveInPlace(r);
        assertThat(r.dataInPlace).isTrue();
        assertThat(q.pool().freeChunks()).as("no buffers taken").isEqualTo(freeBefore);
        int n = r.dataBufferCount();
        assertThat(n).isEqualTo(2);
        for (int i = 0; i < n; i++) {
            ByteBuffer b = r.dataBuffers()[i];
            while (b.hasRemaining()) b.put((byte) 0x6b);
        }
        AtomicInteger status = new AtomicInteger(-1);
        r.completion = req -> status.set(req.status());
        q.dispatch(new Request[]{r}, 1);
        assertThat(status.get()).isZero();
        r.release();
        byte[] out = new byte[400];
        run(Op.READ, 65536 - 60, 400, (byte) 0, out);
        for (int i = 0; i < 400; i++) {
            long at = 65536 - 60 + i;
            assertThat(out[i]).as("byte %d", at).isEqualTo(at >= 65536 - 10 && at < 65536 + 290 ? (byte) 0x6b : (byte) 0);
        }
    }

    @Test
    void flushSucceedsAndStatsCountCpuBytes() throws Exception {
        run(Op.WRITE, 0, 4096, (byte) 1, null);
        assertThat(run(Op.FLUSH, 0, 0, (byte) 0, null)).isZero();
        assertThat(run(Op.FLUSH, 0, 0, (byte) 0, null)).isZero();
        assertThat(q.inflight()).isZero();
    }
}
