#!/usr/bin/env python3
"""One rank of a two-process check of the peer-memory kinds across Linux namespaces: run rank 1
under `unshare` (scripts/device.sh namespaces: a PID namespace, an IPC namespace, or both) to
stand in for two containers that do not share them, where legacy CUDA IPC is reported to fail.

Rank 0 writes the unique id to --id-file and the other rank waits for it, bounded
(anyreduce.share_unique_id).
Each rank then creates a communicator (ANYR_PEER_MEMORY chooses the kind), prints one JSON line
with the kind explain reports and its reason, and checks an all-reduce of small integers
(rank + 1 everywhere: every element must be the sum) with every peer algorithm that is
admitted, and with the automatic choice. Exit status 0 when every check it could run passed.

Usage: python3 tools/peers/namespace_check.py --rank R --nranks 2 --id-file PATH [--timeout-s 60]
"""
import argparse
import json
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--id-file", required=True)
    ap.add_argument("--timeout-s", type=float, default=60)
    a = ap.parse_args()

    import torch
    import anyreduce

    try:
        uid = anyreduce.share_unique_id(a.id_file, a.rank, a.timeout_s)
    except TimeoutError as e:
        print(json.dumps({"rank": a.rank, "error": str(e)}))
        return 1

    torch.cuda.set_device(a.rank % torch.cuda.device_count())
    comm = anyreduce.Comm.init_rank(a.nranks, uid, a.rank)
    ex = comm.explain()
    out = {"rank": a.rank, "pid": os.getpid(), "pidns": os.readlink("/proc/self/ns/pid"),
           "ipcns": os.readlink("/proc/self/ns/ipc"),
           "kind": ex["peerMemory"]["kind"], "reason": ex["peerMemory"]["reason"],
           "checks": {}}
    failures = 0
    n = 65536 + 5
    want = float(a.nranks * (a.nranks + 1) // 2)
    for name in ["oneshot-push", "oneshot-pull", "twoshot", "twoshot-push", "auto"]:
        admitted = name == "auto" or ex["admission"][name]["admitted"]
        if not admitted:
            out["checks"][name] = "not admitted: " + ex["admission"][name]["reason"][:120]
            continue
        comm.set_algorithm(name)
        x = torch.full((n,), float(a.rank + 1), dtype=torch.bfloat16, device="cuda")
        y = torch.full((n,), -7.0, dtype=torch.bfloat16, device="cuda")
        s = torch.cuda.current_stream()
        comm.all_reduce(x.data_ptr(), y.data_ptr(), n, "bf16", stream=s.cuda_stream)
        torch.cuda.synchronize()
        wrong = int((y != want).sum().item())
        out["checks"][name] = "exact" if wrong == 0 else "%d wrong" % wrong
        failures += wrong != 0
    comm.close()
    print(json.dumps(out), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
