#!/usr/bin/env python3
"""PyTorch symmetric-memory all-reduce (one-shot and two-shot), timed like `anyreduce bench`:
CUDA-graph replay of `--calls` calls per sample, median of `--samples` samples, bf16, so its
figures sit beside anyreduce's and NCCL's from the same machine and run.

Usage: python3 tools/peers/torch_symm_bench.py [--nranks N] [--json out.json]
"""
import argparse
import json
import os
import sys


def worker(rank, nranks, port, sizes, calls, samples, out_path):
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nranks,
                            device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    rows = []
    for nbytes in sizes:
        n = nbytes // 2
        buf = symm_mem.empty(n, dtype=torch.bfloat16, device="cuda")
        handle = symm_mem.rendezvous(buf, group.group_name)
        del handle
        buf.copy_(torch.randint(-8, 9, (n,), device="cuda").to(torch.bfloat16))
        row = {"bytes": nbytes}
        ops = {
            "symm-1shot": lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group.group_name),
            "symm-2shot": lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group.group_name),
        }
        for name, op in ops.items():
            try:
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    for _ in range(3):
                        op()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s):
                    for _ in range(calls):
                        op()
                times = []
                with torch.cuda.stream(s):  # replay and events on the same stream
                    for _ in range(3):
                        g.replay()
                    for _ in range(samples):
                        a = torch.cuda.Event(enable_timing=True)
                        b = torch.cuda.Event(enable_timing=True)
                        a.record()
                        g.replay()
                        b.record()
                        b.synchronize()
                        times.append(a.elapsed_time(b) * 1000.0 / calls)
                dist.barrier()
                times.sort()
                row[name] = times[len(times) // 2]
            except Exception as e:  # an op this torch build lacks, or a size it refuses
                row[name] = None
                row[name + "-error"] = str(e)[:200]
        rows.append(row)
        dist.barrier()
    if rank == 0:
        print(f"# torch {torch.__version__} symmetric memory, {nranks} ranks, bf16, graph replay, median us/call")
        print(f"{'bytes':>10} {'symm-1shot':>11} {'symm-2shot':>11}")
        for r in rows:
            f = lambda v: f"{v:11.2f}" if isinstance(v, float) else f"{'-':>11}"
            print(f"{r['bytes']:>10} {f(r['symm-1shot'])} {f(r['symm-2shot'])}")
        for r in rows:
            for k in ("symm-1shot-error", "symm-2shot-error"):
                if k in r:
                    print(f"# {r['bytes']} B {k}: {r[k]}")
        if out_path:
            with open(out_path, "w") as fh:
                json.dump(rows, fh, indent=2)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nranks", type=int, default=0)
    p.add_argument("--json", default="")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--samples", type=int, default=25)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--max-bytes", type=int, default=16 << 20)
    args = p.parse_args()
    import torch
    import torch.multiprocessing as mp

    n = args.nranks or torch.cuda.device_count()
    if n < 2:
        print("torch_symm_bench: needs 2 GPUs", file=sys.stderr)
        return 2
    sizes = []
    b = 1024
    while b <= args.max_bytes:
        sizes.append(b)
        b *= 4
    mp.spawn(worker, args=(n, args.port, sizes, args.calls, args.samples, args.json), nprocs=n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
