package io.pmemblk.pmem;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * libpmem loaded by a JVM that runs pmemblk's modules on the module path with {@code --illegal-native-access=deny},
 * as the launcher does: without a grant to io.pmemblk.pmem the reason names the exact flag to add.
 */
class LibpmemGrantTest {
    @TempDir
    Path dir;

    @Test
    void aMissingGrantNamesTheFlagForThisModule() throws Exception {
        String reason = probe("--enable-native-access=io.pmemblk.posix");
        assertThat(reason).contains("add --enable-native-access=io.pmemblk.pmem to the java command line")
                .doesNotContain("install Debian's libpmem1");
    }

    @Test
    void withTheGrantTheReasonIsNotAboutAccess() throws Exception {
        String reason = probe("--enable-native-access=io.pmemblk.posix,io.pmemblk.pmem");
        assertThat(reason).doesNotContain("--enable-native-access");
    }

    /** Libpmem.unavailableReason() in a child JVM with {@code grant}, the reactor's modules on its module path. */
    private String probe(String grant) throws Exception {
        Path source = dir.resolve("Probe.java");
        Files.writeString(source, """
                public class Probe {
                    public static void main(String[] args) {
                        System.out.println("reason=" + io.pmemblk.pmem.Libpmem.unavailableReason());
                    }
                }
                """);
        // The reactor's own modules as the test sees them: target/classes under `mvn test`, but the packaged
        // target/*.jar of the modules already built under `mvn verify` (CI's run); never their test-jars.
        List<String> modules = Arrays.stream(System.getProperty("java.class.path").split(File.pathSeparator))
                .filter(LibpmemGrantTest::reactorModule).toList();
        assertThat(modules).as("the reactor's module directories").anyMatch(e -> e.contains("pmem-blk"));
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "--illegal-native-access=deny", grant, "--module-path", String.join(File.pathSeparator, modules),
                "--add-modules", "io.pmemblk.pmem", source.toString()));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        assertThat(p.waitFor(60, TimeUnit.SECONDS)).as("the probe JVM ended").isTrue();
        assertThat(p.exitValue()).as(out).isZero();
        return out.lines().filter(l -> l.startsWith("reason=")).findFirst().orElseThrow(() -> new AssertionError(out));
    }

    private static boolean reactorModule(String entry) {
        Path p = Path.of(entry);
        Path parent = p.getParent();
        boolean inTarget = parent != null && parent.getFileName() != null && parent.getFileName().toString().equals("target");
        String name = p.getFileName().toString();
        return inTarget && (name.equals("classes") || name.endsWith(".jar") && !name.endsWith("-tests.jar"));
    }
}
