#!/usr/bin/python3
"""Summarise one fio JSON result for the ublk-nbd comparison (scripts/vm-guest/ublk-check.sh).

  fio-rate.py FILE   prints "IOPS MBPS ERR": read+write IOPS and MB/s (10^6 bytes) summed over all jobs,
                     and the first non-zero job error (0 when every job ended cleanly)
"""
import json
import sys


def main():
    with open(sys.argv[1]) as f:
        text = f.read()
    # fio may print notices before the JSON document when --output is a file it shares with stderr.
    doc = json.loads(text[text.index("{"):])
    iops = bw_kib = 0.0
    err = 0
    for job in doc["jobs"]:
        for d in ("read", "write"):
            iops += job[d]["iops"]
            bw_kib += job[d]["bw"]  # KiB/s
        err = err or job.get("error", 0)
    print(f"{iops:.0f} {bw_kib * 1024 / 1e6:.1f} {err}")


if __name__ == "__main__":
    main()
