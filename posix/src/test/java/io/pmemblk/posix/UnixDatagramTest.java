package io.pmemblk.posix;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The unix datagram calls systemd's notify protocol needs, against the kernel and against python3's socket module. */
class UnixDatagramTest {
    @TempDir
    Path dir;

    private static String text(MemorySegment buf, int n) {
        return new String(buf.asSlice(0, n).toArray(ValueLayout.JAVA_BYTE), StandardCharsets.UTF_8);
    }

    @Test
    void aDatagramSentToABoundPathArrivesWhole() throws Exception {
        try (Arena arena = Arena.ofConfined()) {
            int rx = Sockets.unixDatagramSocket();
            int tx = Sockets.unixDatagramSocket();
            try {
                MemorySegment addr = Sockets.unixAddress(dir.resolve("notify").toString(), arena);
                Sockets.bind(rx, addr);
                Sockets.sendTo(tx, arena.allocateFrom("READY=1\nSTATUS=up", StandardCharsets.UTF_8).asSlice(0, 17), addr);
                MemorySegment buf = arena.allocate(4096);
                // a unix datagram is in the receiver's queue when sendto returns: no wait is needed
                int n = Sockets.recv(rx, buf, Sockets.MSG_DONTWAIT);
                assertThat(text(buf, n)).isEqualTo("READY=1\nSTATUS=up");
                assertThatThrownBy(() -> Sockets.recv(rx, buf, Sockets.MSG_DONTWAIT))
                        .isInstanceOf(NativeException.class)
                        .satisfies(e -> assertThat(((NativeException) e).errno()).isEqualTo(Errno.EAGAIN));
            } finally {
                Libc.close(tx);
                Libc.close(rx);
            }
        }
    }

    /**
     * systemd passes '@name' for an abstract socket: the kernel must see a NUL and then exactly the name's bytes.
     * python3 binds "\0name" on its own, so a wrong encoding here (a trailing NUL, the '@' kept) reaches no one.
     */
    @Test
    void anAbstractAddressReachesAPython3Listener() throws Exception {
        String name = "pmemblk-test-" + ProcessHandle.current().pid() + "-" + System.nanoTime();
        Process py = new ProcessBuilder("python3", "-c", String.join("\n",
                "import socket, sys",
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)",
                "s.bind('\\0' + sys.argv[1])",
                "s.settimeout(20)",
                "print('bound', flush=True)",
                "print(s.recv(4096).decode(), flush=True)"), name).redirectErrorStream(true).start();
        try (Arena arena = Arena.ofConfined();
             BufferedReader out = new BufferedReader(new InputStreamReader(py.getInputStream(), StandardCharsets.UTF_8))) {
            assertThat(out.readLine()).isEqualTo("bound");
            int tx = Sockets.unixDatagramSocket();
            try {
                Sockets.sendTo(tx, arena.allocateFrom("STOPPING=1", StandardCharsets.UTF_8).asSlice(0, 10),
                        Sockets.unixAddress("@" + name, arena));
            } finally {
                Libc.close(tx);
            }
            assertThat(py.waitFor(20, TimeUnit.SECONDS)).as("python3 listener finished").isTrue();
            assertThat(out.readLine()).isEqualTo("STOPPING=1");
        } finally {
            py.destroyForcibly();
        }
    }

    @Test
    void sendingWhereNobodyListensNamesTheAddressAndErrno() throws Exception {
        try (Arena arena = Arena.ofConfined()) {
            int tx = Sockets.unixDatagramSocket();
            try {
                String missing = dir.resolve("nobody").toString();
                assertThatThrownBy(() -> Sockets.sendTo(tx, arena.allocate(1), Sockets.unixAddress(missing, arena)))
                        .isInstanceOf(NativeException.class)
                        .hasMessageContaining("sendto(")
                        .hasMessageContaining("'" + missing + "'")
                        .hasMessageContaining("No such file or directory");
            } finally {
                Libc.close(tx);
            }
        }
    }

    @Test
    void aBlockingReceiveGivesUpAtItsTimeout() throws Exception {
        try (Arena arena = Arena.ofConfined()) {
            int rx = Sockets.unixDatagramSocket();
            try {
                Sockets.bind(rx, Sockets.unixAddress("@pmemblk-timeout-" + System.nanoTime(), arena));
                Sockets.receiveTimeout(rx, 200);
                long t0 = System.nanoTime();
                assertThatThrownBy(() -> Sockets.recv(rx, arena.allocate(64), 0))
                        .isInstanceOf(NativeException.class)
                        .satisfies(e -> assertThat(((NativeException) e).errno()).isEqualTo(Errno.EAGAIN));
                assertThat(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0)).isBetween(150L, 10_000L);
            } finally {
                Libc.close(rx);
            }
        }
    }

    @Test
    void anAddressThatCannotBeOneIsRefusedWithWhatIsAllowed() {
        try (Arena arena = Arena.ofConfined()) {
            for (String bad : new String[]{"", "@", "/tmp/a\0b", "/" + "x".repeat(107)}) {
                assertThatThrownBy(() -> Sockets.unixAddress(bad, arena)).as("'%s'", bad)
                        .isInstanceOf(IllegalArgumentException.class)
                        .hasMessageContaining("is not allowed; allowed: a path, or '@' and a name");
            }
            // the longest that fit: 107 bytes and the NUL; an abstract name uses all 108
            assertThat(Sockets.unixAddress("/" + "x".repeat(106), arena).byteSize()).isEqualTo(110);
            assertThat(Sockets.unixAddress("@" + "x".repeat(107), arena).byteSize()).isEqualTo(110);
        }
    }
}
