"""Unit tests of common.sh's bench_options and bench_check, the bench scripts' one option parser (scripts/test runs
them: python3 -m unittest discover -s scripts/lib). Each runs the real functions in bash."""

import os
import subprocess
import unittest

COMMON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "common.sh")
# A bench script's shape: defaults, its usage, then the shared parser and checks; prints what it was given.
SCRIPT = """
set -euo pipefail
. "$COMMON"
usage() { echo "usage $1"; exit "$1"; }
RUNTIME=8 OUT=out TLS=0 SETS=()
bench_options bench-x "--runtime=RUNTIME --out=OUT --tls=TLS:1 --set+=SETS" "$@"
bench_check bench-x --runtime "$RUNTIME" "$BENCH_WHOLE" "whole seconds >= 1"
echo "RUNTIME=$RUNTIME OUT=$OUT TLS=$TLS SETS=${SETS[*]}"
"""


def run(*args):
    p = subprocess.run(["bash", "-c", SCRIPT, "bench-x", *args], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, COMMON=COMMON))
    return p.returncode, p.stdout, p.stderr


class BenchOptionsTest(unittest.TestCase):
    def test_values_flags_and_repeated_sets_land_where_the_spec_says(self):
        rc, out, _ = run("--set", "a=1", "--runtime", "3", "--tls", "--set", "b=two words", "--out", "d")
        self.assertEqual(rc, 0)
        self.assertEqual(out.strip(), "RUNTIME=3 OUT=d TLS=1 SETS=--set a=1 --set b=two words")

    def test_defaults_stay_without_options(self):
        self.assertEqual(run()[1].strip(), "RUNTIME=8 OUT=out TLS=0 SETS=")

    def test_an_unknown_option_is_named_and_exits_2_with_the_usage_on_stderr(self):
        rc, out, err = run("--runtime", "3", "--bogus")
        self.assertEqual((rc, out), (2, ""))
        self.assertEqual(err, "bench-x: unknown option '--bogus'\nusage 2\n")

    def test_an_option_without_its_value_is_named(self):
        rc, _, err = run("--out")
        self.assertEqual(rc, 2)
        self.assertIn("bench-x: --out wants a value", err)

    def test_help_is_the_usage_with_status_0(self):
        self.assertEqual(run("--runtime", "3", "-h")[:2], (0, "usage 0\n"))

    def test_the_check_names_option_value_and_what_is_allowed(self):
        for bad in ("0", "x", "-1", ""):
            rc, _, err = run("--runtime", bad)
            self.assertEqual(rc, 2, bad)
            self.assertIn(f"bench-x: --runtime wants whole seconds >= 1, got '{bad}'", err)
        self.assertEqual(run("--runtime", "010")[0], 0)


if __name__ == "__main__":
    unittest.main()
