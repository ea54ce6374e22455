package io.pmemblk.dma.vfio;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;

import java.util.List;
import java.util.function.Consumer;

/**
 * A teardown that goes on past failures: every step runs, in order, and the first failure is thrown at the end.
 * A VFIO object half closed would keep the device or the container busy, so one failed step must not skip the
 * others (unmapping a BAR after an interrupt could not be switched off, closing the fd after a BAR unmap failed).
 */
final class Teardown {
    /** A step that may fail with the C call's error. */
    @FunctionalInterface
    interface Step {
        void run() throws NativeException;
    }

    private RuntimeException first;

    /** Runs one step; its failure is kept if it is the first. */
    void step(Step step) {
        try {
            step.run();
        } catch (NativeException e) {
            keep(new IllegalStateException(e.getMessage(), e));
        } catch (RuntimeException e) {
            keep(e);
        }
    }

    /** Closes each of {@code parts} in their order (pass {@code list.reversed()} for newest first). */
    <T> void each(List<T> parts, Consumer<? super T> close) {
        for (T part : parts) {
            step(() -> close.accept(part));
        }
    }

    /** Closes a file descriptor as the last step. */
    void closeFd(int fd) {
        step(() -> Libc.close(fd));
    }

    /** Throws the first failure, if any. */
    void finish() {
        if (first != null) {
            throw first;
        }
    }

    private void keep(RuntimeException e) {
        if (first == null) {
            first = e;
        }
    }
}
