package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Overlapping requests in flight together run and answer in request order, as {@code nbd-tester-client -l -i}
 * and clients that reason like it require: a READ's data is what the WRITEs answered before it wrote, and none of
 * what a WRITE answered after it wrote. Requests that do not overlap keep the batch's freedom. Each test sends its
 * requests in one write, so the reader takes them into one batch.
 */
@Timeout(60)
class OverlapOrderTest extends ServedExportTest {
    private static final int LEN = 64 * 1024;

    private void serveWith(boolean inPlace, MemoryBlockDriver.Mode mode) throws IOException {
        serve("nbd.sock", 1, "", s -> s);
        driver.receiveInPlace(inPlace);
        driver.sendInPlace(inPlace);
        driver.mode(mode);
    }

    /** Replies in arrival order, by cookie. */
    private static List<NbdTestClient.Reply> replies(NbdTestClient c, int n) throws IOException {
        List<NbdTestClient.Reply> got = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            NbdTestClient.Reply r = c.reply();
            assertEquals(0, r.error(), "reply to cookie " + r.cookie());
            got.add(r);
        }
        return got;
    }

    private static List<Long> cookies(List<NbdTestClient.Reply> replies) {
        return replies.stream().map(NbdTestClient.Reply::cookie).toList();
    }

    @Test
    void aReadBeforeAnOverlappingWriteReceivedInPlaceReturnsTheOldDataAndAnswersFirst() throws Exception {
        serveWith(true, MemoryBlockDriver.Mode.INLINE);
        byte[] data = NbdConnectionTest.pattern(LEN, 42);
        try (NbdTestClient c = new NbdTestClient(socket).go(EXPORT, false, false)) {
            c.request(0, CMD_READ, 1, 0, LEN, null);
            c.request(0, CMD_WRITE, 2, 0, LEN, data);
            c.request(0, CMD_READ, 3, 0, LEN, null);
            c.flush();
            List<NbdTestClient.Reply> got = replies(c, 3);
            assertEquals(List.of(1L, 2L, 3L), cookies(got), "overlapping requests answer in request order");
            assertArrayEquals(new byte[LEN], got.get(0).data(),
                    "the READ sent before the WRITE returns what was there before (the WRITE was not answered yet)");
            assertArrayEquals(data, got.get(2).data(), "the READ sent after the WRITE returns its data");
        }
    }

    @Test
    void aReadAfterAnOverlappingWriteAnswersAfterItEvenWhenTheDriverCompletesItFirst() throws Exception {
        serveWith(false, MemoryBlockDriver.Mode.REVERSE); // a batch completes last request first
        byte[] data = NbdConnectionTest.pattern(4096, 7);
        try (NbdTestClient c = new NbdTestClient(socket).go(EXPORT, false, false)) {
            c.request(0, CMD_WRITE, 1, 8192, 4096, data);
            c.request(0, CMD_READ, 2, 0, 3 * 4096, null); // overlaps the WRITE's 4 KiB at its end
            c.flush();
            List<NbdTestClient.Reply> got = replies(c, 2);
            assertEquals(List.of(1L, 2L), cookies(got), "the READ's reply leaves after the WRITE's");
            byte[] expected = new byte[3 * 4096];
            System.arraycopy(data, 0, expected, 8192, 4096);
            assertArrayEquals(expected, got.get(1).data(), "and returns the WRITE's data");
        }
    }

    @Test
    void requestsThatDoNotOverlapKeepTheBatchsOrderOfCompletion() throws Exception {
        serveWith(false, MemoryBlockDriver.Mode.REVERSE);
        try (NbdTestClient c = new NbdTestClient(socket).go(EXPORT, false, false)) {
            c.request(0, CMD_WRITE, 1, 0, 4096, NbdConnectionTest.pattern(4096, 1));
            c.request(0, CMD_READ, 2, 4096, 4096, null); // adjacent, not overlapping
            c.request(0, CMD_READ, 3, 0, 4096, null);    // overlaps WRITE 1: waits for its reply
            c.request(0, CMD_READ, 4, 0, 4096, null);    // overlaps READ 3 only: no hazard between READs
            c.flush();
            List<Long> order = cookies(replies(c, 4));
            assertEquals(List.of(2L, 1L, 4L, 3L), order,
                    "the first batch (1, 2) completed last first; 3 waited for 1 and started a batch with 4");
        }
    }
}
