"""The reports of scripts/bench-nbd, scripts/bench-inproc and scripts/bench-vhost: one reading of fio's and
`pmemblk bench`'s JSON, one A/B rule (medians over rounds, ours/baseline below 0.95 in **bold**, the worst row named)
and the Markdown tables they print. Standard library only: it runs with Debian's /usr/bin/python3 and nothing
installed.

  benchreport.py nbd-cell FIO_JSON JOB SERVER ROUND TICKS RUNTIME HZ   one TSV line of bench-nbd's results
  benchreport.py vhost-cell FIO_JSON JOB TARGET TICKS QTICKS DMA HZ [IRQS]   one TSV line of bench-vhost's results
  benchreport.py rate fio|pmemblk RW                                   "IOPS MiB/s" from the JSON on stdin
  benchreport.py nbd-report / inproc-report / vhost-report ...         the tables (--help lists the options)
  benchreport.py chart DAT PNG TITLE YLABEL                            a clustered bar chart of a report's data
"""

import argparse
import collections
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

SLOW = 0.95  # an A/B row whose ours/baseline is below this is flagged; the noise of one run is about 5 %


def fio_job(text):
    """The first job of fio's JSON output. fio's nbd engine prints "connected" (and fio may print warnings) before
    the JSON itself, so parsing starts at the first brace."""
    return json.loads(text[text.index("{"):])["jobs"][0]


def fio_side(job, rw):
    """The direction a job measured: its write figures for a writing workload, its read figures otherwise."""
    return job["write"] if "write" in rw else job["read"]


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


def rate(kind, text, rw):
    """(IOPS, MiB/s) of one run: fio's libpmem engine (`kind` fio) or `pmemblk bench --json` (`kind` pmemblk)."""
    if kind == "pmemblk":
        d = json.loads(text)
        return d["iops"], d["mib_per_s"]
    side = fio_side(fio_job(text), rw)
    return side["iops"], side["bw"] / 1024


def median(rows, k):
    """The median of field k over the rounds of a cell, None for a cell that has no successful round."""
    return statistics.median(r[k] for r in rows) if rows else None


def ab_ratio(ours, other, baseline):
    """The text of a ratio cell and the ratio; bold when the other side is the baseline and ours is slower by more
    than the noise; "-" when either side failed."""
    if not (ours and other):
        return "-", None
    x = ours / other
    return (f"**{x:.2f}**" if baseline and x < SLOW else f"{x:.2f}"), x


def ab_columns(v, ratios, with_paired, paired_x, name, ab_rows):
    """A row's ratio cells: ours against each of ratios (v: name -> value), then the paired ratio when the run has
    one. Appends to ab_rows the (ratio, name) the verdict reads: the paired one when there is a paired column, else
    ours/baseline."""
    cells = []
    for r in ratios:
        text, x = ab_ratio(v["ours"], v[r], r == "baseline" and not with_paired)
        cells.append(text)
        if r == "baseline" and x is not None and not with_paired:
            ab_rows.append((x, name))
    if with_paired:
        cells.append("-" if paired_x is None else (f"**{paired_x:.2f}**" if paired_x < SLOW else f"{paired_x:.2f}"))
        if paired_x is not None:
            ab_rows.append((paired_x, name))
    return cells


def ab_summary(rows, what):
    """The A/B verdict line: how many rows, the worst one, how many below the threshold. rows: (ratio, name)."""
    if not rows:
        return f"A/B: 0 rows (every {what} failed on ours or the baseline)."
    worst = min(rows)
    slow = sum(1 for x, _ in rows if x < SLOW)
    return f"A/B: {len(rows)} rows, worst ours/baseline {worst[0]:.2f} ({worst[1]}); {slow} row(s) below {SLOW}."


def ab_note(ours_desc, base_desc, alternated):
    return (f"ours = {ours_desc}; baseline = {base_desc}. Even rounds ran the {alternated} in reverse order; "
            f"ours/baseline below {SLOW} is **bold**.")


def paired_ratios(rounds, value, ours_name="ours", base_name="baseline"):
    """An A/B run's paired estimate: rounds[(row, prog)] -> {round: measurement}; for each row, the median over the
    rounds both sides completed of ours/baseline within the round (the two ran back to back, so what the machine
    did that minute weighs on both), or no entry when no round has both. value(row, measurement) -> the figure
    compared. ours_name and base_name: the two progs compared."""
    paired = {}
    for (row, prog), ours in rounds.items():
        if prog != ours_name:
            continue
        base = rounds.get((row, base_name), {})
        xs = [value(row, ours[r]) / value(row, base[r]) for r in ours if r in base and value(row, base[r])]
        if xs:
            paired[row] = statistics.median(xs)
    return paired


def paired_note():
    return ("paired = the median over rounds of ours/baseline within a round (the two ran back to back); the"
            " verdict reads it, the ratio of the medians beside it is the same figures reduced the other way.")


def machine_line(now=None):
    """Where and when: the figures of two runs compare only on the same machine."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return f"{now:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, {platform.machine()}; "


def table_head(columns, align):
    return ["| " + " | ".join(columns) + " |", "|" + "".join(f" {a} |" for a in align)]


# ------------------------------------------------------------------------------------------------------------------
# bench-nbd

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


# ------------------------------------------------------------------------------------------------------------------
# bench-inproc

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



# ------------------------------------------------------------------------------------------------------------------
# bench-btt

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


# ------------------------------------------------------------------------------------------------------------------
# bench-vhost

GIB = 1 << 30
VHOST_LABEL = {"pmemblk": "pmemblk vhost", "qsd": "qemu-storage-daemon vhost",
               "qsd-threads": "qemu-storage-daemon vhost, defaults", "nbd": "pmemblk NBD (QEMU client)",
               "pmemblk-dma": "pmemblk vhost, DMA route", "pmemblk-vfio-user": "pmemblk vhost, vfio-user device",
               "pmemblk-alt": "pmemblk vhost, other settings"}
# The targets that run the 2 MiB jobs only, beside pmemblk: they have their own tables, not columns of the main ones.
VHOST_OFFLOAD_TARGETS = ("pmemblk-dma", "pmemblk-vfio-user")
VHOST_BAR = 1.0      # pmemblk's vhost-user-blk at least as fast as qemu-storage-daemon's and as its own NBD path
VHOST_OFFLOAD_BAR = 0.2  # the queue threads' CPU per GiB on the DMA route at most this share of the CPU route's;
                         # on the vfio-user route the whole process's CPU per GiB (the device is out of it)
VHOST_VFIO_USER_BAR = 0.9  # the vfio-user route's throughput at least this share of the soft route's


def vhost_cell(text, job, target, ticks, qticks, dma_bytes, hz, irqs="-", dticks="-"):
    """One result line of bench-vhost: job, target, IOPS, MiB/s, the server's CPU per request in µs (its user+sys
    around the fio run over the requests fio completed: the jobs have no ramp, so both cover the same span), the
    queue threads' CPU seconds per GiB moved ("-" where the server has none), the DMA bytes its metrics counted in
    the run, the bytes fio moved, the guest's interrupts per request (the disk's virtio interrupts around the
    run, "-" when the guest did not count them), the server's CPU seconds per GiB moved, and its device process's
    CPU seconds per GiB moved ("-" where it has none). ticks, qticks and dticks are clock ticks at hz per second."""
    j = fio_job(text)
    if j["error"]:
        raise ValueError(f"fio job {job} on {target}: error {j['error']}")
    ios = j["read"]["total_ios"] + j["write"]["total_ios"]
    moved = j["read"]["io_bytes"] + j["write"]["io_bytes"]
    side = fio_side(j, job.split("-")[0])
    us = ticks / hz * 1e6 / ios if ios else 0
    q = f"{qticks / hz / (moved / GIB):.5f}" if qticks != "-" and moved else "-"
    per = f"{int(irqs) / ios:.3f}" if irqs != "-" and ios else "-"
    gib = f"{ticks / hz / (moved / GIB):.5f}" if moved else "-"
    d = f"{dticks / hz / (moved / GIB):.5f}" if dticks != "-" and moved else "-"
    return (f"{job}\t{target}\t{side['iops']:.1f}\t{side['bw'] / 1024:.1f}\t{us:.2f}\t{q}\t{dma_bytes}\t{moved}\t{per}"
            f"\t{gib}\t{d}")


def read_vhost_results(path):
    """cells[(job, target)] -> (iops, mib_s, cpu_us, qcpu_s_per_gib or None, dma_bytes, io_bytes, guest interrupts
    per request or None, the server's CPU s/GiB or None, its device process's CPU s/GiB or None), each the median
    over the rounds of that cell (bench-vhost --repeat), or None when one of its rounds failed. Lines of an older
    bench-vhost have no interrupt field, nor the CPU per GiB fields."""
    rounds = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[2] == "FAIL":
                rounds[(fields[0], fields[1])].append(None)
                continue
            iops, mibs, us = (float(x) for x in fields[2:5])
            q = None if fields[5] == "-" else float(fields[5])
            irq, gib, dev = (None if len(fields) <= i or fields[i] == "-" else float(fields[i]) for i in (8, 9, 10))
            rounds[(fields[0], fields[1])].append((iops, mibs, us, q, int(fields[6]), int(fields[7]), irq, gib, dev))
    cells = {}
    for key, rows in rounds.items():
        if any(r is None for r in rows):
            cells[key] = None
            continue
        q, irq, gib, dev = ([r[i] for r in rows if r[i] is not None] for i in (3, 6, 7, 8))
        cells[key] = (median(rows, 0), median(rows, 1), median(rows, 2), statistics.median(q) if q else None,
                      int(median(rows, 4)), int(median(rows, 5)), statistics.median(irq) if irq else None,
                      statistics.median(gib) if gib else None, statistics.median(dev) if dev else None)
    return cells


def read_vhost_rounds(path):
    """rounds[(job, target)] -> {round: the figure vhost_value reads} of the successful runs (for vhost_paired). A
    run's round is how many runs of the same job and target came before it in the file: bench-vhost runs its whole
    plan once per round, so the n-th run of each cell is round n, failed runs counted."""
    seen = collections.Counter()
    rounds = collections.defaultdict(dict)
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            key = (fields[0], fields[1])
            rnd = seen[key]
            seen[key] += 1
            if fields[2] != "FAIL":
                rounds[key][rnd] = float(fields[2 if fields[0].startswith("rand") else 3])
    return rounds


def vhost_paired(rounds, jobs, others, ours="pmemblk"):
    """paired[(job, other)] -> the median over the rounds both ran of ours/other within the round: the runs of a
    job in one round follow each other (the order rotated), so a slow minute of the machine weighs on both, where the
    ratio of the medians may compare one server's fast round with the other's slow one."""
    return {(job, other): x for other in others
            for job, x in paired_ratios(rounds, lambda job, m: m, ours, other).items() if job in jobs}


def vhost_chart_paired(rounds, jobs, targets):
    """The chart's bars with rounds: chart[(job, target)] -> target/qsd paired as vhost_paired pairs pmemblk."""
    return {(job, t): x for t in targets if t != "qsd" and t not in VHOST_OFFLOAD_TARGETS
            for (job, _), x in vhost_paired(rounds, jobs, ("qsd",), ours=t).items()}


def vhost_value(cells, job, target):
    """IOPS for random jobs, MiB/s for sequential ones (as nbd_fmt prints them); None when the run failed or was not
    made."""
    c = cells.get((job, target))
    return None if c is None else c[0 if job.startswith("rand") else 1]


def vhost_report(cells, targets, jobs, *, runtime, size, repeat=1, guest="", paired=None, chart_paired=None,
                 alt=None, alt_sets="", alt_base="", vfio_user=None, now=None, warmup=0):
    """The Markdown report of bench-vhost and the chart's data rows (throughput relative to qemu-storage-daemon).
    targets: the names run, in bench-vhost's order (pmemblk, qsd, qsd-threads, nbd, pmemblk-dma, ...). paired:
    vhost_paired's ratios; with more than one round they get their own columns and the bar reads them, and the chart
    draws chart_paired's (vhost_chart_paired) when given, so that it shows what the bar judges. alt: vhost_paired's
    ratios of pmemblk-alt (pmemblk with alt_sets, of the build alt_base names when given) over pmemblk, an A/B of
    settings or of builds in one guest; it is reported, never judged. vfio_user: vhost_paired's ratios of
    pmemblk-vfio-user over pmemblk-dma (read with more than one round). qsd-threads (the peer at its defaults) gets
    a ratio column of its own, never judged: the bar is against the peer at its best (qsd)."""
    # The offload targets alone (an A/B of the DMA routes): their own figures in the tables, not tables of no column.
    main = [t for t in targets if t not in VHOST_OFFLOAD_TARGETS] or list(targets)
    ratios = [t for t in ("qsd", "nbd") if t in main and "pmemblk" in main]
    info = [t for t in ("qsd-threads",) if t in main and "pmemblk" in main]
    with_paired = paired is not None and repeat > 1
    label = dict(VHOST_LABEL, **({"pmemblk-alt": f"pmemblk vhost, baseline {alt_base.split()[0]}"} if alt_base else {}))
    lines = [
        "# vhost-user-blk: pmemblk vs qemu-storage-daemon and pmemblk's NBD export (one guest, one run)",
        "",
        machine_line(now) + f"{guest}fio libaio direct=1 in the guest, the same jobs on each disk in turn (the order "
        f"rotated per job and round), {runtime} s each, "
        + (f"after an unmeasured {warmup} s warm-up of each job on each disk alike" if int(warmup) else "no ramp")
        + f", {repeat} round(s), the median shown; {size} disks on "
        "/dev/shm. The guest is emulated (TCG): "
        "compare ratios, not figures." + (" paired = the median over rounds of pmemblk's figure over the other's in"
                                          " the same round (they ran one after the other); the bar reads it, the ratio"
                                          " of the medians beside it is the same figures reduced the other way."
                                          if with_paired else ""),
        "Disks: " + "; ".join(f"{label[t]} ({t})" for t in targets) + ". IOPS for random jobs, MiB/s for sequential ones.",
        "",
    ]
    lines += table_head(["job"] + [label[t] for t in main] + [f"pmemblk/{t}" for t in ratios]
                        + ([f"paired /{t}" for t in ratios] if with_paired else [])
                        + [f"{'paired ' if with_paired else ''}pmemblk/{t} (not judged)" for t in info],
                        ["---"] + ["---:"] * (len(main) + len(ratios) * (2 if with_paired else 1) + len(info)))
    chart, short, judged = [], [], 0
    for job in jobs:
        v = {t: vhost_value(cells, job, t) for t in main}
        row = [nbd_fmt(job, v[t]) for t in main]
        cleared = True
        judged_cells = []
        for r in ratios:
            text, x = ab_ratio(v["pmemblk"], v[r], False)
            if with_paired:
                # A failed round fails the cell (v None): its paired ratio is not judged on the other rounds either.
                px = paired.get((job, r)) if v["pmemblk"] and v[r] else None
                judged_cells.append(("-", None) if px is None else (f"{px:.2f}", px))
                row.append(text)
            else:
                judged_cells.append((text, x))
        for text, x in judged_cells:
            if x is not None and x < VHOST_BAR:
                text, cleared = f"**{text}**", False
            row.append(text)
            cleared = cleared and x is not None
        for t in info:
            x = (paired or {}).get((job, t)) if with_paired else ab_ratio(v["pmemblk"], v[t], False)[1]
            row.append("-" if x is None or not (v["pmemblk"] and v[t]) else f"{x:.2f}")
        if ratios:
            judged += 1
            if not cleared:
                short.append(job)
        lines.append(f"| {job} | " + " | ".join(row) + " |")
        if v.get("qsd"):
            if with_paired and chart_paired is not None:
                bars = [1.0 if t == "qsd" else (chart_paired.get((job, t), 0) if v[t] else 0) for t in main]
            else:
                bars = [v[t] / v["qsd"] if v[t] else 0 for t in main]
            chart.append(job + "".join(f"\t{b:.3f}" for b in bars))
    lines += ["", "Server CPU per request (user+sys µs of the server process around the run, over the requests fio"
              " completed; lower is better):", ""]
    lines += table_head(["job"] + [label[t] for t in main], ["---"] + ["---:"] * len(main))
    for job in jobs:
        c = {t: cells.get((job, t)) for t in main}
        lines.append(f"| {job} | " + " | ".join(f"{c[t][2]:.1f}" if c[t] else "-" for t in main) + " |")
    lines.append("")
    if any(c and c[6] is not None for c in cells.values()):
        # An interrupt costs an emulated guest far more than a real one: fewer per request is the device batching
        # completions (EVENT_IDX), and where throughput differs at the same server CPU it often tells why.
        lines += ["Guest interrupts per request (the disk's virtio interrupts in the guest's /proc/interrupts around"
                  " the run, over the requests fio completed):", ""]
        lines += table_head(["job"] + [label[t] for t in main], ["---"] + ["---:"] * len(main))
        for job in jobs:
            c = {t: cells.get((job, t)) for t in main}
            lines.append(f"| {job} | " + " | ".join(f"{c[t][6]:.2f}" if c[t] and c[t][6] is not None else "-"
                                                    for t in main) + " |")
        lines.append("")
    if ratios:
        lines += [f"Bar: pmemblk's vhost-user-blk at least {VHOST_BAR}x " + " and ".join(label[r] for r in ratios)
                  + (" (paired)" if with_paired else "") + f": {judged - len(short)} of {judged} jobs clear it" + (f"; below: {', '.join(short)}." if short else "."), ""]
    if alt is not None and "pmemblk-alt" in main and "pmemblk" in main:
        lines += vhost_alt(cells, jobs, alt, alt_sets, repeat, alt_base)
    lines += vhost_offload(cells, jobs)
    lines += vhost_vfio_user(cells, jobs, vfio_user if repeat > 1 else None)
    chart_data = ("job\t" + "\t".join(label[t] for t in main) + "\n" + "\n".join(chart) + "\n") if chart else ""
    return lines, chart_data


def vhost_alt(cells, jobs, alt, alt_sets, repeat, alt_base=""):
    """The A/B: pmemblk-alt's throughput over pmemblk's, paired by round when there are rounds. pmemblk-alt is
    pmemblk with alt_sets, or the baseline build alt_base names (with alt_sets, if any)."""
    paired = ", paired by round" if repeat > 1 else ""
    if alt_base:
        lines = [f"A/B of builds: baseline {alt_base}'s pmemblk vhost" + (f" with {alt_sets}" if alt_sets else "")
                 + f" (pmemblk-alt) over this tree's pmemblk vhost{paired}; below 1.0 this tree is faster; not judged:",
                 ""]
    else:
        lines = [f"A/B of settings: pmemblk vhost with {alt_sets or '(none given)'} (pmemblk-alt) over pmemblk vhost"
                 f" with the defaults{paired}; not judged:", ""]
    lines += table_head(["job", "pmemblk-alt/pmemblk"], ["---", "---:"])
    for job in jobs:
        a, b = vhost_value(cells, job, "pmemblk-alt"), vhost_value(cells, job, "pmemblk")
        x = alt.get((job, "pmemblk")) if repeat > 1 else (a / b if a and b else None)
        lines.append(f"| {job} | {'-' if x is None or not (a and b) else f'{x:.2f}'} |")
    return lines + [""]


def vhost_offload(cells, jobs):
    """The offload figure: the pmemblk queue threads' CPU seconds per GiB moved on the 2 MiB jobs, CPU route
    (pmemblk) against DMA route (pmemblk-dma), and how many of the bytes moved the DMA route's metrics counted."""
    big = [j for j in jobs if j.split("-")[1] == "2m" and (j, "pmemblk-dma") in cells]
    if not big:
        return []
    lines = ["Offload: CPU time of the queue threads (vhost-blk-qN) per GiB moved at 2 MiB, CPU route (dma.engine=none)"
             " against DMA route (dma.engine=soft: the software engine's own thread does the copy, off the queue"
             " threads); DMA bytes = what the server's metrics counted on the DMA route over the bytes fio moved:", ""]
    lines += table_head(["job", "CPU route (s/GiB)", "DMA route (s/GiB)", "DMA/CPU", "DMA bytes / bytes moved"],
                        ["---", "---:", "---:", "---:", "---:"])
    passed = 0
    for job in big:
        cpu, dma = cells.get((job, "pmemblk")), cells.get((job, "pmemblk-dma"))
        a, b = (c[3] if c else None for c in (cpu, dma))
        ratio = "-"
        if a and b is not None:
            x = b / a
            passed += x <= VHOST_OFFLOAD_BAR
            ratio = f"{x:.2f}" if x <= VHOST_OFFLOAD_BAR else f"**{x:.2f}**"
        share = f"{dma[4] / dma[5]:.3f}" if dma and dma[5] else "-"
        a, b = ("-" if y is None else f"{y:.4f}" for y in (a, b))
        lines.append(f"| {job} | {a} | {b} | {ratio} | {share} |")
    lines += ["", f"Offload bar: DMA/CPU at most {VHOST_OFFLOAD_BAR} on {passed} of {len(big)} 2 MiB jobs.", ""]
    return lines


def vhost_vfio_user(cells, jobs, paired=None):
    """The offload with the device out of the server's process (pmemblk-vfio-user) on the 2 MiB jobs, beside the CPU
    route (pmemblk) and the in-process soft device (pmemblk-dma): the server's whole process CPU per GiB moved (the
    copies leave it for the device process), the device process's CPU per GiB beside it, and the throughput against
    the soft route's (paired by round when paired is given). Bars: the server's CPU at most VHOST_OFFLOAD_BAR of the
    CPU route's, throughput at least VHOST_VFIO_USER_BAR of the soft route's."""
    big = [j for j in jobs if j.split("-")[1] == "2m" and (j, "pmemblk-vfio-user") in cells]
    if not big:
        return []
    lines = ["Offload to a device process (dma.engine=vfio-user: the software I/OAT device in `pmemblk dma-device`,"
             " reached over vfio-user) at 2 MiB: the server process's CPU time per GiB moved (utime+stime of the whole"
             " process) on the CPU route, the soft route (the device in the server's process) and the vfio-user route;"
             " the device process's own CPU per GiB beside it; throughput over the soft route's"
             + (" (paired by round)" if paired is not None else "") + ":", ""]
    lines += table_head(["job", "CPU route (s/GiB)", "soft route (s/GiB)", "vfio-user route (s/GiB)", "vfio-user/CPU",
                         "device process (s/GiB)", "soft MiB/s", "vfio-user MiB/s", "vfio-user/soft",
                         "DMA bytes / bytes moved"], ["---"] + ["---:"] * 9)
    cpu_ok = tput_ok = 0
    fmt = lambda y: "-" if y is None else f"{y:.4f}"  # noqa: E731
    for job in big:
        cpu, soft, vu = (cells.get((job, t)) for t in ("pmemblk", "pmemblk-dma", "pmemblk-vfio-user"))
        a, b, c = (x[7] if x else None for x in (cpu, soft, vu))
        ratio = "-"
        if a and c is not None:
            x = c / a
            cpu_ok += x <= VHOST_OFFLOAD_BAR
            ratio = f"{x:.2f}" if x <= VHOST_OFFLOAD_BAR else f"**{x:.2f}**"
        t = "-"
        if soft and vu:
            x = paired.get((job, "pmemblk-dma")) if paired is not None else vu[1] / soft[1] if soft[1] else None
            if x is not None:
                tput_ok += x >= VHOST_VFIO_USER_BAR
                t = f"{x:.2f}" if x >= VHOST_VFIO_USER_BAR else f"**{x:.2f}**"
        share = f"{vu[4] / vu[5]:.3f}" if vu and vu[5] else "-"
        lines.append(f"| {job} | {fmt(a)} | {fmt(b)} | {fmt(c)} | {ratio} | {fmt(vu[8] if vu else None)} | "
                     f"{'-' if not soft else f'{soft[1]:.0f}'} | {'-' if not vu else f'{vu[1]:.0f}'} | {t} | {share} |")
    lines += ["", f"vfio-user bars: the server's CPU per GiB at most {VHOST_OFFLOAD_BAR} of the CPU route's on {cpu_ok}"
              f" of {len(big)} 2 MiB jobs; throughput at least {VHOST_VFIO_USER_BAR} of the soft route's on {tput_ok}"
              f" of {len(big)}.", ""]
    return lines


def write_report(out, stem, lines, chart_data):
    """A report's files: OUT/STEM.md, and OUT/STEM.dat for its chart when it has data for one; the report is printed
    too."""
    with open(os.path.join(out, stem + ".md"), "w") as f:
        f.write("\n".join(lines))
    if chart_data:
        with open(os.path.join(out, stem + ".dat"), "w") as f:
            f.write(chart_data)
    print("\n".join(lines))


def draw_chart(dat, png, title, ylabel):
    """A clustered bar chart (gnuplot, pngcairo) of a report's data file: a header line naming the columns, then one
    row per job (its name, then one value per column)."""
    with open(dat) as f:
        columns = len(f.readline().rstrip("\n").split("\t"))
    script = f"""set terminal pngcairo size 1100,520 noenhanced font ",10"
set output "{png}"
set title "{title}"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set ylabel "{ylabel}"
set yrange [0:*]
set grid ytics
set xtics rotate by -30
set rmargin 9
set key top left
set datafile separator "\\t"
set key autotitle columnhead
plot for [c=2:{columns}] "{dat}" using c:xtic(1)
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True, timeout=120)

# ------------------------------------------------------------------------------------------------------------------

def main(argv):
    p = argparse.ArgumentParser(prog="benchreport.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("nbd-cell", help="one TSV result line of bench-nbd from fio's JSON")
    c.add_argument("fio_json")
    c.add_argument("job")
    c.add_argument("server")
    c.add_argument("round")
    c.add_argument("ticks", type=int)
    c.add_argument("runtime", type=int)
    c.add_argument("hz", type=int)
    v = sub.add_parser("vhost-cell", help="one TSV result line of bench-vhost from fio's JSON")
    v.add_argument("fio_json")
    v.add_argument("job")
    v.add_argument("target")
    v.add_argument("ticks", type=int)
    v.add_argument("qticks", help='clock ticks of the queue threads, or "-"')
    v.add_argument("dma_bytes", type=int)
    v.add_argument("hz", type=int)
    v.add_argument("irqs", nargs="?", default="-", help='the guest\'s interrupts of the disk during the run, or "-"')
    v.add_argument("dticks", nargs="?", default="-", help='clock ticks of the device process, or "-"')
    r = sub.add_parser("rate", help='"IOPS MiB/s" of fio (libpmem) or pmemblk bench JSON on stdin')
    r.add_argument("kind", choices=("fio", "pmemblk"))
    r.add_argument("rw")
    ab = argparse.ArgumentParser(add_help=False)
    ab.add_argument("--results", required=True, help="the TSV the bench script wrote")
    ab.add_argument("--size", required=True)
    ab.add_argument("--repeat", required=True)
    ab.add_argument("--sets", default="")
    ab.add_argument("--ours-desc", default="")
    ab.add_argument("--base-desc", default="")
    n = sub.add_parser("nbd-report", parents=[ab], help="bench-nbd's report: OUT/STEM.md (and STEM.dat for the chart)")
    n.add_argument("--out", required=True)
    n.add_argument("--stem", required=True)
    n.add_argument("--jobs", required=True, help="comma list, in table order")
    n.add_argument("--runtime", required=True)
    n.add_argument("--ours-cpu", default="?")
    n.add_argument("--base-cpu", default="")
    n.add_argument("--tls", action="store_true")
    n.add_argument("--qemu-desc", default="?")
    n.add_argument("--fresh", action="store_true", help="the pmemblk servers were started afresh every round")
    n.add_argument("servers", nargs="+", metavar="NAME=LABEL")
    i = sub.add_parser("inproc-report", parents=[ab], help="bench-inproc's table (and the A/B file with --ab-file)")
    i.add_argument("--seconds", required=True)
    i.add_argument("--ab-file", default="")
    i.add_argument("progs", nargs="+", metavar="PROGRAM")
    vr = sub.add_parser("vhost-report", help="bench-vhost's report: OUT/STEM.md (and STEM.dat for the chart)")
    vr.add_argument("--results", required=True)
    vr.add_argument("--out", required=True)
    vr.add_argument("--stem", required=True)
    vr.add_argument("--jobs", required=True, help="comma list, in table order")
    vr.add_argument("--runtime", required=True)
    vr.add_argument("--warmup", default="0", help="seconds of each job run unmeasured before its first run on a disk")
    vr.add_argument("--size", required=True)
    vr.add_argument("--repeat", type=int, default=1)
    vr.add_argument("--guest", default="", help="the guest, as the report's heading describes it")
    vr.add_argument("--alt-sets", default="", help="pmemblk-alt's settings, as the report names them")
    vr.add_argument("--alt-base", default="", help="pmemblk-alt's build when it is a baseline: its short sha and name")
    vr.add_argument("targets", nargs="+")
    bt = sub.add_parser("btt-report", help="bench-btt's report (printed, and written to --out when given)")
    bt.add_argument("--results", required=True)
    bt.add_argument("--seconds", required=True)
    bt.add_argument("--runtime", required=True)
    bt.add_argument("--size", required=True)
    bt.add_argument("--repeat", required=True)
    bt.add_argument("--sector", required=True)
    bt.add_argument("--out", default="")
    ch = sub.add_parser("chart", help="a clustered bar chart of a report's data file (gnuplot)")
    ch.add_argument("dat")
    ch.add_argument("png")
    ch.add_argument("title")
    ch.add_argument("ylabel")
    a = p.parse_args(argv)

    if a.cmd == "nbd-cell":
        with open(a.fio_json) as f:
            text = f.read()
        try:
            print(nbd_cell(text, a.job, a.server, a.round, a.ticks, a.runtime, a.hz))
        except ValueError as e:
            sys.exit(str(e))
    elif a.cmd == "vhost-cell":
        with open(a.fio_json) as f:
            text = f.read()
        qticks = a.qticks if a.qticks == "-" else int(a.qticks)
        dticks = a.dticks if a.dticks == "-" else int(a.dticks)
        try:
            print(vhost_cell(text, a.job, a.target, a.ticks, qticks, a.dma_bytes, a.hz, a.irqs, dticks))
        except ValueError as e:
            sys.exit(str(e))
    elif a.cmd == "vhost-report":
        jobs = a.jobs.split(",")
        rounds = read_vhost_rounds(a.results)
        write_report(a.out, a.stem, *vhost_report(read_vhost_results(a.results), a.targets, jobs,
                                                  runtime=a.runtime, size=a.size, repeat=a.repeat, guest=a.guest,
                                                  warmup=a.warmup,
                                                  paired=vhost_paired(rounds, jobs, ("qsd", "nbd", "qsd-threads")),
                                                  chart_paired=vhost_chart_paired(rounds, jobs, a.targets),
                                                  alt=vhost_paired(rounds, jobs, ("pmemblk",), ours="pmemblk-alt"),
                                                  alt_sets=a.alt_sets, alt_base=a.alt_base,
                                                  vfio_user=vhost_paired(rounds, jobs, ("pmemblk-dma",),
                                                                         ours="pmemblk-vfio-user")))
    elif a.cmd == "btt-report":
        rounds, order = read_btt_rounds(a.results)
        lines = btt_report(rounds, order, seconds=a.seconds, runtime=a.runtime, size=a.size, repeat=a.repeat,
                           sector=a.sector)
        print("\n".join(lines))
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(lines) + "\n")
    elif a.cmd == "chart":
        draw_chart(a.dat, a.png, a.title, a.ylabel)
    elif a.cmd == "rate":
        iops, mibs = rate(a.kind, sys.stdin.read(), a.rw)
        print(iops, mibs)
    elif a.cmd == "nbd-report":
        servers = [tuple(s.split("=", 1)) for s in a.servers]
        paired = None
        if any(n == "baseline" for n, _ in servers):
            paired = paired_ratios(read_nbd_rounds(a.results), lambda job, m: m[0 if job.startswith("rand") else 1])
        write_report(a.out, a.stem, *nbd_report(read_nbd_results(a.results), servers, a.jobs.split(","),
                                                runtime=a.runtime, size=a.size, repeat=a.repeat, sets=a.sets,
                                                ours_cpu=a.ours_cpu, base_cpu=a.base_cpu, base_desc=a.base_desc,
                                                ours_desc=a.ours_desc, tls=a.tls, qemu_desc=a.qemu_desc,
                                                fresh=a.fresh, paired=paired))
    else:
        cells, order = read_inproc_results(a.results)
        paired = None
        if "baseline" in a.progs:
            paired = paired_ratios(read_inproc_rounds(a.results), lambda key, m: m[0 if key[1] == "4k" else 1])
        lines = inproc_table(cells, order, a.progs, a.base_desc, paired)
        print("\n".join(lines))
        if a.ab_file:
            head = inproc_head(seconds=a.seconds, size=a.size, repeat=a.repeat, sets=a.sets,
                               ours_desc=a.ours_desc, base_desc=a.base_desc, paired=paired is not None)
            with open(a.ab_file, "w") as f:
                f.write("\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
