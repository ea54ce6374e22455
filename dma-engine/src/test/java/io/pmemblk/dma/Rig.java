package io.pmemblk.dma;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.testing.InjectedFaults;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/** A soft engine with a registered source and destination buffer and a recording listener. */
public final class Rig implements AutoCloseable {
    public final IovaSpace space = new IovaSpace();
    public final Arena arena = Arena.ofShared();
    public final MemorySegment src;
    public final MemorySegment dst;
    public final long srcIova;
    public final long dstIova;
    public final DmaEngine engine;
    public final SoftIoatDevice device;
    /** Faults on cue in {@link #device}. */
    public final InjectedFaults faults = new InjectedFaults();
    public final DmaChannel ch;
    public final Recorder rec = new Recorder();

    public Rig(int channels, int ringSize, int xfercap, long bufferBytes) {
        src = arena.allocate(bufferBytes, 4096);
        dst = arena.allocate(bufferBytes, 4096);
        for (long i = 0; i < bufferBytes; i++) {
            src.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 31 + (i >>> 8) * 7 + 1));
        }
        srcIova = space.map(src);
        dstIova = space.map(dst);
        engine = DmaEngine.soft(space, channels, ringSize, xfercap, faults);
        engine.onCompletion(rec);
        device = engine.softDevice().orElseThrow();
        faults.attach(device);
        ch = engine.channel(0);
    }

    /** Places one copy, ringing the doorbell and waiting for room (bounded) when the ring is full. */
    public void placeWaiting(DmaChannel c, long srcOff, long dstOff, long len, Object ctx) {
        while (!c.place(srcIova + srcOff, dstIova + dstOff, len, ctx)) {
            c.submit();
            int need = c.slotsFor(len);
            rec.awaitCondition(() -> c.freeSlots() >= need, () -> need + " free slots on channel " + c.index() + ", have " + c.freeSlots());
        }
    }

    /**
     * One copy on {@link #ch} by IOVA, alone: places it (the ring must have room), rings the doorbell and waits for
     * its completion, the next one reported. Returns its status (null: the completion reported was another's).
     */
    public Integer copyAlone(long fromIova, long toIova, long len, Object ctx) {
        int before = rec.count();
        assertThat(ch.place(fromIova, toIova, len, ctx)).as("room in the ring for %s", ctx).isTrue();
        ch.submit();
        rec.awaitCount(before + 1);
        return rec.status(ctx);
    }

    /** Index of the first byte where dst differs from src over the range, or -1. */
    public long mismatch(long srcOff, long dstOff, long len) {
        return MemorySegment.mismatch(src, srcOff, srcOff + len, dst, dstOff, dstOff + len);
    }

    @Override
    public void close() {
        engine.close();
        arena.close();
    }
}
