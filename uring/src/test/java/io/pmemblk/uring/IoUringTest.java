package io.pmemblk.uring;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

class IoUringTest {
    @Test
    void nopRoundTripCarriesUserData() throws Exception {
        try (IoUring ring = IoUring.open(8)) {
            assertThat(ring.sq().nop(0xCAFE_BABE_1234L)).isTrue();
            assertThat(ring.submitAndWait(1)).isEqualTo(1);
            List<long[]> seen = new ArrayList<>();
            assertThat(ring.cq().drain((ud, res, flags) -> seen.add(new long[] {ud, res}))).isEqualTo(1);
            assertThat(seen).singleElement().satisfies(c -> {
                assertThat(c[0]).isEqualTo(0xCAFE_BABE_1234L);
                assertThat(c[1]).isZero();
            });
        }
    }
}
