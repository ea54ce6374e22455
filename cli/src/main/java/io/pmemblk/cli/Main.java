package io.pmemblk.cli;

import io.pmemblk.settings.SettingsException;
import picocli.CommandLine;
import picocli.CommandLine.Command;

/** The {@code pmemblk} command. */
@Command(name = "pmemblk", mixinStandardHelpOptions = true, versionProvider = Main.Version.class,
        description = "A userspace persistent-memory block device, served over NBD and ublk.",
        footerHeading = "%nFiles and signals:%n",
        footer = {
                "  /etc/pmemblk/NAME.properties  the settings of systemd's pmemblk@NAME",
                "  SIGTERM, SIGINT   serve stops: requests answered, data persisted, exit 0",
                "  SIGHUP            serve re-reads --config (systemctl reload does this) and",
                "                    applies route.dma.min-bytes, route.dma.min-segments,",
                "                    route.dma.bounce, nbd.stall-timeout and log.level",
                "                    without a restart",
                "Exit status: 0 done, 1 failed, 2 a bad setting or bad usage, 3 serve stopped but",
                "a write-back had failed: data NOT persisted (see the log)."},
        subcommands = {ServeCommand.class, InfoCommand.class, FormatCommand.class, BenchCommand.class, TuneCommand.class, VersionCommand.class, ConfigExampleCommand.class, DmaCommand.class, DmaDeviceCommand.class, BitmapCommand.class,
                CommandLine.HelpCommand.class})
public final class Main {
    /** Exit code for a bad setting or bad command-line usage. */
    public static final int USAGE = 2;

    public static void main(String[] args) {
        // One line per log record on stderr (the JDK's default takes two), before any logger exists.
        if (System.getProperty("java.util.logging.SimpleFormatter.format") == null) {
            System.setProperty("java.util.logging.SimpleFormatter.format", "%1$tF %1$tT %4$s %3$s: %5$s%6$s%n");
        }
        // tune --chart draws off screen: no display is wanted, even where one exists
        if (System.getProperty("java.awt.headless") == null) {
            System.setProperty("java.awt.headless", "true");
        }
        CommandLine cl = new CommandLine(new Main());
        // A bad setting or option value: one line naming it, exit 2 (picocli's own usage errors exit 2 too).
        cl.setExecutionExceptionHandler((e, cmd, parsed) -> {
            cmd.getErr().println("pmemblk: " + e.getMessage());
            return e instanceof SettingsException ? USAGE : 1;
        });
        System.exit(cl.execute(args));
    }

    /** The module's version (the build writes the project version into module-info), or the jar's, or "dev". */
    static String version() {
        return Main.class.getModule().getDescriptor() != null
                ? Main.class.getModule().getDescriptor().rawVersion().orElse("dev")
                : java.util.Objects.requireNonNullElse(Main.class.getPackage().getImplementationVersion(), "dev");
    }

    static final class Version implements CommandLine.IVersionProvider {
        @Override
        public String[] getVersion() {
            return new String[]{"pmemblk " + version() + " (Java " + Runtime.version() + ")"};
        }
    }
}
