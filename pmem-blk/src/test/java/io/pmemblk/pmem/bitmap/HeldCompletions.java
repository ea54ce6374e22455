package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.ForwardingBlockDriver;
import io.pmemblk.queueing.Request;

import java.util.ArrayList;
import java.util.List;
import java.util.function.Predicate;

/**
 * A test device over the real one: the requests {@code hold} picks are executed (their data lands) but their
 * completions are kept until {@link #release}: a device slow, or stuck, to complete them. Writes are received in
 * place as the real one receives them; everything else is the device's, passed through.
 */
final class HeldCompletions extends ForwardingBlockDriver {
    private final Predicate<Request> hold;
    private final List<Runnable> held = new ArrayList<>();

    HeldCompletions(BlockDriver device, Predicate<Request> hold) {
        super(device);
        this.hold = hold;
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            if (hold.test(r)) {
                Request.Completion up = r.completion;
                r.completion = req -> {
                    synchronized (held) {
                        held.add(() -> up.completed(req));
                    }
                };
            }
        }
        device.queueRequests(hwq, batch, count);
    }

    /** Completions held so far. */
    int held() {
        synchronized (held) {
            return held.size();
        }
    }

    /** Runs the held completions. */
    void release() {
        List<Runnable> l;
        synchronized (held) {
            l = new ArrayList<>(held);
            held.clear();
        }
        l.forEach(Runnable::run);
    }

}
