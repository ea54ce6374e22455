package io.pmemblk.cli;

import io.pmemblk.settings.ExampleFile;
import io.pmemblk.settings.SettingsException;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;

@Command(name = "config-example", mixinStandardHelpOptions = true,
        description = "Print a properties file documenting every setting with its default; with --set, a file to install:"
                + " those keys set, every other one commented out at its default.")
final class ConfigExampleCommand implements Callable<Integer> {
    @Option(names = "--set", paramLabel = "KEY=VALUE", description = "A key to set in the file (repeatable).")
    List<String> sets = List.of();

    @Override
    public Integer call() throws SettingsException {
        Map<String, String> values = new LinkedHashMap<>();
        for (String s : sets) {
            int eq = s.indexOf('=');
            if (eq <= 0) {
                throw new SettingsException("--set " + s + ": expected key=value, e.g. --set pmem.path=/var/lib/pmemblk/a.img");
            }
            values.put(s.substring(0, eq).trim(), s.substring(eq + 1));
        }
        System.out.print(ExampleFile.example(values));
        return 0;
    }
}
