package io.pmemblk.pmem;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** A window size outside what a view can hold, or below a page, is refused by name with what is allowed. */
class DeviceViewsTest {
    @Test
    void aWindowBelowAPageOrAboveOneGibibyteIsRefused() {
        MemorySegment memory = Arena.ofAuto().allocate(1 << 20);
        assertThatThrownBy(() -> new DeviceViews(memory, 11)).isInstanceOf(IllegalArgumentException.class)
                .hasMessage("window shift 11; allowed: 12 (4 KiB windows) to 30 (1 GiB)");
        assertThatThrownBy(() -> new DeviceViews(memory, 31)).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("window shift 31");
    }
}
