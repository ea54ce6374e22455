package io.pmemblk.vhost.blk;

/**
 * Where one split ring lies and the avail index it starts from, as the front-end set them (vhost-user.rst:
 * SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE). Addresses are the front-end's user addresses, which the memory
 * table translates.
 * @param index the vring's index
 * @param size  descriptors in the ring (SET_VRING_NUM); 0 until set
 * @param desc  the descriptor table's address
 * @param avail the avail ring's address
 * @param used  the used ring's address
 * @param base  the next avail index to pop (SET_VRING_BASE, or where the ring stopped)
 */
public record VringAddress(int index, int size, long desc, long avail, long used, int base) {
    /** Nothing set yet: no size, no addresses, base 0. */
    public static VringAddress unset(int index) {
        return new VringAddress(index, 0, 0, 0, 0, 0);
    }

    public VringAddress withSize(int size) {
        return new VringAddress(index, size, desc, avail, used, base);
    }

    public VringAddress withRings(long desc, long avail, long used) {
        return new VringAddress(index, size, desc, avail, used, base);
    }

    public VringAddress withBase(int base) {
        return new VringAddress(index, size, desc, avail, used, base);
    }
}
