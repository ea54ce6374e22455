package io.pmemblk.vhost.virtq;

/**
 * Device-independent virtio feature bits (torvalds/linux {@code include/uapi/linux/virtio_config.h},
 * {@code virtio_ring.h}; virtio 1.2 section 6), and vhost-user's own bit 30.
 */
public final class VirtioFeatures {
    private VirtioFeatures() {}

    public static final int NOTIFY_ON_EMPTY = 24;
    public static final int ANY_LAYOUT = 27;
    public static final int RING_INDIRECT_DESC = 28;
    public static final int RING_EVENT_IDX = 29;
    /** {@code VHOST_USER_F_PROTOCOL_FEATURES} (docs/interop/vhost-user.rst), not a virtio bit. */
    public static final int VHOST_USER_PROTOCOL_FEATURES = 30;
    public static final int VERSION_1 = 32;
    public static final int ACCESS_PLATFORM = 33;
    public static final int RING_PACKED = 34;

    public static long bit(int b) {
        return 1L << b;
    }
}
