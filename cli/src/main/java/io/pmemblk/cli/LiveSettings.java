package io.pmemblk.cli;

import io.pmemblk.nbd.NbdServer;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.Routing;
import io.pmemblk.settings.Key;
import io.pmemblk.settings.Keys;
import io.pmemblk.settings.Settings;
import io.pmemblk.settings.SettingsException;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * The settings of a running server that a reload (SIGHUP, {@code systemctl reload}) may change: it reads the
 * properties file again (with the same {@code --set} overrides, still applied last) and applies the
 * {@link Keys#LIVE} keys where they are read, each through a volatile field (the driver's routing, the NBD
 * server's stall timeout, the log level), so no connection and no request is disturbed and the request path
 * pays nothing for it. Keys that need a restart are named, and left as they are.
 */
final class LiveSettings {
    private static final System.Logger LOG = System.getLogger("pmemblk");

    /** What a reload did; {@link #error} set means nothing changed. */
    record Outcome(List<String> applied, List<String> needRestart, String error) {
        /** One line for the log and for systemd's STATUS. */
        String summary() {
            if (error != null) {
                return "reload failed, nothing changed: " + error;
            }
            String s = applied.isEmpty() ? "reload: no live setting changed" : "reload: applied " + String.join(", ", applied);
            return needRestart.isEmpty() ? s : s + "; " + restartLine();
        }

        /** The one line that names every changed key that needs a restart. */
        String restartLine() {
            return "changed but need a restart, left as they are: " + String.join(", ", needRestart);
        }
    }

    private final Path config;
    private final List<String> overrides;
    private final PmemBlockDriver driver;
    private final NbdServer server;
    /** What start-up built: the keys that need a restart are compared with these. */
    private final Settings startup;
    /** The last settings applied: the live keys are compared with these. */
    private Settings applied;

    LiveSettings(Path config, List<String> overrides, Settings startup, PmemBlockDriver driver, NbdServer server) {
        this.config = config;
        this.overrides = List.copyOf(overrides);
        this.startup = startup;
        this.applied = startup;
        this.driver = driver;
        this.server = server;
    }

    Settings applied() {
        return applied;
    }

    /** Re-reads the file and applies what may change live. Called by one thread (serve's main thread). */
    Outcome reload() {
        Settings fresh;
        try {
            fresh = Settings.load(config, overrides);
        } catch (SettingsException e) {
            return new Outcome(List.of(), List.of(), e.getMessage());
        }
        List<String> needRestart = new ArrayList<>();
        for (Key<?> k : fresh.changed(startup)) {
            if (!Keys.LIVE.contains(k)) {
                needRestart.add(k.name() + " (running " + startup.text(k) + ", file " + fresh.text(k) + ")");
            }
        }
        List<String> done = new ArrayList<>();
        List<Key<?>> live = fresh.changed(applied).stream().filter(Keys.LIVE::contains).toList();
        if (live.contains(Keys.ROUTE_DMA_MIN_BYTES) || live.contains(Keys.ROUTE_DMA_MIN_SEGMENTS)
                || live.contains(Keys.ROUTE_DMA_BOUNCE)) {
            driver.routing(routing(fresh));
        }
        if (live.contains(Keys.NBD_STALL_TIMEOUT) && server != null) { // null: no NBD listener (vhost only)
            server.stallTimeout(Duration.ofSeconds(fresh.get(Keys.NBD_STALL_TIMEOUT)));
        }
        if (live.contains(Keys.LOG_LEVEL)) {
            applyLogLevel(fresh.get(Keys.LOG_LEVEL));
        }
        for (Key<?> k : live) {
            done.add(k.name() + "=" + fresh.text(k) + " (was " + applied.text(k) + ")");
        }
        applied = fresh;
        return new Outcome(done, needRestart, null);
    }

    /** The driver's routing from the route.dma.* keys: at start-up (Device) and on reload, one reading. */
    static Routing routing(Settings s) {
        return new Routing(s.get(Keys.ROUTE_DMA_MIN_BYTES), s.get(Keys.ROUTE_DMA_MIN_SEGMENTS),
                s.get(Keys.ROUTE_DMA_BOUNCE));
    }

    /**
     * pmemblk's loggers ("pmemblk", and "io.pmemblk.*" by class name), held here because java.util.logging keeps
     * only weak references to loggers: one collected would come back without its level.
     */
    private static final Logger[] OURS = {Logger.getLogger("pmemblk"), Logger.getLogger("io.pmemblk")};

    /**
     * Sets pmemblk's loggers and the root logger's handlers (the console handler has a level of its own, INFO by
     * default, which would still hide debug records) to {@code level}. The root logger, which the JDK's own
     * loggers inherit from, goes no lower than INFO: debug is for pmemblk's records, not the HTTP server's.
     * System.Logger's DEBUG is java.util.logging's FINE, TRACE is FINER.
     */
    static void applyLogLevel(Keys.LogLevel level) {
        Level jul = switch (level) {
            case ERROR -> Level.SEVERE;
            case WARNING -> Level.WARNING;
            case INFO -> Level.INFO;
            case DEBUG -> Level.FINE;
            case TRACE -> Level.FINEST;
        };
        for (Logger l : OURS) {
            l.setLevel(jul);
        }
        Logger root = Logger.getLogger("");
        root.setLevel(jul.intValue() < Level.INFO.intValue() ? Level.INFO : jul);
        for (Handler h : root.getHandlers()) {
            h.setLevel(jul);
        }
        LOG.log(System.Logger.Level.DEBUG, "log.level=" + level.name().toLowerCase(java.util.Locale.ROOT));
    }
}
