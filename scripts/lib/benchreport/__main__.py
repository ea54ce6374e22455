"""The reports of scripts/bench-nbd, scripts/bench-inproc and scripts/bench-vhost: one reading of fio's and
`pmemblk bench`'s JSON, one A/B rule (medians over rounds, ours/baseline below 0.95 in **bold**, the worst row named)
and the Markdown tables they print. Standard library only: it runs with Debian's /usr/bin/python3 and nothing
installed.

  benchreport nbd-cell FIO_JSON JOB SERVER ROUND TICKS RUNTIME HZ   one TSV line of bench-nbd's results
  benchreport vhost-cell FIO_JSON JOB TARGET TICKS QTICKS DMA HZ [IRQS]   one TSV line of bench-vhost's results
  benchreport rate fio|pmemblk RW                                   "IOPS MiB/s" from the JSON on stdin
  benchreport nbd-report / inproc-report / vhost-report ...         the tables (--help lists the options)
  benchreport chart DAT PNG TITLE YLABEL                            a clustered bar chart of a report's data
"""

import argparse
import sys

from .ab import paired_ratios
from .btt import btt_report, read_btt_rounds
from .chart import draw_chart, write_report
from .inproc import inproc_head, inproc_table, read_inproc_results, read_inproc_rounds
from .nbd import nbd_cell, nbd_report, read_nbd_results, read_nbd_rounds
from .results import rate
from .vhost import read_vhost_results, read_vhost_rounds, vhost_cell, vhost_chart_paired, vhost_paired, vhost_report


def main(argv):
    p = argparse.ArgumentParser(prog="benchreport", description=__doc__.split("\n\n")[0])
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
