package io.pmemblk.cli;

import io.pmemblk.settings.SettingsException;
import org.junit.jupiter.api.Test;
import picocli.CommandLine;

import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class TuneCommandTest {
    @Test
    void takesConfigAndSetFromTheSharedOptions() {
        TuneCommand tune = new TuneCommand();
        new CommandLine(tune).parseArgs("--config", "/etc/pmemblk/fast.properties", "--set", "dma.engine=soft",
                "--set", "queues=2");
        assertThat(tune.settingsOptions.config).isEqualTo(Path.of("/etc/pmemblk/fast.properties"));
        assertThat(tune.settingsOptions.overrides).containsExactly("dma.engine=soft", "queues=2");
    }

    @Test
    void writeWithoutConfigIsRefusedBeforeAnythingIsMeasured() {
        TuneCommand tune = new TuneCommand();
        new CommandLine(tune).parseArgs("--write", "--set", "dma.engine=soft");
        assertThatThrownBy(tune::call).isInstanceOf(SettingsException.class)
                .hasMessageStartingWith("--write needs --config FILE");
    }

    @Test
    void aBadSettingNamesTheKey() {
        TuneCommand tune = new TuneCommand();
        new CommandLine(tune).parseArgs("--set", "dma.engine=warp");
        assertThatThrownBy(tune::call).isInstanceOf(SettingsException.class)
                .hasMessageStartingWith("dma.engine: 'warp' is not allowed");
    }
}
