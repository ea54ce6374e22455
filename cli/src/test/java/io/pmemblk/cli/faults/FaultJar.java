package io.pmemblk.cli.faults;

import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.testing.InjectedFaults;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;

/**
 * A jar holding {@link EnvironmentFaults} as a {@link SoftFaults} provider, and the environment that puts it on a
 * real {@code pmemblk serve}'s class path ({@code JDK_JAVA_OPTIONS}, read by the java launcher itself) with the
 * faults to inject: the served device fails on cue with the launcher's command line unchanged.
 */
public final class FaultJar {
    private FaultJar() {}

    /** Writes the jar into {@code dir}; returns the environment for a server whose soft device gets {@code spec}. */
    public static Map<String, String> environment(Path dir, String spec) throws IOException {
        Path jar = dir.resolve("soft-faults.jar");
        try (JarOutputStream out = new JarOutputStream(Files.newOutputStream(jar))) {
            for (Class<?> c : List.of(EnvironmentFaults.class, InjectedFaults.class)) {
                for (Class<?> k : c.getNestMembers()) {
                    String name = k.getName().replace('.', '/') + ".class";
                    out.putNextEntry(new JarEntry(name));
                    try (InputStream in = k.getClassLoader().getResourceAsStream(name)) {
                        if (in == null) {
                            throw new IOException(name + " is not on the test class path");
                        }
                        in.transferTo(out);
                    }
                }
            }
            out.putNextEntry(new JarEntry("META-INF/services/" + SoftFaults.class.getName()));
            write(out, EnvironmentFaults.class.getName() + "\n");
        }
        return Map.of("JDK_JAVA_OPTIONS", "-cp " + jar, EnvironmentFaults.VARIABLE, spec);
    }

    private static void write(OutputStream out, String s) throws IOException {
        out.write(s.getBytes(StandardCharsets.UTF_8));
    }
}
