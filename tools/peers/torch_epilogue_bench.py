#!/usr/bin/env python3
"""The standalone add + RMSNorm of anyreduce (``anyreduce.torch.add_rms_norm`` with
``residual_out`` and ``out``) beside the same function in eager PyTorch and compiled by
``torch.compile`` (Inductor, ``fullgraph=True``), timed like ``anyr_epilogue_bench``: CUDA-graph
replay of --calls calls, the median of --samples replays after two warm-up replays, us per call,
fresh random inputs per shape; and an empty kernel (``torch.cuda._sleep(0)``) as the floor of
one graph node. One GPU.

The function, anyreduce's contract in PyTorch (x is already in the dtype, so round(x) = x)::

    r = (x.float() + residual.float()).to(dtype)
    y = (r.float() * rsqrt(mean(r.float()^2) + eps) * weight.float()).to(dtype)
    return y, r

Every shape is checked before it is timed: anyreduce's r bit-exact against eager's and the
compiled one's, its y within one ulp of the dtype of the fp64 value, eager's and the compiled y
within two ulps of anyreduce's (each rounds its own fp32 sum). A wrong result is printed (WRONG
...), that shape is not timed, and the script exits with status 4 at the end.

torch.compile must compile, never fall back to eager in silence: the recompile and cache limits
are raised (every shape of a static run is its own graph), ``fail_on_cache_limit_hit`` is set
where this torch has it, errors are not suppressed, and each new shape must add a compiled
graph (torch._dynamo's counters) or the script fails. --compile-shapes static (default)
compiles per shape, as a model with fixed shapes gets it; dynamic marks the token count dynamic
(one graph per dtype and hidden size, plus one for a single token), quicker to compile.

Usage: python3 tools/peers/torch_epilogue_bench.py [--json FILE] [--dtypes bf16,fp16]
    [--hidden 2880,4096,5120,6144,7168,8192] [--tokens 1,8,32,128,512,2048,8192]
    [--calls 50] [--samples 15] [--compile-shapes static|dynamic]
(ANYREDUCE_LIBRARY names the library to load, PYTHONPATH the python/ folder, as for the tests.)
"""
import argparse
import json
import sys
import time


def ints(text):
    return [int(v) for v in text.split(",") if v]


def raise_dynamo_limits(torch):
    """Every shape compiles: no limit sends a call to eager in silence."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 4096)
    for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 1 << 16)
    if hasattr(cfg, "fail_on_cache_limit_hit"):
        cfg.fail_on_cache_limit_hit = True
    cfg.suppress_errors = False


def compiled_graphs(torch):
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def ulp(t, dtype, torch):
    """The dtype's spacing at |t| (t float), the subnormal spacing below the smallest normal."""
    bits, min_exp = (8, -126) if dtype == torch.bfloat16 else (11, -14)
    e = torch.frexp(t.abs()).exponent.to(torch.int32) - 1  # |t| in [2^e, 2^(e+1))
    e = torch.clamp(e, min=min_exp)
    return torch.ldexp(torch.ones_like(t), (e - (bits - 1)).to(t.dtype))


def time_graph(torch, fn, calls, samples):
    """Median us per call of `calls` fn() calls captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls):
            fn()
    times = []
    with torch.cuda.stream(s):
        for _ in range(2):
            g.replay()
        for _ in range(samples):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000.0 / calls)
    del g
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default="")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--hidden", default="2880,4096,5120,6144,7168,8192")
    p.add_argument("--tokens", default="1,8,32,128,512,2048,8192")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--compile-shapes", choices=("static", "dynamic"), default="static")
    args = p.parse_args()

    import torch

    import anyreduce.torch as art

    if not torch.cuda.is_available():
        print("torch_epilogue_bench: no CUDA GPU visible; nothing to measure")
        return 0
    raise_dynamo_limits(torch)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    eps = args.eps

    def add_rms_norm(x, residual, weight):
        r = (x.float() + residual.float()).to(x.dtype)
        rf = r.float()
        y = rf * torch.rsqrt(rf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
        return y.to(x.dtype), r

    dynamic = args.compile_shapes == "dynamic"
    doc = {
        "tool": "torch_epilogue_bench",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "calls": args.calls,
        "samples": args.samples,
        "compile_shapes": args.compile_shapes,
        "method": "CUDA-graph replay of `calls` calls, the median of `samples` replays after two "
                  "warm-up replays, us per call; fresh random inputs per shape; anyreduce with "
                  "residual_out and out given; eager and compiled return new tensors (from the "
                  "graph's pool: no allocation at replay)",
        "results": [],
        "wrong": [],
    }

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)

    print(f"# torch_epilogue_bench: {doc['gpu']}, torch {torch.__version__}, graph replay of "
          f"{args.calls} calls, median of {args.samples}, us per call; torch.compile "
          f"{args.compile_shapes} shapes")
    print(f"{'dtype':>5} {'hidden':>6} {'tokens':>6} {'empty':>7} {'eager':>8} {'compile':>8} "
          f"{'anyreduce':>9} {'compile/any':>11} {'compile s':>9}")
    wrong = 0
    gen = torch.Generator(device="cuda")
    for dn in args.dtypes.split(","):
        dtype = dtypes[dn]
        for hidden in ints(args.hidden):
            # A fresh compiled function per hidden size: its graphs are this width's only.
            compiled = torch.compile(add_rms_norm, fullgraph=True,
                                     dynamic=None if dynamic else False)
            for tokens in ints(args.tokens):
                gen.manual_seed(100003 * hidden + 7 * tokens + (dn == "fp16"))
                x = (torch.rand(tokens, hidden, device="cuda", generator=gen) * 8 - 4).to(dtype)
                res = (torch.rand(tokens, hidden, device="cuda", generator=gen) * 8 - 4).to(dtype)
                w = (torch.rand(hidden, device="cuda", generator=gen) * 3 - 1.5).to(dtype)
                ro = torch.empty_like(x)
                out = torch.empty_like(x)
                if dynamic and tokens > 1:
                    torch._dynamo.mark_dynamic(x, 0)
                    torch._dynamo.mark_dynamic(res, 0)
                before = compiled_graphs(torch)
                t0 = time.time()
                yc, rc = compiled(x, res, w)
                torch.cuda.synchronize()
                compile_s = time.time() - t0
                added = compiled_graphs(torch) - before
                if not dynamic and added < 1:
                    print(f"torch_epilogue_bench: {dn} {hidden} x {tokens}: torch.compile added no "
                          "graph for a new static shape (a fallback to eager?)", file=sys.stderr)
                    return 3
                ye, re_ = add_rms_norm(x, res, w)
                art.add_rms_norm(x, res, w, eps, residual_out=ro, out=out)
                torch.cuda.synchronize()
                # The checks.
                why = ""
                r64 = ro.double()
                exact = (r64 * torch.rsqrt(r64.pow(2).mean(dim=-1, keepdim=True) + eps)
                         * w.double())
                if not torch.equal(ro, re_) or not torch.equal(ro, rc):
                    why = "residual_out differs from eager's / the compiled r"
                elif not bool(((out.double() - exact).abs() <= ulp(exact.float(), dtype, torch)
                               .double()).all()):
                    why = "anyreduce's y is more than one ulp from the fp64 value"
                else:
                    two = 2 * ulp(out.float(), dtype, torch)
                    for name, y in (("eager", ye), ("compiled", yc)):
                        if not bool(((y.float() - out.float()).abs() <= two).all()):
                            why = f"{name} y is more than two ulps from anyreduce's"
                row = {"dtype": dn, "hidden": hidden, "tokens": tokens,
                       "compile_s": round(compile_s, 3)}
                if why:
                    print(f"WRONG {dn} hidden {hidden} tokens {tokens}: {why}", file=sys.stderr)
                    doc["wrong"].append(dict(row, what=why))
                    wrong += 1
                    continue
                del ye, re_, yc, rc
                row["empty_us"] = time_graph(torch, lambda: torch.cuda._sleep(0), args.calls,
                                             args.samples)
                row["eager_us"] = time_graph(torch, lambda: add_rms_norm(x, res, w), args.calls,
                                             args.samples)
                row["compile_us"] = time_graph(torch, lambda: compiled(x, res, w), args.calls,
                                               args.samples)
                if not dynamic and compiled_graphs(torch) != before + added:
                    print(f"torch_epilogue_bench: {dn} {hidden} x {tokens}: torch.compile "
                          "recompiled while timed", file=sys.stderr)
                    return 3
                row["anyreduce_us"] = time_graph(
                    torch, lambda: art.add_rms_norm(x, res, w, eps, residual_out=ro, out=out),
                    args.calls, args.samples)
                doc["results"].append(row)
                print(f"{dn:>5} {hidden:>6} {tokens:>6} {row['empty_us']:7.2f} "
                      f"{row['eager_us']:8.2f} {row['compile_us']:8.2f} {row['anyreduce_us']:9.2f} "
                      f"{row['compile_us'] / row['anyreduce_us']:11.2f} {compile_s:9.1f}",
                      flush=True)
                save()
    save()
    if wrong:
        print(f"torch_epilogue_bench: {wrong} WRONG shapes (not timed; see above)",
              file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
