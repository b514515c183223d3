#!/usr/bin/env python3
"""The performance targets of the fusion, host-memory and wide-machine issues, judged from the
JSON that `anyreduce bench --json` writes (scripts/device.sh targets runs the benches).

Every verdict compares figures of one bench run: anyreduce and its peer (NCCL, or NCCL + the
standalone add+RMSNorm kernel, or the unfused own path) timed in the same process on the same
buffers. Files, in --dir (each optional; a target without its file is NOT MEASURED):

  fused-none.json, fused-fp8.json, fused-nvfp4.json   bench --op add-rmsnorm [--quant Q], 2 ranks
  host.json               bench -a auto, ANYR_PEER_MEMORY=none NCCL_P2P_DISABLE=1, 2 ranks
  host-wire-native.json, host-wire-fp8.json           the same at 16 MiB, --wire native / fp8
  ar-8.json, fused-8.json bench -a auto / bench --op add-rmsnorm, 8 ranks
  epilogue.json           anyr_epilogue_bench (the standalone add + RMSNorm, one GPU)
  epilogue-torch.json     tools/peers/torch_epilogue_bench.py (eager PyTorch, torch.compile)

The standalone kernel's targets (issue 46) judge one of anyr_epilogue_bench's variants
(--epilogue-case, default auto: the library's choice) against torch.compile, the copy of the
same bytes, the empty kernel and its own unquantized time.

A target is MET when every point it covers meets it, MISSED when one does not (the worst point
is shown), NOT MEASURED when its file or its points are absent. Exit status: 0 judged (targets
met or not), 1 with --require-met and a target MISSED or NOT MEASURED, 2 when a file is
unreadable or malformed, or a bench point was wrong (#wrong or a modified input): a bench that
was not exact is not judged.
"""

import argparse
import json
import os
import sys
from typing import Callable, Dict, List, Optional, Tuple

KIB = 1024
MIB = 1024 * KIB


class InputError(Exception):
    """A file that cannot be judged: unreadable, malformed, or holding a wrong result."""


def read_json(path: str):
    """The JSON document at `path`; InputError when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable JSON file ({e})") from e


def load(directory: str, name: str) -> Optional[dict]:
    """The bench record `name` in `directory`, None when absent; InputError when it cannot be
    used (not JSON, no points, a point missing a field, a point that was not exact)."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return None
    record = read_json(path)
    points = record.get("points") if isinstance(record, dict) else None
    if not isinstance(points, list) or not points or not isinstance(record.get("nranks"), int):
        raise InputError(f"{path}: needs 'nranks' (an integer) and a non-empty 'points' list")
    fused = record.get("op") == "add-rmsnorm"
    needed = (("hidden", "tokens", "fusedUs", "ncclPlusKernelUs", "ownPlusKernelUs", "wrong")
              if fused else ("bytes", "algo", "us", "ncclUs", "wrong"))
    for i, p in enumerate(points):
        missing = [k for k in needed if not isinstance(p, dict) or k not in p]
        if missing:
            raise InputError(f"{path}: point {i} lacks {', '.join(missing)}")
        if p["wrong"] or p.get("inputChanged", 0):
            where = (f"hidden {p['hidden']} x {p['tokens']} tokens" if fused else
                     f"{p['algo']} at {p['bytes']} bytes")
            raise InputError(f"{path}: {where} was not exact (#wrong {p['wrong']}, input "
                             f"changed {p.get('inputChanged', 0)}): not judged")
    return record


def size_text(n: int) -> str:
    for unit, div in (("MiB", MIB), ("KiB", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


# A point a target covers: (label, measured value, whether it meets the target).
Point = Tuple[str, float, bool]


class Verdict:
    def __init__(self, issue: int, text: str, points: List[Point], why_absent: str = "",
                 higher_is_better: bool = True, unit: str = "x") -> None:
        self.issue = issue
        self.unit = unit
        self.text = text
        self.points = points
        self.why_absent = why_absent
        self.higher_is_better = higher_is_better

    @property
    def state(self) -> str:
        if not self.points:
            return "NOT MEASURED"
        return "MET" if all(ok for _, _, ok in self.points) else "MISSED"

    def worst(self) -> Optional[Point]:
        if not self.points:
            return None
        pick = min if self.higher_is_better else max
        return pick(self.points, key=lambda p: p[1])

    def as_json(self) -> dict:
        w = self.worst()
        return {"issue": self.issue, "target": self.text, "state": self.state,
                "points": len(self.points), "missed": sum(1 for p in self.points if not p[2]),
                "worst": None if w is None else {"point": w[0], "value": w[1]},
                "whyNotMeasured": self.why_absent if not self.points else ""}


def ranks_rule(record: Optional[dict], name: str, nranks: int) -> str:
    """'' when `record` exists and was measured at `nranks`, else why the target is absent."""
    if record is None:
        return f"{name} absent"
    if record["nranks"] != nranks:
        return f"{name} was measured at {record['nranks']} ranks, the target is at {nranks}"
    return ""


def fused_points(record: dict, keep: Callable[[dict], bool], value: Callable[[dict], float],
                 ok: Callable[[float], bool]) -> List[Point]:
    out = []
    for p in record["points"]:
        if keep(p) and value(p) is not None:
            v = value(p)
            out.append((f"{p['hidden']} x {p['tokens']}", v, ok(v)))
    return out


def nccl_ratio(p: dict, ours: str, theirs: str) -> Optional[float]:
    """theirs / ours, None where the peer was not timed (no NCCL: -1 in the record)."""
    if p[theirs] is None or p[theirs] <= 0 or p[ours] <= 0:
        return None
    return p[theirs] / p[ours]


def judge_fusion(d: str) -> List[Verdict]:
    files = {q: load(d, f"fused-{q}.json") for q in ("none", "fp8", "nvfp4")}
    none = files["none"]
    why = ranks_rule(none, "fused-none.json", 2)
    wide = (6144, 7168)
    out = []

    def add(text: str, keep, value, ok, higher=True, unit="x"):
        pts = [] if why else fused_points(none, keep, value, ok)
        out.append(Verdict(3, text, pts, why or "no such points in fused-none.json", higher, unit))

    add("fused <= 5 us up to 32 tokens (hidden 6144, 7168)",
        lambda p: p["hidden"] in wide and p["tokens"] <= 32, lambda p: p["fusedUs"],
        lambda v: v <= 5.0, higher=False, unit=" us")
    add("fused >= 3.5x NCCL + kernel up to 32 tokens (hidden 6144, 7168)",
        lambda p: p["hidden"] in wide and p["tokens"] <= 32,
        lambda p: nccl_ratio(p, "fusedUs", "ncclPlusKernelUs"), lambda v: v >= 3.5)
    add("fused >= 2x NCCL + kernel up to 128 tokens (hidden 6144, 7168)",
        lambda p: p["hidden"] in wide and p["tokens"] <= 128,
        lambda p: nccl_ratio(p, "fusedUs", "ncclPlusKernelUs"), lambda v: v >= 2.0)
    # Where fusion loses, the default must not use it: every token count, every output.
    pts: List[Point] = []
    whys = []
    for q, rec in files.items():
        w = ranks_rule(rec, f"fused-{q}.json", 2)
        if w:
            whys.append(w)
            continue
        for label, v, ok in fused_points(rec, lambda p: True,
                                         lambda p: p["ownPlusKernelUs"] / p["fusedUs"],
                                         lambda v: v >= 1.0):
            pts.append((f"{q} {label}", v, ok))
    out.append(Verdict(3, "fused never slower than own all-reduce + kernel (own+k / fused >= 1)",
                       pts, "; ".join(whys)))
    for q, name in (("fp8", "FP8"), ("nvfp4", "NVFP4")):
        rec = files[q]
        w = why or ranks_rule(rec, f"fused-{q}.json", 2)
        pts = []
        if not w:
            base = {(p["hidden"], p["tokens"]): p["fusedUs"] for p in none["points"]}
            for p in rec["points"]:
                key = (p["hidden"], p["tokens"])
                if key in base:
                    v = p["fusedUs"] / base[key]
                    pts.append((f"{key[0]} x {key[1]}", v, v <= 1.10))
        out.append(Verdict(3, f"{name} output <= 1.10x the unquantized fused op (same points)",
                           pts, w or f"no point common to fused-{q}.json and fused-none.json",
                           higher_is_better=False))
    return out


def auto_points(record: dict, keep: Callable[[int], bool], ok: Callable[[float], bool]
                ) -> List[Point]:
    out = []
    for p in record["points"]:
        if p["algo"] == "auto" and keep(p["bytes"]) and p["ncclUs"] and p["ncclUs"] > 0:
            v = p["ncclUs"] / p["us"]
            out.append((f"{size_text(p['bytes'])} ({p.get('chosen', '?')})", v, ok(v)))
    return out


def judge_host(d: str) -> List[Verdict]:
    host = load(d, "host.json")
    why = ranks_rule(host, "host.json", 2)
    out = []
    for text, keep, floor in (
            ("host path (auto, no peer access) >= 2x NCCL without P2P up to 64 KiB",
             lambda b: b <= 64 * KIB, 2.0),
            ("host path (auto, no peer access) >= 1.2x NCCL without P2P, 256 KiB to 16 MiB",
             lambda b: 256 * KIB <= b <= 16 * MIB, 1.2)):
        pts = [] if why else auto_points(host, keep, lambda v, f=floor: v >= f)
        out.append(Verdict(8, text, pts, why or "no auto point of that range in host.json"))
    native, fp8 = load(d, "host-wire-native.json"), load(d, "host-wire-fp8.json")
    why = ranks_rule(native, "host-wire-native.json", 2) or ranks_rule(fp8, "host-wire-fp8.json", 2)
    pts = []
    if not why:
        slow = {p["bytes"]: p["us"] for p in native["points"] if p["algo"] == "auto"}
        for p in fp8["points"]:
            if p["algo"] == "auto" and p["bytes"] == 16 * MIB and p["bytes"] in slow:
                v = slow[p["bytes"]] / p["us"]
                pts.append(("16 MiB", v, v >= 1.6))
    out.append(Verdict(8, "FP8 wire >= 1.6x the uncompressed host path at 16 MiB", pts,
                       why or "no 16 MiB auto point in both wire files"))
    return out


def judge_wide(d: str) -> List[Verdict]:
    ar, fused = load(d, "ar-8.json"), load(d, "fused-8.json")
    why = ranks_rule(ar, "ar-8.json", 8)
    out = []
    for text, keep, floor in (("all-reduce (auto) >= 3x NCCL up to 256 KiB at 8 ranks",
                               lambda b: b <= 256 * KIB, 3.0),
                              ("all-reduce (auto) never below NCCL at 8 ranks (any size)",
                               lambda b: True, 1.0)):
        pts = [] if why else auto_points(ar, keep, lambda v, f=floor: v >= f)
        out.append(Verdict(9, text, pts, why or "no auto point of that range in ar-8.json"))
    why = ranks_rule(fused, "fused-8.json", 8)
    pts = [] if why else fused_points(
        fused, lambda p: p["hidden"] == 6144 and p["tokens"] <= 32,
        lambda p: nccl_ratio(p, "fusedUs", "ncclPlusKernelUs"), lambda v: v >= 3.0)
    out.append(Verdict(9, "fused >= 3x NCCL + kernel up to 32 tokens at hidden 6144, 8 ranks",
                       pts, why or "no such points in fused-8.json"))
    return out


def load_epilogue(directory: str, name: str, needed: Tuple[str, ...]) -> Optional[dict]:
    """epilogue.json / epilogue-torch.json, None when absent; InputError when malformed or when
    a check failed (a wrong result is not judged)."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return None
    record = read_json(path)
    rows = record.get("results") if isinstance(record, dict) else None
    if not isinstance(rows, list) or not rows or not isinstance(record.get("wrong"), list):
        raise InputError(f"{path}: needs a non-empty 'results' list and a 'wrong' list")
    for i, r in enumerate(rows):
        missing = [k for k in needed if not isinstance(r, dict) or k not in r]
        if missing:
            raise InputError(f"{path}: result {i} lacks {', '.join(missing)}")
    if record["wrong"]:
        w = record["wrong"][0]
        raise InputError(f"{path}: {len(record['wrong'])} checks failed (first: {w}): not judged")
    return record


def judge_epilogue(d: str, case: str = "auto") -> List[Verdict]:
    ours = load_epilogue(d, "epilogue.json", ("dtype", "hidden", "tokens", "case", "quant", "us"))
    torch = load_epilogue(d, "epilogue-torch.json", ("dtype", "hidden", "tokens", "compile_us"))
    why = "" if ours is not None else "epilogue.json absent"
    us: Dict[Tuple[str, int, int, str, str], float] = {}
    if ours is not None:
        for r in ours["results"]:
            if r["us"] is not None and r["us"] > 0:
                us[(r["dtype"], r["hidden"], r["tokens"], r["case"], r["quant"])] = r["us"]
        if not any(k[3] == case for k in us):
            why = f"epilogue.json has no timed '{case}'"
    shapes = sorted({k[:3] for k in us if k[3] == case and k[4] == "none"})

    def label(k):
        return f"{k[0]} {k[1]} x {k[2]}"

    out = []
    for floor, keep, text in ((1.0, lambda t: True, "at every shape"),
                              (1.2, lambda t: t == 512, "at 512 tokens")):
        pts: List[Point] = []
        w = why or ("" if torch is not None else "epilogue-torch.json absent")
        if not w:
            for r in torch["results"]:
                k = (r["dtype"], r["hidden"], r["tokens"])
                mine = us.get(k + (case, "none"))
                if keep(k[2]) and mine and r["compile_us"]:
                    v = r["compile_us"] / mine
                    pts.append((label(k), v, v >= floor))
        out.append(Verdict(46, f"standalone ({case}) >= {floor:.1f}x torch.compile {text}", pts,
                           w or "no shape common to both files"))
    pts = []
    for k in shapes:
        copy = [us.get(k + (c, "none")) for c in ("copy", "copy-kernel")]
        copy = [c for c in copy if c]
        if k[2] in (2048, 8192) and copy:
            v = min(copy) / us[k + (case, "none")]
            pts.append((label(k), v, v >= 0.90))
    out.append(Verdict(46, f"standalone ({case}) >= 90% of the copy bandwidth at 2048, 8192 tokens",
                       pts, why or "no 2048- or 8192-token shape with a copy"))
    pts = []
    for k in shapes:
        empty = us.get(k + ("empty", "none"))
        if k[2] == 1 and empty:
            v = us[k + (case, "none")] - empty
            pts.append((label(k), v, v <= 0.30))
    out.append(Verdict(46, f"standalone ({case}) one token within 0.3 us of an empty kernel", pts,
                       why or "no one-token shape with an empty kernel", higher_is_better=False,
                       unit=" us"))
    for q, name in (("fp8", "FP8"), ("nvfp4", "NVFP4")):
        pts = []
        for k in shapes:
            quant = us.get(k + (case, q))
            if quant:
                v = quant / us[k + (case, "none")]
                pts.append((label(k), v, v <= 1.05))
        out.append(Verdict(46, f"standalone ({case}) {name} output <= 1.05x unquantized", pts,
                           why or f"no {name} point", higher_is_better=False))
    return out


def judge(directory: str, epilogue_case: str = "auto") -> List[Verdict]:
    return (judge_fusion(directory) + judge_host(directory) + judge_wide(directory) +
            judge_epilogue(directory, epilogue_case))


def report(verdicts: List[Verdict]) -> str:
    lines = [f"{'issue':>5}  {'state':<12}  {'worst point':<34}  target"]
    for v in verdicts:
        w = v.worst()
        if w is None:
            worst = f"({v.why_absent})"
        else:
            worst = f"{w[1]:.2f}{v.unit} at {w[0]}"
            if v.state == "MISSED":
                worst += f", {sum(1 for p in v.points if not p[2])}/{len(v.points)} missed"
        lines.append(f"{v.issue:>5}  {v.state:<12}  {worst:<34}  {v.text}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="folder of the bench JSON files")
    ap.add_argument("--json", help="write the verdicts here")
    ap.add_argument("--require-met", action="store_true",
                    help="exit 1 unless every target is MET")
    ap.add_argument("--epilogue-case", default="auto",
                    help="the anyr_epilogue_bench variant the standalone targets judge")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.dir):
        print(f"check_targets: argument '--dir': {args.dir} is not a folder", file=sys.stderr)
        return 2
    try:
        verdicts = judge(args.dir, args.epilogue_case)
    except InputError as e:
        print(f"check_targets: {e}", file=sys.stderr)
        return 2
    print(report(verdicts))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([v.as_json() for v in verdicts], f, indent=2)
            f.write("\n")
    states: Dict[str, int] = {}
    for v in verdicts:
        states[v.state] = states.get(v.state, 0) + 1
    print("# " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
    if args.require_met and any(v.state != "MET" for v in verdicts):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
