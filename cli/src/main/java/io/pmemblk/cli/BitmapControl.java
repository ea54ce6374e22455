package io.pmemblk.cli;

import io.pmemblk.pmem.bitmap.DirtyBitmaps;
import io.pmemblk.posix.UnixSocketFile;
import io.pmemblk.queueing.log.AcceptLoop;

import java.io.IOException;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;

/**
 * The control socket {@code pmemblk bitmap} talks to: {@code control.sock} in the bitmap directory, made as the
 * NBD socket is ({@link UnixSocketFile}: mode 0600 in a directory checked as pmem.path's are, so only its owner and
 * root reach it). One request a connection, one line: {@code add NAME [GRANULARITY]}, {@code remove NAME},
 * {@code clear NAME}, {@code checkpoint NAME}, {@code list}; the answer is {@code ok} or {@code error: WHY}, then
 * the lines of the result, then the connection closes. Each connection has a virtual thread of its own, so a
 * client that sends nothing holds up nobody else.
 */
final class BitmapControl implements AutoCloseable {
    static final String SOCKET = "control.sock";
    /** A request is one short line; more is not one. */
    static final int MAX_LINE = 1024;
    private static final System.Logger LOG = System.getLogger(BitmapControl.class.getName());

    private final DirtyBitmaps bitmaps;
    private final ServerSocketChannel listener;
    private final UnixSocketFile file;
    private final Thread acceptor;

    private BitmapControl(DirtyBitmaps bitmaps, ServerSocketChannel listener, UnixSocketFile file) {
        this.bitmaps = bitmaps;
        this.listener = listener;
        this.file = file;
        this.acceptor = Thread.ofPlatform().name("bitmap-control").daemon().start(this::accept);
    }

    static BitmapControl start(DirtyBitmaps bitmaps) throws IOException {
        Path path = bitmaps.directory().path().resolve(SOCKET);
        ServerSocketChannel ch = ServerSocketChannel.open(java.net.StandardProtocolFamily.UNIX);
        try {
            UnixSocketFile f = UnixSocketFile.bind(bitmaps.directory().held(), path, "bitmap.dir",
                    address -> ch.bind(UnixDomainSocketAddress.of(address), 16));
            return new BitmapControl(bitmaps, ch, f);
        } catch (IOException | RuntimeException e) {
            ch.close();
            throw e;
        }
    }

    Path path() {
        return file.path();
    }

    private void accept() {
        AcceptLoop.run(LOG, "bitmap control socket", listener::accept,
                c -> Thread.ofVirtual().name("bitmap-control-conn").start(() -> serve(c)), () -> !listener.isOpen());
    }

    private void serve(SocketChannel c) {
        try (c) {
            String reply;
            try {
                String line = readLine(c);
                reply = "ok\n" + execute(line == null ? "" : line);
            } catch (IllegalArgumentException | IOException e) {
                reply = "error: " + e.getMessage() + "\n";
            }
            ByteBuffer out = ByteBuffer.wrap(reply.getBytes(StandardCharsets.UTF_8));
            while (out.hasRemaining()) {
                c.write(out);
            }
        } catch (IOException e) {
            LOG.log(System.Logger.Level.DEBUG, "bitmap control connection: " + e.getMessage());
        }
    }

    /** One line (without its newline), or null at a close before it ended; refused when longer than {@link #MAX_LINE}. */
    private static String readLine(SocketChannel c) throws IOException {
        ByteBuffer b = ByteBuffer.allocate(MAX_LINE + 1);
        while (b.hasRemaining()) {
            if (c.read(b) < 0) {
                break;
            }
            for (int i = 0; i < b.position(); i++) {
                if (b.get(i) == '\n') {
                    return new String(b.array(), 0, i, StandardCharsets.UTF_8);
                }
            }
        }
        if (!b.hasRemaining()) {
            throw new IllegalArgumentException("a request longer than " + MAX_LINE + " bytes; allowed: one line of"
                    + " at most " + MAX_LINE + " bytes");
        }
        return b.position() == 0 ? null : new String(b.array(), 0, b.position(), StandardCharsets.UTF_8);
    }

    /** Runs one request; returns the result's lines, each ending in a newline. */
    String execute(String line) throws IOException {
        List<String> w = List.of(line.trim().split("\\s+"));
        String verb = w.getFirst();
        int args = w.size() - 1;
        switch (verb) {
            case "list" -> {
                expect(verb, args, 0, 0, "list");
                StringBuilder b = new StringBuilder();
                for (DirtyBitmaps.Info i : bitmaps.list()) {
                    b.append(i.name()).append(' ').append(i.frozen() ? "frozen" : "active")
                            .append(" generation=").append(i.generation())
                            .append(" granularity=").append(i.granularity())
                            .append(" dirty-blocks=").append(i.dirtyBlocks())
                            .append(" context=qemu:dirty-bitmap:").append(i.name()).append('\n');
                }
                return b.toString();
            }
            case "add" -> {
                expect(verb, args, 1, 2, "add NAME [GRANULARITY]");
                long g = args == 2 ? granularity(w.get(2)) : 64 << 10;
                bitmaps.add(w.get(1), g);
                return "";
            }
            case "remove" -> {
                expect(verb, args, 1, 1, "remove NAME");
                bitmaps.remove(w.get(1));
                return "";
            }
            case "clear" -> {
                expect(verb, args, 1, 1, "clear NAME");
                bitmaps.clear(w.get(1));
                return "";
            }
            case "checkpoint" -> {
                expect(verb, args, 1, 1, "checkpoint NAME");
                return bitmaps.checkpoint(w.get(1)) + "\n";
            }
            default -> throw new IllegalArgumentException("unknown request '" + verb + "'; allowed: add, remove,"
                    + " clear, checkpoint, list");
        }
    }

    private static void expect(String verb, int args, int min, int max, String usage) {
        if (args < min || args > max) {
            throw new IllegalArgumentException(verb + " with " + args + " arguments; usage: " + usage);
        }
    }

    private static long granularity(String text) {
        try {
            return io.pmemblk.settings.Sizes.parse(text);
        } catch (RuntimeException e) {
            throw new IllegalArgumentException("granularity '" + text + "'; allowed: a power of two from 512 to 1G"
                    + " (suffixes K, M, G)");
        }
    }

    @Override
    public void close() {
        try {
            listener.close();
        } catch (IOException e) {
            LOG.log(System.Logger.Level.WARNING, "bitmap control socket: " + e.getMessage());
        }
        file.remove();
    }
}
