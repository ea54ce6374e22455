package io.pmemblk.cli;

import org.assertj.core.api.AbstractThrowableAssert;
import org.junit.jupiter.api.Test;
import picocli.CommandLine;

import java.time.Duration;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class DmaDeviceCommandTest {
    /** dma-device with --socket and ARGS, which must end in a usage error (exit 2), not in a start. */
    private static AbstractThrowableAssert<?, ? extends Throwable> usageError(String... args) {
        DmaDeviceCommand d = new DmaDeviceCommand();
        String[] all = new String[args.length + 2];
        all[0] = "--socket";
        all[1] = "/run/x.sock";
        System.arraycopy(args, 0, all, 2, args.length);
        new CommandLine(d).parseArgs(all);
        return assertThatThrownBy(d::call).isInstanceOf(CommandLine.ParameterException.class);
    }

    @Test
    void anUnknownLogLevelIsAUsageErrorNamingTheOption() {
        // Was Enum.valueOf's "No enum constant io.pmemblk.settings.Keys.LogLevel.LOUD", exit 1.
        usageError("--log-level", "loud").hasMessage("--log-level loud is not allowed (allowed: error, warning, info, debug or trace)");
    }

    @Test
    void channelsOutOfRangeAreAUsageErrorNamingTheOption() {
        // Was the device's IllegalArgumentException ("channels 0 not in 1..31 ..."), exit 1, after the signal handlers.
        for (String n : new String[]{"0", "32", "-1"}) {
            usageError("--channels", n).hasMessageStartingWith("--channels " + n + " is not allowed (allowed: 1..31");
        }
    }

    @Test
    void aNegativeSocketGroupIsNoGroup() {
        // The JDK took -1 for a gid, chown(2)'s "no change": the socket was made 0660 for the group it was created with.
        usageError("--socket-group", "-1").hasMessage("--socket-group -1: no such group (allowed: a group in /etc/group)");
    }

    @Test
    void aNegativeMetricsIntervalIsNotADuration() {
        // Was Duration -1s: the wait for a signal returned at once, and the loop spun a CPU until SIGTERM.
        assertThatThrownBy(() -> DmaDeviceCommand.parseDuration("-1s"))
                .isInstanceOf(CommandLine.ParameterException.class)
                .hasMessage("--metrics-interval -1s is not a duration (allowed: 0, N ms, N s, N m)");
        assertThat(DmaDeviceCommand.parseDuration("250ms")).isEqualTo(Duration.ofMillis(250));
        assertThat(DmaDeviceCommand.parseDuration("0")).isEqualTo(Duration.ZERO);
    }
}
