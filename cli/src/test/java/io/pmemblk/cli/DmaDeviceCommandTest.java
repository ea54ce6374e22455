package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import picocli.CommandLine;

import java.time.Duration;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class DmaDeviceCommandTest {
    private static DmaDeviceCommand dmaDevice(String... args) {
        DmaDeviceCommand d = new DmaDeviceCommand();
        new CommandLine(d).parseArgs(args);
        return d;
    }

    @Test
    void anUnknownLogLevelIsAUsageErrorNamingTheOption() {
        // Was Enum.valueOf's "No enum constant io.pmemblk.settings.Keys.LogLevel.LOUD", exit 1.
        assertThatThrownBy(dmaDevice("--socket", "/run/x.sock", "--log-level", "loud")::call)
                .isInstanceOf(CommandLine.ParameterException.class)
                .hasMessage("--log-level loud is not allowed (allowed: error, warning, info, debug or trace)");
    }

    @Test
    void channelsOutOfRangeAreAUsageErrorNamingTheOption() {
        // Was the device's IllegalArgumentException ("channels 0 not in 1..31 ..."), exit 1, after the signal handlers.
        for (String n : new String[]{"0", "32", "-1"}) {
            assertThatThrownBy(dmaDevice("--socket", "/run/x.sock", "--channels", n)::call)
                    .isInstanceOf(CommandLine.ParameterException.class)
                    .hasMessageStartingWith("--channels " + n + " is not allowed (allowed: 1..31");
        }
    }

    @Test
    void aNegativeSocketGroupIsNoGroup() {
        // The JDK took -1 for a gid, chown(2)'s "no change": the socket was made 0660 for the group it was created with.
        assertThatThrownBy(dmaDevice("--socket", "/run/x.sock", "--socket-group", "-1")::call)
                .isInstanceOf(CommandLine.ParameterException.class)
                .hasMessage("--socket-group -1: no such group (allowed: a group in /etc/group)");
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
