package io.pmemblk.posix;

import org.assertj.core.api.ThrowableAssert.ThrowingCallable;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.catchThrowableOfType;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/** The one binding helper and Errno, against this machine's kernel and its own errno headers. */
class NativeTest {
    /** {@code <asm-generic/ioctls.h>}: clear / set close-on-exec, an ioctl that takes no argument (0 by value). */
    private static final long FIONCLEX = 0x5450, FIOCLEX = 0x5451;
    /** {@code <asm-generic/ioctls.h>}: a terminal's attributes; a regular file answers ENOTTY. */
    private static final long TCGETS = 0x5401;

    @TempDir
    Path dir;

    /** A call that must fail: its NativeException, or an assertion error saying it did not fail. */
    private static NativeException failure(ThrowingCallable call) {
        NativeException e = catchThrowableOfType(NativeException.class, call);
        assertThat(e).as("the call failed with a NativeException").isNotNull();
        return e;
    }

    @Test
    void aFailedCallCarriesTheErrnoItLeftNamedAndExplained() {
        NativeException e = failure(() -> Libc.close(-1));
        assertThat(e.errno()).isEqualTo(Errno.EBADF);
        assertThat(e).hasMessage("close(fd -1) failed: Bad file descriptor (errno 9, EBADF)");
    }

    @Test
    void eachThreadHasItsOwnCaptureBuffer() throws Exception {
        MemorySegment mine = Native.callState();
        MemorySegment[] other = new MemorySegment[1];
        Thread t = Thread.ofPlatform().start(() -> other[0] = Native.callState());
        t.join(10_000);
        assertThat(t.isAlive()).as("the other thread finished").isFalse();
        assertThat(Native.callState()).as("reused: the per-request calls allocate nothing").isSameAs(mine);
        assertThat(other[0]).as("another thread's errno cannot overwrite this one's").isNotSameAs(mine);
    }

    /**
     * ioctl, bound once as the variadic call it is, in both shapes: by value (FIONCLEX/FIOCLEX change the
     * descriptor's close-on-exec flag, which the kernel shows in /proc/self/fdinfo) and by pointer (FIONREAD of a
     * regular file: the bytes from its position to its end, written through the pointer).
     */
    @Test
    void aVariadicIoctlReachesTheKernelByValueAndByPointer() throws Exception {
        int fd = FileCalls.open(Files.write(dir.resolve("seventeen"), new byte[17]).toString(), FileCalls.O_RDONLY, 0);
        try (Arena arena = Arena.ofConfined()) {
            assertThat(closeOnExec(fd)).as("open adds O_CLOEXEC").isTrue();
            assertThat(Libc.ioctl(fd, FIONCLEX, 0L, "FIONCLEX")).isZero();
            assertThat(closeOnExec(fd)).isFalse();
            assertThat(Libc.ioctl(fd, FIOCLEX, 0L, "FIOCLEX")).isZero();
            assertThat(closeOnExec(fd)).isTrue();
            MemorySegment out = arena.allocate(ValueLayout.JAVA_INT);
            assertThat(Libc.ioctl(fd, Sockets.FIONREAD, out)).isZero();
            assertThat(out.get(ValueLayout.JAVA_INT, 0)).as("bytes left to read").isEqualTo(17);
            NativeException e = failure(() -> Libc.ioctl(fd, TCGETS, 0L, "TCGETS"));
            assertThat(e.errno()).isEqualTo(Errno.ENOTTY);
            assertThat(e).hasMessage("ioctl TCGETS(fd " + fd + ", 0x0) failed: Inappropriate ioctl for device (errno 25, ENOTTY)");
        } finally {
            Libc.close(fd);
        }
    }

    /** Every constant is the kernel's value of its name (the uapi headers of this machine), and named back. */
    @Test
    void everyErrnoIsTheKernelsAndIsNamedBack() throws Exception {
        Map<String, Integer> kernel = kernelErrnos();
        int checked = 0;
        for (Field f : Errno.class.getFields()) {
            if (!Modifier.isStatic(f.getModifiers()) || f.getType() != int.class) {
                continue;
            }
            int value = f.getInt(null);
            assertThat(kernel).as("the kernel's headers define " + f.getName()).containsKey(f.getName());
            assertThat(value).as(f.getName()).isEqualTo(kernel.get(f.getName()));
            assertThat(Errno.name(value)).as("name of " + value)
                    .isEqualTo(f.getName().equals("ENOTSUP") ? "EOPNOTSUPP" : f.getName());
            assertThat(Errno.name(-value)).as("a negated result is named as its errno").isEqualTo(Errno.name(value));
            checked++;
        }
        assertThat(checked).isGreaterThanOrEqualTo(20);
        assertThat(Errno.name(4000)).isEqualTo("errno 4000");
    }

    @Test
    void whatInvokeExactThrowsGoesOnUncheckedOrBecomesAnAssertion() {
        IllegalStateException closed = new IllegalStateException("Already closed");
        assertThatThrownBy(() -> Native.unexpected(closed)).isSameAs(closed);
        InternalError fault = new InternalError("a fault occurred in an unsafe memory access");
        assertThatThrownBy(() -> Native.unexpected(fault)).isSameAs(fault);
        IOException checked = new IOException("impossible from a downcall");
        assertThatThrownBy(() -> Native.unexpected(checked)).isInstanceOf(AssertionError.class).hasCause(checked);
    }

    private static boolean closeOnExec(int fd) throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc/self/fdinfo/" + fd))) {
            if (line.startsWith("flags:")) {
                return (Integer.parseInt(line.substring(6).trim(), 8) & FileCalls.O_CLOEXEC) != 0;
            }
        }
        throw new AssertionError("/proc/self/fdinfo/" + fd + " has no flags line");
    }

    /** {@code #define ENAME number} and {@code #define ENAME ENAME2} of the uapi errno headers. */
    private static Map<String, Integer> kernelErrnos() throws IOException {
        Path base = Path.of("/usr/include/asm-generic/errno-base.h"), more = Path.of("/usr/include/asm-generic/errno.h");
        assumeTrue(Files.exists(base) && Files.exists(more), "needs linux-libc-dev's asm-generic/errno*.h");
        Map<String, String> defines = new HashMap<>();
        Pattern define = Pattern.compile("^#define\\s+(E[A-Z0-9]+)\\s+(\\w+)", Pattern.MULTILINE);
        for (Path p : new Path[] {base, more}) {
            Matcher m = define.matcher(Files.readString(p));
            while (m.find()) {
                defines.put(m.group(1), m.group(2));
            }
        }
        defines.putIfAbsent("ENOTSUP", "EOPNOTSUPP"); // glibc's <bits/errno.h>: Linux has no ENOTSUP of its own
        Map<String, Integer> values = new HashMap<>();
        for (String name : defines.keySet()) {
            String v = defines.get(name);
            while (!v.chars().allMatch(Character::isDigit)) {
                v = defines.get(v);
            }
            values.put(name, Integer.parseInt(v));
        }
        return values;
    }
}
