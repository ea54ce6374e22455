package io.pmemblk.vhost.spec;

import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;

/**
 * virtio's field types: little-endian once VERSION_1 is negotiated (virtio 1.2 section 1.4, {@code le16} ..
 * {@code le64}). Aligned where the layout guarantees it and a torn read would matter (the ring indices); unaligned
 * where the guest or the front-end chooses the address (descriptor tables, indirect tables, the inflight region).
 */
public final class Le {
    private Le() {}

    public static final ValueLayout.OfShort U16 = ValueLayout.JAVA_SHORT.withOrder(ByteOrder.LITTLE_ENDIAN);
    public static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT.withOrder(ByteOrder.LITTLE_ENDIAN);
    public static final ValueLayout.OfShort U16_UNALIGNED = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    public static final ValueLayout.OfInt U32_UNALIGNED = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    public static final ValueLayout.OfLong U64_UNALIGNED = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
}
