"""Unit tests of hostbench_report.py (scripts/test runs them: python3 -m unittest discover -s scripts/lib)."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hostbench_report as hr  # noqa: E402

HEADER = "round\tjob\ttarget\tios\tbytes\tnanos\tserver_ticks\tload_ticks\n"


def rounds(rows):
    """Rounds-file text: (round, job, target, ios, server_ticks) per run, 1 s each, 4 KiB requests."""
    return HEADER + "".join(f"{r}\t{j}\t{t}\t{ios}\t{ios * 4096}\t1000000000\t{st}\t10\n" for r, j, t, ios, st in rows)


class PairedRatios(unittest.TestCase):
    def test_ratios_are_paired_by_round_not_taken_of_the_medians(self):
        # the host's load moves both runs of a round together: paired, the ratios are 0.9, 0.9 and 1.2 (median
        # 0.9); the ratio of the two medians (600 / 500) would say 1.2
        runs = {"pmemblk": {1: {"iops": 100.0}, 2: {"iops": 1000.0}, 3: {"iops": 500.0}},
                "alt": {1: {"iops": 90.0}, 2: {"iops": 900.0}, 3: {"iops": 600.0}}}
        m, lo, hi, q1, q3, n = hr.ratio_cells(runs["pmemblk"], runs["alt"], "iops")
        self.assertAlmostEqual(m, 0.9)
        self.assertAlmostEqual(lo, 0.9)
        self.assertAlmostEqual(hi, 1.2)
        self.assertEqual(n, 3)
        self.assertEqual(hr.verdict((m, lo, hi, q1, q3, n), True), "not resolvable (quartile spread 30.0% >= 5%)")
        self.assertEqual(hr.verdict((m, 0.89, 0.91, 0.895, 0.905, 3), True), "slower 5% (+10.0% worse)")

    def test_a_wide_spread_is_called_unresolvable(self):
        cells = (0.97, 0.60, 1.40, 0.80, 1.20, 7)
        self.assertEqual(hr.verdict(cells, True), "not resolvable (quartile spread 40.0% >= 5%)")

    def test_the_report_has_the_paired_row(self):
        text = rounds([(r, "randread-4k-qd32-1j", t, ios, 100) for r in (1, 2, 3)
                       for t, ios in (("pmemblk", 1000), ("pmemblk-alt", 980))])
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "r.tsv"), os.path.join(d, "r.md")
            with open(src, "w") as f:
                f.write(text)
            subprocess.run([sys.executable, os.path.join(HERE, "hostbench_report.py"), "--rounds", src, "--out", out,
                            "--hz", "100", "--runtime", "1", "--size", "1G", "--jobs", "randread-4k-qd32-1j",
                            "pmemblk", "pmemblk-alt"], check=True)
            with open(out) as f:
                md = f.read()
        self.assertIn("| randread-4k-qd32-1j | 0.980 | 0.980-0.980 | 0.980-0.980 | within 5% (+2.0% worse) |", md)
        self.assertIn("| randread-4k-qd32-1j | pmemblk | 1,000 | 3.9 | 1,000.00 | 100.00 | 262.1440 | - | - | - | 3 |", md)


if __name__ == "__main__":
    unittest.main()
