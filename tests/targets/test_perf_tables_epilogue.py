"""scripts/perf-tables.py --import-epilogue: `scripts/device.sh epilogue`'s JSON as a run file.

The records are written the way anyr_epilogue_bench and tools/peers/torch_epilogue_bench.py
write them, with made-up figures; the run file must pass the generator's own rules and give one
current-table row per shape.
"""

import importlib.util
import os
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC = importlib.util.spec_from_file_location(
    "perf_tables", os.path.join(_HERE, "..", "..", "scripts", "perf-tables.py"))
pt = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(pt)


def bench():
    rows = []
    for tokens, mine in ((1, 0.9), (8192, 100.0)):
        for case, us in (("empty", 0.55), ("copy", 96.0 if tokens > 1 else 1.2),
                         ("copy-kernel", 94.0 if tokens > 1 else 1.3), ("auto", mine),
                         ("rows", mine * 1.1)):
            rows.append({"dtype": "bf16", "hidden": 6144, "tokens": tokens, "case": case,
                         "quant": "none", "us": us, "launch": "x", "checked": True})
        rows.append({"dtype": "bf16", "hidden": 6144, "tokens": tokens, "case": "auto",
                     "quant": "nvfp4", "us": mine * 1.02, "launch": "x", "checked": True})
    return {"tool": "anyr_epilogue_bench", "gpu": "NVIDIA H200", "sms": 132, "driver": 13000,
            "variants": ["auto", "rows"], "method": "m", "copy": "c", "quant": "q",
            "results": rows, "wrong": []}


def torch():
    return {"tool": "torch_epilogue_bench", "torch": "2.9", "compile_shapes": "static",
            "method": "t", "wrong": [],
            "results": [{"dtype": "bf16", "hidden": 6144, "tokens": 1, "empty_us": 0.5,
                         "eager_us": 9.0, "compile_us": 2.47, "anyreduce_us": 0.9}]}


class ImportEpilogue(unittest.TestCase):
    def test_run_file_rows_and_table(self):
        run = pt.epilogue_run(bench(), torch(), "auto", "2026-12-05", 99, "abc1234", "")
        for key, kind in pt.REQUIRED.items():
            self.assertIsInstance(run[key], kind, key)
        current = [r for r in run["results"] if "family" in r]
        self.assertEqual([r["shape"] for r in current], ["bf16, 6144 x 1", "bf16, 6144 x 8192"])
        one, big = current
        self.assertEqual(one["anyreduce"], 0.9)
        self.assertEqual(one["empty"], 0.55)
        self.assertEqual(one["copy of the same bytes"], 1.2)
        self.assertEqual(one["torch.compile"], 2.47)
        self.assertEqual(one["torch.compile / anyreduce"], round(2.47 / 0.9, 3))
        self.assertEqual(one["nvfp4 / none"], 1.02)
        self.assertEqual(big["copy of the same bytes"], 94.0)  # the faster copy
        self.assertEqual(big["copy / anyreduce"], 0.94)
        self.assertNotIn("torch.compile", big)  # not measured by torch there
        history = [r for r in run["results"] if r.get("table") == "anyr_epilogue_bench"]
        self.assertEqual(len(history), len(bench()["results"]))
        self.assertEqual(len([r for r in run["results"]
                              if r.get("table") == "torch_epilogue_bench"]), 1)
        run["_file"] = "2026-12-05-standalone-epilogue.json"
        text = pt.generate([run])
        self.assertIn("| bf16, 6144 x 8192 |", text)
        self.assertIn("1 x NVIDIA H200", text)

    def test_many_shapes_are_one_grid_per_dtype(self):
        b = bench()
        rows = []
        for dtype in ("bf16", "fp16"):
            for hidden in (2880, 6144):
                for tokens in (1, 8, 32, 128):
                    us = hidden * tokens / 1000.0 + 1.0
                    for case, t in (("copy", us * 0.9), ("auto", us)):
                        rows.append({"dtype": dtype, "hidden": hidden, "tokens": tokens,
                                     "case": case, "quant": "none", "us": t, "launch": "x"})
        b["results"] = rows
        run = pt.epilogue_run(b, None, "auto", "2026-12-05", 99, "abc1234", "")
        run["_file"] = "2026-12-05-standalone-epilogue.json"
        text = pt.generate([run])
        self.assertNotIn("| bf16, 6144 x 128 |", text)
        self.assertIn("| bf16 | 1 | 8 | 32 | 128 |", text)
        self.assertIn("| fp16 | 1 | 8 | 32 | 128 |", text)
        # hidden 6144 x 128 tokens: 787.43 us, the copy 0.9 of it
        self.assertIn("| 6144 | 7.14 · 0.90 | 50.15 · 0.90 | 197.61 · 0.90 | 787.43 · 0.90 |", text)
        self.assertIn("copy / anyreduce", text)

    def test_another_case_and_no_torch(self):
        run = pt.epilogue_run(bench(), None, "rows", "2026-12-05", 99, "abc1234", "t")
        current = [r for r in run["results"] if "family" in r]
        self.assertEqual(current[1]["anyreduce"], 110.0)
        self.assertNotIn("torch.compile", current[0])
        self.assertIn("copy", run["peer"])


if __name__ == "__main__":
    unittest.main()
