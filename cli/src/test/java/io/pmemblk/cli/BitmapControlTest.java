package io.pmemblk.cli;

import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.bitmap.BitmapDirectory;
import io.pmemblk.pmem.bitmap.DirtyBitmaps;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The control socket's requests against real bitmaps: results, and refusals that say what is allowed. */
class BitmapControlTest {
    @TempDir
    Path dir;

    private static String ask(Path socket, String request) throws Exception {
        try (SocketChannel c = SocketChannel.open(UnixDomainSocketAddress.of(socket))) {
            c.write(ByteBuffer.wrap(request.getBytes(StandardCharsets.UTF_8)));
            ByteBuffer b = ByteBuffer.allocate(4096);
            while (c.read(b) >= 0) {
                if (!b.hasRemaining()) throw new AssertionError("answer longer than 4 KiB");
            }
            return new String(b.array(), 0, b.position(), StandardCharsets.UTF_8);
        }
    }

    @Test
    void requestsOverTheSocketAndTheirRefusals() throws Exception {
        try (DirtyBitmaps bitmaps = DirtyBitmaps.open(BitmapDirectory.open(dir.resolve("d.img.bitmaps"), "bitmap.dir",
                PmemRegion.Mapper.JAVA), 16 << 20, 64 << 10, List.of("b"), 1);
             BitmapControl control = BitmapControl.start(bitmaps)) {
            assertThat(Files.getPosixFilePermissions(control.path())).as("mode 0600")
                    .isEqualTo(java.nio.file.attribute.PosixFilePermissions.fromString("rw-------"));
            assertThat(ask(control.path(), "checkpoint b\n")).isEqualTo("ok\nb@1\n");
            assertThat(ask(control.path(), "add c 4K\n")).isEqualTo("ok\n");
            assertThat(ask(control.path(), "list\n")).isEqualTo("ok\n"
                    + "b active generation=2 granularity=65536 dirty-blocks=0 context=qemu:dirty-bitmap:b\n"
                    + "c active generation=1 granularity=4096 dirty-blocks=0 context=qemu:dirty-bitmap:c\n"
                    + "b@1 frozen generation=1 granularity=65536 dirty-blocks=0 context=qemu:dirty-bitmap:b@1\n");
            assertThat(ask(control.path(), "add d 3000\n")).isEqualTo("error: granularity 3000; allowed: a power of"
                    + " two from 512 to 1073741824 bytes (QEMU's default is 65536)\n");
            assertThat(ask(control.path(), "add\n")).isEqualTo("error: add with 0 arguments; usage: add NAME [GRANULARITY]\n");
            assertThat(ask(control.path(), "frobnicate x\n")).isEqualTo("error: unknown request 'frobnicate'; allowed:"
                    + " add, remove, clear, checkpoint, list\n");
            assertThat(ask(control.path(), "x".repeat(BitmapControl.MAX_LINE + 1))).as("a line past the limit is not a request")
                    .isEqualTo("error: a request longer than 1024 bytes; allowed: one line of at most 1024 bytes\n");
            assertThat(ask(control.path(), "remove b@1\n")).isEqualTo("ok\n");
            assertThat(bitmaps.names()).containsExactly("b", "c");
        }
        assertThat(dir.resolve("d.img.bitmaps/control.sock")).doesNotExist();
    }
}
