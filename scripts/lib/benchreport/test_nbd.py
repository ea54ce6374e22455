"""Unit tests of benchreport's nbd (scripts/test runs them: python3 -m unittest discover -s scripts/lib)."""

import unittest

from benchreport import ab, nbd
from benchreport.fixtures import NOW, columns, nbd_cells, tables


class NbdReportTest(unittest.TestCase):
    CELLS = [
        ("read-64k-qd1", "ours", 20000.0, 1250.0, 17.0), ("read-64k-qd1", "ours", 22000.0, 1350.0, 15.0),
        ("read-64k-qd1", "baseline", 21000.0, 1500.0, 30.0),
        ("randread-4k-qd32", "ours", 75300.0, 294.0, 3.2), ("randread-4k-qd32", "baseline"),
    ]

    def report(self, servers, cells, fresh=False):
        return nbd.nbd_report(nbd_cells(cells), servers, ["read-64k-qd1", "randread-4k-qd32"], runtime="1",
                             size="1G", repeat="2", base_desc="abc1234 (HEAD: x)", ours_desc="this tree",
                             ours_cpu="0:05", base_cpu="0:06", fresh=fresh, now=NOW)

    def test_paired_ratios_pair_rounds_and_carry_the_verdict(self):
        # Round 1 slow for both, round 2 fast for both: the medians of 2 are means (150 and 155), the pairs 1.00, 0.94.
        rounds = {("read-64k-qd1", "ours"): {"1": (0, 100.0, 0), "2": (0, 200.0, 0)},
                  ("read-64k-qd1", "baseline"): {"1": (0, 100.0, 0), "2": (0, 212.0, 0), "3": (0, 1.0, 0)}}
        paired = ab.paired_ratios(rounds, lambda job, m: m[1])
        self.assertAlmostEqual(paired["read-64k-qd1"], (1.0 + 200 / 212) / 2)
        lines, _ = nbd.nbd_report(nbd_cells(self.CELLS), [("ours", "ours"), ("baseline", "baseline abc1234")],
                                 ["read-64k-qd1", "randread-4k-qd32"], runtime="1", size="1G", repeat="2",
                                 base_desc="abc1234 (HEAD: x)", paired={"read-64k-qd1": 0.97}, now=NOW)
        throughput, _ = tables(lines)
        self.assertEqual(throughput[0], "| job | ours | baseline abc1234 | ours/baseline abc1234 | paired |")
        self.assertEqual(throughput[2], "| read-64k-qd1 | 1300 MiB/s | 1500 MiB/s | 0.87 | 0.97 |")
        self.assertEqual(throughput[3], "| randread-4k-qd32 | 75.3k IOPS | FAILED | - | - |")
        self.assertIn("A/B: 1 rows, worst ours/baseline 0.97 (read-64k-qd1); 0 row(s) below 0.95.", lines)

    def test_fresh_servers_are_said(self):
        servers = [("ours", "ours"), ("baseline", "baseline abc1234")]
        said = "the pmemblk servers started afresh every round"
        self.assertTrue(any(said in line for line in self.report(servers, self.CELLS, fresh=True)[0]))
        self.assertFalse(any(said in line for line in self.report(servers, self.CELLS)[0]))

    def test_ab_tables_keep_their_columns_bold_and_cpu_table(self):
        lines, chart = self.report([("ours", "ours"), ("baseline", "baseline abc1234")], self.CELLS)
        self.assertEqual(lines[0], "# NBD A/B: pmemblk (ours) vs baseline abc1234 (one run, servers alternated per job)")
        self.assertTrue(lines[2].startswith("2026-12-01 23:30 UTC, "))
        throughput, cpu = tables(lines)
        self.assertEqual(throughput[0], "| job | ours | baseline abc1234 | ours/baseline abc1234 |")
        self.assertEqual(throughput[1], "| --- | ---: | ---: | ---: |")
        # medians: ours 1300 MiB/s against 1500: 0.87, flagged; the failed baseline cell reads FAILED, its ratio -.
        self.assertEqual(throughput[2], "| read-64k-qd1 | 1300 MiB/s | 1500 MiB/s | **0.87** |")
        self.assertEqual(throughput[3], "| randread-4k-qd32 | 75.3k IOPS | FAILED | - |")
        self.assertEqual(cpu[0], "| job | ours | baseline abc1234 | baseline/ours |")
        self.assertEqual(cpu[2], "| read-64k-qd1 | 16.0 | 30.0 | 1.88 |")
        for table in (throughput, cpu):
            self.assertEqual({len(columns(row)) for row in table}, {len(columns(table[0]))})
        self.assertIn("A/B: 1 rows, worst ours/baseline 0.87 (read-64k-qd1); 1 row(s) below 0.95.", lines)
        self.assertIn("CPU time of our server over the whole run (user+sys, seconds, all jobs; ps): 0:05; "
                      "of the baseline's: 0:06.", lines)
        self.assertEqual(chart, "")

    def test_peer_run_has_the_bar_and_the_chart_and_no_ab_line(self):
        cells = [("read-64k-qd1", "ours", 1.0, 1300.0, 16.0), ("read-64k-qd1", "memory", 1.0, 1000.0, 0.0),
                 ("read-64k-qd1", "null", 1.0, 1100.0, 0.0),
                 ("randread-4k-qd32", "ours", 75000.0, 1.0, 3.0), ("randread-4k-qd32", "memory", 70000.0, 1.0, 0.0),
                 ("randread-4k-qd32", "null", 80000.0, 1.0, 0.0)]
        lines, chart = self.report([("ours", "ours"), ("memory", "nbdkit memory"), ("null", "nbdkit null")], cells)
        throughput, cpu = tables(lines)
        self.assertEqual(throughput[0], "| job | ours | nbdkit memory | nbdkit null | ours/nbdkit memory"
                                        " | ours/nbdkit null | ours/bar |")
        # 64k: the bar is 1.3x memory = 1300 MiB/s, cleared exactly; 4k: 1.1x memory = 77k IOPS (above 0.9x null,
        # 72k), missed: bold.
        self.assertEqual(throughput[2], "| read-64k-qd1 | 1300 MiB/s | 1000 MiB/s | 1100 MiB/s | 1.30 | 1.18"
                                        " | 1.00 (1.3x nbdkit memory) |")
        self.assertTrue(throughput[3].endswith("| **0.97** (1.1x nbdkit memory) |"), throughput[3])
        self.assertEqual(cpu[0], "| job | ours | nbdkit memory | nbdkit null |")
        self.assertIn("Bar: 1 of 2 jobs clear it; below: randread-4k-qd32 0.97.", lines)
        self.assertFalse(any(line.startswith("A/B:") for line in lines))
        self.assertEqual(chart.splitlines(), ["job\tours\tnbdkit memory\tnbdkit null",
                                              "read-64k-qd1\t1.300\t1.000\t1.100",
                                              "randread-4k-qd32\t1.071\t1.000\t1.143"])


if __name__ == "__main__":
    unittest.main()
