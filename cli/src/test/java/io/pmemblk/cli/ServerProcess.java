package io.pmemblk.cli;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A real {@code pmemblk serve} process, launched as scripts/pmemblk launches it (the modules on the module path,
 * the JVM arguments from the build's {@code target/pmemblk.args}), for interop tests.
 * Start-up waits for the {@code ready:} lines with a bounded wait; stderr goes to a log file named in failures.
 * The process inherits this JVM's signal dispositions (the JDK's launch resets none): a test run started under
 * nohup starts its servers with SIGHUP ignored, which serve takes back itself ({@link ServeSignals}; ServeNotifyIT
 * starts one under nohup on purpose), so the SIGHUP tests do not depend on how their run was started.
 */
final class ServerProcess implements AutoCloseable {
    static final Path JAR = Path.of("target", "pmemblk.jar").toAbsolutePath();
    static final Path MODULES = Path.of("target", "modules").toAbsolutePath();
    /** The JVM's argument file every launcher uses (cli/src/launch/pmemblk.args, filtered by the build). */
    static final Path ARGS = Path.of("target", "pmemblk.args").toAbsolutePath();
    static final String JAVA = Path.of(System.getProperty("java.home"), "bin", "java").toString();

    final Process process;
    final Path log;
    final List<String> uris = new ArrayList<>();
    final List<String> stdout = new ArrayList<>();
    private final BlockingQueue<String> lines = new LinkedBlockingQueue<>();

    private ServerProcess(Process process, Path log) {
        this.process = process;
        this.log = log;
    }

    static List<String> command(String subcommand, List<String> args) {
        return command(ARGS, subcommand, args);
    }

    /** The launcher's command line, with the JVM arguments of {@code argFile} (the build's, or a test's variant). */
    static List<String> command(Path argFile, String subcommand, List<String> args) {
        List<String> cmd = new ArrayList<>(List.of(JAVA, "--module-path", JAR + java.io.File.pathSeparator + MODULES,
                "@" + argFile, subcommand));
        cmd.addAll(args);
        return cmd;
    }

    /**
     * {@code cmd} run under nohup(1): started with SIGHUP ignored, as {@code nohup pmemblk serve &} and some
     * supervisors start it (nohup execs {@code cmd}: the process is the server itself).
     */
    static List<String> hangupIgnored(List<String> cmd) {
        List<String> wrapped = new ArrayList<>(List.of("nohup"));
        wrapped.addAll(cmd);
        return wrapped;
    }

    /** Starts serve with {@code --set} for each of {@code sets}; waits until it is ready or fails. */
    static ServerProcess start(Path dir, String... sets) throws IOException, InterruptedException {
        return start(dir, java.util.Map.of(), sets(sets), expectedListeners(sets));
    }

    /** {@code --set} before each of {@code sets}. */
    static List<String> sets(String... sets) {
        List<String> args = new ArrayList<>();
        for (String s : sets) {
            args.add("--set");
            args.add(s);
        }
        return args;
    }

    /** Runs serve with {@code --set} for each of {@code sets} to its exit (within 60 s): a refusal's code and text. */
    static Run serveToExit(String... sets) throws IOException, InterruptedException {
        return run(command("serve", sets(sets)), 60);
    }

    /**
     * Starts serve with {@code args} as given (e.g. {@code --config FILE}) and {@code env} added to the
     * environment; waits for {@code listeners} ready lines (0: returns at once, the caller waits its own way).
     */
    static ServerProcess start(Path dir, java.util.Map<String, String> env, List<String> args, int listeners)
            throws IOException, InterruptedException {
        return start(command("serve", args), dir, env, listeners);
    }

    /** Starts {@code cmd}, a serve command line of any launcher; waits as {@link #start(Path, java.util.Map, List, int)}. */
    static ServerProcess start(List<String> cmd, Path dir, java.util.Map<String, String> env, int listeners)
            throws IOException, InterruptedException {
        Path log = Files.createTempFile(dir, "serve", ".log");
        ProcessBuilder pb = new ProcessBuilder(cmd)
                .redirectError(ProcessBuilder.Redirect.appendTo(log.toFile()));
        pb.environment().putAll(env);
        Process p = pb.start();
        ServerProcess sp = new ServerProcess(p, log);
        Thread reader = Thread.ofPlatform().daemon().name("serve-stdout").start(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
                for (String line; (line = r.readLine()) != null; ) {
                    sp.lines.add(line);
                }
            } catch (IOException ignored) {
                // process gone
            }
            sp.lines.add("<eof>");
        });
        if (listeners == 0) {
            return sp;
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (true) {
            String line = sp.lines.poll(Math.max(1, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
            if (line == null || line.equals("<eof>")) {
                p.destroyForcibly();
                throw new IllegalStateException("serve did not become ready (" + (line == null ? "timeout" : "exited "
                        + p.waitFor()) + "); stdout " + sp.stdout + "; stderr:\n" + Files.readString(log));
            }
            sp.stdout.add(line);
            if (line.startsWith("ready: ")) {
                sp.uris.add(line.substring(7));
                // every listener prints its line at once; a unix-only server prints one
                if (sp.uris.size() >= listeners) {
                    return sp;
                }
            }
        }
    }

    private static int expectedListeners(String[] sets) {
        boolean tcp = true, unix = true;
        for (String s : sets) {
            if (s.equals("nbd.port=0")) tcp = false;
            if (s.equals("nbd.socket=")) unix = false;
        }
        return (tcp ? 1 : 0) + (unix ? 1 : 0);
    }

    String unixUri() {
        return uris.stream().filter(u -> u.startsWith("nbd+unix:")).findFirst().orElseThrow();
    }

    /** SIGTERM and a bounded wait; returns the exit code. */
    int terminate() throws InterruptedException {
        process.destroy();
        if (!process.waitFor(60, TimeUnit.SECONDS)) {
            process.destroyForcibly();
            throw new IllegalStateException("serve did not stop within 60 s of SIGTERM");
        }
        return process.exitValue();
    }

    /** Sends {@code signal} (e.g. "HUP") with kill(1): the JDK can only send TERM and KILL. */
    void signal(String signal) throws IOException, InterruptedException {
        Run r = run(List.of("kill", "-" + signal, Long.toString(process.pid())), 10);
        if (r.exit() != 0) {
            throw new IllegalStateException("kill -" + signal + " " + process.pid() + ": " + r.out());
        }
    }

    /** SIGKILL: no chance to flush anything. */
    void kill9() throws InterruptedException {
        process.destroyForcibly();
        if (!process.waitFor(30, TimeUnit.SECONDS)) {
            throw new IllegalStateException("serve survived SIGKILL for 30 s");
        }
    }

    String stderr() throws IOException {
        return Files.readString(log);
    }

    @Override
    public void close() throws InterruptedException {
        if (process.isAlive()) {
            process.destroyForcibly();
            process.waitFor(30, TimeUnit.SECONDS);
        }
    }

    /** The Prometheus text a server with {@code metrics.port=port} serves now (HTTP 200 asserted). */
    static String metrics(int port) throws IOException, InterruptedException {
        java.net.http.HttpResponse<String> r = java.net.http.HttpClient.newHttpClient().send(
                java.net.http.HttpRequest.newBuilder(java.net.URI.create("http://127.0.0.1:" + port + "/metrics"))
                        .timeout(java.time.Duration.ofSeconds(10)).build(),
                java.net.http.HttpResponse.BodyHandlers.ofString());
        org.assertj.core.api.Assertions.assertThat(r.statusCode()).isEqualTo(200);
        return r.body();
    }

    /** The value of {@code series} (name and labels, as written in the text) in {@code metrics}; fails if absent. */
    static double metric(String metrics, String series) {
        java.util.regex.Matcher m = java.util.regex.Pattern.compile(
                "(?m)^" + java.util.regex.Pattern.quote(series) + " (\\S+)$").matcher(metrics);
        org.assertj.core.api.Assertions.assertThat(m.find()).as("series %s in:%n%s", series, metrics).isTrue();
        return Double.parseDouble(m.group(1));
    }

    /** The value of {@code series} on the server with {@code metrics.port=port}, read now. */
    static double metric(int port, String series) throws IOException, InterruptedException {
        return metric(metrics(port), series);
    }

    /** A throwaway PKI made by scripts/lib/test-pki (Debian's openssl) in {@code dir}; see that script for the layout. */
    static Path testPki(Path dir) throws IOException, InterruptedException {
        Path pki = dir.resolve("pki");
        Run r = run(List.of("bash", Path.of("..", "scripts", "lib", "test-pki").toString(), pki.toString()), 60);
        if (r.exit() != 0) {
            throw new IllegalStateException("scripts/lib/test-pki failed: " + r.out());
        }
        return pki;
    }

    /** Result of a peer tool run. */
    record Run(int exit, String out) {}

    /** Runs a peer tool with a bounded wait; stdout and stderr merged. */
    static Run run(List<String> cmd, long timeoutSeconds) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        byte[][] out = new byte[1][];
        Thread t = Thread.ofPlatform().daemon().start(() -> {
            try {
                out[0] = p.getInputStream().readAllBytes();
            } catch (IOException e) {
                out[0] = new byte[0];
            }
        });
        if (!p.waitFor(timeoutSeconds, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new IllegalStateException(cmd + " did not finish within " + timeoutSeconds + " s");
        }
        t.join(10_000);
        return new Run(p.exitValue(), new String(out[0] == null ? new byte[0] : out[0], StandardCharsets.UTF_8));
    }
}
