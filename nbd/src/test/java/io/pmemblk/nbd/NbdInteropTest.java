package io.pmemblk.nbd;

import static org.junit.jupiter.api.Assertions.*;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/** Real peers (libnbd's nbdinfo and nbdsh, QEMU's qemu-io) against the in-process server. */
@Timeout(120)
class NbdInteropTest {
    static final long SIZE = 64L << 20;
    static final int MAX = 32 << 20;

    @TempDir
    Path dir;
    MemoryBlockDriver driver;
    BlockLayer layer;
    NbdServer server;
    String uri;

    @BeforeEach
    void start() throws IOException {
        driver = new MemoryBlockDriver(SIZE);
        layer = new BlockLayer(driver, 2, 16, 2L * MAX, MAX);
        server = new NbdServer(new NbdConfig("pmem0", dir.resolve("nbd.sock"), "127.0.0.1", 0, MAX, 16,
                "interop"), layer);
        List<URI> uris = server.start();
        uri = uris.getFirst().toString();
    }

    @AfterEach
    void stop() {
        server.close();
        layer.close();
        driver.close();
    }

    record Result(int exit, String out) {}

    static Result run(String... command) throws IOException, InterruptedException {
        assumeTrue(Files.isExecutable(Path.of(command[0])), command[0] + " is not installed");
        ProcessBuilder pb = new ProcessBuilder(command).redirectErrorStream(true);
        // nbdsh is a python3 script: use the system python that has libnbd's bindings, not a user's pyenv.
        pb.environment().put("PATH", "/usr/bin:/bin");
        Process p = pb.start();
        byte[] out = p.getInputStream().readAllBytes();
        assertTrue(p.waitFor(60, TimeUnit.SECONDS), String.join(" ", command) + " did not finish");
        return new Result(p.exitValue(), new String(out, StandardCharsets.UTF_8));
    }

    @Test
    void nbdinfoSeesFlagsAndBlockSizes() throws Exception {
        Result r = run("/usr/bin/nbdinfo", "--json", uri);
        assertEquals(0, r.exit(), r.out());
        String json = r.out().replaceAll("\\s+", "");
        for (String expected : List.of("\"export-size\":" + SIZE, "\"is_read_only\":false", "\"can_flush\":true",
                "\"can_fua\":true", "\"can_trim\":true", "\"can_zero\":true", "\"can_fast_zero\":true",
                "\"can_cache\":true", "\"can_df\":true", "\"can_multi_conn\":true",
                "\"block_size_minimum\":1", "\"block_size_preferred\":4096", "\"block_size_maximum\":" + MAX,
                "\"description\":\"interop\"", "\"base:allocation\"")) {
            assertTrue(json.contains(expected), "nbdinfo --json lacks " + expected + ":\n" + r.out());
        }
    }

    @Test
    void nbdinfoMapReportsAllocatedData() throws Exception {
        Result r = run("/usr/bin/nbdinfo", "--map", uri);
        assertEquals(0, r.exit(), r.out());
        String[] fields = r.out().trim().split("\\s+");
        assertEquals("0", fields[0], r.out());
        assertEquals(String.valueOf(SIZE), fields[1], r.out());
        assertEquals("0", fields[2], r.out());
    }

    @Test
    void qemuIoWritesAndReadsPatterns() throws Exception {
        List<String> cmd = new ArrayList<>(List.of("/usr/bin/qemu-io", "-f", "raw", uri));
        for (String c : List.of("write -P 0xab 0 1M", "write -P 0xcd 1M 4M", "write -z 8M 64k", "flush",
                "read -P 0xab 0 1M", "read -P 0xcd 1M 4M", "read -P 0 8M 64k", "aio_write -P 0x5a 16M 256k",
                "aio_flush", "read -P 0x5a 16M 256k", "discard 32M 1M")) {
            cmd.add("-c");
            cmd.add(c);
        }
        Result r = run(cmd.toArray(String[]::new));
        assertEquals(0, r.exit(), r.out());
        assertFalse(r.out().contains("Pattern verification failed"), r.out());
        assertFalse(r.out().toLowerCase().contains("error"), r.out());
        assertEquals((byte) 0xab, driver.memory.get(ValueLayout.JAVA_BYTE, 4095));
        assertEquals((byte) 0xcd, driver.memory.get(ValueLayout.JAVA_BYTE, (5L << 20) - 1));
        assertEquals((byte) 0x5a, driver.memory.get(ValueLayout.JAVA_BYTE, 16L << 20));
    }

    @Test
    void qemuIoSeesDataWrittenDirectlyToTheDevice() throws Exception {
        MemorySegment.copy(new byte[] {0x11, 0x11, 0x11, 0x11}, 0, driver.memory, ValueLayout.JAVA_BYTE, 0, 4);
        driver.memory.asSlice(0, 512).fill((byte) 0x11);
        Result r = run("/usr/bin/qemu-io", "-f", "raw", "-r", uri, "-c", "read -P 0x11 0 512");
        assertEquals(0, r.exit(), r.out());
        assertFalse(r.out().contains("Pattern verification failed"), r.out());
    }

    @Test
    void nbdshOutOfOrderAndErrors() throws Exception {
        String script = String.join("\n",
                "h.connect_uri('" + uri + "')",
                "assert h.get_size() == " + SIZE,
                "assert h.get_structured_replies_negotiated()",
                "buf = b'\\x42' * 65536",
                "cookies = [h.aio_pwrite(buf, i * 65536) for i in range(64)]",
                "while h.aio_in_flight() > 0: h.poll(-1)",
                "assert all(h.aio_command_completed(c) for c in cookies)",
                "assert h.pread(65536, 63 * 65536) == buf",
                "try:",
                "    h.pread(1024, " + (SIZE - 512) + ")",
                "    raise SystemExit('read past the end succeeded')",
                "except nbd.Error as e:",
                "    assert e.errnum == errno.EINVAL, e",
                "try:",
                "    h.pwrite(b'x' * 1024, " + (SIZE - 512) + ")",
                "    raise SystemExit('write past the end succeeded')",
                "except nbd.Error as e:",
                "    assert e.errnum == errno.ENOSPC, e",
                "h.zero(65536, 0, nbd.CMD_FLAG_FAST_ZERO)",
                "assert h.pread(65536, 0) == bytes(65536)",
                "h.shutdown()",
                "print('nbdsh-ok')");
        Path py = dir.resolve("t.py");
        Files.writeString(py, "import errno\n" + script + "\n");
        Result r = run("/usr/bin/nbdsh", "-c", "exec(open('" + py + "').read())");
        assertEquals(0, r.exit(), r.out());
        assertTrue(r.out().contains("nbdsh-ok"), r.out());
    }
}
