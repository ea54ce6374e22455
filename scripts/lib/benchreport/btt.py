"""scripts/bench-btt: the BTT layout against the raw one, paired per round and held to a bar per workload."""

import collections
import statistics

from .results import machine_line, table_head


# The cost a BTT may have against the raw layout, by workload (the bars: reads 0.9x raw, writes 0.7x raw).
BTT_BAR = {"randread": 0.9, "randwrite": 0.7}


def read_btt_rounds(path):
    """rounds[(path, rw, bs, qd, jobs)][layout] -> {round: iops}, and the rows' keys in the order they ran."""
    rounds = collections.defaultdict(lambda: collections.defaultdict(dict))
    order = []
    with open(path) as f:
        for line in f:
            where, rw, bs, qd, jobs, layout, r, iops = line.rstrip("\n").split("\t")
            key = (where, rw, bs, qd, jobs)
            if key not in order:
                order.append(key)
            if iops != "FAIL":
                rounds[key][layout][r] = float(iops)
    return rounds, order


def btt_report(rounds, order, *, seconds, runtime, size, repeat, sector, now=None):
    """bench-btt's report: per row the medians of raw and btt, and the paired btt/raw (median over rounds of the
    ratio within a round, the two run back to back on one machine minute) against the row's bar."""
    lines = [
        "# pmem.layout=btt against raw (one run, alternated per row)",
        "",
        machine_line(now) + f"one {size} file per layout on /dev/shm with PMEM_IS_PMEM_FORCE=1, the two files swapping"
        f" layouts every round; BTT of {sector}-byte sectors; in process: `pmemblk bench` {seconds} s per cell,"
        f" queues=2; over NBD: fio's nbd engine on a unix socket, {runtime} s per cell; {repeat} round(s), median"
        " shown. paired = the median over rounds of btt/raw within a round; the verdict reads it.",
        "",
    ]
    lines += table_head(["path", "workload", "jobs", "raw", "btt", "btt/raw", "paired", "bar"],
                        ["---", "---", "---:", "---:", "---:", "---:", "---:", "---:"])
    misses = []
    for key in order:
        where, rw, bs, qd, jobs = key
        raw, btt = rounds[key].get("raw", {}), rounds[key].get("btt", {})
        m_raw = statistics.median(raw.values()) if raw else None
        m_btt = statistics.median(btt.values()) if btt else None
        xs = [btt[r] / raw[r] for r in btt if r in raw and raw[r]]
        paired = statistics.median(xs) if xs else None
        bar = BTT_BAR.get(rw) if qd != "1" else None  # QD1 rows are shown, not judged: one request has nothing to group
        below = bar and (paired is None or paired < bar - 1e-9)  # 0.85 and 0.95 pair to 0.9, not to 0.8999...
        cell = "-" if paired is None else (f"**{paired:.2f}**" if below else f"{paired:.2f}")
        if below:
            misses.append(f"{where} {bs} {rw} QD{qd} jobs={jobs} ({cell.strip('*')} < {bar})")
        fmt = lambda v: "FAILED" if v is None else f"{v / 1000:.0f}k IOPS"
        ratio = "-" if not (m_raw and m_btt) else f"{m_btt / m_raw:.2f}"
        lines.append(f"| {'in process' if where == 'inproc' else 'NBD'} | {bs} {rw} QD{qd} | {jobs} | {fmt(m_raw)} |"
                     f" {fmt(m_btt)} | {ratio} | {cell} | {bar if bar else '-'} |")
    lines += ["", "Bars: 4k randread at least 0.9x raw, 4k randwrite at least 0.7x raw (QD32 rows). "
              + ("Every judged row meets its bar." if not misses else "Below the bar: " + "; ".join(misses) + ".")]
    return lines
