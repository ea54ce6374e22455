package io.pmemblk.vhost.blk;

import org.junit.jupiter.api.Test;

import static org.assertj.core.api.Assertions.assertThat;

/** The session's vring state is one VringAddress, replaced field by field as SET_VRING_NUM, _ADDR and _BASE come. */
class VringAddressTest {
    @Test
    void eachMessageReplacesOnlyItsOwnFields() {
        VringAddress a = VringAddress.unset(3);
        assertThat(a).isEqualTo(new VringAddress(3, 0, 0, 0, 0, 0));

        a = a.withSize(128).withRings(0x1000, 0x2000, 0x3000).withBase(77);
        assertThat(a).isEqualTo(new VringAddress(3, 128, 0x1000, 0x2000, 0x3000, 77));

        // a ring stopped where it was: only its base moves; SET_VRING_NUM again: only its size
        assertThat(a.withBase(5)).isEqualTo(new VringAddress(3, 128, 0x1000, 0x2000, 0x3000, 5));
        assertThat(a.withSize(64)).isEqualTo(new VringAddress(3, 64, 0x1000, 0x2000, 0x3000, 77));
        assertThat(a.withRings(0x4000, 0x5000, 0x6000)).isEqualTo(new VringAddress(3, 128, 0x4000, 0x5000, 0x6000, 77));
    }
}
