#!/usr/bin/env python3
"""Per-kernel shared memory for one GPU target (default sm_120), checked against a limit.

Every CUDA source under src/ and tools/ is compiled for the target with ptxas's resource
report; each kernel's static shared memory is added to the dynamic shared memory its source
declares with a line

    // anyr-dynamic-smem-max: <bytes>

(kept true by a static_assert next to it), and the total must not exceed the limit: 99 KB
(101,376 bytes), what a block may use on a GPU with compute capability 12.0.

    scripts/check-smem.py [--arch sm_120] [--limit 101376] [--nvcc PATH]
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
USED = re.compile(r"Used (\d+) registers.*?(?:, (\d+) bytes smem)?(?:,|$)")
SPILL = re.compile(r"(\d+) bytes spill stores")
DYN = re.compile(r"//\s*anyr-dynamic-smem-max:\s*(\d+)")


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout
    pretty = out.splitlines()
    return {n: (p if p else n) for n, p in zip(names, pretty)}


def report(nvcc, arch, src):
    # The library's own CUDA flags that change what compiles (src/CMakeLists.txt).
    cmd = [nvcc, "-std=c++17", "-O3", "--expt-relaxed-constexpr", f"-arch={arch}", "-I",
           str(ROOT / "include"), "-I", str(ROOT / "src"), "-I", str(ROOT / "tools"),
           "--resource-usage", "-cubin", "-o", os.devnull, str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{src}: nvcc failed:\n{r.stderr[-3000:]}")
    kernels = []
    cur = None
    for line in r.stderr.splitlines():
        m = ENTRY.search(line)
        if m:
            cur = {"name": m.group(1), "smem": 0, "regs": 0, "spill": 0}
            kernels.append(cur)
            continue
        if cur is None:
            continue
        m = SPILL.search(line)
        if m:
            cur["spill"] = int(m.group(1))
        m = USED.search(line)
        if m and "registers" in line:
            cur["regs"] = int(m.group(1))
            sm = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(sm.group(1)) if sm else 0
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_120")
    ap.add_argument("--limit", type=int, default=99 * 1024)
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    args = ap.parse_args()
    if not Path(args.nvcc).exists():
        print(f"check-smem: nvcc not found ({args.nvcc})", file=sys.stderr)
        return 2
    sources = sorted(p for d in ("src", "tools") for p in (ROOT / d).rglob("*.cu"))
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        for src, kernels in zip(sources, ex.map(lambda s: report(args.nvcc, args.arch, s),
                                                sources)):
            m = DYN.search(src.read_text())
            dyn = int(m.group(1)) if m else 0
            for k in kernels:
                rows.append((src.relative_to(ROOT), k, dyn))
    names = demangle([k["name"] for _, k, _ in rows])
    bad = 0
    print(f"# shared memory per block for {args.arch} (limit {args.limit} bytes)")
    print(f"{'static':>7} {'dynamic':>8} {'total':>7} {'regs':>5} {'spill':>6}  kernel")
    for src, k, dyn in sorted(rows, key=lambda r: -(r[1]["smem"] + r[2])):
        total = k["smem"] + dyn
        flag = "  OVER THE LIMIT" if total > args.limit else ""
        bad += total > args.limit
        name = re.sub(r"anyr::\(anonymous namespace\)::", "", names[k["name"]])
        name = name if len(name) <= 90 else name[:87] + "..."
        print(f"{k['smem']:>7} {dyn:>8} {total:>7} {k['regs']:>5} {k['spill']:>6}  {name} "
              f"[{src}]{flag}")
    if not rows:
        print("check-smem: no kernels found", file=sys.stderr)
        return 1
    print(f"check-smem: {len(rows)} kernels, {bad} over {args.limit} bytes")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
