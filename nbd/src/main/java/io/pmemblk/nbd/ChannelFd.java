package io.pmemblk.nbd;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.nio.channels.SocketChannel;

/**
 * The file descriptor behind a JDK {@link SocketChannel}, for the one socket query the JDK has no API for on
 * Unix-domain channels: how many bytes wait to be read (FIONREAD), that is, whether the next read would block
 * ({@link BusyPoll}). The JDK keeps it in {@code sun.nio.ch.SelChImpl.getFDVal()}, which java.base exports to
 * this module only when the launcher says so ({@code --add-exports java.base/sun.nio.ch=io.pmemblk.nbd}); without
 * it, or for any other channel class (TLS), {@link #of} says -1 and the connection reads without polling.
 */
final class ChannelFd {
    private static final MethodHandle FD_VAL = find();

    private ChannelFd() {}

    private static MethodHandle find() {
        try {
            Class<?> selCh = Class.forName("sun.nio.ch.SelChImpl", false, SocketChannel.class.getClassLoader());
            return MethodHandles.lookup().findVirtual(selCh, "getFDVal", MethodType.methodType(int.class));
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null; // not exported to us: no fd
        }
    }

    /** The channel's fd, or -1 when it cannot be known (not exported, or not a JDK socket channel). */
    static int of(SocketChannel channel) {
        if (FD_VAL == null || !FD_VAL.type().parameterType(0).isInstance(channel)) {
            return -1;
        }
        try {
            return (int) FD_VAL.invoke(channel);
        } catch (Throwable t) {
            return -1;
        }
    }

    /** Whether fds can be known in this JVM at all. */
    static boolean available() {
        return FD_VAL != null;
    }
}
