package io.pmemblk.uring;

import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import static io.pmemblk.posix.Errno.*;
import static io.pmemblk.uring.IoUringAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** Runs against this machine's kernel: every completion below was produced by io_uring itself. */
class IoUringTest {

    /** One completion, as recorded by a test's handler. */
    record Cqe(long userData, int res, int flags) {}

    private static List<Cqe> reap(IoUring ring, int atLeast) throws NativeException {
        List<Cqe> out = new ArrayList<>();
        while (out.size() < atLeast) {
            if (ring.cq().drain((ud, res, flags) -> out.add(new Cqe(ud, res, flags))) == 0) {
                ring.submitAndWait(atLeast - out.size());
            }
        }
        return out;
    }

    /** A descriptor a test opens on a file, closed with the try block that opened it. */
    record OpenFile(Path path, int fd) implements AutoCloseable {
        static OpenFile open(Path path, int flags) throws NativeException {
            return new OpenFile(path, FileCalls.open(path.toString(), flags, 0));
        }

        /** Writes {@code path} as {@code size} zero bytes, then opens it. */
        static OpenFile create(Path path, int size, int flags) throws IOException {
            Files.write(path, new byte[size]);
            return open(path, flags);
        }

        @Override
        public void close() throws NativeException {
            Libc.close(fd);
        }
    }

    /** Fills the struct iovec array {@code iov} with one entry per buffer, in order. */
    private static void setIovecs(MemorySegment iov, MemorySegment... bufs) {
        for (int i = 0; i < bufs.length; i++) {
            iov.set(JAVA_LONG, i * IOVEC_SIZE + IOVEC_BASE, bufs[i].address());
            iov.set(JAVA_LONG, i * IOVEC_SIZE + IOVEC_LEN, bufs[i].byteSize());
        }
    }

    /** The buffers' bytes one after another, as the file holds what a writev of them wrote. */
    private static byte[] concat(MemorySegment... bufs) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        for (MemorySegment b : bufs) {
            out.writeBytes(b.toArray(JAVA_BYTE));
        }
        return out.toByteArray();
    }

    private static MemorySegment pattern(Arena arena, int size, int seed) {
        MemorySegment s = arena.allocate(size, 4096);
        for (int i = 0; i < size; i++) {
            s.set(JAVA_BYTE, i, (byte) (i * 31 + seed));
        }
        return s;
    }

    @Test
    void nopRoundTripCarriesUserData() throws Exception {
        try (IoUring ring = IoUring.open(8)) {
            assertThat(ring.sq().nop(0xCAFE_BABE_1234L)).isTrue();
            assertThat(ring.submitAndWait(1)).isEqualTo(1);
            List<Cqe> seen = new ArrayList<>();
            assertThat(ring.cq().drain((ud, res, flags) -> seen.add(new Cqe(ud, res, flags)))).isEqualTo(1);
            assertThat(seen).containsExactly(new Cqe(0xCAFE_BABE_1234L, 0, 0));
            assertThat(ring.cq().ready()).isZero();
        }
    }

    /** WRITE, then READ into another buffer, then FSYNC, on a disk-backed temp file and on tmpfs. */
    @ParameterizedTest
    @ValueSource(strings = {"tempdir", "/dev/shm"})
    void writeThenReadThenFsyncMoveTheBytes(String where, @TempDir Path tmp) throws Exception {
        Path dir = where.equals("tempdir") ? tmp : Path.of(where);
        Path file = Files.createTempFile(dir, "uring", ".img");
        try (Arena arena = Arena.ofConfined(); IoUring ring = IoUring.open(8);
             OpenFile f = OpenFile.open(file, FileCalls.O_RDWR)) {
            int fd = f.fd();
            MemorySegment out = pattern(arena, 8192, 7);
            MemorySegment in = arena.allocate(8192, 4096);
            assertThat(ring.sq().write(fd, out, 4096, 1)).isTrue();
            assertThat(ring.submitAndWait(1)).isEqualTo(1);
            assertThat(reap(ring, 1)).containsExactly(new Cqe(1, 8192, 0));
            assertThat(ring.sq().read(fd, in, 4096, 2)).isTrue();
            assertThat(ring.sq().fsync(fd, 0, 3)).isTrue();
            assertThat(ring.submit()).isEqualTo(2); // one enter for both
            assertThat(reap(ring, 2)).containsExactlyInAnyOrder(new Cqe(2, 8192, 0), new Cqe(3, 0, 0));
            assertThat(in.mismatch(out)).isEqualTo(-1);
            byte[] onDisk = Files.readAllBytes(file);
            assertThat(onDisk).hasSize(4096 + 8192);
            assertThat(Arrays.copyOfRange(onDisk, 4096, 4096 + 8192)).isEqualTo(out.toArray(JAVA_BYTE));
        } finally {
            Files.deleteIfExists(file);
        }
    }

    @Test
    void writevThenReadvGatherAndScatter(@TempDir Path dir) throws Exception {
        try (Arena arena = Arena.ofConfined(); IoUring ring = IoUring.open(4);
             OpenFile file = OpenFile.create(dir.resolve("v"), 0, FileCalls.O_RDWR)) {
            int fd = file.fd();
            MemorySegment a = pattern(arena, 512, 1), b = pattern(arena, 1024, 2);
            MemorySegment iov = arena.allocate(2 * IOVEC_SIZE, 8);
            setIovecs(iov, a, b);
            assertThat(ring.sq().writev(fd, iov, 2, 0, 10)).isTrue();
            ring.submitAndWait(1);
            assertThat(reap(ring, 1)).containsExactly(new Cqe(10, 1536, 0));
            byte[] expected = concat(a, b);
            assertThat(Files.readAllBytes(file.path())).isEqualTo(expected);

            MemorySegment c = arena.allocate(1024, 4096), d = arena.allocate(512, 4096);
            setIovecs(iov, c, d);
            assertThat(ring.sq().readv(fd, iov, 2, 0, 11)).isTrue();
            ring.submitAndWait(1);
            assertThat(reap(ring, 1)).containsExactly(new Cqe(11, 1536, 0));
            assertThat(concat(c, d)).as("what readv scattered, gathered again").isEqualTo(expected);
        }
    }

    @Test
    void aFullSqRefusesTheNextSqeUntilSubmitFreesTheSlots() throws Exception {
        try (IoUring ring = IoUring.open(4)) {
            SubmissionQueue sq = ring.sq();
            assertThat(sq.entries()).isEqualTo(4);
            for (int i = 0; i < 4; i++) {
                assertThat(sq.nop(i)).as("slot %d", i).isTrue();
            }
            assertThat(sq.free()).isZero();
            assertThat(sq.nop(99)).as("fifth SQE in a 4-slot SQ").isFalse();
            assertThat(sq.next()).isEqualTo(-1);
            assertThat(sq.pending()).isEqualTo(4);
            assertThat(ring.submit()).isEqualTo(4);
            assertThat(sq.free()).isEqualTo(4);
            assertThat(sq.nop(4)).isTrue();
            assertThat(ring.submit()).isEqualTo(1);
            assertThat(reap(ring, 5)).extracting(Cqe::userData).containsExactlyInAnyOrder(0L, 1L, 2L, 3L, 4L);
        }
    }

    /**
     * 64 NOPs through an 8-slot SQ into a 16-slot CQ, never reaping in between: 48 completions have to wait on the
     * kernel's overflow list (IORING_FEAT_NODROP), and drain must bring every one of them back.
     */
    @Test
    void moreCompletionsThanCqEntriesAreAllReaped() throws Exception {
        try (IoUring ring = IoUring.open(8, 16, 0)) {
            assertThat(ring.features() & IORING_FEAT_NODROP).isNotZero();
            assertThat(ring.cq().entries()).isEqualTo(16);
            int submitted = 0;
            for (int i = 0; i < 64; i++) {
                while (!ring.sq().nop(i)) {
                    submitted += ring.submit();
                }
            }
            submitted += ring.submit();
            assertThat(submitted).isEqualTo(64);
            assertThat(ring.cq().ready()).as("CQEs in the CQ itself").isEqualTo(16);
            Set<Long> seen = new HashSet<>();
            int[] count = {0};
            int reaped = ring.cq().drain((ud, res, flags) -> {
                count[0]++;
                assertThat(res).isZero();
                seen.add(ud);
            });
            assertThat(reaped).isEqualTo(64);
            assertThat(count[0]).isEqualTo(64);
            assertThat(seen).hasSize(64).allMatch(ud -> ud >= 0 && ud < 64);
            assertThat(ring.cq().overflow()).as("dropped CQEs").isZero();
            assertThat(ring.cq().drain((ud, res, flags) -> {})).isZero();
        }
    }

    @Test
    void errorsArriveAsNegativeRes(@TempDir Path dir) throws Exception {
        try (Arena arena = Arena.ofConfined(); IoUring ring = IoUring.open(8)) {
            MemorySegment buf = arena.allocate(4096, 4096);
            try (OpenFile dirFile = OpenFile.open(dir, FileCalls.O_RDONLY);
                 OpenFile shortFile = OpenFile.create(dir.resolve("short"), 100, FileCalls.O_RDONLY)) {
                int dirFd = dirFile.fd();
                int fileFd = shortFile.fd();
                assertThat(ring.sq().read(1 << 20, buf, 0, 1)).isTrue();        // no such fd
                assertThat(ring.sq().read(dirFd, buf, 0, 2)).isTrue();          // a directory
                assertThat(ring.sq().write(fileFd, buf, 0, 3)).isTrue();        // fd opened read-only
                assertThat(ring.sq().readFixed(fileFd, buf, 0, 0, 4)).isTrue(); // no buffers registered
                long sqe = ring.sq().next();                                    // opcode no kernel has
                ring.sq().sqes().set(JAVA_BYTE, sqe + SQE_OPCODE, (byte) 250);
                ring.sq().sqes().set(JAVA_LONG, sqe + SQE_USER_DATA, 5);
                assertThat(ring.sq().read(fileFd, buf, 0, 6)).isTrue();        // short read at EOF: 100 bytes
                assertThat(ring.sq().read(fileFd, buf, 4096, 7)).isTrue();     // beyond EOF: 0
                assertThat(ring.submit()).as("SUBMIT_ALL: bad SQEs do not stop the batch").isEqualTo(7);
                assertThat(reap(ring, 7)).containsExactlyInAnyOrder(
                        new Cqe(1, -EBADF, 0), new Cqe(2, -EISDIR, 0), new Cqe(3, -EBADF, 0),
                        new Cqe(4, -EFAULT, 0), new Cqe(5, -EINVAL, 0), new Cqe(6, 100, 0), new Cqe(7, 0, 0));
            }
        }
    }

    @Test
    void sqe128RingPlacesTheUringCmdFieldsAtTheAbiOffsets(@TempDir Path dir) throws Exception {
        try (Arena arena = Arena.ofConfined(); IoUring ring = IoUring.open(4, 0, IORING_SETUP_SQE128)) {
            SubmissionQueue sq = ring.sq();
            assertThat(sq.sqeSize()).isEqualTo(128);
            assertThat(sq.sqes().byteSize()).isEqualTo(4 * 128);
            try (OpenFile file = OpenFile.create(dir.resolve("f"), 1, FileCalls.O_RDONLY)) {
                int fd = file.fd();
                MemorySegment cmd = pattern(arena, SQE128_CMD_SIZE, 3);
                assertThat(sq.nop(1)).isTrue();                              // slot 0: SQE at 0
                assertThat(sq.uringCmd(fd, 0xC020_7504, cmd, 0x77)).isTrue(); // slot 1: SQE at 128
                MemorySegment s = sq.sqes();
                long at = 128;
                assertThat(s.get(JAVA_BYTE, at)).isEqualTo((byte) 46);
                assertThat(s.get(JAVA_BYTE, at + 1)).isZero();
                assertThat(s.get(JAVA_SHORT, at + 2)).isZero();
                assertThat(s.get(JAVA_INT, at + 4)).isEqualTo(fd);
                assertThat(s.get(JAVA_INT, at + 8)).isEqualTo(0xC020_7504);
                assertThat(s.get(JAVA_INT, at + 12)).as("__pad1").isZero();
                assertThat(s.get(JAVA_LONG, at + 16)).as("addr").isZero();
                assertThat(s.get(JAVA_INT, at + 24)).as("len").isZero();
                assertThat(s.get(JAVA_INT, at + 28)).as("uring_cmd_flags").isZero();
                assertThat(s.get(JAVA_LONG, at + 32)).isEqualTo(0x77);
                assertThat(s.asSlice(at + 48, 80).mismatch(cmd)).isEqualTo(-1);
                assertThat(s.get(JAVA_LONG, 32)).as("the NOP's user_data, untouched").isEqualTo(1);
                // The kernel accepts the SQE and the file says it has no uring_cmd handler.
                assertThat(ring.submit()).isEqualTo(2);
                assertThat(reap(ring, 2)).containsExactlyInAnyOrder(new Cqe(1, 0, 0), new Cqe(0x77, -EOPNOTSUPP, 0));
            }
        }
        try (Arena arena = Arena.ofConfined(); IoUring plain = IoUring.open(4)) {
            assertThatThrownBy(() -> plain.sq().uringCmd(0, 1, arena.allocate(80), 0))
                    .isInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("IORING_SETUP_SQE128");
        }
    }

    @Test
    void registeredFileAndBuffersMoveTheBytesByIndex(@TempDir Path dir) throws Exception {
        try (Arena arena = Arena.ofConfined(); IoUring ring = IoUring.open(8);
             OpenFile file = OpenFile.create(dir.resolve("fixed"), 16384, FileCalls.O_RDWR)) {
            int fd = file.fd();
            MemorySegment out = pattern(arena, 8192, 9);
            MemorySegment in = arena.allocate(8192, 4096);
            ring.registerFiles(-1, fd);           // index 1 (-1: an empty slot)
            ring.registerBuffers(out, in);        // indexes 0, 1
            assertThat(ring.sq().writeFixed(1, out.asSlice(4096, 4096), 8192, 0, 1)).isTrue();
            ring.sq().setLastFlags(IOSQE_FIXED_FILE);
            assertThat(ring.submitAndWait(1)).isEqualTo(1);
            assertThat(reap(ring, 1)).containsExactly(new Cqe(1, 4096, 0));
            assertThat(ring.sq().readFixed(1, in, 4096, 1, 2)).isTrue();
            ring.sq().setLastFlags(IOSQE_FIXED_FILE);
            ring.submitAndWait(1);
            assertThat(reap(ring, 1)).containsExactly(new Cqe(2, 8192, 0));
            assertThat(in.asSlice(4096, 4096).mismatch(out.asSlice(4096, 4096))).isEqualTo(-1);
            assertThat(in.asSlice(0, 4096).mismatch(arena.allocate(4096))).as("file bytes 4096..8191 are zeros").isEqualTo(-1);
            // A buffer outside the registered one it names is refused by the kernel.
            assertThat(ring.sq().readFixed(1, out, 0, 1, 3)).isTrue();
            ring.sq().setLastFlags(IOSQE_FIXED_FILE);
            ring.submitAndWait(1);
            assertThat(reap(ring, 1)).containsExactly(new Cqe(3, -EFAULT, 0));
            ring.unregisterBuffers();
            ring.unregisterFiles();
        }
    }

    /** A slot is reused once the kernel has consumed it; nothing of its previous SQE (flags, buf_index) may remain. */
    @Test
    void aReusedSlotCarriesNothingFromItsPreviousSqe(@TempDir Path dir) throws Exception {
        try (Arena arena = Arena.ofConfined(); IoUring ring = IoUring.open(1);
             OpenFile file = OpenFile.create(dir.resolve("r"), 4096, FileCalls.O_RDONLY)) {
            assertThat(ring.sq().entries()).isEqualTo(1);
            int fd = file.fd();
            MemorySegment buf = arena.allocate(4096, 4096);
            ring.registerFiles(fd);
            ring.registerBuffers(buf);
            assertThat(ring.sq().readFixed(0, buf, 0, 0, 1)).isTrue();
            ring.sq().setLastFlags(IOSQE_FIXED_FILE);
            ring.submitAndWait(1);
            assertThat(reap(ring, 1)).containsExactly(new Cqe(1, 4096, 0));
            // Same slot, a plain READ by real fd: a leftover IOSQE_FIXED_FILE would make fd an index (-EBADF).
            assertThat(ring.sq().read(fd, buf.asSlice(0, 512), 0, 2)).isTrue();
            ring.submitAndWait(1);
            assertThat(reap(ring, 1)).containsExactly(new Cqe(2, 512, 0));
        }
    }

    @Test
    void closeIsIdempotentAndAClosedRingSaysSo() throws Exception {
        IoUring ring = IoUring.open(4);
        SubmissionQueue sq = ring.sq();
        CompletionQueue cq = ring.cq();
        MemorySegment sqes = sq.sqes();
        ring.close();
        ring.close();
        assertThat(ring.isClosed()).isTrue();
        assertThatThrownBy(() -> sq.nop(1)).isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("io_uring (fd " + ring.fd() + ") is closed");
        assertThatThrownBy(ring::submit).isInstanceOf(IllegalStateException.class).hasMessageContaining("closed");
        assertThatThrownBy(() -> cq.drain((ud, res, flags) -> {})).isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("closed");
        assertThatThrownBy(() -> ring.registerFiles(0)).isInstanceOf(IllegalStateException.class);
        // The mappings went with the ring: a view kept from before cannot reach unmapped memory.
        assertThatThrownBy(() -> sqes.get(JAVA_LONG, 0)).isInstanceOf(IllegalStateException.class);
    }

    @Test
    void badSizesAreRefusedWithTheAllowedRange() {
        assertThatThrownBy(() -> IoUring.open(0)).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("1..32768");
        assertThatThrownBy(() -> IoUring.open(8, 4, 0)).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("cqEntries 4");
    }
}
