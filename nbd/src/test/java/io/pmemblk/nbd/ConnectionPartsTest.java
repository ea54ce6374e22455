package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.SIMPLE_REPLY_MAGIC;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.ByteBuffer;
import java.nio.file.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.io.TempDir;

/**
 * What the tests of one half of a connection ({@link ReplySenderTest}, {@link RequestReaderTest}) share: each test
 * builds its {@link ConnectionParts} in {@link #dir} and keeps them in {@link #c}, closed after it, and reads the
 * replies that come out at the client end.
 */
abstract class ConnectionPartsTest {
    @TempDir
    Path dir;
    ConnectionParts c;

    @AfterEach
    void closeParts() throws Exception {
        if (c != null) {
            c.close();
        }
    }

    /** The next reply in {@code w} is a simple reply to {@code cookie} with {@code error}. */
    static void simpleReply(ByteBuffer w, int error, long cookie) {
        assertEquals(SIMPLE_REPLY_MAGIC, w.getInt(), "simple reply magic");
        assertEquals(error, w.getInt(), "error of the reply to cookie " + cookie);
        assertEquals(cookie, w.getLong(), "cookie");
    }
}
