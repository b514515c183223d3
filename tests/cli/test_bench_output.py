"""`anyreduce bench` read by an nccl-tests parser (nccl_tests_format.py), and the bench's flags.

CPU (ANYR_BENCH_LIVE unset): the table of a recorded run (`bench --load`, a made-up record under
tests/fixtures), its --json, and the command line's nccl-tests flags and old meanings (GPUs
hidden: every case stops at parsing or right after it).
GPU (ANYR_BENCH_LIVE=1): a real run on the visible GPUs, read by the same parser; with fewer than
two GPUs it prints "SKIPPED: bench needs two GPUs" (ctest then reports it skipped).

Environment: ANYR_TOOL (the anyreduce binary), ANYR_BENCH_FIXTURE (the record).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nccl_tests_format  # noqa: E402

TOOL = os.environ.get("ANYR_TOOL", "")
FIXTURE = os.environ.get("ANYR_BENCH_FIXTURE", "")
LIVE = os.environ.get("ANYR_BENCH_LIVE") == "1"

# The column header as nccl-tests' all_reduce_perf prints it (the brief's and nccl-tests'
# long-standing spelling; later releases put two spaces before "#wrong", which a parser that
# splits on whitespace reads the same).
NCCL_TESTS_HEADER = ("#       size         count      type   redop    root     time   algbw   busbw"
                     " #wrong     time   algbw   busbw #wrong")


def run(*args, env_extra=None, hide_gpus=False):
    env = dict(os.environ)
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(env_extra or {})
    p = subprocess.run([TOOL, *args], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=600)
    return p.returncode, p.stdout, p.stderr


def nranks_of(parsed):
    for c in parsed["comments"]:
        fields = c.split()
        if "nRanks" in fields:
            return int(fields[fields.index("nRanks") + 1])
    raise AssertionError("no '# nRanks N' line")


class TableChecks:
    """The checks a table passes whatever made it."""

    def check_table(self, text, expect_rows=None):
        parsed = nccl_tests_format.parse(text)
        self.assertIsNotNone(parsed["header"], "no column header")
        self.assertEqual(parsed["header"][:13], nccl_tests_format.COLUMNS)
        header_line = next(c for c in parsed["comments"] if c.split()[1:3] == ["size", "count"])
        self.assertTrue(header_line.startswith(NCCL_TESTS_HEADER), header_line)
        n = nranks_of(parsed)
        rows = parsed["rows"]
        if expect_rows is not None:
            self.assertEqual(len(rows), expect_rows)
        self.assertGreater(len(rows), 0)
        busbws = []
        for r in rows:
            self.assertEqual(r["redop"], "sum")
            self.assertEqual(r["root"], -1)
            self.assertIn(r["type"], ("bfloat16", "half", "float"))
            elt = {"bfloat16": 2, "half": 2, "float": 4}[r["type"]]
            self.assertEqual(r["size"], r["count"] * elt)
            for g in (r["out_of_place"], r["in_place"]):
                # algbw = bytes / time (GB/s from us), busbw = algbw * 2 (n-1) / n; the table
                # prints 2 decimals, so compare at that precision.
                self.assertGreater(g["time"], 0)
                algbw = r["size"] / (g["time"] * 1e3)
                self.assertAlmostEqual(g["algbw"], algbw, delta=0.006 + 0.002 * algbw)
                self.assertAlmostEqual(g["busbw"], g["algbw"] * 2 * (n - 1) / n,
                                       delta=0.011 + 0.002 * g["busbw"])
                self.assertEqual(g["wrong"], 0)
                busbws.append(g["busbw"])
            # anyreduce's trailing columns: the algorithm, NCCL's time, the speedup.
            self.assertEqual(len(r["extra"]), 3, r)
        self.assertEqual(parsed["out_of_bounds"], (0, "OK"))
        self.assertAlmostEqual(parsed["avg_busbw"], sum(busbws) / len(busbws), delta=0.01)
        last = parsed["last_lines"]
        self.assertRegex(last[0], r"^# Out of bounds values : 0 OK$")
        self.assertRegex(last[1], r"^# Avg bus bandwidth    : [0-9.e+-]+$")
        return parsed


@unittest.skipIf(LIVE, "the CPU checks")
class RecordedTable(unittest.TestCase, TableChecks):
    def test_table_parses(self):
        rc, out, err = run("bench", "--load", FIXTURE)
        self.assertEqual(rc, 0, err)
        parsed = self.check_table(out, expect_rows=9)
        first = parsed["rows"][0]
        self.assertEqual((first["size"], first["count"], first["type"]), (1024, 512, "bfloat16"))
        self.assertEqual(first["out_of_place"]["time"], 6.12)
        self.assertEqual(first["extra"][0], "auto:oneshot-push")
        self.assertEqual(first["extra"][1], "14.20")
        self.assertNotIn("\r", err)  # no progress line off a terminal

    def test_json_has_bandwidths(self):
        rc, out, err = run("bench", "--load", FIXTURE, "--json")
        self.assertEqual(rc, 0, err)
        j = json.loads(out)  # stdout is the JSON alone
        self.assertEqual(j["nranks"], 4)
        for p in j["points"]:
            algbw = p["bytes"] / (p["us"] * 1e3)
            self.assertAlmostEqual(p["algbw"], algbw, places=9)
            self.assertAlmostEqual(p["busbw"], algbw * 2 * 3 / 4, places=9)
            ip = p["inPlace"]
            self.assertAlmostEqual(ip["algbw"], p["bytes"] / (ip["us"] * 1e3), places=9)
            self.assertAlmostEqual(ip["busbw"], ip["algbw"] * 1.5, places=9)
        self.assertEqual(j["outOfBounds"], 0)

    def test_json_file_round_trip(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "again.json")
            rc, first, err = run("bench", "--load", FIXTURE, "--json", path)
            self.assertEqual(rc, 0, err)
            rc, second, err = run("bench", "--load", path)
            self.assertEqual(rc, 0, err)
            self.assertEqual(first, second)


@unittest.skipIf(LIVE, "the CPU checks")
class Flags(unittest.TestCase):
    """Parsing only (GPUs hidden). A parse error is CLI11's, which always ends with "Run with
    --help for more information."; a command that parsed went on to look for GPUs."""

    def parses(self, *args):
        rc, out, err = run(*args, hide_gpus=True)
        self.assertNotIn("Run with --help", out + err, f"{args}: {out}{err}")
        self.assertNotEqual(rc, 0)  # no GPU: nothing ran
        return out + err

    def refused(self, want, *args):
        rc, out, err = run(*args, hide_gpus=True)
        self.assertNotEqual(rc, 0)
        self.assertIn("Run with --help", out + err)
        self.assertIn(want, out + err)

    def test_nccl_tests_flags_parse(self):
        self.parses("bench", "-b", "8", "-e", "128M", "-f", "2", "-g", "8", "-n", "20", "-w", "1",
                    "-c", "1", "-d", "float", "-o", "sum", "-G", "10", "-a", "3")
        self.parses("bench", "-d", "all", "-a", "0", "-c", "0", "-G", "0")
        self.parses("bench", "-d", "bfloat16,half", "--ranks", "4")

    def test_old_meanings_are_said(self):
        # -n was the number of ranks; it is nccl-tests' iterations now: a note says so.
        text = self.parses("bench", "-n", "2")
        self.assertIn("-n 2 is the number of calls per timed sample", text)
        self.assertIn("--ranks", text)
        self.assertNotIn("-n 2 is the number", self.parses("bench", "-n", "2", "--ranks", "2"))
        # -a took algorithm names; it is nccl-tests' averaging now.
        self.refused("algorithms are chosen with --algos (use --algos auto,nccl)",
                     "bench", "-a", "auto,nccl")
        self.refused("must be 0 (rank 0), 1 (mean over ranks), 2 (min) or 3 (max)",
                     "bench", "-a", "4")
        for cmd in (["tune"], ["explain"], ["doctor", "--preset", "tiny"]):
            text = self.parses(*cmd, "-n", "2")
            self.assertIn("-n 2 is deprecated for the number of ranks; use --ranks 2", text)

    def test_refusals(self):
        self.refused("anyreduce's all-reduce sums", "bench", "-o", "max")
        self.refused("unknown dtype 'int8'", "bench", "-d", "int8")
        self.refused("contradicts -G 5", "bench", "-G", "5", "--samples", "7")
        self.refused("--no-graph: contradicts -G 3", "bench", "-G", "3", "--no-graph")
        self.refused("--ngpus", "bench", "-g", "0")

    def test_version_and_help(self):
        rc, out, _ = run("--version")
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"^anyreduce \d+\.\d+\.\d+\n$")
        rc, out, _ = run()
        self.assertEqual(rc, 0)
        for word in ("Subcommands:", "bench", "tune", "doctor", "--version"):
            self.assertIn(word, out)
        for cmd in ("probe", "bench", "tune", "explain", "doctor", "env", "version"):
            rc, out, _ = run(cmd, "--help")
            self.assertEqual(rc, 0, cmd)
            self.assertIn("--json [FILE]", out, cmd)
        rc, out, _ = run("bench", "--help")
        self.assertRegex(out, r"--peer-memory none\|auto\|cuda-ipc\|vmm")
        self.assertNotRegex(out, r"--peer-memory INT")

    def test_json_everywhere(self):
        rc, out, err = run("version", "--json")
        self.assertEqual(rc, 0, err)
        self.assertRegex(json.loads(out)["version"], r"^\d+\.\d+\.\d+$")
        rc, out, err = run("env", "--json")
        self.assertEqual(rc, 0, err)
        self.assertTrue(any(p["name"] == "ANYR_ALGO" for p in json.loads(out)))


@unittest.skipUnless(LIVE, "needs GPUs (ANYR_BENCH_LIVE=1)")
class LiveTable(unittest.TestCase, TableChecks):
    def test_live_run_parses(self):
        rc, out, err = run("bench", "-b", "1K", "-e", "64K", "-f", "4", "-n", "5", "-G", "3",
                           "-w", "1", "--algos", "auto,nccl", "-d", "bf16,float")
        if rc == 3:  # kExitNoGpu: no usable GPU, or one (the bench needs two ranks)
            print("SKIPPED: bench needs two GPUs:", err.strip(), flush=True)
            self.skipTest(err.strip())
        self.assertEqual(rc, 0, out + err)
        self.check_table(out)  # rows: 2 dtypes x 4 sizes x the admitted algorithms
        self.assertNotIn("\r", err)  # stderr is a pipe here: no progress line
        rc, out, err = run("bench", "-b", "1K", "-e", "4K", "-n", "2", "-G", "2", "-w", "0",
                           "--algos", "auto", "--json")
        self.assertEqual(rc, 0, err)
        j = json.loads(out)
        self.assertEqual(len(j["points"]), 2)
        for p in j["points"]:
            self.assertIn("algbw", p)
            self.assertIn("busbw", p["inPlace"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
