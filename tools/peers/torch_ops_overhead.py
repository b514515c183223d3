#!/usr/bin/env python3
"""Host time per eager call of an all-reduce through the three Python doors of anyreduce:
``Communicator.all_reduce`` (ctypes), ``torch.ops.anyreduce.all_reduce_inplace`` and
``torch.ops.anyreduce.all_reduce`` (the dispatcher operators of anyreduce/_torch_ops.py, which
torch.compile keeps in its graphs), plus the fused op both ways. Inside a CUDA graph none of
this host time is paid; this is what an eager (or compiled, not graphed) model pays per call.

Two ranks (spawned here; rank r on GPU r % device_count, so one GPU is enough: the host time
is what is measured, the GPU time is not). Each door: 20 warm-up calls, then ROUNDS rounds of
CALLS calls timed on the host without synchronizing (a full GPU queue would stall the host, so
the calls are small and few), the median round per call; then each door's result is checked
against the ctypes call's (bit-identical). Prints a table and, with --json, writes the figures.

Usage: python3 tools/peers/torch_ops_overhead.py [--elements 4096] [--json FILE] [--profile DOOR]
"""
import argparse
import json
import os
import statistics
import time


def profile(call, calls: int) -> None:
    """cProfile of `calls` calls of `call` on this rank: the 25 functions of most own time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def body(rank: int, world: int, elements: int, out: str, profiled: str = "") -> None:
    import torch

    import anyreduce
    import anyreduce.torch as art

    uid = anyreduce.share_unique_id(f"{out}.unique_id", rank)
    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    comm = art.Communicator.from_unique_id(world, uid, rank, device=dev)
    # Without op_handle (an anyreduce before the operators) only the Communicator rows run.
    has_ops = hasattr(comm, "op_handle")
    ops, h = (torch.ops.anyreduce, comm.op_handle) if has_ops else (None, 0)
    x = torch.randint(-8, 9, (elements,), device="cuda").to(torch.bfloat16)
    p = torch.randint(-8, 9, (1, 6144), device="cuda").to(torch.bfloat16)
    res = torch.zeros_like(p)
    w = torch.ones(6144, dtype=torch.bfloat16, device="cuda")
    raw, ptr, n = comm.comm.all_reduce, x.data_ptr(), x.numel()
    bf16 = art.DataType.BFLOAT16
    stream = torch.cuda.current_stream().cuda_stream
    device = torch.device("cuda", dev)
    doors = {
        # The pieces of a Communicator call's host time.
        "Comm.all_reduce on raw pointers (ctypes+lib)": lambda: raw(ptr, ptr, n, bf16, stream),
        "torch.cuda.current_stream(d).cuda_stream": lambda: torch.cuda.current_stream(
            device).cuda_stream,
        "torch._C._cuda_getCurrentRawStream(i)": lambda: torch._C._cuda_getCurrentRawStream(dev),
        "torch.cuda.current_device()": torch.cuda.current_device,
        "argument checks of one tensor (_check)": lambda: art._check(
            x, "tensor", device, art.ALL_REDUCE_DTYPES),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        # The doors.
        "Communicator.all_reduce (in place)": lambda: comm.all_reduce(x),
        "torch.ops.anyreduce.all_reduce_inplace": lambda: ops.all_reduce_inplace(x, h),
        "torch.ops.anyreduce.all_reduce": lambda: ops.all_reduce(x, h),
        "Communicator.all_reduce_add_rms_norm": lambda: comm.all_reduce_add_rms_norm(
            p, res, w, 1e-6),
        "torch.ops.anyreduce.all_reduce_add_rms_norm": lambda: ops.all_reduce_add_rms_norm(
            p, res, w, 1e-6, h, False),
    }
    if not has_ops:
        doors = {k: v for k, v in doors.items() if not k.startswith("torch.ops")}
    calls, rounds = 50, 15
    figures = {}
    if profiled:  # both ranks make the calls (collectives); rank 0 prints its profile
        call = doors[profiled]
        if rank == 0:
            profile(call, 2000)
        else:
            for _ in range(2000):
                call()
        torch.cuda.synchronize()
    for name, call in doors.items():
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        per_round = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            per_round.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
        figures[name] = statistics.median(per_round)
    # The operators' results against the ctypes call's, on fresh small integers.
    if has_ops:
        y = torch.randint(-8, 9, (elements,), device="cuda").to(torch.bfloat16)
        direct = comm.all_reduce(y.clone())
        assert torch.equal(ops.all_reduce(y, h), direct), "all_reduce differs from the ctypes call"
        z = y.clone()
        ops.all_reduce_inplace(z, h)
        assert torch.equal(z, direct), "all_reduce_inplace differs from the ctypes call"
        n1, r1 = ops.all_reduce_add_rms_norm(p, res, w, 1e-6, h, False)
        n2, r2 = comm.all_reduce_add_rms_norm(p, res, w, 1e-6)
        assert torch.equal(n1, n2) and torch.equal(r1, r2), "the fused operator differs"
    torch.cuda.synchronize()
    comm.close()
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(figures, f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=4096)
    ap.add_argument("--json", default="")
    ap.add_argument("--profile", default="", metavar="DOOR",
                    help="first print rank 0's cProfile of 2000 calls through DOOR (a row name)")
    a = ap.parse_args()

    import torch.multiprocessing as mp

    out = a.json or "/tmp/anyr_torch_ops_overhead.json"
    if os.path.exists(f"{out}.unique_id"):
        os.remove(f"{out}.unique_id")
    mp.start_processes(body, args=(2, a.elements, out, a.profile), nprocs=2, start_method="spawn")
    ranks = [json.load(open(f"{out}.rank{r}")) for r in range(2)]
    print(f"host us per eager call ({a.elements} bf16 elements; fused: 1 x 6144), "
          "median of 15 rounds of 50, rank 0 / rank 1")
    for name in ranks[0]:
        print(f"  {name:46s} {ranks[0][name]:7.2f} / {ranks[1][name]:7.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"elements": a.elements, "ranks": ranks}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
