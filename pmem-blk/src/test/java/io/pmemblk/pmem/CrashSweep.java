package io.pmemblk.pmem;

import java.util.Random;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Which crash points of a crash sweep ({@link CrashModel}'s hooks after each persistence step and each write-back)
 * are judged. Judging a point (a copy of the whole device, opened, recovered and read back) is what a sweep spends
 * its time on, so by default a seeded sample is judged: the first point of each kind, then each point with a
 * probability of 1 in {@link #RATE}. Every case of a sweep still runs its whole workload and reaches every point;
 * the points judged differ from run to run, so runs add up to the whole sweep over time.
 *
 * <p>The whole sweep, every point judged: {@code ./scripts/test --long}, which sets {@code PMEMBLK_CRASH_SWEEP=full},
 * or {@code -Dpmemblk.crash.sweep=full}. A sample's seed is drawn for the run unless {@code -Dpmemblk.crash.seed=N}
 * (or {@code PMEMBLK_CRASH_SEED}) gives it; {@link Sampler#describe} names it for a failure's message, with the way to
 * replay it. A replay judges the same picks in the same order; which point each pick falls on also depends on the
 * threads' interleaving, so a failure found by a sample is best replayed under the whole sweep as well.
 */
public final class CrashSweep {
    /** One point in this many is judged in a sample, besides the first of each kind. */
    public static final int RATE = 8;
    /** Whether every crash point is judged. */
    public static final boolean FULL = full();
    private static final long SEED = seed();

    private CrashSweep() {
    }

    /** The kinds of crash point, each judged at least once in a sample. */
    public enum Point { AFTER_STEP, AFTER_WRITE_BACK }

    /** A sampler for one case of a sweep, its stream drawn from the run's seed and the case's name. */
    public static Sampler sampler(String caseName) {
        return new Sampler(caseName);
    }

    /** Which points of one case are judged; counts the points reached and those judged. Safe on any thread. */
    public static final class Sampler {
        private final String caseName;
        private final Random random;
        private final boolean[] seen = new boolean[Point.values().length];
        private final AtomicInteger reached = new AtomicInteger(), judged = new AtomicInteger();

        private Sampler(String caseName) {
            this.caseName = caseName;
            this.random = new Random(SEED ^ caseName.hashCode());
        }

        /** A point of {@code kind} is reached: whether to judge it. */
        public boolean judge(Point kind) {
            reached.incrementAndGet();
            boolean take;
            synchronized (this) {
                take = FULL || !seen[kind.ordinal()] || random.nextInt(RATE) == 0;
                seen[kind.ordinal()] = true;
            }
            if (take) {
                judged.incrementAndGet();
            }
            return take;
        }

        /** Crash points reached so far. */
        public int reached() {
            return reached.get();
        }

        /** Crash points judged so far. */
        public int judged() {
            return judged.get();
        }

        /** For a failure's message: what was judged, the seed, and how to replay or run the whole sweep. */
        public String describe() {
            return FULL ? "crash sweep of " + caseName + ": every point judged (" + judged() + ")"
                    : "crash sweep of " + caseName + ": " + judged() + " of " + reached() + " points judged, a sample"
                    + " (1 in " + RATE + ") of seed " + SEED + "; replay with -Dpmemblk.crash.seed=" + SEED + ", judge"
                    + " every point with -Dpmemblk.crash.sweep=full (./scripts/test --long does)";
        }
    }

    private static boolean full() {
        String v = setting("pmemblk.crash.sweep", "PMEMBLK_CRASH_SWEEP");
        if (v == null || v.equals("sample")) {
            return false;
        }
        if (v.equals("full")) {
            return true;
        }
        throw new IllegalArgumentException("pmemblk.crash.sweep (PMEMBLK_CRASH_SWEEP) is \"" + v + "\"; allowed: sample"
                + " (the default) or full");
    }

    private static long seed() {
        String given = setting("pmemblk.crash.seed", "PMEMBLK_CRASH_SEED");
        if (given == null) {
            return new Random().nextLong();
        }
        try {
            return Long.parseLong(given.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("pmemblk.crash.seed (PMEMBLK_CRASH_SEED) is \"" + given
                    + "\"; allowed: a decimal long, as a failure's message prints it", e);
        }
    }

    /** A system property, else the environment variable (which reaches every surefire execution's JVM). */
    private static String setting(String property, String env) {
        String v = System.getProperty(property);
        return v != null ? v : System.getenv(env);
    }
}
