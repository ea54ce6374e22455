package io.pmemblk.cli;

import io.pmemblk.settings.Settings;
import io.pmemblk.settings.SettingsException;
import picocli.CommandLine.Option;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/** {@code --config FILE} and {@code --set key=value}, shared by every command that opens the device. */
final class SettingsOptions {
    @Option(names = "--config", paramLabel = "FILE",
            description = "Properties file (see pmemblk.properties.example). Built-in defaults without it.")
    Path config;

    @Option(names = "--set", paramLabel = "KEY=VALUE",
            description = "Override one setting; repeatable, applied after --config.")
    List<String> overrides = new ArrayList<>();

    Settings load() throws SettingsException {
        return Settings.load(config, overrides);
    }
}
