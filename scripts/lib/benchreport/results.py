"""Reading fio's and `pmemblk bench`'s JSON, and what every report shares: medians, the machine line, table heads."""

import datetime
import json
import os
import platform
import statistics


def fio_job(text):
    """The first job of fio's JSON output. fio's nbd engine prints "connected" (and fio may print warnings) before
    the JSON itself, so parsing starts at the first brace."""
    return json.loads(text[text.index("{"):])["jobs"][0]


def fio_side(job, rw):
    """The direction a job measured: its write figures for a writing workload, its read figures otherwise."""
    return job["write"] if "write" in rw else job["read"]


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


def machine_line(now=None):
    """Where and when: the figures of two runs compare only on the same machine."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return f"{now:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, {platform.machine()}; "


def table_head(columns, align):
    return ["| " + " | ".join(columns) + " |", "|" + "".join(f" {a} |" for a in align)]
