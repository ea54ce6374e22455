package io.pmemblk.dma.testing;

import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Faults on cue for a {@link SoftIoatDevice}: the nth descriptor from now fails, every nth fails, the nth breaks
 * the channel for good, the engine stalls, the channel halts now. Test code only; the served device has none.
 * {@link #attach} it to the device it was given to, so a change wakes the engine.
 */
public final class InjectedFaults implements SoftFaults {
    private static final int MAX_CHANNELS = 256;

    private final Channel[] channels = new Channel[MAX_CHANNELS];
    private volatile SoftIoatDevice device;

    public InjectedFaults() {
        for (int i = 0; i < MAX_CHANNELS; i++) {
            channels[i] = new Channel();
        }
    }

    /** One channel's faults; the countdown fields are read and written by its engine under {@link #lock}. */
    private static final class Channel {
        final ReentrantLock lock = new ReentrantLock();
        int countdown;
        int period;
        int bit;
        boolean breaks;
        volatile boolean broken;
        volatile boolean stalled;
        volatile int haltBit;
    }

    /** The device these faults were given to: its engines are woken when a fault changes. */
    public InjectedFaults attach(SoftIoatDevice device) {
        this.device = device;
        return this;
    }

    /** The {@code nth} descriptor the channel processes from now (1 = the next one) halts with {@code chanerrBit}. */
    public void failDescriptor(int channel, int nth, int chanerrBit) {
        arm(channel, requireNth(nth), 0, chanerrBit, false);
    }

    /** Channel 0 shorthand of {@link #failDescriptor(int, int, int)}. */
    public void failDescriptor(int nth, int chanerrBit) {
        failDescriptor(0, nth, chanerrBit);
    }

    /** Every {@code period}-th descriptor the channel processes from now halts with {@code chanerrBit} (0 stops it). */
    public void failEvery(int channel, int period, int chanerrBit) {
        if (period < 0) {
            throw new IllegalArgumentException("period must be >= 0, got " + period);
        }
        arm(channel, period, period, chanerrBit, false);
    }

    /**
     * The {@code nth} descriptor from now halts the channel with {@code chanerrBit}, and the channel is broken for
     * good: it never arms again, so a driver's recovery times out and the channel stays unusable.
     */
    public void breakAfter(int channel, int nth, int chanerrBit) {
        arm(channel, requireNth(nth), 0, chanerrBit, true);
    }

    /** Whether the channel was broken by {@link #breakAfter}. */
    public boolean isBroken(int channel) {
        return channels[channel].broken;
    }

    /** While stalled the engine processes nothing (doorbells are remembered); releasing resumes it. */
    public void stall(int channel, boolean stalled) {
        channels[channel].stalled = stalled;
        wake(channel);
    }

    /** Stalls or releases every channel of the attached device. */
    public void stall(boolean stalled) {
        for (int i = 0; i < attached().channelCount(); i++) {
            stall(i, stalled);
        }
    }

    /**
     * Halts the channel with {@code chanerrBit} as soon as its engine has nothing to run (at once when idle or
     * stalled), as a device-detected error between descriptors would.
     */
    public void halt(int channel, int chanerrBit) {
        channels[channel].haltBit = chanerrBit;
        wake(channel);
    }

    /** Channel 0 shorthand of {@link #halt(int, int)}. */
    public void halt(int chanerrBit) {
        halt(0, chanerrBit);
    }

    private static int requireNth(int nth) {
        if (nth < 1) {
            throw new IllegalArgumentException("nth counts from 1 (the next descriptor), got " + nth);
        }
        return nth;
    }

    private void arm(int channel, int countdown, int period, int chanerrBit, boolean breaks) {
        Channel c = channels[channel];
        c.lock.lock();
        try {
            c.countdown = countdown;
            c.period = period;
            c.bit = chanerrBit;
            c.breaks = breaks;
        } finally {
            c.lock.unlock();
        }
    }

    private SoftIoatDevice attached() {
        SoftIoatDevice d = device;
        if (d == null) {
            throw new IllegalStateException("attach(device) first: the faults need to wake its engines");
        }
        return d;
    }

    private void wake(int channel) {
        SoftIoatDevice d = device;
        if (d != null) {
            d.wake(channel);
        }
    }

    @Override
    public boolean stalled(int channel) {
        return channels[channel].stalled;
    }

    @Override
    public int failDescriptor(int channel) {
        Channel c = channels[channel];
        c.lock.lock();
        try {
            if (c.countdown > 0 && --c.countdown == 0) {
                c.countdown = c.period;
                c.broken |= c.breaks;
                return c.bit;
            }
            return 0;
        } finally {
            c.lock.unlock();
        }
    }

    @Override
    public int haltNow(int channel) {
        Channel c = channels[channel];
        int bit = c.haltBit;
        if (bit != 0) {
            c.haltBit = 0;
        }
        return bit;
    }

    @Override
    public boolean broken(int channel) {
        return channels[channel].broken;
    }
}
