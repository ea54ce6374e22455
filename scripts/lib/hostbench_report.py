#!/usr/bin/env python3
"""The report of bench-vhost's host mode (scripts/bench-vhost-host): from the rounds file (one line per run:
round, job, target, ios, bytes, nanos, server_ticks, load_ticks, and where measured queue_ticks (the server's
vhost-blk-qN threads), device_ticks (a DMA device's own process) and queue_sleeps (the queue threads' voluntary
context switches)), a markdown table per target of the medians, and,
when pmemblk-alt ran, per job the paired ratios pmemblk-alt/pmemblk of each round with their median and spread, and
whether the spread lets a 5% bar be read."""
import argparse
import csv
import statistics
import sys
from collections import defaultdict

BAR = 0.05


def quartiles(xs):
    """Lower and upper quartile (the median of each half), as a box plot draws them; the value itself for one."""
    s = sorted(xs)
    if len(s) < 2:
        return s[0], s[0]
    h = len(s) // 2
    return statistics.median(s[:h]), statistics.median(s[-h:])


def load(path):
    runs = defaultdict(dict)  # (job, target) -> round -> figures
    with open(path, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            ios, nanos = int(row["ios"]), int(row["nanos"])
            if ios <= 0 or nanos <= 0:
                raise SystemExit(f"hostbench_report: round {row['round']} {row['job']} on {row['target']}: "
                                 f"{ios} requests in {nanos} ns, no figure can be made of it")
            gib = int(row["bytes"]) / 2**30
            runs[(row["job"], row["target"])][int(row["round"])] = {
                "iops": ios / (nanos / 1e9),
                "mibs": int(row["bytes"]) / (nanos / 1e9) / 2**20,
                "server": ticks(row, "server_ticks", ios),
                "load": int(row["load_ticks"]) / ios,
                "server_gib": ticks(row, "server_ticks", gib),
                "queue_gib": ticks(row, "queue_ticks", gib),
                "device_gib": ticks(row, "device_ticks", gib),
                "sleeps": ticks(row, "queue_sleeps", ios),
            }
    return runs


def ticks(row, column, per):
    """A count (ticks, sleeps) over `per` (requests, GiB), or None where not measured ("-", or an older file)."""
    v = row.get(column)
    return None if v in (None, "", "-") or per <= 0 else int(v) / per


def med(rounds, key, scale=1.0):
    xs = [r[key] for r in rounds.values() if r[key] is not None]
    return statistics.median(xs) * scale if xs else None


def fmt(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def ratio_cells(ours, alt, key):
    """Paired ratios alt/ours over the rounds both ran; (median, min, max, q1, q3, n) or None."""
    common = sorted(set(ours) & set(alt))
    rs = [alt[r][key] / ours[r][key] for r in common
          if ours[r][key] is not None and alt[r][key] is not None and ours[r][key] > 0]
    if not rs:
        return None
    q1, q3 = quartiles(rs)
    return statistics.median(rs), min(rs), max(rs), q1, q3, len(rs)


def verdict(cells, higher_is_better):
    """Whether the median is inside or outside the 5% bar and whether the quartiles are narrow enough to tell."""
    m, lo, hi, q1, q3, n = cells
    worse = (1 - m) if higher_is_better else (m - 1)
    spread = q3 - q1
    if n < 3:
        return "too few rounds to judge"
    if spread >= BAR:
        return f"not resolvable (quartile spread {spread:.1%} >= 5%)"
    return f"{'slower' if worse > BAR else 'within'} 5% ({'+' if worse > 0 else ''}{worse:.1%} worse)" if higher_is_better \
        else f"{'costlier' if worse > BAR else 'within'} 5% ({'+' if worse > 0 else ''}{worse:.1%} more CPU)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hz", type=int, required=True)
    ap.add_argument("--runtime", required=True)
    ap.add_argument("--size", required=True)
    ap.add_argument("--verify", type=int, default=0)
    ap.add_argument("--route", default="cpu")
    ap.add_argument("--ours", default="this tree")
    ap.add_argument("--base", default="")
    ap.add_argument("--alt-sets", default="")
    ap.add_argument("--host", default="")
    ap.add_argument("--jobs", required=True)
    ap.add_argument("targets", nargs="+")
    a = ap.parse_args()
    runs = load(a.rounds)
    jobs = a.jobs.split(",")
    us = 1e6 / a.hz
    rounds_n = max((max(v) for v in runs.values()), default=0)
    out = ["# vhost-user-blk, host mode (no guest)", ""]
    out.append(f"bench-vhost --host: a vhost-user-blk front end on the host (bench/vhost-load) drives each server with "
               f"bench-vhost's jobs, {a.runtime} s per run, {rounds_n} rounds, the order rotated per job and round; "
               f"disks of {a.size} in /dev/shm, 2 queues, prefilled; route {a.route}. Host: {a.host}.")
    if a.verify:
        out.append("")
        out.append("**Verify mode**: every write was read back and every read checked, so these figures include the "
                   "checks' requests and CPU: not figures to compare.")
    out.append("")
    out.append(f"- pmemblk: {a.ours}")
    if "pmemblk-alt" in a.targets:
        out.append(f"- pmemblk-alt: {a.base or 'the same build'}" + (f" with {a.alt_sets}" if a.alt_sets else ""))
    out += ["", "Medians over the rounds; CPU per request is utime+stime of the process over the requests it "
            "completed (server: around the generator's run; load: the generator's own JVM); per GiB, CPU seconds "
            "over the bytes moved: the server's process, its queue threads (vhost-blk-qN) alone, and a DMA device's "
            "own process (vfio-user route); the queue threads' sleeps (voluntary context switches) per request.", ""]
    out.append("| job | target | IOPS | MiB/s | server CPU us/req | load CPU us/req | server s/GiB | queue threads "
               "s/GiB | device s/GiB | queue sleeps/req | runs |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for j in jobs:
        for t in a.targets:
            r = runs.get((j, t))
            if not r:
                out.append(f"| {j} | {t} | FAIL | | | | | | | | 0 |")
                continue
            sec = 1.0 / a.hz
            out.append(f"| {j} | {t} | {fmt(med(r, 'iops'), 0)} | {fmt(med(r, 'mibs'))} | "
                       f"{fmt(med(r, 'server', us), 2)} | {fmt(med(r, 'load', us), 2)} | "
                       f"{fmt(med(r, 'server_gib', sec), 4)} | {fmt(med(r, 'queue_gib', sec), 4)} | "
                       f"{fmt(med(r, 'device_gib', sec), 4)} | {fmt(med(r, 'sleeps'), 2)} | {len(r)} |")
    if "pmemblk-alt" in a.targets:
        out += ["", "## pmemblk-alt / pmemblk, paired by round", "",
                "Each round's ratio of its two back-to-back runs; the median and the spread of those ratios "
                "(min-max, and the quartiles). A 5% bar is readable where the quartile spread is under 5%.", "",
                "| job | IOPS ratio: median | min-max | quartiles | verdict | server CPU/req ratio: median | min-max | verdict "
                "| queue threads s/GiB ratio: median | min-max |",
                "|---|---:|---:|---:|---|---:|---:|---|---:|---:|"]
        for j in jobs:
            ours, alt = runs.get((j, "pmemblk"), {}), runs.get((j, "pmemblk-alt"), {})
            t = ratio_cells(ours, alt, "iops")
            c = ratio_cells(ours, alt, "server")
            q = ratio_cells(ours, alt, "queue_gib")
            if not t:
                out.append(f"| {j} | - | | | no paired round | | | | | |")
                continue
            row = f"| {j} | {t[0]:.3f} | {t[1]:.3f}-{t[2]:.3f} | {t[3]:.3f}-{t[4]:.3f} | {verdict(t, True)} |"
            row += f" {c[0]:.3f} | {c[1]:.3f}-{c[2]:.3f} | {verdict(c, False)} |" if c else " - | | |"
            row += f" {q[0]:.3f} | {q[1]:.3f}-{q[2]:.3f} |" if q else " - | |"
            out.append(row)
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
