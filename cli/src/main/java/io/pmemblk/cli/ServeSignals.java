package io.pmemblk.cli;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import sun.misc.Signal;
import sun.misc.SignalHandler;

import java.util.concurrent.BlockingQueue;

/**
 * The signals {@code serve} acts on: SIGTERM and SIGINT stop it, SIGHUP reloads it. Each is put, by name, in one
 * queue, in the order they came, for the one thread that acts on them.
 *
 * <p>A process started with SIGHUP ignored ({@code nohup pmemblk serve &}, some supervisors: an ignored signal stays
 * ignored across exec) would never reload, and say nothing: HotSpot installs no handler for SIGHUP, SIGINT or SIGTERM
 * while it is ignored (its JVM_RegisterSignal keeps the JDK's shutdown hooks from undoing nohup), and
 * {@link Signal#handle} tells only by returning SIG_IGN. For serve, SIGHUP means reload, and a handled SIGHUP never
 * ends the process, so what nohup is for (outliving the terminal's hangup) holds with the handler too: SIGHUP gets
 * its default action back and is handled, and the server says so. SIGINT and SIGTERM keep what they were started
 * with: a shell starts background jobs with SIGINT ignored so that ^C at the terminal does not reach them.
 */
final class ServeSignals {
    private ServeSignals() {}

    /**
     * Handles SIGTERM, SIGINT and SIGHUP from now on, each put in {@code inbox} by name ("TERM", "INT", "HUP").
     * @return a line for the operator when SIGHUP was ignored at start: that it reloads again, or, where it could
     *         not be taken back, that it does not and what to do; null otherwise
     */
    static String install(BlockingQueue<String> inbox) {
        SignalHandler handler = sig -> inbox.add(sig.getName());
        Signal.handle(new Signal("TERM"), handler);
        Signal.handle(new Signal("INT"), handler);
        return handleHangup(handler);
    }

    private static String handleHangup(SignalHandler handler) {
        Signal hup = new Signal("HUP");
        if (Signal.handle(hup, handler) != SignalHandler.SIG_IGN) {
            return null;
        }
        // A SIGHUP between these two calls (microseconds, before anything is opened) takes the default action and
        // ends the process; any later one is a reload.
        try {
            Libc.defaultSignalAction(Libc.SIGHUP);
        } catch (NativeException e) {
            return stillIgnored(e.getMessage());
        }
        if (Signal.handle(hup, handler) == SignalHandler.SIG_IGN) {
            return stillIgnored("the JVM still finds it ignored");
        }
        return "SIGHUP was ignored when serve started (nohup, or a supervisor that ignores it); serve handles it"
                + " again: SIGHUP reloads --config";
    }

    private static String stillIgnored(String why) {
        return "warning: SIGHUP is ignored (serve was started with it ignored: nohup, or a supervisor) and could not"
                + " be taken back (" + why + "): SIGHUP does NOT reload this server. Restart it to apply a changed"
                + " --config, and start it without nohup (setsid, or a systemd unit) to reload it with SIGHUP";
    }
}
