package io.pmemblk.bench.vhostload;

import io.pmemblk.posix.Errno;
import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.NativeException;
import io.pmemblk.vhost.driver.DriverRing;
import io.pmemblk.vhost.driver.MemfdGuestRam;

import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A vhost-user-blk front end on the host as a load generator: it connects to a back-end's socket as QEMU does,
 * runs one of bench-vhost's fio jobs on its virtqueues with no guest in between, and prints one result line:
 * <pre>job ios bytes nanos server-ticks generator-ticks queue-ticks device-ticks queue-sleeps</pre>
 * (tab-separated; ticks are utime+stime from /proc/PID/stat in clock ticks, the server's around the run when
 * {@code --server-pid} is given, else -; queue-ticks: the server's {@code vhost-blk-q} threads' alone, the
 * threads serving this run's rings, where the loop's own cost shows apart from the engine's and the JVM's;
 * device-ticks: the process of {@code --device-pid}, a DMA device out of the server's process, else -;
 * queue-sleeps: the queue threads' voluntary context switches, /proc/PID/task/TID/status, each a sleep and its
 * wake-up). Exit 1
 * when any request failed, was answered wrongly or (with {@code --verify}) read back other data than was written:
 * no throughput is reported for such a run.
 * <pre>
 *   java -cp vhost-load.jar io.pmemblk.bench.vhostload.VhostLoad --socket S --job randread-4k-qd32-2j
 *        [--runtime SECONDS] [--server-pid PID] [--device-pid PID] [--verify] [--prefill] [--ring N]
 * </pre>
 * {@code --prefill}: one sequential pass of 2 MiB writes over the disk (2 queues), each sector stamped as verify
 * mode checks; the job's name then only gives the queue count.
 */
public final class VhostLoad {
    /** A vhost-user-blk ring's size as QEMU's vhost-user-blk device has it by default (queue-size=128). */
    static final int RING = 128;

    private VhostLoad() {}

    record Result(Job job, long ios, long bytes, long nanos, long serverTicks, long ownTicks, long queueTicks,
                  long deviceTicks, long queueSleeps, long errors, String firstError) {
        String line() {
            return job.name() + "\t" + ios + "\t" + bytes + "\t" + nanos + "\t" + orDash(serverTicks) + "\t" + ownTicks
                    + "\t" + orDash(queueTicks) + "\t" + orDash(deviceTicks) + "\t" + orDash(queueSleeps);
        }

        private static String orDash(long ticks) {
            return ticks < 0 ? "-" : Long.toString(ticks);
        }
    }

    public static void main(String[] args) {
        try {
            Result r = run(Options.parse(args));
            if (r.errors() > 0) {
                System.err.println("vhost-load: " + r.errors() + " requests went wrong, the first: " + r.firstError());
                System.exit(1);
            }
            System.out.println(r.line());
        } catch (IllegalArgumentException e) {
            System.err.println("vhost-load: " + e.getMessage());
            System.exit(2);
        } catch (IOException | InterruptedException e) {
            System.err.println("vhost-load: " + e.getMessage());
            System.exit(1);
        }
    }

    record Options(Path socket, Job job, int runtime, long serverPid, long devicePid, boolean verify, boolean prefill,
                   int ring) {
        static Options parse(String[] args) {
            Path socket = null;
            String job = null;
            int runtime = 5, ring = RING;
            long pid = -1, device = -1;
            boolean verify = false, prefill = false;
            for (int i = 0; i < args.length; i++) {
                String a = args[i];
                switch (a) {
                    case "--socket" -> socket = Path.of(value(args, ++i, a));
                    case "--job" -> job = value(args, ++i, a);
                    case "--runtime" -> runtime = number(value(args, ++i, a), a, 1, 3600);
                    case "--server-pid" -> pid = number(value(args, ++i, a), a, 1, Integer.MAX_VALUE);
                    case "--device-pid" -> device = number(value(args, ++i, a), a, 1, Integer.MAX_VALUE);
                    case "--ring" -> ring = number(value(args, ++i, a), a, 2, 32768);
                    case "--verify" -> verify = true;
                    case "--prefill" -> prefill = true;
                    default -> throw new IllegalArgumentException("unknown option '" + a + "' (known: --socket, --job,"
                            + " --runtime, --server-pid, --device-pid, --verify, --prefill, --ring)");
                }
            }
            if (socket == null || job == null) {
                throw new IllegalArgumentException("--socket PATH and --job NAME are required");
            }
            if (Integer.bitCount(ring) != 1) {
                throw new IllegalArgumentException("--ring " + ring + ": a split ring's size is a power of 2");
            }
            Job j = Job.parse(job);
            if (prefill) {
                j = Job.parse("write-2m-qd4-" + j.jobs() + "j");
            }
            return new Options(socket, j, runtime, pid, device, verify, prefill, ring);
        }

        private static String value(String[] args, int i, String option) {
            if (i >= args.length) {
                throw new IllegalArgumentException(option + " wants a value");
            }
            return args[i];
        }

        private static int number(String v, String option, int min, int max) {
            try {
                int n = Integer.parseInt(v);
                if (n >= min && n <= max) {
                    return n;
                }
            } catch (NumberFormatException e) {
                // told below
            }
            throw new IllegalArgumentException(option + " '" + v + "': allowed a whole number from " + min + " to " + max);
        }
    }

    /** One run: realize, start the rings, the job on each for the runtime, the counts and the CPU it took. */
    static Result run(Options o) throws IOException, InterruptedException {
        Job job = o.job();
        try (VhostUserLink link = connect(o.socket(), job.jobs())) {
            long queueBytes = DriverRing.bytes(o.ring()) + QueueLoad.bytes(job, o.ring(), link.segMax, link.sizeMax);
            queueBytes = (queueBytes + (2 << 20) - 1) & ~((2L << 20) - 1);
            List<EventFd> fds = new ArrayList<>();
            try (MemfdGuestRam ram = new MemfdGuestRam("vhost-load-guest-ram", queueBytes * job.jobs(), true)) {
                DriverRing[] rings = new DriverRing[job.jobs()];
                EventFd[] kicks = new EventFd[job.jobs()], calls = new EventFd[job.jobs()];
                QueueLoad[] loads = new QueueLoad[job.jobs()];
                for (int q = 0; q < job.jobs(); q++) {
                    long base = q * queueBytes;
                    rings[q] = new DriverRing(ram, base, o.ring());
                    kicks[q] = EventFd.create(true);
                    fds.add(kicks[q]);
                    calls[q] = EventFd.create(true);
                    fds.add(calls[q]);
                    loads[q] = new QueueLoad(ram, rings[q], base + DriverRing.bytes(o.ring()), kicks[q], calls[q], job, q,
                            link.capacitySectors, link.segMax, link.sizeMax, o.verify(), o.prefill());
                }
                link.start(ram, rings, kicks, calls);
                Thread[] threads = new Thread[job.jobs()];
                for (int q = 0; q < job.jobs(); q++) {
                    threads[q] = Thread.ofPlatform().name("vhost-load-q" + q).unstarted(loads[q]);
                }
                long server0 = o.serverPid() > 0 ? ticks(o.serverPid()) : -1, own0 = ticks(ProcessHandle.current().pid());
                // After link.start: the queue threads serving this run's rings are running, and live until it ends.
                QueueThreads queue0 = o.serverPid() > 0 ? QueueThreads.of(o.serverPid()) : null;
                long device0 = o.devicePid() > 0 ? ticks(o.devicePid()) : -1;
                long t0 = System.nanoTime();
                for (int q = 0; q < job.jobs(); q++) {
                    loads[q].until(t0 + o.runtime() * 1_000_000_000L);
                    threads[q].start();
                }
                for (Thread t : threads) {
                    t.join();
                }
                long nanos = System.nanoTime() - t0;
                long server = o.serverPid() > 0 ? ticks(o.serverPid()) - server0 : -1;
                long own = ticks(ProcessHandle.current().pid()) - own0;
                QueueThreads queue1 = queue0 != null ? QueueThreads.of(o.serverPid()) : null;
                long queue = queue1 != null ? queue1.ticks() - queue0.ticks() : -1;
                long sleeps = queue1 != null ? queue1.sleeps() - queue0.sleeps() : -1;
                long device = o.devicePid() > 0 ? ticks(o.devicePid()) - device0 : -1;
                long ios = 0, bytes = 0, errors = 0;
                String first = null;
                for (QueueLoad l : loads) {
                    ios += l.ios;
                    bytes += l.bytes;
                    errors += l.errors;
                    first = first != null ? first : l.firstError;
                }
                return new Result(job, ios, bytes, nanos, server, own, queue, device, sleeps, errors, first);
            } finally {
                for (EventFd e : fds) {
                    e.close();
                }
            }
        }
    }

    /**
     * Connects, retrying for up to 10 s while the back-end refuses: it serves one front end at a time and refuses
     * the next until it has seen the last one go (the previous run's, a moment ago).
     */
    private static VhostUserLink connect(Path socket, int queues) throws IOException, InterruptedException {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (true) {
            try {
                return VhostUserLink.realize(socket, queues);
            } catch (NativeException e) {
                boolean refused = e.errno() == Errno.ECONNRESET || e.errno() == Errno.EPIPE;
                if (!refused || System.nanoTime() > deadline) {
                    throw e;
                }
                Thread.sleep(20); // a retry of the connection, bounded by the deadline above
            }
        }
    }

    /** utime + stime of process {@code pid} in clock ticks (/proc/PID/stat fields 14 and 15, proc(5)). */
    static long ticks(long pid) throws IOException {
        return statTicks(Files.readString(Path.of("/proc/" + pid + "/stat")));
    }

    /** utime + stime of a stat line: fields 14 and 15, counted after the command name (which may hold spaces). */
    private static long statTicks(String stat) {
        String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
        return Long.parseLong(f[11]) + Long.parseLong(f[12]);
    }

    /**
     * What process {@code pid}'s threads named {@code vhost-blk-q<N>} (the vhost queue threads) have spent so far:
     * utime + stime in clock ticks (/proc/PID/task/TID/stat) and voluntary context switches, each a sleep
     * (/proc/PID/task/TID/status); a thread gone between the listing and the read counts nothing.
     */
    record QueueThreads(long ticks, long sleeps) {
        static QueueThreads of(long pid) throws IOException {
            long ticks = 0, sleeps = 0;
            try (DirectoryStream<Path> tasks = Files.newDirectoryStream(Path.of("/proc/" + pid + "/task"))) {
                for (Path task : tasks) {
                    try {
                        if (Files.readString(task.resolve("comm")).strip().matches("vhost-blk-q[0-9]+")) {
                            ticks += statTicks(Files.readString(task.resolve("stat")));
                            sleeps += voluntarySwitches(Files.readString(task.resolve("status")));
                        }
                    } catch (NoSuchFileException e) {
                        // the thread ended meanwhile: not one of this run's (they live until the link closes)
                    }
                }
            }
            return new QueueThreads(ticks, sleeps);
        }

        private static long voluntarySwitches(String status) {
            for (String line : status.split("\n")) {
                if (line.startsWith("voluntary_ctxt_switches:")) {
                    return Long.parseLong(line.substring(line.indexOf(':') + 1).strip());
                }
            }
            return 0;
        }
    }
}
