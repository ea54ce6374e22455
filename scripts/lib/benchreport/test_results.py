"""Unit tests of benchreport's results (scripts/test runs them: python3 -m unittest discover -s scripts/lib)."""

import unittest

from benchreport import nbd, results
from benchreport.fixtures import FIO_READ


class ParsingTest(unittest.TestCase):
    def test_fio_json_after_the_nbd_engines_banner(self):
        self.assertEqual(results.fio_job(FIO_READ)["read"]["iops"], 1000.0)

    def test_nbd_cell_cpu_per_request_counts_the_ramp_second(self):
        # 150 ticks at 100 Hz = 1.5 s of CPU over 1000 IOPS x (2 s + 1 s ramp) = 3000 requests: 500 µs each.
        line = nbd.nbd_cell(FIO_READ, "read-64k-qd1", "ours", "1", 150, 2, 100)
        self.assertEqual(line.split("\t"), ["read-64k-qd1", "ours", "1", "1000.0", "62.5", "500.00"])

    def test_nbd_cell_refuses_a_job_that_failed_naming_job_and_server(self):
        with self.assertRaisesRegex(ValueError, "fio job read-64k-qd1 on baseline: error 5"):
            nbd.nbd_cell(FIO_READ.replace('"error":0', '"error":5'), "read-64k-qd1", "baseline", "1", 1, 1, 100)

    def test_rate_takes_the_side_the_workload_measured(self):
        self.assertEqual(results.rate("fio", FIO_READ, "randread"), (1000.0, 62.5))
        self.assertEqual(results.rate("fio", FIO_READ, "write"), (5.0, 0.3125))
        self.assertEqual(results.rate("pmemblk", '{"iops": 7, "mib_per_s": 8.5}', "read"), (7, 8.5))


if __name__ == "__main__":
    unittest.main()
