package io.pmemblk.cli;

import io.pmemblk.pmem.Libpmem;
import picocli.CommandLine.Command;

import java.util.concurrent.Callable;

@Command(name = "version", mixinStandardHelpOptions = true, description = "Print the version and what native libraries load.")
final class VersionCommand implements Callable<Integer> {
    @Override
    public Integer call() {
        System.out.println("pmemblk " + Main.version());
        System.out.println("java " + Runtime.version());
        String why = Libpmem.unavailableReason();
        System.out.println("libpmem " + (why == null ? "loaded (" + Libpmem.SONAME + ")" : "unavailable: " + why));
        return 0;
    }
}
