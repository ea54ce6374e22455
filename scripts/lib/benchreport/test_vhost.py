"""Unit tests of benchreport's vhost (scripts/test runs them: python3 -m unittest discover -s scripts/lib)."""

import tempfile
import unittest

from benchreport import vhost
from benchreport.fixtures import NOW, columns, fio_vhost, tables, tsv_file


class VhostReportTest(unittest.TestCase):
    def test_cell_divides_the_cpu_by_the_requests_fio_completed_and_the_queue_cpu_by_the_gib_moved(self):
        # 250 ticks at 100 Hz = 2.5 s over 10000 + 2500 requests: 200 µs each; 50 ticks = 0.5 s over 2 GiB: 0.25 s/GiB.
        line = vhost.vhost_cell(fio_vhost(10000, 1 << 30, 2500, 1 << 30), "read-2m-qd4-1j", "pmemblk", 250, 50, 7, 100)
        # The whole process: 2.5 s over 2 GiB, 1.25 s/GiB; no device process: "-".
        self.assertEqual(line.split("\t"), ["read-2m-qd4-1j", "pmemblk", "1000.0", "3.9", "200.00", "0.25000", "7",
                                            str(2 << 30), "-", "1.25000", "-"])
        # A device process of 20 ticks: 0.2 s over 2 GiB, 0.1 s/GiB.
        self.assertEqual(vhost.vhost_cell(fio_vhost(10000, 1 << 30, 2500, 1 << 30), "read-2m-qd4-1j", "pmemblk-vfio-user",
                                       250, 50, 7, 100, "-", 20).split("\t")[9:], ["1.25000", "0.10000"])
        # 3125 guest interrupts over 12500 requests: 0.25 each.
        self.assertEqual(vhost.vhost_cell(fio_vhost(10000, 1 << 30, 2500, 1 << 30), "read-2m-qd4-1j", "pmemblk", 250, 50,
                                       7, 100, "3125").split("\t")[8], "0.250")

    def test_cell_without_queue_threads_and_a_failed_job(self):
        self.assertEqual(vhost.vhost_cell(fio_vhost(100, 4096), "randread-4k-qd32-1j", "qsd", 1, "-", 0, 100)
                         .split("\t")[5], "-")
        with self.assertRaisesRegex(ValueError, "fio job randread-4k-qd32-1j on nbd: error 5"):
            vhost.vhost_cell(fio_vhost(1, 1, error=5), "randread-4k-qd32-1j", "nbd", 1, "-", 0, 100)

    def report(self, rows):
        with tempfile.TemporaryDirectory() as d:
            cells = vhost.read_vhost_results(tsv_file(d, rows))
        return vhost.vhost_report(cells, ["pmemblk", "qsd", "nbd", "pmemblk-dma"],
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
            cells = vhost.read_vhost_results(path)
            alt = vhost.vhost_paired(vhost.read_vhost_rounds(path), ["randread-4k-qd32-1j"], ("pmemblk",), ours="pmemblk-alt")
        lines, chart = vhost.vhost_report(cells, ["pmemblk", "qsd", "pmemblk-alt"], ["randread-4k-qd32-1j"], runtime="8",
                                       size="1G", alt=alt, alt_sets="vhost.busy-poll=0", now=NOW)
        at = lines.index("A/B of settings: pmemblk vhost with vhost.busy-poll=0 (pmemblk-alt) over pmemblk vhost with"
                         " the defaults; not judged:")
        # 12000 against 9000 IOPS: 1.33; the bar still reads pmemblk against qsd alone (0.90, below).
        self.assertEqual(lines[at + 4], "| randread-4k-qd32-1j | 1.33 |")
        self.assertIn("Bar: pmemblk's vhost-user-blk at least 1.0x qemu-storage-daemon vhost: 0 of 1 jobs clear it;"
                      " below: randread-4k-qd32-1j.", lines)
        self.assertEqual(chart.splitlines()[1], "randread-4k-qd32-1j\t0.900\t1.000\t1.200")
        self.assertFalse(any(line.startswith("A/B") for line in self.report(self.ROWS)[0]))
        lines, _ = vhost.vhost_report(cells, ["pmemblk", "qsd", "pmemblk-alt"], ["randread-4k-qd32-1j"], runtime="8",
                                   size="1G", repeat=3, alt=alt, alt_base="abc1234 (main)", now=NOW)
        at = lines.index("A/B of builds: baseline abc1234 (main)'s pmemblk vhost (pmemblk-alt) over this tree's"
                         " pmemblk vhost, paired by round; below 1.0 this tree is faster; not judged:")
        self.assertEqual(lines[at + 4], "| randread-4k-qd32-1j | 1.33 |")
        self.assertIn("| job | pmemblk vhost | qemu-storage-daemon vhost | pmemblk vhost, baseline abc1234 | pmemblk/qsd |",
                      lines)

    def test_the_dma_route_alone_fills_the_tables_with_its_own_figures(self):
        with tempfile.TemporaryDirectory() as d:
            cells = vhost.read_vhost_results(tsv_file(d, [self.ROWS[-1]]))
        lines, chart = vhost.vhost_report(cells, ["pmemblk-dma"], ["read-2m-qd4-1j"], runtime="8", size="1G", now=NOW)
        throughput, cpu, offload = tables(lines)
        self.assertEqual(throughput[0], "| job | pmemblk vhost, DMA route |")
        self.assertEqual(throughput[2], "| read-2m-qd4-1j | 3100 MiB/s |")
        self.assertEqual(cpu[2], "| read-2m-qd4-1j | 300.0 |")
        self.assertEqual(offload[2], "| read-2m-qd4-1j | - | 0.0500 | - | 0.990 |")
        self.assertEqual(chart, "")

    def test_rounds_of_a_cell_are_reduced_to_their_medians_and_a_failed_round_fails_the_cell(self):
        with tempfile.TemporaryDirectory() as d:
            cells = vhost.read_vhost_results(tsv_file(d, [
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
            cells = vhost.read_vhost_results(tsv_file(d, self.ROWS))
        lines, _ = vhost.vhost_report(cells, ["pmemblk", "qsd"], ["randread-4k-qd32-1j"], runtime="5", size="1G",
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
            cells, rounds = vhost.read_vhost_results(path), vhost.read_vhost_rounds(path)
        paired = vhost.vhost_paired(rounds, ["randread-4k-qd32-1j", "read-2m-qd4-1j"], ("qsd", "nbd"))
        self.assertAlmostEqual(paired[("randread-4k-qd32-1j", "qsd")], 1.1)
        # Round 1 of the 2 MiB job failed on qsd: only round 0 pairs (0.9); the cell is failed all the same.
        self.assertAlmostEqual(paired[("read-2m-qd4-1j", "qsd")], 0.9)
        chart_paired = vhost.vhost_chart_paired(rounds, ["randread-4k-qd32-1j", "read-2m-qd4-1j"], ["pmemblk", "qsd"])
        lines, chart = vhost.vhost_report(cells, ["pmemblk", "qsd"], ["randread-4k-qd32-1j", "read-2m-qd4-1j"],
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
        lines, _ = vhost.vhost_report(cells, ["pmemblk", "qsd"], ["randread-4k-qd32-1j"], runtime="5", size="1G",
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
            cells = vhost.read_vhost_results(tsv_file(d, self.VFIO_ROWS))
        jobs = ["read-2m-qd4-1j", "write-2m-qd4-1j"]
        lines, chart = vhost.vhost_report(cells, ["pmemblk", "pmemblk-dma", "pmemblk-vfio-user"], jobs, runtime="5",
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
        lines, _ = vhost.vhost_report(cells, ["pmemblk", "pmemblk-dma", "pmemblk-vfio-user"], jobs, runtime="5",
                                   size="1G", repeat=2, vfio_user={("read-2m-qd4-1j", "pmemblk-dma"): 0.5}, now=NOW)
        self.assertIn("| read-2m-qd4-1j | 1.0000 | 0.9000 | 0.1500 | 0.15 | 0.8000 | 3100 | 2900 | **0.50** | 1.000 |",
                      lines)
        self.assertFalse(any(line.startswith("vfio-user bars") for line in self.report(self.ROWS)[0]))

    def test_the_peer_at_its_defaults_gets_a_ratio_that_is_not_judged(self):
        rows = [("randread-4k-qd32-1j", "pmemblk", "9000.0", "35.2", "20.00", "-", "0", "1"),
                ("randread-4k-qd32-1j", "qsd", "10000.0", "39.1", "30.00", "-", "0", "1"),
                ("randread-4k-qd32-1j", "qsd-threads", "6000.0", "23.4", "40.00", "-", "0", "1")]
        with tempfile.TemporaryDirectory() as d:
            cells = vhost.read_vhost_results(tsv_file(d, rows))
        lines, chart = vhost.vhost_report(cells, ["pmemblk", "qsd", "qsd-threads"], ["randread-4k-qd32-1j"],
                                       runtime="5", size="1G", now=NOW)
        throughput = tables(lines)[0]
        self.assertEqual(throughput[0], "| job | pmemblk vhost | qemu-storage-daemon vhost | qemu-storage-daemon vhost,"
                                        " defaults | pmemblk/qsd | pmemblk/qsd-threads (not judged) |")
        # 9000 against qsd's 10000 is below the bar; 1.50 against its defaults changes nothing.
        self.assertEqual(throughput[2], "| randread-4k-qd32-1j | 9.0k IOPS | 10.0k IOPS | 6.0k IOPS | **0.90** | 1.50 |")
        self.assertIn("Bar: pmemblk's vhost-user-blk at least 1.0x qemu-storage-daemon vhost: 0 of 1 jobs clear it;"
                      " below: randread-4k-qd32-1j.", lines)
        self.assertEqual(chart.splitlines()[1], "randread-4k-qd32-1j\t0.900\t1.000\t0.600")
        lines, _ = vhost.vhost_report(cells, ["pmemblk", "qsd", "qsd-threads"], ["randread-4k-qd32-1j"], runtime="5",
                                   size="1G", repeat=2, paired={("randread-4k-qd32-1j", "qsd"): 0.95,
                                                                ("randread-4k-qd32-1j", "qsd-threads"): 1.4}, now=NOW)
        self.assertIn("| randread-4k-qd32-1j | 9.0k IOPS | 10.0k IOPS | 6.0k IOPS | 0.90 | **0.95** | 1.40 |", lines)

    def test_offload_above_the_bar_is_bold(self):
        rows = [r if r[1] != "pmemblk-dma" else r[:5] + ("0.200",) + r[6:] for r in self.ROWS]
        # 0.2 / 0.5 = 0.40
        lines, _ = self.report(rows)
        self.assertIn("| read-2m-qd4-1j | 0.5000 | 0.2000 | **0.40** | 0.990 |", lines)
        self.assertIn("Offload bar: DMA/CPU at most 0.2 on 0 of 1 2 MiB jobs.", lines)


if __name__ == "__main__":
    unittest.main()
