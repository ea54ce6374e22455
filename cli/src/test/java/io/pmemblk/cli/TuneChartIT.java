package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import javax.imageio.ImageIO;
import java.awt.image.BufferedImage;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The real {@code pmemblk tune} (a short sweep on the soft engine): --write says a reload applies it, --chart draws it. */
class TuneChartIT {
    @TempDir
    Path dir;

    @Test
    void writeThenReloadHintAndAChartOfTheSweep() throws Exception {
        Path config = dir.resolve("t.properties");
        Files.writeString(config, "pmem.path=" + dir.resolve("p.img") + "\ndma.engine=soft\n");
        Path png = dir.resolve("tune.png");
        ServerProcess.Run r = ServerProcess.run(ServerProcess.command("tune", List.of("--config", config.toString(),
                "--write", "--chart", png.toString(), "--seconds", "1", "--repeats", "1", "--scratch-size", "64M",
                "--sizes", "64K,1M")), 300);
        assertThat(r.exit()).as(r.out()).isZero();
        assertThat(r.out()).contains("wrote route.dma.min-bytes=", "wrote route.dma.min-segments=")
                .contains("path: buffers <-> mapping on both routes")
                .containsPattern("(?m)^1M +8 +write ") // the segment dimension at the largest size, 8 pool chunks
                .contains("No restart needed: a running 'pmemblk serve --config " + config + "' applies it on reload: kill -HUP")
                .contains("chart: " + png);
        BufferedImage image = ImageIO.read(png.toFile());
        assertThat(image.getWidth()).isEqualTo(1600);
        assertThat(image.getHeight()).isEqualTo(1000);
        assertThat(Files.readString(config)).containsPattern("(?m)^route\\.dma\\.min-bytes=")
                .containsPattern("(?m)^route\\.dma\\.min-segments=");
    }

    /** One through the real command (exit 2, before any measuring); the other cases on the check itself. */
    @Test
    void aChartThatCouldNotBeWrittenIsRefusedBeforeMeasuring() throws Exception {
        ServerProcess.Run r = ServerProcess.run(ServerProcess.command("tune", List.of("--set", "dma.engine=soft",
                "--set", "pmem.path=" + dir.resolve("p.img"), "--chart", dir.resolve("no/such/dir/t.png").toString())), 60);
        assertThat(r.exit()).as(r.out()).isEqualTo(2);
        assertThat(r.out().trim()).isEqualTo("pmemblk: --chart " + dir.resolve("no/such/dir/t.png") + ": directory "
                + dir.resolve("no/such/dir") + " does not exist or is not writable; allowed: a .png file in a writable directory");
        try (var files = Files.list(dir)) {
            assertThat(files).as("nothing was measured, no scratch file made").isEmpty();
        }
        for (Path bad : new Path[]{dir.resolve("t.jpg"), dir}) {
            assertThatThrownBy(() -> TuneCommand.checkChartPath(bad)).as("%s", bad)
                    .isInstanceOf(io.pmemblk.settings.SettingsException.class)
                    .hasMessageStartingWith("--chart " + bad + ": ").hasMessageContaining("allowed: a");
        }
    }

    @Test
    void sizesAreCheckedAndSorted() throws Exception {
        assertThat(TuneCommand.sizes(List.of("1M", "64K"))).containsExactly(64 << 10, 1 << 20);
        assertThat(TuneCommand.sizes(null)).containsExactly(io.pmemblk.tuning.Autotuner.Options.DEFAULT_SIZES);
        for (List<String> bad : List.of(List.of("64K"), List.of("64K", "3K"), List.of("64K", "64M"), List.of("64K", "x"))) {
            assertThatThrownBy(() -> TuneCommand.sizes(bad)).as("%s", bad)
                    .isInstanceOf(io.pmemblk.settings.SettingsException.class).hasMessageStartingWith("--sizes: ")
                    .hasMessageContaining("allowed: ");
        }
    }

    @Test
    void theReloadHintNamesTheUnitForAFileInEtcPmemblk() {
        assertThat(TuneCommand.reloadHint(Path.of("/etc/pmemblk/fast.properties")))
                .isEqualTo("No restart needed: a running pmemblk@fast applies it on reload: systemctl reload pmemblk@fast");
    }
}
