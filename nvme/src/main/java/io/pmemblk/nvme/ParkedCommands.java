package io.pmemblk.nvme;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * The I/O commands of one queue that found no tag while the queue still had to read data from its socket (a write
 * holding a tag waits for H2CData behind them): kept in arrival order, each its SQE and its in-capsule data, until a
 * tag frees. A ring as deep as the host's submission queue: a host never has more commands outstanding than its
 * queue holds, so the ring cannot overflow unless the host breaks the queue's size, and then the queue is closed.
 *
 * <p>SQE copies are made when the queue connects. In-capsule data places are allocated the first time an entry
 * holds data and reused after: a queue that never runs out of tags allocates none, and at most the queue's depth
 * times the in-capsule size ever.
 */
final class ParkedCommands {
    private final ByteBuffer[] sqes;
    private final ByteBuffer[] data;
    private final int dataCapacity;
    private int head;
    private int count;

    ParkedCommands(int entries, int dataCapacity) {
        this.sqes = new ByteBuffer[entries];
        this.data = new ByteBuffer[entries];
        this.dataCapacity = dataCapacity;
        for (int i = 0; i < entries; i++) {
            sqes[i] = ByteBuffer.allocate(Nvme.SQE_SIZE).order(ByteOrder.LITTLE_ENDIAN);
        }
    }

    boolean isEmpty() {
        return count == 0;
    }

    boolean full() {
        return count == sqes.length;
    }

    int size() {
        return count;
    }

    int capacity() {
        return sqes.length;
    }

    /** Appends a copy of {@code sqe}; the caller checked {@link #full()}. */
    void add(ByteBuffer sqe) {
        int at = (head + count) % sqes.length;
        sqes[at].put(0, sqe, 0, Nvme.SQE_SIZE);
        ByteBuffer d = data[at];
        if (d != null) {
            d.clear().limit(0); // no data unless the caller reads some into lastData()
        }
        count++;
    }

    /** The last added entry's data place, cleared for {@code length} bytes (position 0, limit length). */
    ByteBuffer lastData(int length) {
        int at = (head + count - 1) % sqes.length;
        ByteBuffer d = data[at];
        if (d == null) {
            d = data[at] = ByteBuffer.allocate(dataCapacity).order(ByteOrder.LITTLE_ENDIAN);
        }
        d.clear().limit(length);
        return d;
    }

    /** Drops the last added entry (its data failed its digest: it was answered instead). */
    void dropLast() {
        count--;
    }

    ByteBuffer headSqe() {
        return sqes[head];
    }

    /** The oldest entry's data (position 0, limit its length), or null when it carried none. */
    ByteBuffer headData() {
        ByteBuffer d = data[head];
        return d == null || d.limit() == 0 ? null : d.position(0);
    }

    void pop() {
        head = (head + 1) % sqes.length;
        count--;
    }
}
