"""scripts/bench-inproc: `pmemblk bench` and fio in the process, read from the script's TSV; the table and the A/B."""

import collections

from .ab import ab_columns, ab_note, ab_summary, paired_note
from .results import machine_line, median, table_head


def read_inproc_results(path):
    """cells[(rw, bs, qd, jobs, prog)] -> [(iops, mib_s)] per round, and the rows' keys in the order they ran."""
    cells = collections.defaultdict(list)
    order = []
    with open(path) as f:
        for line in f:
            rw, bs, qd, jobs, prog, _, measured = line.rstrip("\n").split("\t")
            key = (rw, bs, qd, jobs)
            if key not in order:
                order.append(key)
            cells[key + (prog,)].append(tuple(float(x) for x in measured.split()))
    return cells, order


def read_inproc_rounds(path):
    """rounds[((rw, bs, qd, jobs), prog)] -> {round: (iops, mib_s)} (for paired_ratios)."""
    rounds = collections.defaultdict(dict)
    with open(path) as f:
        for line in f:
            rw, bs, qd, jobs, prog, r, measured = line.rstrip("\n").split("\t")
            rounds[((rw, bs, qd, jobs), prog)][r] = tuple(float(x) for x in measured.split())
    return rounds


def inproc_fmt(key, v):
    if v is None:
        return "FAILED"
    return f"{v / 1000:.0f}k IOPS" if key[1] == "4k" else f"{v:.0f} MiB/s"


def inproc_table(cells, order, progs, base_desc="", paired=None):
    """The rows of bench-inproc's table (IOPS for 4k rows, MiB/s otherwise, medians) and, in an A/B run, the
    verdict line (on the paired ratios when given: key -> paired ours/baseline)."""
    ab = "baseline" in progs
    label = {"ours": "ours" if ab else "pmemblk bench", "baseline": f"baseline {base_desc.split()[0]}" if ab else "",
             "fio": "fio libpmem"}
    ratios = [p for p in ("fio", "baseline") if p in progs]
    with_paired = ab and paired is not None
    lines = table_head(["workload", "jobs"] + [label[p] for p in progs] + [f"ours/{r}" for r in ratios]
                       + (["paired"] if with_paired else []),
                       ["---"] * (2 + len(progs) + len(ratios) + with_paired))
    ab_rows = []
    for key in order:
        rw, bs, qd, jobs = key
        name = f"{bs} {rw} QD{qd} jobs={jobs}"
        v = {p: median(cells[key + (p,)], 0 if bs == "4k" else 1) for p in progs}
        row = [inproc_fmt(key, v[p]) for p in progs]
        row += ab_columns(v, ratios, with_paired, (paired or {}).get(key), name, ab_rows)
        lines.append(f"| {bs} {rw} QD{qd} | {jobs} | " + " | ".join(row) + " |")
    if ab:
        lines += ["", ab_summary(ab_rows, "row")]
    return lines


def inproc_head(*, seconds, size, repeat, sets="", ours_desc="", base_desc="", paired=False, now=None):
    """The heading of the A/B file bench-inproc writes (the terminal gets the table alone)."""
    return [
        "# In process A/B: `pmemblk bench` ours vs baseline (one run, alternated per row)",
        "",
        machine_line(now) + f"{size} files on /dev/shm with PMEM_IS_PMEM_FORCE=1; {seconds} s per row and program, "
        f"{repeat} round(s), median shown; queues=2" + (f" {sets}" if sets else "") + ".",
        ab_note(ours_desc, base_desc, "programs") + (" " + paired_note() if paired else ""),
        "",
    ]
