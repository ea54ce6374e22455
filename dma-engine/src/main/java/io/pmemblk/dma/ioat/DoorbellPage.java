package io.pmemblk.dma.ioat;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/**
 * The doorbell page: pmemblk's own extension of the I/OAT register file for a device that is a process of its own
 * ({@code pmemblk dma-device}, BAR2), written once here for both sides. Real I/OAT hardware has no such page;
 * Linux's ioatdma never looks at BAR2 and rings DMACOUNT, which keeps its meaning.
 *
 * <p>Why: over vfio-user a DMACOUNT write is a message on the device's socket, a sendmsg here and a wake-up of the
 * device's loop there, for every batch a driver submits. A device that is a process can instead watch memory both
 * sides map, as NVMe's shadow doorbells do for an emulated controller (Doorbell Buffer Config, NVMe 1.3, with its
 * EventIdx) and virtio's event index does for a ring: the driver stores the count in the page, and the device,
 * whose engine looks there before every descriptor it fetches and before it sleeps, takes it without a message.
 * Only a device that has gone to sleep needs the register written, and it says so in the page.
 *
 * <p>Layout (little-endian, 4 KiB, one page): at 0 {@link #MAGIC}, at 4 {@link #VERSION}, at 8 the number of
 * channels; channel n's pair at {@link #channel}(n), a cache line each so that two channels' engines do not share
 * one:
 * <ul>
 *   <li>+0 u32 DOORBELL, written by the driver: {@link #VALID} | the DMACOUNT value (bits 15:0). Once it holds
 *       {@link #VALID} it is the channel's DMACOUNT, and a write of the DMACOUNT register only wakes the engine; the
 *       device clears it on the channel's RESET (and a device reset), so that a driver that rings only the register
 *       after a reset (ioatdma, or this one re-arming) is read as before.</li>
 *   <li>+4 u32 SLEEP, written by the device: bit 0 set from just before its engine sleeps until it is woken (cleared
 *       by a DMACOUNT register write before the engine runs, so that the driver rings in the page alone while the
 *       wake-up is on its way), bits 31:1 counting the engine's sleeps. The driver stores DOORBELL, fences, then reads
 *       SLEEP, and writes the DMACOUNT register only when bit 0 is set and it has not written the register in that
 *       very sleep already (a register write over a socket reaches the device when its loop gets a CPU, which on a
 *       busy host can be after the driver's next doorbells). The engine stores SLEEP, fences, then reads DOORBELL
 *       before it sleeps: one of the two sees the other's store (the order both sides' full fences give), so no
 *       doorbell is left unseen by a sleeping engine, and a sleep the driver has rung the register for ends.</li>
 * </ul>
 */
public final class DoorbellPage {
    private DoorbellPage() {}

    public static final long SIZE = 4096;
    /** "PMDB", little-endian. */
    public static final int MAGIC = 0x4244_4d50;
    public static final int VERSION = 1;
    public static final long MAGIC_OFFSET = 0, VERSION_OFFSET = 4, CHANNELS_OFFSET = 8;
    /** Marks DOORBELL as holding a count (a page a driver never wrote holds 0). */
    public static final int VALID = 1 << 31;
    public static final long DOORBELL = 0, SLEEP = 4;
    private static final long FIRST_CHANNEL = 64, CHANNEL_STRIDE = 64;
    /** The most channels the page holds. */
    public static final int MAX_CHANNELS = (int) ((SIZE - FIRST_CHANNEL) / CHANNEL_STRIDE);

    private static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final VarHandle WORD = U32.varHandle();

    /** Where channel {@code n}'s DOORBELL is; its SLEEP word at + {@link #SLEEP}. */
    public static long channel(int n) {
        if (n < 0 || n >= MAX_CHANNELS) {
            throw new IllegalArgumentException("channel " + n + " not in 0.." + (MAX_CHANNELS - 1));
        }
        return FIRST_CHANNEL + CHANNEL_STRIDE * n;
    }

    /** The device's side: a new page for {@code channels} channels (zeroed, then the header). */
    public static void format(MemorySegment page, int channels) {
        channel(channels - 1);
        page.asSlice(0, SIZE).fill((byte) 0);
        writeHeader(page, channels);
    }

    /**
     * The device's side: the header again, as at {@link #format}, leaving the channels' words alone (a reset, after
     * a client that may have written over it: the page is mapped writable by every client, a guest's included).
     */
    public static void writeHeader(MemorySegment page, int channels) {
        page.set(U32, VERSION_OFFSET, VERSION);
        page.set(U32, CHANNELS_OFFSET, channels);
        WORD.setVolatile(page, MAGIC_OFFSET, MAGIC); // last: a page whose magic reads right is whole
    }

    /** Why {@code page} is not a doorbell page for {@code channel}, or null when it is. */
    public static String refusal(MemorySegment page, int channel) {
        if (page.byteSize() < SIZE) {
            return "it is " + page.byteSize() + " bytes, not " + SIZE;
        }
        int magic = (int) WORD.getVolatile(page, MAGIC_OFFSET);
        int version = page.get(U32, VERSION_OFFSET);
        int channels = page.get(U32, CHANNELS_OFFSET);
        if (magic != MAGIC || version != VERSION) {
            return "magic 0x" + Integer.toHexString(magic) + " version " + version + ", not 0x"
                    + Integer.toHexString(MAGIC) + " version " + VERSION;
        }
        if (channel >= channels || channels > MAX_CHANNELS) {
            return "it holds " + channels + " channel(s), not channel " + channel;
        }
        return null;
    }

    public static int doorbell(MemorySegment page, int channel) {
        return (int) WORD.getVolatile(page, channel(channel) + DOORBELL);
    }

    public static void doorbell(MemorySegment page, int channel, int value) {
        WORD.setVolatile(page, channel(channel) + DOORBELL, value);
    }

    /** The channel's SLEEP word (for {@link #asleep(int)}, and to tell one sleep from the next). */
    public static int sleepWord(MemorySegment page, int channel) {
        return (int) WORD.getVolatile(page, channel(channel) + SLEEP);
    }

    public static boolean asleep(int sleepWord) {
        return (sleepWord & 1) != 0;
    }

    public static boolean asleep(MemorySegment page, int channel) {
        return asleep(sleepWord(page, channel));
    }

    /** The device's side: the engine is about to sleep, a sleep of its own (the count goes up). */
    public static void sleeping(MemorySegment page, int channel) {
        long at = channel(channel) + SLEEP;
        int w;
        do {
            w = (int) WORD.getVolatile(page, at);
        } while (!WORD.compareAndSet(page, at, w, (((w >>> 1) + 1) << 1) | 1));
    }

    /** The device's side: the engine is awake, or its wake-up on the way (a compare-and-set: two threads write it). */
    public static void awake(MemorySegment page, int channel) {
        long at = channel(channel) + SLEEP;
        int w;
        do {
            w = (int) WORD.getVolatile(page, at);
            if ((w & 1) == 0) {
                return;
            }
        } while (!WORD.compareAndSet(page, at, w, w & ~1));
    }
}
