package io.pmemblk.bench.vhostload;

import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One of bench-vhost's fio jobs by its name, RW-BS-qdQD-Nj (bench/fio/vhost/job.fio): {@code random} or
 * sequential, read or write, {@code bytes} per request, {@code depth} requests in flight per job, {@code jobs} jobs,
 * each on its own virtqueue and its own span of the disk (1/jobs of it, as fio's size and offset_increment there).
 */
record Job(String name, boolean random, boolean write, int bytes, int depth, int jobs) {
    private static final Pattern NAME = Pattern.compile("(rand)?(read|write)-([0-9]+)([km])-qd([0-9]+)-([0-9]+)j");
    static final int MAX_BYTES = 64 << 20, MAX_DEPTH = 1024, MAX_JOBS = 16;

    static Job parse(String name) {
        Matcher m = NAME.matcher(name);
        if (!m.matches()) {
            throw new IllegalArgumentException("job '" + name + "' is not RW-BS-qdQD-Nj (RW read, write, randread or"
                    + " randwrite; BS in k or m), e.g. randread-4k-qd32-2j");
        }
        long bytes = Long.parseLong(m.group(3)) << (m.group(4).equals("k") ? 10 : 20);
        int depth = Integer.parseInt(m.group(5)), jobs = Integer.parseInt(m.group(6));
        if (bytes < 512 || bytes % 512 != 0 || bytes > MAX_BYTES) {
            throw new IllegalArgumentException("job '" + name + "': block size " + bytes
                    + " bytes; allowed a multiple of 512 from 512 to " + MAX_BYTES);
        }
        if (depth < 1 || depth > MAX_DEPTH || jobs < 1 || jobs > MAX_JOBS) {
            throw new IllegalArgumentException("job '" + name + "': qd " + depth + " and " + jobs + " jobs; allowed qd 1.."
                    + MAX_DEPTH + " and 1.." + MAX_JOBS + " jobs");
        }
        return new Job(name, m.group(1) != null, m.group(2).equals("write"), (int) bytes, depth, jobs);
    }
}
