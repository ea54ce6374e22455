package io.pmemblk.cli;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;

/**
 * systemd's notify protocol (sd_notify(3)), for a service of {@code Type=notify}: state changes sent as one
 * datagram of {@code KEY=VALUE} lines to the unix socket named by {@code $NOTIFY_SOCKET} (a path, or '@' and an
 * abstract name). Without that variable (not started by systemd) every call does nothing. A send that fails is
 * logged once and otherwise ignored, as sd_notify's callers do: serving does not depend on the service manager
 * hearing about it.
 */
final class SystemdNotify implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger("pmemblk");
    /** Longer messages are cut: STATUS is one line for {@code systemctl status}, not a report. */
    static final int MAX_MESSAGE = 4096;

    private final String address;
    private final Arena arena;
    private final MemorySegment sockaddr;
    private final MemorySegment buffer;
    private final int fd;
    private boolean warned;
    private boolean closed;

    private SystemdNotify(String address) throws NativeException {
        this.address = address;
        this.arena = Arena.ofShared();
        try {
            this.sockaddr = Sockets.unixAddress(address, arena);
            this.buffer = arena.allocate(MAX_MESSAGE);
            this.fd = Sockets.unixDatagramSocket();
        } catch (NativeException | RuntimeException e) {
            arena.close();
            throw e;
        }
    }

    private SystemdNotify() {
        this.address = null;
        this.arena = null;
        this.sockaddr = null;
        this.buffer = null;
        this.fd = -1;
    }

    /**
     * From {@code $NOTIFY_SOCKET}; one that does nothing when it is unset or cannot be used (which is logged with
     * what was wrong: the service then fails to start by its own timeout, and the journal says why).
     */
    static SystemdNotify fromEnvironment() {
        String address = System.getenv("NOTIFY_SOCKET");
        if (address == null || address.isEmpty()) {
            return new SystemdNotify();
        }
        try {
            return new SystemdNotify(address);
        } catch (NativeException | IllegalArgumentException e) {
            LOG.log(System.Logger.Level.WARNING, "NOTIFY_SOCKET: cannot notify systemd: " + e.getMessage());
            return new SystemdNotify();
        }
    }

    boolean enabled() {
        return fd >= 0;
    }

    /** Start-up or a reload is done: every listener is up. */
    void ready(String status) {
        send("READY=1\nSTATUS=" + oneLine(status));
    }

    /**
     * A reload begins. MONOTONIC_USEC (CLOCK_MONOTONIC, which System.nanoTime reads on Linux) lets systemd >= 253
     * match it to the reload it asked for ({@code Type=notify-reload}); older ones ignore it.
     */
    void reloading(String status) {
        send("RELOADING=1\nMONOTONIC_USEC=" + System.nanoTime() / 1000 + "\nSTATUS=" + oneLine(status));
    }

    /** Shutdown begins. */
    void stopping(String status) {
        send("STOPPING=1\nSTATUS=" + oneLine(status));
    }

    void status(String status) {
        send("STATUS=" + oneLine(status));
    }

    /** A newline would start another assignment: the status is one line. */
    private static String oneLine(String s) {
        return s.replace('\n', ' ');
    }

    private synchronized void send(String message) {
        if (fd < 0 || closed) {
            return;
        }
        byte[] bytes = message.getBytes(StandardCharsets.UTF_8);
        int n = Math.min(bytes.length, MAX_MESSAGE);
        MemorySegment.copy(bytes, 0, buffer, ValueLayout.JAVA_BYTE, 0, n);
        try {
            Sockets.sendTo(fd, buffer.asSlice(0, n), sockaddr);
        } catch (NativeException e) {
            if (!warned) {
                warned = true;
                LOG.log(System.Logger.Level.WARNING, "NOTIFY_SOCKET=" + address + ": cannot notify systemd ("
                        + message.lines().findFirst().orElse("") + "): " + e.getMessage());
            }
        }
    }

    @Override
    public synchronized void close() {
        if (fd < 0 || closed) {
            return;
        }
        closed = true;
        try {
            Libc.close(fd);
        } catch (NativeException e) {
            LOG.log(System.Logger.Level.WARNING, "NOTIFY_SOCKET: " + e.getMessage());
        } finally {
            arena.close();
        }
    }
}
