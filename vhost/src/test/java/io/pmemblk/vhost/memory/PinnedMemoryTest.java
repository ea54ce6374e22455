package io.pmemblk.vhost.memory;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class PinnedMemoryTest {
    @Test
    void releasesRunAtOnceUnlessARingPinsThemAndThenWhenTheLastPinGoes() {
        PinnedMemory p = new PinnedMemory();
        List<String> released = new ArrayList<>();
        p.release(() -> released.add("a"));
        assertThat(released).as("nothing pinned: at once").containsExactly("a");
        p.pin();
        p.pin();
        p.release(() -> released.add("b"));
        p.release(() -> released.add("c"));
        assertThat(released).as("held while two rings may still touch them").containsExactly("a");
        assertThat(p.held()).isEqualTo(2);
        p.unpin();
        assertThat(released).as("one ring is still busy").containsExactly("a");
        p.unpin();
        assertThat(released).as("the last one quiet: all of them, in order").containsExactly("a", "b", "c");
        assertThat(p.held()).isZero();
        assertThat(p.pins()).isZero();
        assertThatThrownBy(p::unpin).isInstanceOf(IllegalStateException.class);
    }
}
