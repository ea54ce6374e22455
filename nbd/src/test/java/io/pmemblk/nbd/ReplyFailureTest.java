package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static io.pmemblk.queueing.testing.Waits.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.nbd.testing.NbdTestClient;
import java.io.IOException;
import java.util.List;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * A reply that fails to be built with an exception of ours (not the socket's IOException): here a dirty bitmap that
 * throws when read, on the sender thread or on the reader's inline replies. Every request it drained must still
 * be released (the hardware queue gets its tags back) and the connection must end, not linger with a client
 * waiting for a reply that will never come.
 */
@Timeout(60)
class ReplyFailureTest extends ServedExportTest {
    @BeforeEach
    void start() throws IOException {
        serve("nbd.sock", 1, "", s -> s.dirtyBitmaps(new DirtyBitmapContexts() {
            @Override
            public List<String> names() {
                return List.of("b");
            }

            @Override
            public Bitmap find(String name) {
                return (offset, limit) -> {
                    throw new IllegalArgumentException("bitmap b cannot be read");
                };
            }
        }));
    }

    int inflightTags() {
        int n = 0;
        for (int i = 0; i < layer.queueCount(); i++) {
            n += layer.queue(i).inflight();
        }
        return n;
    }

    /**
     * Alone, the BLOCK_STATUS's reply is built by the sender thread; with a READ in the same write, by whichever
     * thread drains first: the sender, or the reader replying inline after the READ's dispatch.
     */
    @ParameterizedTest
    @ValueSource(booleans = {false, true})
    void aReplyThatCannotBeBuiltEndsTheConnectionAndEveryTagComesBack(boolean withRead) throws Exception {
        try (NbdTestClient c = new NbdTestClient(socket)) {
            c.greet(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
            c.option(OPT_STRUCTURED_REPLY, new byte[0]);
            assertEquals(REP_ACK, c.optionReply().type());
            c.option(OPT_SET_META_CONTEXT, NbdTestClient.metaData(EXPORT, META_DIRTY_BITMAP + "b"));
            assertEquals(REP_META_CONTEXT, c.optionReplies().getFirst().type());
            c.option(OPT_GO, NbdTestClient.infoData(EXPORT));
            assertEquals(REP_ACK, c.optionReplies().getLast().type());
            c.structured = true;

            c.request(0, CMD_BLOCK_STATUS, 1, 0, 4096, null);
            if (withRead) {
                c.request(0, CMD_READ, 2, 0, 4096, null);
            }
            c.flush();
            assertTrue(c.eofWithin(10), "the server hangs up: it cannot answer in order any more");
        }
        await("every tag back", () -> inflightTags() == 0);
        await("the connection's threads gone", () -> server.connectionCount() == 0);
    }
}
