package io.pmemblk.dma;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/**
 * {@link Mmio} over a mapped memory segment: a VFIO BAR0 mmap on hardware, or plain memory in tests.
 * Every access is a volatile VarHandle access of its exact width, which on x86 compiles to a single MOV
 * (plus a fence after stores), matching the kernel's readl/writel ordering.
 */
public final class SegmentMmio implements Mmio {
    private static final VarHandle U8 = ValueLayout.JAVA_BYTE.varHandle();
    private static final VarHandle U16 = ValueLayout.JAVA_SHORT.withOrder(ByteOrder.LITTLE_ENDIAN).varHandle();
    private static final VarHandle U32 = ValueLayout.JAVA_INT.withOrder(ByteOrder.LITTLE_ENDIAN).varHandle();
    private static final VarHandle U64 = ValueLayout.JAVA_LONG.withOrder(ByteOrder.LITTLE_ENDIAN).varHandle();

    private final MemorySegment window;

    /** A view over {@code window}; the caller that mapped it owns its lifetime. */
    public SegmentMmio(MemorySegment window) {
        this.window = window;
    }

    @Override public int read8(long offset) { return Byte.toUnsignedInt((byte) U8.getVolatile(window, offset)); }
    @Override public int read16(long offset) { return Short.toUnsignedInt((short) U16.getVolatile(window, offset)); }
    @Override public int read32(long offset) { return (int) U32.getVolatile(window, offset); }
    @Override public long read64(long offset) { return (long) U64.getVolatile(window, offset); }
    @Override public void write8(long offset, int value) { U8.setVolatile(window, offset, (byte) value); }
    @Override public void write16(long offset, int value) { U16.setVolatile(window, offset, (short) value); }
    @Override public void write32(long offset, int value) { U32.setVolatile(window, offset, value); }
    @Override public void write64(long offset, long value) { U64.setVolatile(window, offset, value); }
}
