"""Unit tests of benchreport's btt (scripts/test runs them: python3 -m unittest discover -s scripts/lib)."""

import tempfile
import unittest

from benchreport import btt
from benchreport.fixtures import NOW, columns, results_file, tables, tsv_file


class BttReportTest(unittest.TestCase):
    def test_paired_ratio_against_the_bar_qd1_shown_not_judged_and_a_failed_round_left_out(self):
        with tempfile.TemporaryDirectory() as d:
            path = tsv_file(d, [line.split() for line in """
                inproc randread 4k 32 1 raw 1 1000000
                inproc randread 4k 32 1 btt 1 850000
                inproc randread 4k 32 1 raw 2 800000
                inproc randread 4k 32 1 btt 2 760000
                nbd randwrite 4k 32 1 raw 1 100000
                nbd randwrite 4k 32 1 btt 1 FAIL
                nbd randwrite 4k 32 1 raw 2 110000
                nbd randwrite 4k 32 1 btt 2 88000
                inproc randwrite 4k 1 1 raw 1 200000
                inproc randwrite 4k 1 1 btt 1 90000""".strip().splitlines()])
            rounds, order = btt.read_btt_rounds(path)
        lines = btt.btt_report(rounds, order, seconds="2", runtime="3", size="1G", repeat="2", sector="4096", now=NOW)
        rows = tables(lines)[0]
        # paired: median of 0.85 and 0.95 = 0.90, at the bar; medians 900k and 805k
        self.assertEqual(columns(rows[2]), [" in process ", " 4k randread QD32 ", " 1 ", " 900k IOPS ", " 805k IOPS ",
                                            " 0.89 ", " 0.90 ", " 0.9 "])
        # the failed btt round pairs with nothing: 88/110 alone, below 0.7 is not, 0.80 meets it
        self.assertEqual(columns(rows[3])[5:], [" 0.84 ", " 0.80 ", " 0.7 "])
        self.assertEqual(columns(rows[4])[6:], [" 0.45 ", " - "])
        self.assertIn("Every judged row meets its bar.", lines[-1])

    def test_a_row_below_its_bar_is_bold_and_named(self):
        with tempfile.TemporaryDirectory() as d:
            path = results_file(d, "nbd\trandread\t4k\t32\t1\traw\t1\t100\nnbd\trandread\t4k\t32\t1\tbtt\t1\t80\n")
            rounds, order = btt.read_btt_rounds(path)
        lines = btt.btt_report(rounds, order, seconds="2", runtime="3", size="1G", repeat="1", sector="512", now=NOW)
        self.assertIn("| **0.80** |", lines[-3])
        self.assertIn("Below the bar: nbd 4k randread QD32 jobs=1 (0.80 < 0.9).", lines[-1])


if __name__ == "__main__":
    unittest.main()
