"""scripts/bench-nbd: one TSV line per fio run (nbd-cell), and its report: throughput, CPU per request, the A/B."""

import collections

from .ab import ab_columns, ab_note, ab_summary, paired_note
from .results import fio_job, fio_side, machine_line, median, table_head


def nbd_cell(text, job, server, rnd, ticks, runtime, hz):
    """One result line of bench-nbd: job, server, round, IOPS, MiB/s and the server's CPU per request in µs.
    The CPU is the server's user+sys over the whole fio run, ramp included, so the requests are estimated as
    IOPS x (runtime + 1 s ramp); it is much steadier than throughput on a shared machine."""
    j = fio_job(text)
    if j["error"]:
        raise ValueError(f"fio job {job} on {server}: error {j['error']}")
    side = fio_side(j, job)
    ops = side["iops"] * (runtime + 1)
    us = ticks / hz * 1e6 / ops if ops else 0
    return f"{job}\t{server}\t{rnd}\t{side['iops']:.1f}\t{side['bw'] / 1024:.1f}\t{us:.2f}"


def read_nbd_results(path):
    """cells[(job, server)] -> [(iops, mib_s, cpu_us)] per successful round; a failed round leaves the key."""
    cells = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[3] == "FAIL":
                cells.setdefault((fields[0], fields[1]), [])
                continue
            cells[(fields[0], fields[1])].append(tuple(float(x) for x in fields[3:6]))
    return cells


def read_nbd_rounds(path):
    """rounds[(job, server)] -> {round: (iops, mib_s, cpu_us)} of the successful rounds (for paired_ratios)."""
    rounds = collections.defaultdict(dict)
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[3] != "FAIL":
                rounds[(fields[0], fields[1])][fields[2]] = tuple(float(x) for x in fields[3:6])
    return rounds


def nbd_value(cells, job, server):
    """IOPS for random jobs, MiB/s for sequential ones; the median over the rounds."""
    return median(cells[(job, server)], 0 if job.startswith("rand") else 1)


def nbd_fmt(job, v):
    if v is None:
        return "FAILED"
    return f"{v / 1000:.1f}k IOPS" if job.startswith("rand") else f"{v:.0f} MiB/s"


def nbd_bar(job, v):
    """The bar a job must clear: at least the best storing peer; 1.3x nbdkit memory for 64k and 2M jobs, 1.1x for
    4k jobs; and 0.9x nbdkit null where null is faster than every storing peer. (value, what) or None."""
    storing = [n for n in ("memory", "qemu") if n in v]
    parts = []
    if storing and all(v[n] for n in storing):
        parts.append((max(v[n] for n in storing), "best storing peer"))
    if v.get("memory"):
        k = 1.1 if "-4k-" in job else 1.3
        parts.append((k * v["memory"], f"{k}x nbdkit memory"))
    if v.get("null") and storing and all(v[n] for n in storing) and v["null"] > max(v[n] for n in storing):
        parts.append((0.9 * v["null"], "0.9x nbdkit null"))
    return max(parts) if parts else None


def nbd_report(cells, servers, jobs, *, runtime, size, repeat, sets="", ours_cpu="?", base_cpu="", base_desc="",
               ours_desc="", tls=False, qemu_desc="?", fresh=False, paired=None, now=None):
    """The Markdown report of bench-nbd and the chart's data rows (ratios to nbdkit memory; empty in an A/B run).
    servers: [(name, label)] in the order they ran. paired: job -> the paired ours/baseline (paired_ratios), which
    an A/B run's verdict reads; without it the verdict reads the ratio of the medians."""
    names = [n for n, _ in servers]
    label = dict(servers)
    ab = "baseline" in names
    ratios = [r for r in ("memory", "qemu", "null", "baseline") if r in names]
    if ab:
        title = f"# NBD A/B: pmemblk (ours) vs baseline {base_desc.split()[0]} (one run, servers alternated per job)"
    else:
        title = "# NBD throughput: pmemblk vs nbdkit and qemu-nbd (one run, servers alternated per job)"
    if tls:
        title += ", every server over TLS 1.3 with client certificates"
    peers_note = []
    if "null" in names:
        peers_note.append("nbdkit null stores nothing: it is the transport limit.")
    if "qemu" in names:
        peers_note.append(f"qemu-nbd serves a raw image on /dev/shm with {qemu_desc}.")
    lines = [
        title,
        "",
        machine_line(now)
        + "fio nbd engine, unix sockets, one connection per job unless the job says -Nconn (N connections, fio numjobs); "
        f"{size} exports; {runtime} s per job (+1 s ramp), "
        f"{repeat} round(s), median shown" + (f"; pmemblk serve {sets}" if sets else "")
        + ("; the pmemblk servers started afresh every round" if fresh else "") + ".",
    ]
    if tls:
        lines.append("TLS: pmemblk nbd.tls=require with nbd.tls.verify-clients (the JDK's SSLEngine); nbdkit --tls=require"
                     " --tls-verify-peer and qemu-nbd tls-creds-x509 verify-peer=on (GnuTLS); same certificates"
                     " (scripts/lib/test-pki, EC P-256); fio's libnbd (GnuTLS) presents a client certificate.")
    lines.append(" ".join(["MiB/s for sequential jobs, IOPS for random ones."] + peers_note))
    if ab:
        lines.append(ab_note(ours_desc, base_desc, "servers") + (" " + paired_note() if paired is not None else ""))
    show_bar = not ab and "memory" in names
    lines.append("")
    with_paired = ab and paired is not None
    lines += table_head(["job"] + [label[n] for n in names] + [f"ours/{label[r]}" for r in ratios]
                        + (["paired"] if with_paired else []) + (["ours/bar"] if show_bar else []),
                        ["---"] + ["---:"] * (len(names) + len(ratios) + with_paired + (1 if show_bar else 0)))
    chart, ab_rows, bar_rows = [], [], []
    for job in jobs:
        v = {n: nbd_value(cells, job, n) for n in names}
        row = [nbd_fmt(job, v[n]) for n in names]
        row += ab_columns(v, ratios, with_paired, (paired or {}).get(job), job, ab_rows)
        if show_bar:
            b = nbd_bar(job, v)
            if b and v["ours"]:
                x = v["ours"] / b[0]
                bar_rows.append((x, job, b[1]))
                row.append(f"**{x:.2f}** ({b[1]})" if x < 1.0 else f"{x:.2f} ({b[1]})")
            else:
                row.append("-")
        lines.append(f"| {job} | " + " | ".join(row) + " |")
        if show_bar and v["memory"]:
            chart.append(job + "".join(f"\t{(v[n] / v['memory'] if v[n] else 0):.3f}" for n in names))
    lines += ["", "Server CPU per request (user+sys µs, median; lower is better; steadier than throughput on a shared"
              " machine):", ""]
    lines += table_head(["job"] + [label[n] for n in names] + (["baseline/ours"] if ab else []),
                        ["---"] + ["---:"] * (len(names) + (1 if ab else 0)))
    for job in jobs:
        c = {n: median(cells[(job, n)], 2) for n in names}
        row = [f"{c[n]:.1f}" if c[n] else "-" for n in names]
        if ab:
            row.append(f"{c['baseline'] / c['ours']:.2f}" if c["ours"] and c["baseline"] else "-")
        lines.append(f"| {job} | " + " | ".join(row) + " |")
    lines.append("")
    if bar_rows:
        short = [f"{j} {x:.2f}" for x, j, _ in sorted(bar_rows) if x < 1.0]
        lines += [f"Bar: {len(bar_rows) - len(short)} of {len(bar_rows)} jobs clear it"
                  + (f"; below: {', '.join(short)}." if short else "."), ""]
    if ab:
        lines += [ab_summary(ab_rows, "job"), ""]
    cpu = f"CPU time of our server over the whole run (user+sys, seconds, all jobs; ps): {ours_cpu}"
    lines += [cpu + (f"; of the baseline's: {base_cpu}." if ab else "."), ""]
    chart_data = ("job\t" + "\t".join(label[n] for n in names) + "\n" + "\n".join(chart) + "\n") if chart else ""
    return lines, chart_data
