package io.pmemblk.vhost.testing;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.NativeException;

import java.util.ArrayList;
import java.util.List;

/** The eventfds a test hands a server (kick, call, err), closed together when the test is done with them. */
public final class EventFds implements AutoCloseable {
    private final List<EventFd> open = new ArrayList<>();

    /** A new non-blocking eventfd, as QEMU makes them. */
    public EventFd create() throws NativeException {
        return add(EventFd.create(true));
    }

    /** {@code e}, closed with the others. */
    public EventFd add(EventFd e) {
        open.add(e);
        return e;
    }

    /** Closes every one so far; later ones are kept anew. */
    @Override
    public void close() throws NativeException {
        for (EventFd e : open) {
            e.close();
        }
        open.clear();
    }
}
