"""Unit tests of benchreport's inproc (scripts/test runs them: python3 -m unittest discover -s scripts/lib)."""

import collections
import unittest

from benchreport import inproc


class InprocReportTest(unittest.TestCase):
    def test_table_with_fio_and_baseline(self):
        cells = collections.defaultdict(list, {
            ("randread", "4k", "32", "1", "ours"): [(1111000.0, 1.0)],
            ("randread", "4k", "32", "1", "baseline"): [(1031000.0, 1.0)],
            ("randread", "4k", "32", "1", "fio"): [(900000.0, 1.0)],
            ("write", "2m", "4", "2", "ours"): [(1.0, 17000.0), (1.0, 18000.0), (1.0, 16000.0)],
            ("write", "2m", "4", "2", "baseline"): [(1.0, 19000.0)],
        })
        order = [("randread", "4k", "32", "1"), ("write", "2m", "4", "2")]
        lines = inproc.inproc_table(cells, order, ["ours", "baseline", "fio"], "abc1234 (HEAD: x)")
        self.assertEqual(lines[:2], ["| workload | jobs | ours | baseline abc1234 | fio libpmem | ours/fio | ours/baseline |",
                                     "| --- | --- | --- | --- | --- | --- | --- |"])
        self.assertEqual(lines[2], "| 4k randread QD32 | 1 | 1111k IOPS | 1031k IOPS | 900k IOPS | 1.23 | 1.08 |")
        self.assertEqual(lines[3], "| 2m write QD4 | 2 | 17000 MiB/s | 19000 MiB/s | FAILED | - | **0.89** |")
        self.assertEqual(lines[-1], "A/B: 2 rows, worst ours/baseline 0.89 (2m write QD4 jobs=2); 1 row(s) below 0.95.")

    def test_peer_run_names_pmemblk_bench_and_has_no_ab_line(self):
        cells = collections.defaultdict(list, {("read", "64k", "16", "1", "ours"): [(1.0, 14000.0)],
                                                  ("read", "64k", "16", "1", "fio"): [(1.0, 12500.0)]})
        lines = inproc.inproc_table(cells, [("read", "64k", "16", "1")], ["ours", "fio"])
        self.assertEqual(lines, ["| workload | jobs | pmemblk bench | fio libpmem | ours/fio |",
                                 "| --- | --- | --- | --- | --- |",
                                 "| 64k read QD16 | 1 | 14000 MiB/s | 12500 MiB/s | 1.12 |"])


if __name__ == "__main__":
    unittest.main()
