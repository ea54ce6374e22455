package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;

import static io.pmemblk.queueing.testing.Digests.sha256;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * Dirty bitmaps served by the real {@code pmemblk serve}: the same writes against QEMU's server ({@code qemu-nbd -B}
 * on a qcow2 with a persistent bitmap) give the same {@code nbdinfo --map} and {@code qemu-img map}; an incremental
 * backup (full nbdcopy, random writes, checkpoint, {@code scripts/pmemblk-backup}) gives the device's sha256; and
 * after a kill -9 under writes every block that holds written data is dirty.
 */
class BitmapServeIT {
    static final String PYTHON = "/usr/bin/python3";
    static final Path BACKUP = Path.of("..", "scripts", "pmemblk-backup").toAbsolutePath();
    static final long SIZE = 64 << 20;

    @TempDir
    Path dir;

    private ServerProcess serve(String... extra) throws Exception {
        List<String> s = new ArrayList<>(List.of("pmem.path=" + dir.resolve("d.img"), "pmem.size=64M",
                "nbd.socket=" + dir.resolve("nbd.sock"), "nbd.port=0", "queue.buffer-bytes=32M", "bitmap.dir=auto"));
        s.addAll(List.of(extra));
        return ServerProcess.start(dir, s.toArray(String[]::new));
    }

    private ServerProcess.Run bitmap(String... request) throws Exception {
        List<String> args = new ArrayList<>(List.of("--set", "pmem.path=" + dir.resolve("d.img"), "--set",
                "bitmap.dir=auto"));
        args.addAll(List.of(request));
        return ServerProcess.run(ServerProcess.command("bitmap", args), 60);
    }

    private static ServerProcess.Run ok(List<String> cmd) throws Exception {
        ServerProcess.Run r = ServerProcess.run(cmd, 120);
        assertThat(r.exit()).as(String.join(" ", cmd) + ": " + r.out()).isZero();
        return r;
    }

    /** The writes both servers get: data, unaligned, zeroes, discard, across block edges. */
    private static final List<String> WRITES = List.of("write -P 0x11 0 4k", "write -P 0x22 1M 192k",
            "write -P 0x33 3000000 1000", "write -z 8M 64k", "discard 12M 128k", "write -P 0x44 16777000 2000",
            "write -P 0x55 63M 1M");

    private static List<String> qemuIo(String uri) {
        List<String> cmd = new ArrayList<>(List.of("qemu-io", "-f", "raw"));
        for (String w : WRITES) {
            cmd.add("-c");
            cmd.add(w);
        }
        cmd.add(uri);
        return cmd;
    }

    /** nbdinfo --map lines as (offset, length, flags), adjacent runs of one flag merged. */
    private static List<List<Long>> map(String out) {
        List<List<Long>> runs = new ArrayList<>();
        for (String line : out.lines().map(String::trim).filter(l -> !l.isEmpty()).toList()) {
            String[] f = line.split("\\s+");
            long off = Long.parseLong(f[0]), len = Long.parseLong(f[1]), flags = Long.parseLong(f[2]);
            if (!runs.isEmpty() && runs.getLast().get(2) == flags
                    && runs.getLast().get(0) + runs.getLast().get(1) == off) {
                List<Long> last = runs.removeLast();
                runs.add(List.of(last.get(0), last.get(1) + len, flags));
            } else {
                runs.add(List.of(off, len, flags));
            }
        }
        return runs;
    }

    @Test
    void theSameWritesGiveTheSameMapAsQemuNbdServingAQcow2Bitmap() throws Exception {
        Path qcow2 = dir.resolve("q.qcow2"), qsock = dir.resolve("q.sock");
        ok(List.of("qemu-img", "create", "-q", "-f", "qcow2", qcow2.toString(), "64M"));
        ok(List.of("qemu-img", "bitmap", "--add", qcow2.toString(), "b"));
        Path pid = dir.resolve("qemu-nbd.pid");
        // --fork: the command returns once the server listens; --discard=unmap: qemu-nbd ignores TRIM by default
        ok(List.of("qemu-nbd", "--fork", "--pid-file=" + pid, "--discard=unmap", "-f", "qcow2", "-t", "-B", "b", "-k", qsock.toString(),
                "-x", "pmem0", qcow2.toString()));
        try (ServerProcess s = serve("bitmap.names=b")) {
            String quri = "nbd+unix:///pmem0?socket=" + qsock;
            ok(qemuIo(quri));
            ok(qemuIo(s.unixUri()));
            String theirs = ok(List.of("nbdinfo", "--map=qemu:dirty-bitmap:b", quri)).out();
            String ours = ok(List.of("nbdinfo", "--map=qemu:dirty-bitmap:b", s.unixUri())).out();
            assertThat(map(ours)).as("pmemblk's map; qemu-nbd's:\n" + theirs + "\npmemblk's:\n" + ours)
                    .isEqualTo(map(theirs));
            assertThat(map(ours)).as("some blocks dirty, some clean").extracting(r -> r.get(2)).contains(0L, 1L);
            assertThat(ok(List.of("nbdinfo", "--json", s.unixUri())).out()).contains("qemu:dirty-bitmap:b",
                    "base:allocation");
            String imageOpts = "driver=nbd,server.type=unix,export=pmem0,x-dirty-bitmap=qemu:dirty-bitmap:b,server.path=";
            String theirMap = ok(List.of("qemu-img", "map", "--output=json", "--image-opts", imageOpts + qsock)).out();
            String ourMap = ok(List.of("qemu-img", "map", "--output=json", "--image-opts",
                    imageOpts + dir.resolve("nbd.sock"))).out();
            assertThat(ourMap).as("qemu-img map of pmemblk's bitmap").isEqualTo(theirMap);
            assertThat(s.terminate()).as(s.stderr()).isZero();
        } finally {
            ServerProcess.run(List.of("kill", Files.readString(pid).trim()), 10);
        }
    }

    @Test
    void anIncrementalBackupFromACheckpointEqualsTheDevice() throws Exception {
        Path full = dir.resolve("full.img"), now = dir.resolve("now.img"), seed = dir.resolve("seed.img");
        byte[] bytes = new byte[(int) SIZE];
        new Random(46).nextBytes(bytes);
        Files.write(seed, bytes);
        try (ServerProcess s = serve("bitmap.names=b")) {
            ok(List.of("nbdcopy", seed.toString(), s.unixUri()));
            // the boundary: what the full copy holds is what the device held at this checkpoint, or later
            ServerProcess.Run c1 = bitmap("checkpoint", "b");
            assertThat(c1.exit()).as(c1.out()).isZero();
            assertThat(c1.out().trim()).isEqualTo("b@1");
            assertThat(bitmap("remove", "b@1").exit()).isZero();
            ok(List.of("nbdcopy", s.unixUri(), full.toString()));

            Random rnd = new Random(7);
            List<String> writes = new ArrayList<>(List.of("qemu-io", "-f", "raw"));
            for (int i = 0; i < 200; i++) {
                long off = (long) rnd.nextInt((int) (SIZE / 512) - 256) * 512;
                writes.addAll(List.of("-c", "write -P " + (1 + rnd.nextInt(255)) + " " + off + " " + 512 * (1 + rnd.nextInt(128))));
            }
            writes.addAll(List.of("-c", "write -z 5M 300k", "-c", "discard 9M 64k", s.unixUri()));
            ok(writes);

            ServerProcess.Run c2 = bitmap("checkpoint", "b");
            assertThat(c2.out().trim()).as(c2.out()).isEqualTo("b@2");
            ServerProcess.Run list = bitmap("list");
            assertThat(list.out()).contains("b active generation=3", "b@2 frozen generation=2 granularity=65536");
            ServerProcess.Run copied = ok(List.of(PYTHON, BACKUP.toString(), s.unixUri(), "b@2", full.toString()));
            long bytesCopied = Long.parseLong(copied.out().trim());
            assertThat(bytesCopied).as("the increment is a part of the device").isPositive().isLessThan(SIZE / 2);
            ok(List.of("nbdcopy", s.unixUri(), now.toString()));
            assertThat(sha256(full)).as("full copy + increment vs the device").isEqualTo(sha256(now));

            ServerProcess.Run bad = bitmap("add", "no/such");
            assertThat(bad.exit()).isEqualTo(1);
            assertThat(bad.out()).contains("bitmap name 'no/such'; allowed: 1 to 64 of A-Z a-z 0-9 _ -");
            ServerProcess.Run gone = bitmap("checkpoint", "nope");
            assertThat(gone.out()).contains("no bitmap named 'nope'; there are b, b@2");
            assertThat(s.terminate()).as(s.stderr()).isZero();
        }
    }

    @Test
    void afterAKillUnderWritesEveryBlockHoldingWrittenDataIsDirty() throws Exception {
        Path writer = dir.resolve("writer.py");
        Files.writeString(writer, """
                import nbd, random, sys
                h = nbd.NBD()
                h.connect_uri(sys.argv[1])
                rnd = random.Random(9)
                for i in range(100000):
                    off = rnd.randrange(0, %d // 4096) * 4096
                    h.pwrite(bytes([1 + i %% 255]) * 4096, off)
                    print(off, flush=True)
                """.formatted(SIZE));
        List<Long> acked = new ArrayList<>();
        try (ServerProcess s = serve("bitmap.names=b", "bitmap.granularity=4K")) {
            Process w = new ProcessBuilder(PYTHON, writer.toString(), s.unixUri()).redirectErrorStream(true).start();
            try (BufferedReader r = new BufferedReader(new InputStreamReader(w.getInputStream(), StandardCharsets.UTF_8))) {
                for (String line; acked.size() < 2000 && (line = r.readLine()) != null; ) {
                    acked.add(Long.parseLong(line.trim()));
                }
                s.kill9(); // under writes: the writer is still sending
            } finally {
                w.destroyForcibly();
                w.waitFor(30, TimeUnit.SECONDS);
            }
        }
        assertThat(acked).as("writes acknowledged before the kill").hasSize(2000);
        Path image = dir.resolve("after.img");
        try (ServerProcess s = serve()) {
            ok(List.of("nbdcopy", s.unixUri(), image.toString()));
            List<List<Long>> dirty = map(ok(List.of("nbdinfo", "--map=qemu:dirty-bitmap:b", s.unixUri())).out());
            byte[] data = Files.readAllBytes(image);
            int written = 0;
            for (int b = 0; b < SIZE / 4096; b++) {
                boolean nonzero = false;
                for (int i = b * 4096; i < (b + 1) * 4096 && !nonzero; i++) nonzero = data[i] != 0;
                long off = (long) b * 4096;
                if (nonzero || acked.contains(off)) {
                    written++;
                    assertThat(dirty.stream().anyMatch(r -> r.get(2) == 1 && r.get(0) <= off && off < r.get(0) + r.get(1)))
                            .as("block at " + off + " was written but is clean after the restart").isTrue();
                }
            }
            assertThat(written).isGreaterThanOrEqualTo((int) acked.stream().distinct().count());
            assertThat(s.terminate()).as(s.stderr()).isZero();
        }
    }
}
