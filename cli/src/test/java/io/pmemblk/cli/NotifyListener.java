package io.pmemblk.cli;

import io.pmemblk.posix.Errno;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * What systemd does for a {@code Type=notify} service, for tests: a unix datagram socket bound where
 * {@code $NOTIFY_SOCKET} says, receiving the service's notifications with bounded waits.
 */
final class NotifyListener implements AutoCloseable {
    final String address;
    private final Arena arena = Arena.ofConfined();
    private final MemorySegment buffer = arena.allocate(8192);
    private final int fd;
    /** Every message received so far, in order (for failure messages). */
    final List<String> received = new ArrayList<>();

    NotifyListener(String address) throws NativeException {
        this.address = address;
        this.fd = Sockets.unixDatagramSocket();
        Sockets.bind(fd, Sockets.unixAddress(address, arena));
    }

    /** The next notification, waiting at most {@code timeout}. */
    String next(Duration timeout) throws NativeException {
        Sockets.receiveTimeout(fd, Math.max(1, timeout.toMillis()));
        try {
            int n = Sockets.recv(fd, buffer, 0);
            String m = new String(buffer.asSlice(0, n).toArray(ValueLayout.JAVA_BYTE), StandardCharsets.UTF_8);
            received.add(m);
            return m;
        } catch (NativeException e) {
            if (e.errno() == Errno.EAGAIN) {
                throw new AssertionError("no notification on " + address + " within " + timeout + "; received so far: "
                        + received);
            }
            throw e;
        }
    }

    /** Nothing arrives within {@code quiet} (what was received instead is named). */
    void assertNothingWithin(Duration quiet) throws NativeException {
        Sockets.receiveTimeout(fd, quiet.toMillis());
        try {
            int n = Sockets.recv(fd, buffer, 0);
            throw new AssertionError("unexpected notification: " + new String(buffer.asSlice(0, n)
                    .toArray(ValueLayout.JAVA_BYTE), StandardCharsets.UTF_8));
        } catch (NativeException e) {
            if (e.errno() != Errno.EAGAIN) {
                throw e;
            }
        }
    }

    /** The value of {@code key} in a notification ("READY=1\nSTATUS=x" -> STATUS -> "x"), or null. */
    static String field(String message, String key) {
        for (String line : message.split("\n")) {
            if (line.startsWith(key + "=")) {
                return line.substring(key.length() + 1);
            }
        }
        return null;
    }

    @Override
    public void close() throws NativeException {
        try {
            Libc.close(fd);
        } finally {
            arena.close();
        }
    }
}
