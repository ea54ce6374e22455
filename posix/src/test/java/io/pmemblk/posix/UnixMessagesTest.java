package io.pmemblk.posix;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** SCM_RIGHTS over a real socketpair: what one end attaches, the other can use; what it cannot take is closed. */
class UnixMessagesTest {
    @TempDir
    Path dir;
    private int[] pair;
    private final Arena arena = Arena.ofConfined();

    @BeforeEach
    void connect() throws NativeException {
        pair = Sockets.unixStreamPair();
    }

    @AfterEach
    void close() throws NativeException {
        Libc.close(pair[0]);
        Libc.close(pair[1]);
        arena.close();
    }

    private MemorySegment bytes(String s) {
        byte[] b = s.getBytes(StandardCharsets.UTF_8);
        return arena.allocate(b.length).copyFrom(MemorySegment.ofArray(b));
    }

    private static String text(MemorySegment buf, int n) {
        return new String(buf.asSlice(0, n).toArray(ValueLayout.JAVA_BYTE), StandardCharsets.UTF_8);
    }

    /** A file's content through a descriptor: read with pread from offset 0. */
    private String contentOf(int fd) {
        MemorySegment buf = arena.allocate(64);
        long n = FileIo.pread(fd, buf, 0);
        assertThat(n).isPositive();
        return text(buf, (int) n);
    }

    private int openFile(String name, String content) throws IOException {
        Path p = dir.resolve(name);
        Files.writeString(p, content);
        return FileCalls.open(p.toString(), FileCalls.O_RDONLY, 0);
    }

    @Test
    void aPassedDescriptorReadsTheSameFile() throws IOException {
        int file = openFile("a", "the same file");
        UnixMessages.send(pair[0], bytes("hdr"), file);
        Libc.close(file); // the receiver's copy stays open
        int[] fds = new int[2];
        MemorySegment buf = arena.allocate(16);
        int n = UnixMessages.receive(pair[1], buf, fds);
        assertThat(text(buf, n)).isEqualTo("hdr");
        assertThat(fds[0]).isNotNegative(); // the sender closed its copy: the number may well be the same
        assertThat(fds[1]).isEqualTo(-1);
        assertThat(contentOf(fds[0])).isEqualTo("the same file");
        Libc.close(fds[0]);
    }

    /** Files with these contents, their descriptors sent with {@code text}; the sender's copies closed again. */
    private void sendFiles(String text, String... contents) throws IOException {
        int[] fds = new int[contents.length];
        for (int i = 0; i < contents.length; i++) {
            fds[i] = openFile("f" + i, contents[i]);
        }
        try {
            UnixMessages.send(pair[0], bytes(text), fds);
        } finally {
            for (int fd : fds) {
                Libc.close(fd);
            }
        }
    }

    /** How many of this process's descriptors are open on file {@code name} (read from /proc/self/fd). */
    private long descriptorsOf(String name) throws IOException {
        Path file = dir.resolve(name).toRealPath();
        try (var fds = Files.list(Path.of("/proc/self/fd"))) {
            return fds.filter(p -> {
                try {
                    return Files.readSymbolicLink(p).equals(file);
                } catch (IOException gone) {
                    return false; // the listing's own descriptor, closed by now
                }
            }).count();
        }
    }

    @Test
    void severalDescriptorsArriveInOrder() throws IOException {
        sendFiles("three", "first", "second", "third");
        int[] fds = new int[4];
        int n = UnixMessages.receive(pair[1], arena.allocate(16), fds);
        assertThat(n).isEqualTo(5);
        assertThat(contentOf(fds[0])).isEqualTo("first");
        assertThat(contentOf(fds[1])).isEqualTo("second");
        assertThat(contentOf(fds[2])).isEqualTo("third");
        assertThat(fds[3]).isEqualTo(-1);
        for (int i = 0; i < 3; i++) {
            Libc.close(fds[i]);
        }
    }

    /** Descriptors beyond the caller's array are closed, not leaked. */
    @Test
    void descriptorsBeyondTheArrayAreClosed() throws IOException {
        sendFiles("x", "kept", "dropped");
        int[] fds = new int[1];
        UnixMessages.receive(pair[1], arena.allocate(4), fds);
        assertThat(contentOf(fds[0])).isEqualTo("kept");
        assertThat(descriptorsOf("f0")).isEqualTo(1);
        assertThat(descriptorsOf("f1")).as("the copy beyond the array is closed").isZero();
        Libc.close(fds[0]);
    }

    @Test
    void controlDataCutShortIsAnErrorAndClosesWhatArrived() throws IOException {
        sendFiles("x", "1", "2", "3");
        int[] fds = new int[3];
        assertThatThrownBy(() -> UnixMessages.receive(pair[1], arena.allocate(4), fds, 1))
                .isInstanceOf(IOException.class).hasMessageContaining("MSG_CTRUNC");
        assertThat(fds).containsOnly(-1);
        for (String f : new String[]{"f0", "f1", "f2"}) {
            assertThat(descriptorsOf(f)).as("no copy of " + f + " left open").isZero();
        }
    }

    @Test
    void aShortMessageReturnsWhatCameAndEndOfStreamIsZero() throws IOException {
        UnixMessages.send(pair[0], bytes("12345"));
        Sockets.shutdown(pair[0], 1); // SHUT_WR: end of stream after the five bytes
        int[] fds = new int[1];
        MemorySegment header = arena.allocate(12);
        assertThat(UnixMessages.receive(pair[1], header, fds)).isEqualTo(5);
        assertThat(text(header, 5)).isEqualTo("12345");
        assertThat(UnixMessages.receive(pair[1], header, fds)).isZero();
        assertThat(fds).containsOnly(-1);
    }

    @Test
    void aDescriptorWithoutDataIsRefused() {
        assertThatThrownBy(() -> UnixMessages.send(pair[0], arena.allocate(0), 0))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("first byte");
    }

    @Test
    void aListeningSocketAcceptsAConnectionByPath() throws Exception {
        int listener = Sockets.unixStreamSocket();
        int client = Sockets.unixStreamSocket();
        try {
            Sockets.listen(listener, dir.resolve("s").toString(), 1);
            Sockets.connect(client, dir.resolve("s").toString()); // completes into the backlog
            int server = Sockets.accept(listener);
            UnixMessages.send(client, bytes("hi"));
            MemorySegment buf = arena.allocate(2);
            assertThat(UnixMessages.receive(server, buf, new int[0])).isEqualTo(2);
            assertThat(text(buf, 2)).isEqualTo("hi");
            Libc.close(server);
        } finally {
            Libc.close(client);
            Libc.close(listener);
        }
    }
}
