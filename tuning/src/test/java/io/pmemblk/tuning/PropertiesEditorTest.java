package io.pmemblk.tuning;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

class PropertiesEditorTest {
    @TempDir
    Path dir;

    @Test
    void replacesOnlyTheKeyLineAndKeepsEverythingElse() throws Exception {
        Path f = dir.resolve("p.properties");
        List<String> before = List.of("# my device", "pmem.size=4G", "", "# threshold, tuned later",
                "route.dma.min-bytes = 256K", "queues=2   # two", "route.dma.min-bytes.extra.comment.not=a key");
        Files.write(f, before);
        PropertiesEditor.set(f, "route.dma.min-bytes", "516K", "2026-11-30T04:00Z (throughput)");
        assertThat(Files.readAllLines(f)).containsExactly("# my device", "pmem.size=4G", "", "# threshold, tuned later",
                "# measured by pmemblk tune 2026-11-30T04:00Z (throughput)", "route.dma.min-bytes=516K",
                "queues=2   # two", "route.dma.min-bytes.extra.comment.not=a key");
        // a second run replaces its own comment instead of stacking them
        PropertiesEditor.set(f, "route.dma.min-bytes", "off", "again");
        List<String> after = Files.readAllLines(f);
        assertThat(after).containsExactly("# my device", "pmem.size=4G", "", "# threshold, tuned later",
                "# measured by pmemblk tune again", "route.dma.min-bytes=off",
                "queues=2   # two", "route.dma.min-bytes.extra.comment.not=a key");
    }

    @Test
    void appendsWhenTheKeyIsAbsent() throws Exception {
        Path f = dir.resolve("p.properties");
        Files.write(f, List.of("pmem.size=1G"));
        PropertiesEditor.set(f, "route.dma.min-bytes", "64K", "now");
        assertThat(Files.readAllLines(f)).containsExactly("pmem.size=1G", "", "# measured by pmemblk tune now",
                "route.dma.min-bytes=64K");
    }
}
