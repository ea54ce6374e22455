"""What the report tests share: results files as the bench scripts write them, fio's JSON, table parsing."""

import collections
import datetime
import json
import os


NOW = datetime.datetime(2026, 12, 1, 23, 30, tzinfo=datetime.timezone.utc)


FIO_READ = 'connected\n{"jobs":[{"error":0,"read":{"iops":1000.0,"bw":64000},"write":{"iops":5.0,"bw":320}}]}'


def nbd_cells(rows):
    cells = {}
    for job, server, *figures in rows:
        cells.setdefault((job, server), [])
        if figures:
            cells[(job, server)].append(tuple(figures))
    return collections.defaultdict(list, cells)


def results_file(folder, text):
    """A bench script's results TSV with this text, in folder; its path."""
    path = os.path.join(folder, "results.tsv")
    with open(path, "w") as f:
        f.write(text)
    return path


def tsv_file(folder, rows):
    """A bench script's results TSV of these rows (tuples of fields), in folder; its path."""
    return results_file(folder, "".join("\t".join(r) + "\n" for r in rows))


def columns(line):
    return line.strip().strip("|").split("|")


def tables(lines):
    """Each Markdown table of a report as its list of lines."""
    out, cur = [], []
    for line in lines + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            out.append(cur)
            cur = []
    return out


def fio_vhost(read_ios, read_bytes, write_ios=0, write_bytes=0, iops=1000.0, bw=4000, error=0):
    return json.dumps({"jobs": [{"error": error,
                                "read": {"iops": iops, "bw": bw, "total_ios": read_ios, "io_bytes": read_bytes},
                                "write": {"iops": 1.0, "bw": 4, "total_ios": write_ios, "io_bytes": write_bytes}}]})
