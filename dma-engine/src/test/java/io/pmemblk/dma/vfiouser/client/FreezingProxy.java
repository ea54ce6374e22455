package io.pmemblk.dma.vfiouser.client;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.UnixMessages;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A unix-socket proxy between a vfio-user client and a device, descriptors (SCM_RIGHTS) passed along: test code
 * that makes a device "stop answering" while its process (this one) still runs. {@link #freeze} holds whatever
 * the client sends from then on (its doorbells included: the device never sees them); {@link #drop} closes the
 * connections (the device sees its client go, as when a stopped process resumes and finds the socket closed),
 * discards what was held, and lets the next connection through normally.
 */
final class FreezingProxy implements AutoCloseable {
    private final int listenFd;
    private final Path device;
    private final Thread acceptor;
    private final List<int[]> pairs = new ArrayList<>();
    private volatile boolean frozen;
    private volatile boolean closed;

    FreezingProxy(Path socket, Path device) throws NativeException {
        this.device = device;
        this.listenFd = Sockets.unixStreamSocket();
        Sockets.listen(listenFd, socket.toString(), 4);
        this.acceptor = Thread.ofPlatform().daemon().name("proxy-accept").start(this::accept);
    }

    private void accept() {
        while (!closed) {
            try {
                int client = Sockets.accept(listenFd);
                int dev = Sockets.unixStreamSocket();
                Sockets.connect(dev, device.toString());
                synchronized (pairs) {
                    pairs.add(new int[]{client, dev});
                }
                Thread.ofPlatform().daemon().name("proxy-c2d").start(() -> pump(client, dev, true));
                Thread.ofPlatform().daemon().name("proxy-d2c").start(() -> pump(dev, client, false));
            } catch (NativeException e) {
                return; // shut down
            }
        }
    }

    private void pump(int from, int to, boolean toDevice) {
        int[] fds = new int[UnixMessages.SCM_MAX_FD];
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(1 << 16);
            while (true) {
                int n = UnixMessages.receive(from, buf, fds);
                if (n == 0) {
                    break;
                }
                boolean held = false;
                synchronized (this) {
                    while (toDevice && frozen && !closed) {
                        held = true;
                        wait(); // until drop() or close(): then this data is discarded with the connection
                    }
                }
                int count = 0;
                while (count < fds.length && fds[count] >= 0) {
                    count++;
                }
                int[] pass = java.util.Arrays.copyOf(fds, count);
                if (!held) {
                    UnixMessages.send(to, buf.asSlice(0, n), pass);
                }
                for (int fd : pass) {
                    Libc.close(fd);
                }
                if (held) {
                    break;
                }
            }
        } catch (Exception e) {
            // a connection shut down under the pump
        }
        shutdown(from);
        shutdown(to);
    }

    private static void shutdown(int fd) {
        try {
            Sockets.shutdown(fd, Sockets.SHUT_RDWR);
        } catch (NativeException ignored) {
            // closed already
        }
    }

    /** Holds everything the client sends from now on. */
    void freeze() {
        frozen = true;
    }

    /** Closes every connection, discards what was held, and lets the next connections through. */
    void drop() {
        synchronized (pairs) {
            for (int[] p : pairs) {
                shutdown(p[0]);
                shutdown(p[1]);
            }
        }
        synchronized (this) {
            frozen = false;
            notifyAll();
        }
    }

    @Override
    public void close() throws Exception {
        closed = true;
        drop();
        shutdown(listenFd);
        acceptor.join(5000);
        Libc.close(listenFd);
    }
}
