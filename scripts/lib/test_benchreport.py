"""Unit tests of benchreport.py (scripts/test runs them: python3 -m unittest discover -s scripts/lib)."""

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchreport as br  # noqa: E402

NOW = datetime.datetime(2026, 12, 1, 23, 30, tzinfo=datetime.timezone.utc)
FIO_READ = 'connected\n{"jobs":[{"error":0,"read":{"iops":1000.0,"bw":64000},"write":{"iops":5.0,"bw":320}}]}'


def nbd_cells(rows):
    cells = {}
    for job, server, *figures in rows:
        cells.setdefault((job, server), [])
        if figures:
            cells[(job, server)].append(tuple(figures))
    return br.collections.defaultdict(list, cells)


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


class ParsingTest(unittest.TestCase):
    def test_fio_json_after_the_nbd_engines_banner(self):
        self.assertEqual(br.fio_job(FIO_READ)["read"]["iops"], 1000.0)

    def test_nbd_cell_cpu_per_request_counts_the_ramp_second(self):
        # 150 ticks at 100 Hz = 1.5 s of CPU over 1000 IOPS x (2 s + 1 s ramp) = 3000 requests: 500 µs each.
        line = br.nbd_cell(FIO_READ, "read-64k-qd1", "ours", "1", 150, 2, 100)
        self.assertEqual(line.split("\t"), ["read-64k-qd1", "ours", "1", "1000.0", "62.5", "500.00"])

    def test_nbd_cell_refuses_a_job_that_failed_naming_job_and_server(self):
        with self.assertRaisesRegex(ValueError, "fio job read-64k-qd1 on baseline: error 5"):
            br.nbd_cell(FIO_READ.replace('"error":0', '"error":5'), "read-64k-qd1", "baseline", "1", 1, 1, 100)

    def test_rate_takes_the_side_the_workload_measured(self):
        self.assertEqual(br.rate("fio", FIO_READ, "randread"), (1000.0, 62.5))
        self.assertEqual(br.rate("fio", FIO_READ, "write"), (5.0, 0.3125))
        self.assertEqual(br.rate("pmemblk", '{"iops": 7, "mib_per_s": 8.5}', "read"), (7, 8.5))


class AbTest(unittest.TestCase):
    def test_bold_only_below_the_threshold_and_only_against_the_baseline(self):
        self.assertEqual(br.ab_ratio(94, 100, True), ("**0.94**", 0.94))
        self.assertEqual(br.ab_ratio(95, 100, True)[0], "0.95")
        self.assertEqual(br.ab_ratio(50, 100, False)[0], "0.50")
        self.assertEqual(br.ab_ratio(None, 100, True), ("-", None))
        self.assertEqual(br.ab_ratio(100, None, True), ("-", None))

    def test_summary_names_the_worst_row_and_counts_the_slow_ones(self):
        self.assertEqual(br.ab_summary([(1.02, "a"), (0.90, "b"), (0.94, "c")], "job"),
                         "A/B: 3 rows, worst ours/baseline 0.90 (b); 2 row(s) below 0.95.")
        self.assertEqual(br.ab_summary([], "row"), "A/B: 0 rows (every row failed on ours or the baseline).")


class NbdReportTest(unittest.TestCase):
    CELLS = [
        ("read-64k-qd1", "ours", 20000.0, 1250.0, 17.0), ("read-64k-qd1", "ours", 22000.0, 1350.0, 15.0),
        ("read-64k-qd1", "baseline", 21000.0, 1500.0, 30.0),
        ("randread-4k-qd32", "ours", 75300.0, 294.0, 3.2), ("randread-4k-qd32", "baseline"),
    ]

    def report(self, servers, cells, fresh=False):
        return br.nbd_report(nbd_cells(cells), servers, ["read-64k-qd1", "randread-4k-qd32"], runtime="1",
                             size="1G", repeat="2", base_desc="abc1234 (HEAD: x)", ours_desc="this tree",
                             ours_cpu="0:05", base_cpu="0:06", fresh=fresh, now=NOW)

    def test_paired_ratios_pair_rounds_and_carry_the_verdict(self):
        # Round 1 slow for both, round 2 fast for both: the medians of 2 are means (150 and 155), the pairs 1.00, 0.94.
        rounds = {("read-64k-qd1", "ours"): {"1": (0, 100.0, 0), "2": (0, 200.0, 0)},
                  ("read-64k-qd1", "baseline"): {"1": (0, 100.0, 0), "2": (0, 212.0, 0), "3": (0, 1.0, 0)}}
        paired = br.paired_ratios(rounds, lambda job, m: m[1])
        self.assertAlmostEqual(paired["read-64k-qd1"], (1.0 + 200 / 212) / 2)
        lines, _ = br.nbd_report(nbd_cells(self.CELLS), [("ours", "ours"), ("baseline", "baseline abc1234")],
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


class InprocReportTest(unittest.TestCase):
    def test_table_with_fio_and_baseline(self):
        cells = br.collections.defaultdict(list, {
            ("randread", "4k", "32", "1", "ours"): [(1111000.0, 1.0)],
            ("randread", "4k", "32", "1", "baseline"): [(1031000.0, 1.0)],
            ("randread", "4k", "32", "1", "fio"): [(900000.0, 1.0)],
            ("write", "2m", "4", "2", "ours"): [(1.0, 17000.0), (1.0, 18000.0), (1.0, 16000.0)],
            ("write", "2m", "4", "2", "baseline"): [(1.0, 19000.0)],
        })
        order = [("randread", "4k", "32", "1"), ("write", "2m", "4", "2")]
        lines = br.inproc_table(cells, order, ["ours", "baseline", "fio"], "abc1234 (HEAD: x)")
        self.assertEqual(lines[:2], ["| workload | jobs | ours | baseline abc1234 | fio libpmem | ours/fio | ours/baseline |",
                                     "| --- | --- | --- | --- | --- | --- | --- |"])
        self.assertEqual(lines[2], "| 4k randread QD32 | 1 | 1111k IOPS | 1031k IOPS | 900k IOPS | 1.23 | 1.08 |")
        self.assertEqual(lines[3], "| 2m write QD4 | 2 | 17000 MiB/s | 19000 MiB/s | FAILED | - | **0.89** |")
        self.assertEqual(lines[-1], "A/B: 2 rows, worst ours/baseline 0.89 (2m write QD4 jobs=2); 1 row(s) below 0.95.")

    def test_peer_run_names_pmemblk_bench_and_has_no_ab_line(self):
        cells = br.collections.defaultdict(list, {("read", "64k", "16", "1", "ours"): [(1.0, 14000.0)],
                                                  ("read", "64k", "16", "1", "fio"): [(1.0, 12500.0)]})
        lines = br.inproc_table(cells, [("read", "64k", "16", "1")], ["ours", "fio"])
        self.assertEqual(lines, ["| workload | jobs | pmemblk bench | fio libpmem | ours/fio |",
                                 "| --- | --- | --- | --- | --- |",
                                 "| 64k read QD16 | 1 | 14000 MiB/s | 12500 MiB/s | 1.12 |"])


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
            rounds, order = br.read_btt_rounds(path)
        lines = br.btt_report(rounds, order, seconds="2", runtime="3", size="1G", repeat="2", sector="4096", now=NOW)
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
            rounds, order = br.read_btt_rounds(path)
        lines = br.btt_report(rounds, order, seconds="2", runtime="3", size="1G", repeat="1", sector="512", now=NOW)
        self.assertIn("| **0.80** |", lines[-3])
        self.assertIn("Below the bar: nbd 4k randread QD32 jobs=1 (0.80 < 0.9).", lines[-1])


def fio_vhost(read_ios, read_bytes, write_ios=0, write_bytes=0, iops=1000.0, bw=4000, error=0):
    return json.dumps({"jobs": [{"error": error,
                                "read": {"iops": iops, "bw": bw, "total_ios": read_ios, "io_bytes": read_bytes},
                                "write": {"iops": 1.0, "bw": 4, "total_ios": write_ios, "io_bytes": write_bytes}}]})


class VhostReportTest(unittest.TestCase):
    def test_cell_divides_the_cpu_by_the_requests_fio_completed_and_the_queue_cpu_by_the_gib_moved(self):
        # 250 ticks at 100 Hz = 2.5 s over 10000 + 2500 requests: 200 µs each; 50 ticks = 0.5 s over 2 GiB: 0.25 s/GiB.
        line = br.vhost_cell(fio_vhost(10000, 1 << 30, 2500, 1 << 30), "read-2m-qd4-1j", "pmemblk", 250, 50, 7, 100)
        # The whole process: 2.5 s over 2 GiB, 1.25 s/GiB; no device process: "-".
        self.assertEqual(line.split("\t"), ["read-2m-qd4-1j", "pmemblk", "1000.0", "3.9", "200.00", "0.25000", "7",
                                            str(2 << 30), "-", "1.25000", "-"])
        # A device process of 20 ticks: 0.2 s over 2 GiB, 0.1 s/GiB.
        self.assertEqual(br.vhost_cell(fio_vhost(10000, 1 << 30, 2500, 1 << 30), "read-2m-qd4-1j", "pmemblk-vfio-user",
                                       250, 50, 7, 100, "-", 20).split("\t")[9:], ["1.25000", "0.10000"])
        # 3125 guest interrupts over 12500 requests: 0.25 each.
        self.assertEqual(br.vhost_cell(fio_vhost(10000, 1 << 30, 2500, 1 << 30), "read-2m-qd4-1j", "pmemblk", 250, 50,
                                       7, 100, "3125").split("\t")[8], "0.250")

    def test_cell_without_queue_threads_and_a_failed_job(self):
        self.assertEqual(br.vhost_cell(fio_vhost(100, 4096), "randread-4k-qd32-1j", "qsd", 1, "-", 0, 100)
                         .split("\t")[5], "-")
        with self.assertRaisesRegex(ValueError, "fio job randread-4k-qd32-1j on nbd: error 5"):
            br.vhost_cell(fio_vhost(1, 1, error=5), "randread-4k-qd32-1j", "nbd", 1, "-", 0, 100)

    def report(self, rows):
        with tempfile.TemporaryDirectory() as d:
            cells = br.read_vhost_results(tsv_file(d, rows))
        return br.vhost_report(cells, ["pmemblk", "qsd", "nbd", "pmemblk-dma"],
                               ["randread-4k-qd32-1j", "read-2m-qd4-1j"], runtime="8", size="1G", now=NOW)

    ROWS = [("randread-4k-qd32-1j", "pmemblk", "9000.0", "35.2", "20.00", "-", "0", "1"),
            ("randread-4k-qd32-1j", "qsd", "10000.0", "39.1", "30.00", "-", "0", "1"),
            ("randread-4k-qd32-1j", "nbd", "FAIL"),
            ("read-2m-qd4-1j", "pmemblk", "2.0", "3000.0", "400.00", "0.500", "0", "100"),
            ("read-2m-qd4-1j", "qsd", "1.0", "2000.0", "500.00", "-", "0", "100"),
            ("read-2m-qd4-1j", "nbd", "1.0", "1500.0", "600.00", "-", "0", "100"),
            ("read-2m-qd4-1j", "pmemblk-dma", "2.0", "3100.0", "300.00", "0.050", "99", "100")]

    def test_tables_flag_jobs_below_the_bar_and_the_offload_ratio(self):
        lines, chart = self.report(self.ROWS)
        throughput, cpu, offload = tables(lines)
        self.assertEqual(throughput[0], "| job | pmemblk vhost | qemu-storage-daemon vhost | pmemblk NBD (QEMU client)"
                                        " | pmemblk/qsd | pmemblk/nbd |")
        # 4k: 9k IOPS against 10k: below 1.0, bold; the failed NBD run reads FAILED and its ratio -.
        self.assertEqual(throughput[2], "| randread-4k-qd32-1j | 9.0k IOPS | 10.0k IOPS | FAILED | **0.90** | - |")
        self.assertEqual(throughput[3], "| read-2m-qd4-1j | 3000 MiB/s | 2000 MiB/s | 1500 MiB/s | 1.50 | 2.00 |")
        self.assertEqual(cpu[2], "| randread-4k-qd32-1j | 20.0 | 30.0 | - |")
        self.assertIn("Bar: pmemblk's vhost-user-blk at least 1.0x qemu-storage-daemon vhost and pmemblk NBD (QEMU"
                      " client): 1 of 2 jobs clear it; below: randread-4k-qd32-1j.", lines)
        # 0.05 s/GiB on the DMA route against 0.5 on the CPU route: 0.10, within 0.2; 99 of 100 bytes counted.
        self.assertEqual(offload[2], "| read-2m-qd4-1j | 0.5000 | 0.0500 | 0.10 | 0.990 |")
        self.assertIn("Offload bar: DMA/CPU at most 0.2 on 1 of 1 2 MiB jobs.", lines)
        for table in (throughput, cpu, offload):
            self.assertEqual({len(columns(row)) for row in table}, {len(columns(table[0]))})
        self.assertEqual(chart.splitlines()[0], "job\tpmemblk vhost\tqemu-storage-daemon vhost\tpmemblk NBD (QEMU client)")
        self.assertEqual(chart.splitlines()[2], "read-2m-qd4-1j\t1.500\t1.000\t0.750")

    def test_an_a_b_of_settings_is_reported_beside_the_bar_and_not_judged(self):
        rows = [("randread-4k-qd32-1j", "pmemblk", "9000.0", "35.2", "20.00", "-", "0", "1"),
                ("randread-4k-qd32-1j", "qsd", "10000.0", "39.1", "30.00", "-", "0", "1"),
                ("randread-4k-qd32-1j", "pmemblk-alt", "12000.0", "46.9", "15.00", "-", "0", "1")]
        with tempfile.TemporaryDirectory() as d:
            path = tsv_file(d, rows)
            cells = br.read_vhost_results(path)
            alt = br.vhost_paired(br.read_vhost_rounds(path), ["randread-4k-qd32-1j"], ("pmemblk",), ours="pmemblk-alt")
        lines, chart = br.vhost_report(cells, ["pmemblk", "qsd", "pmemblk-alt"], ["randread-4k-qd32-1j"], runtime="8",
                                       size="1G", alt=alt, alt_sets="vhost.busy-poll=0", now=NOW)
        at = lines.index("A/B of settings: pmemblk vhost with vhost.busy-poll=0 (pmemblk-alt) over pmemblk vhost with"
                         " the defaults; not judged:")
        # 12000 against 9000 IOPS: 1.33; the bar still reads pmemblk against qsd alone (0.90, below).
        self.assertEqual(lines[at + 4], "| randread-4k-qd32-1j | 1.33 |")
        self.assertIn("Bar: pmemblk's vhost-user-blk at least 1.0x qemu-storage-daemon vhost: 0 of 1 jobs clear it;"
                      " below: randread-4k-qd32-1j.", lines)
        self.assertEqual(chart.splitlines()[1], "randread-4k-qd32-1j\t0.900\t1.000\t1.200")
        self.assertFalse(any(line.startswith("A/B") for line in self.report(self.ROWS)[0]))
        lines, _ = br.vhost_report(cells, ["pmemblk", "qsd", "pmemblk-alt"], ["randread-4k-qd32-1j"], runtime="8",
                                   size="1G", repeat=3, alt=alt, alt_base="abc1234 (main)", now=NOW)
        at = lines.index("A/B of builds: baseline abc1234 (main)'s pmemblk vhost (pmemblk-alt) over this tree's"
                         " pmemblk vhost, paired by round; below 1.0 this tree is faster; not judged:")
        self.assertEqual(lines[at + 4], "| randread-4k-qd32-1j | 1.33 |")
        self.assertIn("| job | pmemblk vhost | qemu-storage-daemon vhost | pmemblk vhost, baseline abc1234 | pmemblk/qsd |",
                      lines)

    def test_the_dma_route_alone_fills_the_tables_with_its_own_figures(self):
        with tempfile.TemporaryDirectory() as d:
            cells = br.read_vhost_results(tsv_file(d, [self.ROWS[-1]]))
        lines, chart = br.vhost_report(cells, ["pmemblk-dma"], ["read-2m-qd4-1j"], runtime="8", size="1G", now=NOW)
        throughput, cpu, offload = tables(lines)
        self.assertEqual(throughput[0], "| job | pmemblk vhost, DMA route |")
        self.assertEqual(throughput[2], "| read-2m-qd4-1j | 3100 MiB/s |")
        self.assertEqual(cpu[2], "| read-2m-qd4-1j | 300.0 |")
        self.assertEqual(offload[2], "| read-2m-qd4-1j | - | 0.0500 | - | 0.990 |")
        self.assertEqual(chart, "")

    def test_rounds_of_a_cell_are_reduced_to_their_medians_and_a_failed_round_fails_the_cell(self):
        with tempfile.TemporaryDirectory() as d:
            cells = br.read_vhost_results(tsv_file(d, [
                ("randread-4k-qd32-1j", "pmemblk", "9000.0", "35.2", "20.00", "-", "0", "10"),
                ("randread-4k-qd32-1j", "pmemblk", "12000.0", "46.9", "10.00", "-", "0", "30"),
                ("randread-4k-qd32-1j", "pmemblk", "11000.0", "43.0", "40.00", "-", "0", "20"),
                ("read-2m-qd4-1j", "pmemblk-dma", "2.0", "3100.0", "300.00", "0.050", "99", "100"),
                ("read-2m-qd4-1j", "pmemblk-dma", "2.0", "3200.0", "300.00", "0.150", "97", "100"),
                ("read-2m-qd4-1j", "pmemblk-vfio-user", "2.0", "3000.0", "100.00", "0.010", "100", "100", "-",
                 "0.100", "0.700"),
                ("read-2m-qd4-1j", "pmemblk-vfio-user", "2.0", "3000.0", "100.00", "0.010", "100", "100", "-",
                 "0.300", "0.500"),
                ("read-2m-qd4-1j", "qsd", "1.0", "2000.0", "500.00", "-", "0", "100"),
                ("read-2m-qd4-1j", "qsd", "FAIL")]))
        # Each field on its own: IOPS 11000 of 9000/11000/12000, CPU 20 of 10/20/40, bytes 20 of 10/20/30; lines of
        # an older bench-vhost (no CPU per GiB fields) read None there.
        self.assertEqual(cells[("randread-4k-qd32-1j", "pmemblk")],
                         (11000.0, 43.0, 20.0, None, 0, 20, None, None, None))
        self.assertEqual(cells[("read-2m-qd4-1j", "pmemblk-dma")], (2.0, 3150.0, 300.0, 0.1, 98, 100, None, None, None))
        # The server's and the device's CPU per GiB: medians of their own.
        self.assertEqual(cells[("read-2m-qd4-1j", "pmemblk-vfio-user")][7:], (0.2, 0.6))
        self.assertIsNone(cells[("read-2m-qd4-1j", "qsd")], "a failed round: the cell is not judged on the others")

    def test_guest_interrupts_get_their_table_when_counted(self):
        rows = [r + ("0.500",) if len(r) > 3 and r[1] == "pmemblk" else r for r in self.ROWS]
        lines, _ = self.report(rows)
        at = lines.index("Guest interrupts per request (the disk's virtio interrupts in the guest's /proc/interrupts"
                         " around the run, over the requests fio completed):")
        self.assertEqual(lines[at + 4], "| randread-4k-qd32-1j | 0.50 | - | - |")
        self.assertFalse(any(line.startswith("Guest interrupts") for line in self.report(self.ROWS)[0]))

    def test_the_heading_says_how_many_rounds_the_medians_are_of(self):
        with tempfile.TemporaryDirectory() as d:
            cells = br.read_vhost_results(tsv_file(d, self.ROWS))
        lines, _ = br.vhost_report(cells, ["pmemblk", "qsd"], ["randread-4k-qd32-1j"], runtime="5", size="1G",
                                   repeat=3, now=NOW)
        self.assertIn("3 round(s), the median shown", "\n".join(lines))

    def test_paired_ratios_pair_the_nth_run_of_each_cell_and_the_bar_reads_them(self):
        # The machine fast in round 0, slow in round 1, between in round 2; pmemblk ahead of qsd in every round by
        # 10% in two rounds; its median (11k) falls below qsd's (12k): the medians say 0.92, the rounds paired 1.10.
        rows = []
        for ours, theirs in ((22000.0, 20000.0), (5500.0, 5000.0), (11000.0, 10000.0)):
            rows += [("randread-4k-qd32-1j", "pmemblk", f"{ours}", "1.0", "20.00", "-", "0", "1"),
                     ("randread-4k-qd32-1j", "qsd", f"{theirs * 1.2 if theirs == 10000.0 else theirs}", "1.0", "20.00",
                      "-", "0", "1")]
        # qsd's rounds: 20k, 5k, 12k (median 12k); pmemblk's 22k, 5.5k, 11k (median 11k); paired 1.10, 1.10, 0.92.
        rows += [("read-2m-qd4-1j", "pmemblk", "1.0", "900.0", "1.00", "-", "0", "1"),
                 ("read-2m-qd4-1j", "qsd", "1.0", "1000.0", "1.00", "-", "0", "1"),
                 ("read-2m-qd4-1j", "pmemblk", "1.0", "1100.0", "1.00", "-", "0", "1"),
                 ("read-2m-qd4-1j", "qsd", "FAIL")]
        with tempfile.TemporaryDirectory() as d:
            path = tsv_file(d, rows)
            cells, rounds = br.read_vhost_results(path), br.read_vhost_rounds(path)
        paired = br.vhost_paired(rounds, ["randread-4k-qd32-1j", "read-2m-qd4-1j"], ("qsd", "nbd"))
        self.assertAlmostEqual(paired[("randread-4k-qd32-1j", "qsd")], 1.1)
        # Round 1 of the 2 MiB job failed on qsd: only round 0 pairs (0.9); the cell is failed all the same.
        self.assertAlmostEqual(paired[("read-2m-qd4-1j", "qsd")], 0.9)
        chart_paired = br.vhost_chart_paired(rounds, ["randread-4k-qd32-1j", "read-2m-qd4-1j"], ["pmemblk", "qsd"])
        lines, chart = br.vhost_report(cells, ["pmemblk", "qsd"], ["randread-4k-qd32-1j", "read-2m-qd4-1j"],
                                       runtime="5", size="1G", repeat=3, paired=paired, chart_paired=chart_paired,
                                       now=NOW)
        # The chart draws what the bar judges: the paired 1.10, not the medians' 0.92.
        self.assertIn("randread-4k-qd32-1j\t1.100\t1.000", chart.splitlines())
        self.assertIn("| job | pmemblk vhost | qemu-storage-daemon vhost | pmemblk/qsd | paired /qsd |", lines)
        self.assertIn("| randread-4k-qd32-1j | 11.0k IOPS | 12.0k IOPS | 0.92 | 1.10 |", lines)
        self.assertIn("| read-2m-qd4-1j | 1000 MiB/s | FAILED | - | - |", lines)
        self.assertIn("Bar: pmemblk's vhost-user-blk at least 1.0x qemu-storage-daemon vhost (paired): 1 of 2 jobs"
                      " clear it; below: read-2m-qd4-1j.", lines)
        # One round: no paired columns, the bar reads the ratio of the medians.
        lines, _ = br.vhost_report(cells, ["pmemblk", "qsd"], ["randread-4k-qd32-1j"], runtime="5", size="1G",
                                   repeat=1, paired=paired, now=NOW)
        self.assertIn("| randread-4k-qd32-1j | 11.0k IOPS | 12.0k IOPS | **0.92** |", lines)

    VFIO_ROWS = [("read-2m-qd4-1j", "pmemblk", "2.0", "3000.0", "400.00", "0.500", "0", "100", "-", "1.000", "-"),
                 ("read-2m-qd4-1j", "pmemblk-dma", "2.0", "3100.0", "300.00", "0.050", "99", "100", "-", "0.900", "-"),
                 ("read-2m-qd4-1j", "pmemblk-vfio-user", "2.0", "2900.0", "100.00", "0.040", "100", "100", "-",
                  "0.150", "0.800"),
                 ("write-2m-qd4-1j", "pmemblk", "2.0", "2000.0", "400.00", "0.500", "0", "100", "-", "1.000", "-"),
                 ("write-2m-qd4-1j", "pmemblk-dma", "2.0", "2000.0", "300.00", "0.050", "99", "100", "-", "0.900", "-"),
                 ("write-2m-qd4-1j", "pmemblk-vfio-user", "2.0", "1700.0", "100.00", "0.040", "90", "100", "-",
                  "0.300", "0.700")]

    def test_the_vfio_user_route_is_held_to_the_cpu_routes_process_cpu_and_the_soft_routes_throughput(self):
        with tempfile.TemporaryDirectory() as d:
            cells = br.read_vhost_results(tsv_file(d, self.VFIO_ROWS))
        jobs = ["read-2m-qd4-1j", "write-2m-qd4-1j"]
        lines, chart = br.vhost_report(cells, ["pmemblk", "pmemblk-dma", "pmemblk-vfio-user"], jobs, runtime="5",
                                       size="1G", now=NOW)
        throughput, cpu, offload, vfio = tables(lines)
        # The offload targets have their own tables: no column in the main ones.
        self.assertEqual(throughput[0], "| job | pmemblk vhost |")
        self.assertEqual(vfio[0], "| job | CPU route (s/GiB) | soft route (s/GiB) | vfio-user route (s/GiB) |"
                                  " vfio-user/CPU | device process (s/GiB) | soft MiB/s | vfio-user MiB/s |"
                                  " vfio-user/soft | DMA bytes / bytes moved |")
        # read: 0.15 of 1.0 s/GiB (within 0.2), 2900 of 3100 MiB/s (0.94, within 0.9); the device's 0.8 beside it.
        self.assertEqual(vfio[2], "| read-2m-qd4-1j | 1.0000 | 0.9000 | 0.1500 | 0.15 | 0.8000 | 3100 | 2900 | 0.94"
                                  " | 1.000 |")
        # write: 0.30 of the CPU route's and 1700 of 2000 MiB/s (0.85): both below their bars, bold.
        self.assertEqual(vfio[3], "| write-2m-qd4-1j | 1.0000 | 0.9000 | 0.3000 | **0.30** | 0.7000 | 2000 | 1700 |"
                                  " **0.85** | 0.900 |")
        self.assertIn("vfio-user bars: the server's CPU per GiB at most 0.2 of the CPU route's on 1 of 2 2 MiB jobs;"
                      " throughput at least 0.9 of the soft route's on 1 of 2.", lines)
        for table in (throughput, cpu, offload, vfio):
            self.assertEqual({len(columns(row)) for row in table}, {len(columns(table[0]))})
        # With rounds the throughput reads the ratio paired by round, not the medians'.
        lines, _ = br.vhost_report(cells, ["pmemblk", "pmemblk-dma", "pmemblk-vfio-user"], jobs, runtime="5",
                                   size="1G", repeat=2, vfio_user={("read-2m-qd4-1j", "pmemblk-dma"): 0.5}, now=NOW)
        self.assertIn("| read-2m-qd4-1j | 1.0000 | 0.9000 | 0.1500 | 0.15 | 0.8000 | 3100 | 2900 | **0.50** | 1.000 |",
                      lines)
        self.assertFalse(any(line.startswith("vfio-user bars") for line in self.report(self.ROWS)[0]))

    def test_the_peer_at_its_defaults_gets_a_ratio_that_is_not_judged(self):
        rows = [("randread-4k-qd32-1j", "pmemblk", "9000.0", "35.2", "20.00", "-", "0", "1"),
                ("randread-4k-qd32-1j", "qsd", "10000.0", "39.1", "30.00", "-", "0", "1"),
                ("randread-4k-qd32-1j", "qsd-threads", "6000.0", "23.4", "40.00", "-", "0", "1")]
        with tempfile.TemporaryDirectory() as d:
            cells = br.read_vhost_results(tsv_file(d, rows))
        lines, chart = br.vhost_report(cells, ["pmemblk", "qsd", "qsd-threads"], ["randread-4k-qd32-1j"],
                                       runtime="5", size="1G", now=NOW)
        throughput = tables(lines)[0]
        self.assertEqual(throughput[0], "| job | pmemblk vhost | qemu-storage-daemon vhost | qemu-storage-daemon vhost,"
                                        " defaults | pmemblk/qsd | pmemblk/qsd-threads (not judged) |")
        # 9000 against qsd's 10000 is below the bar; 1.50 against its defaults changes nothing.
        self.assertEqual(throughput[2], "| randread-4k-qd32-1j | 9.0k IOPS | 10.0k IOPS | 6.0k IOPS | **0.90** | 1.50 |")
        self.assertIn("Bar: pmemblk's vhost-user-blk at least 1.0x qemu-storage-daemon vhost: 0 of 1 jobs clear it;"
                      " below: randread-4k-qd32-1j.", lines)
        self.assertEqual(chart.splitlines()[1], "randread-4k-qd32-1j\t0.900\t1.000\t0.600")
        lines, _ = br.vhost_report(cells, ["pmemblk", "qsd", "qsd-threads"], ["randread-4k-qd32-1j"], runtime="5",
                                   size="1G", repeat=2, paired={("randread-4k-qd32-1j", "qsd"): 0.95,
                                                                ("randread-4k-qd32-1j", "qsd-threads"): 1.4}, now=NOW)
        self.assertIn("| randread-4k-qd32-1j | 9.0k IOPS | 10.0k IOPS | 6.0k IOPS | 0.90 | **0.95** | 1.40 |", lines)

    def test_offload_above_the_bar_is_bold(self):
        rows = [r if r[1] != "pmemblk-dma" else r[:5] + ("0.200",) + r[6:] for r in self.ROWS]
        # 0.2 / 0.5 = 0.40
        lines, _ = self.report(rows)
        self.assertIn("| read-2m-qd4-1j | 0.5000 | 0.2000 | **0.40** | 0.990 |", lines)
        self.assertIn("Offload bar: DMA/CPU at most 0.2 on 0 of 1 2 MiB jobs.", lines)


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
            out = subprocess.run([sys.executable, br.__file__, "inproc-report", "--results", res, "--ab-file", ab,
                                  "--seconds", "1", "--size", "1G", "--repeat", "3", "--base-desc", "abc (x)",
                                  "--ours-desc", "this tree", "ours", "baseline"],
                                 capture_output=True, text=True, check=True, timeout=60).stdout
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
            out = subprocess.run([sys.executable, br.__file__, "vhost-report", "--results", res, "--out", d, "--stem",
                                  "v", "--jobs", "read-2m-qd4-1j", "--runtime", "5", "--size", "1G", "qsd", "nbd"],
                                 capture_output=True, text=True, check=True, timeout=60).stdout
            self.assertIn("| read-2m-qd4-1j | 2000 MiB/s | 1000 MiB/s |", out)
            fio = os.path.join(d, "fio.json")
            with open(fio, "w") as f:
                f.write(fio_vhost(1000, 1 << 30, 0, 0))
            cell = subprocess.run([sys.executable, br.__file__, "vhost-cell", fio, "read-2m-qd4-1j", "pmemblk-vfio-user",
                                   "100", "10", "0", "100", "-", "50"],
                                  capture_output=True, text=True, check=True, timeout=60).stdout
            # 1 s of the server and 0.5 s of the device over 1 GiB.
            self.assertEqual(cell.rstrip("\n").split("\t")[9:], ["1.00000", "0.50000"])
            with open(os.path.join(d, "v.md")) as f:
                self.assertEqual(f.read().rstrip("\n"), out.rstrip("\n"))
            if shutil.which("gnuplot"):
                png = os.path.join(d, "v.png")
                subprocess.run([sys.executable, br.__file__, "chart", os.path.join(d, "v.dat"), png, "t", "y"],
                               check=True, timeout=120)
                with open(png, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
