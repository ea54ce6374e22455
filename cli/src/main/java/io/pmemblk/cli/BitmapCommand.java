package io.pmemblk.cli;

import io.pmemblk.settings.Settings;
import io.pmemblk.settings.SettingsException;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Parameters;

import java.io.IOException;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.Callable;

/**
 * Manages the dirty bitmaps of a running server through its control socket ({@link BitmapControl}), found from the
 * same settings the server was started with (bitmap.dir, pmem.path).
 */
@Command(name = "bitmap", mixinStandardHelpOptions = true,
        description = {"Manage the dirty bitmaps of the running server (changed-block tracking, docs/bitmaps.md):",
                "  list                      every bitmap: active or frozen, generation, granularity, dirty blocks",
                "  add NAME [GRANULARITY]    a new clean bitmap (default 64K per bit) that every write marks",
                "  checkpoint NAME           freeze NAME as NAME@G (printed) for a backup, and start it anew",
                "  clear NAME                empty NAME",
                "  remove NAME               remove a bitmap, active or frozen (NAME@G)",
                "Needs bitmap.dir set (as for serve, with the same --config / --set)."})
final class BitmapCommand implements Callable<Integer> {
    @Mixin
    SettingsOptions options;

    @Parameters(arity = "1..3", paramLabel = "REQUEST", description = "list | add NAME [GRANULARITY] | checkpoint NAME"
            + " | clear NAME | remove NAME")
    List<String> request;

    @Override
    public Integer call() throws IOException, SettingsException {
        Settings s = options.load();
        Path dir = s.bitmapDir(Device.layoutRecords());
        if (dir == null) {
            System.err.println("pmemblk: bitmap.dir is off: the server keeps no bitmaps; allowed: bitmap.dir=auto or a"
                    + " directory (as the server was started with)");
            return Main.USAGE;
        }
        Path socket = dir.resolve(BitmapControl.SOCKET);
        String reply;
        try (SocketChannel c = SocketChannel.open(UnixDomainSocketAddress.of(socket))) {
            ByteBuffer out = ByteBuffer.wrap((String.join(" ", request) + "\n").getBytes(StandardCharsets.UTF_8));
            while (out.hasRemaining()) {
                c.write(out);
            }
            reply = new String(readAll(c), StandardCharsets.UTF_8);
        } catch (IOException e) {
            System.err.println("pmemblk: cannot reach the server's control socket " + socket + ": " + e.getMessage()
                    + "; is `pmemblk serve` running with these settings?");
            return 1;
        }
        if (reply.startsWith("ok\n")) {
            System.out.print(reply.substring(3));
            return 0;
        }
        System.err.print("pmemblk: " + (reply.isEmpty() ? "the server closed the control socket without an answer\n"
                : reply.startsWith("error: ") ? reply.substring(7) : reply));
        return 1;
    }

    private static byte[] readAll(SocketChannel c) throws IOException {
        java.io.ByteArrayOutputStream all = new java.io.ByteArrayOutputStream();
        ByteBuffer b = ByteBuffer.allocate(8192);
        while (c.read(b) >= 0) {
            all.write(b.array(), 0, b.position());
            b.clear();
        }
        return all.toByteArray();
    }
}
