"""Unit tests of benchreport's ab (scripts/test runs them: python3 -m unittest discover -s scripts/lib)."""

import unittest

from benchreport import ab


class AbTest(unittest.TestCase):
    def test_bold_only_below_the_threshold_and_only_against_the_baseline(self):
        self.assertEqual(ab.ab_ratio(94, 100, True), ("**0.94**", 0.94))
        self.assertEqual(ab.ab_ratio(95, 100, True)[0], "0.95")
        self.assertEqual(ab.ab_ratio(50, 100, False)[0], "0.50")
        self.assertEqual(ab.ab_ratio(None, 100, True), ("-", None))
        self.assertEqual(ab.ab_ratio(100, None, True), ("-", None))

    def test_summary_names_the_worst_row_and_counts_the_slow_ones(self):
        self.assertEqual(ab.ab_summary([(1.02, "a"), (0.90, "b"), (0.94, "c")], "job"),
                         "A/B: 3 rows, worst ours/baseline 0.90 (b); 2 row(s) below 0.95.")
        self.assertEqual(ab.ab_summary([], "row"), "A/B: 0 rows (every row failed on ours or the baseline).")


if __name__ == "__main__":
    unittest.main()
