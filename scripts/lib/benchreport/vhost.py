"""scripts/bench-vhost: one TSV line per fio run in the guest (vhost-cell), and the report: pmemblk's vhost-user-blk
against qemu-storage-daemon and its own NBD path, the offload tables (DMA and vfio-user routes) and the A/B."""

import collections
import statistics

from .ab import ab_ratio, paired_ratios
from .nbd import nbd_fmt
from .results import fio_job, fio_side, machine_line, median, table_head


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
