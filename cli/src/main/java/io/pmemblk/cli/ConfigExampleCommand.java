package io.pmemblk.cli;

import io.pmemblk.settings.Settings;
import picocli.CommandLine.Command;

import java.util.concurrent.Callable;

@Command(name = "config-example", mixinStandardHelpOptions = true,
        description = "Print a properties file documenting every setting with its default.")
final class ConfigExampleCommand implements Callable<Integer> {
    @Override
    public Integer call() {
        System.out.print(Settings.example());
        return 0;
    }
}
