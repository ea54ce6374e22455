"""Unit tests of benchreport's __main__ (scripts/test runs them: python3 -m unittest discover -s scripts/lib)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from benchreport.fixtures import fio_vhost, results_file

# The command line as common.sh's benchreport runs it: the package by name, scripts/lib on the path.
BENCHREPORT = [sys.executable, "-m", "benchreport"]
LIB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CommandLineTest(unittest.TestCase):
    def test_inproc_report_reads_the_scripts_tsv_and_writes_the_ab_file(self):
        with tempfile.TemporaryDirectory() as d:
            # The machine slow in round 1, fast in round 2, between in round 3, where ours is slower: the medians
            # (140 against 160) say 0.88, the rounds paired say 1.00, 1.00, 0.88: median 1.00.
            res = results_file(d, "".join(f"read\t64k\t16\t1\t{p}\t{r}\t1.0 {v}\n" for p, r, v in [
                ("ours", 1, 100.0), ("baseline", 1, 100.0), ("ours", 2, 200.0), ("baseline", 2, 200.0),
                ("ours", 3, 140.0), ("baseline", 3, 160.0)]) + "read\t2m\t4\t1\tours\t1\t1.0 90.0\n"
                               "read\t2m\t4\t1\tbaseline\t1\t1.0 100.0\n")
            ab = os.path.join(d, "ab.md")
            out = subprocess.run([*BENCHREPORT, "inproc-report", "--results", res, "--ab-file", ab,
                                  "--seconds", "1", "--size", "1G", "--repeat", "3", "--base-desc", "abc (x)",
                                  "--ours-desc", "this tree", "ours", "baseline"],
                                 capture_output=True, text=True, check=True, timeout=60, cwd=LIB).stdout
            self.assertIn("| 64k read QD16 | 1 | 140 MiB/s | 160 MiB/s | 0.88 | 1.00 |", out)
            # One round: paired and medians agree, and the verdict reads the paired column.
            self.assertIn("| 2m read QD4 | 1 | 90 MiB/s | 100 MiB/s | 0.90 | **0.90** |", out)
            self.assertIn("A/B: 2 rows, worst ours/baseline 0.90 (2m read QD4 jobs=1); 1 row(s) below 0.95.", out)
            with open(ab) as f:
                written = f.read()
            self.assertTrue(written.startswith("# In process A/B: `pmemblk bench` ours vs baseline"))
            self.assertIn("ours = this tree; baseline = abc (x). Even rounds ran the programs in reverse order", written)
            self.assertIn("paired = the median over rounds of ours/baseline within a round", written)
            self.assertTrue(written.endswith(out))

    def test_vhost_report_and_its_chart_from_the_scripts_tsv(self):
        with tempfile.TemporaryDirectory() as d:
            res = results_file(d, "read-2m-qd4-1j\tqsd\t1.0\t2000.0\t500.00\t-\t0\t100\n"
                                  "read-2m-qd4-1j\tnbd\t1.0\t1000.0\t600.00\t-\t0\t100\n")
            out = subprocess.run([*BENCHREPORT, "vhost-report", "--results", res, "--out", d, "--stem",
                                  "v", "--jobs", "read-2m-qd4-1j", "--runtime", "5", "--size", "1G", "qsd", "nbd"],
                                 capture_output=True, text=True, check=True, timeout=60, cwd=LIB).stdout
            self.assertIn("| read-2m-qd4-1j | 2000 MiB/s | 1000 MiB/s |", out)
            fio = os.path.join(d, "fio.json")
            with open(fio, "w") as f:
                f.write(fio_vhost(1000, 1 << 30, 0, 0))
            cell = subprocess.run([*BENCHREPORT, "vhost-cell", fio, "read-2m-qd4-1j", "pmemblk-vfio-user",
                                   "100", "10", "0", "100", "-", "50"],
                                  capture_output=True, text=True, check=True, timeout=60, cwd=LIB).stdout
            # 1 s of the server and 0.5 s of the device over 1 GiB.
            self.assertEqual(cell.rstrip("\n").split("\t")[9:], ["1.00000", "0.50000"])
            with open(os.path.join(d, "v.md")) as f:
                self.assertEqual(f.read().rstrip("\n"), out.rstrip("\n"))
            if shutil.which("gnuplot"):
                png = os.path.join(d, "v.png")
                subprocess.run([*BENCHREPORT, "chart", os.path.join(d, "v.dat"), png, "t", "y"],
                               check=True, timeout=120, cwd=LIB)
                with open(png, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
