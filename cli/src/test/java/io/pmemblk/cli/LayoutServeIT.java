package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import static io.pmemblk.queueing.testing.Digests.sha256;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Who decides a device's layout, against the real {@code pmemblk serve} and {@code pmemblk format}: a raw device's
 * client cannot decide the layout. NBD clients (nbdcopy, qemu-io) write a whole valid pmemblk pool header at LBA 0 of a
 * raw device; the next serve still serves it raw with those bytes intact, and serve with pmem.layout=btt refuses it
 * without changing a byte. {@code pmemblk format} finds data anywhere in the device, not only in its first MiB.
 */
class LayoutServeIT {
    static final long SIZE = 32L << 20;

    @TempDir
    Path dir;

    private List<String> settings(Path file, String layout) {
        return new ArrayList<>(List.of("pmem.path=" + file, "pmem.size=" + SIZE, "pmem.layout=" + layout,
                "nbd.socket=" + dir.resolve("nbd.sock"), "nbd.port=0", "queue.buffer-bytes=32M"));
    }

    private ServerProcess serve(Path file, String layout) throws Exception {
        return ServerProcess.start(dir, settings(file, layout).toArray(String[]::new));
    }

    private static ServerProcess.Run pmemblk(String sub, String... args) throws Exception {
        return ServerProcess.run(ServerProcess.command(sub, List.of(args)), 120);
    }

    private static void run(String... cmd) throws Exception {
        ServerProcess.Run r = ServerProcess.run(List.of(cmd), 60);
        assertThat(r.exit()).as(r.out()).isZero();
        assertThat(r.out()).doesNotContain("failed", "error");
    }

    @Test
    void aPoolHeaderAClientWroteAtLba0IsItsDataRawStaysRawAndBttIsRefusedWithoutAByteChanged() throws Exception {
        // A whole valid pool header (its checksum is public): the first 8 KiB of a pool pmemblk formats.
        Path scratch = dir.resolve("scratch.img");
        ServerProcess.Run f = pmemblk("format", "--layout", "btt", "--size", "32M", scratch.toString());
        assertThat(f.exit()).as(f.out()).isZero();
        byte[] header = Arrays.copyOf(Files.readAllBytes(scratch), 8192);
        assertThat(new String(header, 0, 8, java.nio.charset.StandardCharsets.ISO_8859_1)).isEqualTo("PMEMBLK\0");
        Path headerFile = dir.resolve("header.bin"), copy = dir.resolve("copy.bin");
        Files.write(headerFile, header);
        long tail = SIZE - (1 << 20);

        Path raw = dir.resolve("raw.img");
        try (ServerProcess s = serve(raw, "raw")) {
            // NBD clients write it (nbdcopy writes the 8 KiB at offset 0); arena 0, from 8 KiB on, stays zero: the
            // case the old serve took for `pmempool create blk` without -w and laid a BTT out over
            run("nbdcopy", headerFile.toString(), s.unixUri());
            // data in the last MiB but its last 4 KiB, where arena 0's backup info block would be (zeros)
            run("qemu-io", "-f", "raw", "-c", "write -P 0x5a " + tail + " " + ((1 << 20) - 4096), "-c", "flush",
                    s.unixUri());
            assertThat(s.terminate()).as("stderr: %s", s.stderr()).isZero();
        }
        assertThat(Files.exists(dir.resolve("raw.img.pmemblk-layout"))).as("raw: nothing recorded").isFalse();

        // restarted: raw, as configured, whatever the client wrote
        try (ServerProcess s = serve(raw, "raw")) {
            run("nbdcopy", s.unixUri(), copy.toString());
            assertThat(s.terminate()).isZero();
        }
        byte[] served = Files.readAllBytes(copy);
        assertThat(Arrays.copyOf(served, header.length)).as("the client's bytes, intact").isEqualTo(header);
        byte[] last = new byte[1 << 20];
        Arrays.fill(last, 0, last.length - 4096, (byte) 0x5a);
        assertThat(Arrays.copyOfRange(served, (int) tail, (int) SIZE)).isEqualTo(last);

        // following the old refusal's advice (pmem.layout=btt) must not lay a BTT out over the raw image
        String before = sha256(raw);
        assertThatThrownBy(() -> serve(raw, "btt")).isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("is not recorded as a BTT (no " + raw + ".pmemblk-layout)")
                .hasMessageContaining("nothing was written")
                .hasMessageContaining("serve it with pmem.layout=raw");
        assertThat(sha256(raw)).as("not one byte of the raw image changed").isEqualTo(before);
        ServerProcess.Run info = pmemblk("info", "--set", "pmem.path=" + raw, "--set", "pmem.size=" + SIZE);
        assertThat(info.out()).contains("layout=raw", "layout_record=" + raw + ".pmemblk-layout (none)")
                .doesNotContain("layout_mismatch");
    }

    @Test
    void formatFindsDataPastTheFirstMibAndARecordedBttIsRefusedRaw() throws Exception {
        Path img = dir.resolve("late.img");
        try (RandomAccessFile f = new RandomAccessFile(img.toFile(), "rw")) {
            f.setLength(SIZE);
            f.seek((5L << 20) + 3);
            f.write(0x53); // a filesystem that starts at 5 MiB, say (a partition)
        }
        String before = sha256(img);
        ServerProcess.Run refused = pmemblk("format", "--layout", "btt", img.toString());
        assertThat(refused.exit()).as(refused.out()).isEqualTo(1);
        assertThat(refused.out()).contains(img + " holds data (a non-zero byte at offset " + ((5L << 20) + 3) + " of "
                + SIZE + ")", "--force");
        assertThat(sha256(img)).isEqualTo(before);
        assertThat(Files.exists(dir.resolve("late.img.pmemblk-layout"))).isFalse();

        ServerProcess.Run forced = pmemblk("format", "--layout", "btt", "--force", img.toString());
        assertThat(forced.exit()).as(forced.out()).isZero();
        assertThat(forced.out()).contains("recorded in " + img + ".pmemblk-layout");
        ServerProcess.Run again = pmemblk("format", "--layout", "btt", img.toString());
        assertThat(again.exit()).isEqualTo(1);
        assertThat(again.out()).contains("is recorded as a BTT already (" + img + ".pmemblk-layout)");

        assertThatThrownBy(() -> serve(img, "raw")).hasMessageContaining("is recorded as a BTT of 4096-byte sectors")
                .hasMessageContaining(img + ".pmemblk-layout")
                .hasMessageContaining("serve it with --set pmem.layout=btt");
        try (ServerProcess s = serve(img, "btt")) {
            assertThat(s.terminate()).isZero();
        }
    }
}
