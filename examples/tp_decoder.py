#!/usr/bin/env python3
"""A tensor-parallel decoder block in plain PyTorch, all-reduced by anyreduce or by
torch.distributed's NCCL, checked against each other and timed.

Each layer is the Megatron layout: column-parallel QKV and MLP gate/up projections, row-parallel
attention-out and MLP-down projections, so each layer does two all-reduces of a
(tokens, hidden) tensor, each followed by the residual add and an RMSNorm (pre-norm).

    torchrun --nproc-per-node 2 examples/tp_decoder.py --backend anyreduce --graph
    python examples/tp_decoder.py --nproc-per-node 2 --fused      # spawns its own ranks

--backend nccl|anyreduce|both  which backends to time (the check always runs both: NCCL is
                               the reference); default both
--graph                        also time CUDA-graph replay of the whole forward
--fused                        anyreduce path uses all_reduce_add_rms_norm (all-reduce +
                               residual add + RMSNorm in one kernel); the NCCL reference then
                               runs NCCL all-reduce + anyreduce's standalone add+RMSNorm kernel,
                               which has the same arithmetic
--inputs int|random            int (default): the input of every all-reduce is rounded to a
                               small integer, so every sum is exact in any order and the two
                               backends must agree bit for bit; random: real activations,
                               compared with a tolerance
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

try:
    import anyreduce
except ImportError:  # running from a checkout without `pip install ./python`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    import anyreduce
import anyreduce.torch as art  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["nccl", "anyreduce", "both"], default="both")
    p.add_argument("--graph", action="store_true", help="also time CUDA-graph replay")
    p.add_argument("--fused", action="store_true", help="use all_reduce_add_rms_norm")
    p.add_argument("--inputs", choices=["int", "random"], default="int")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--ffn", type=int, default=0, help="MLP width (default 3 * hidden)")
    p.add_argument("--tokens", type=int, default=16, help="tokens per forward (decode batch)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--nproc-per-node", type=int, default=0,
                   help="ranks to spawn when not started by torchrun (default: all GPUs)")
    args = p.parse_args(argv)
    args.ffn = args.ffn or 3 * args.hidden
    return args


class TPDecoder:
    """The shards of this rank. Every rank draws its own shards from a seed that depends on
    (layer, rank), so both backends see exactly the same model."""

    def __init__(self, args, rank: int, tp: int, device: torch.device):
        if args.heads % tp or args.ffn % tp or args.hidden % args.heads:
            raise SystemExit(f"heads ({args.heads}) and ffn ({args.ffn}) must divide by the TP "
                             f"size {tp}, and hidden ({args.hidden}) by heads")
        dt = DTYPES[args.dtype]
        self.args, self.dtype, self.device = args, dt, device
        self.hl, self.hd = args.heads // tp, args.hidden // args.heads
        fl, h = args.ffn // tp, args.hidden

        def w(shape, fan_in, seed):
            g = torch.Generator().manual_seed(seed)
            return (torch.randn(shape, generator=g) / fan_in ** 0.5).to(dt).to(device)

        def norm_w(seed):  # the same on every rank (replicated parameter)
            g = torch.Generator().manual_seed(seed)
            return (1 + 0.1 * torch.randn(h, generator=g)).to(dt).to(device)

        self.layers = []
        for i in range(args.layers):
            s = 1000 * i + 10 * rank
            self.layers.append(dict(
                qkv=w((3 * self.hl * self.hd, h), h, s + 1),       # column-parallel
                o=w((h, self.hl * self.hd), h, s + 2),             # row-parallel
                gate_up=w((2 * fl, h), h, s + 3),                  # column-parallel
                down=w((h, fl), args.ffn, s + 4),                  # row-parallel
                ln_attn=norm_w(1000 * i + 5),                      # before attention
                ln_mlp=norm_w(1000 * i + 6),                       # before the MLP
            ))
        self.ln_final = norm_w(999_999)

    def _exact(self, t: torch.Tensor) -> torch.Tensor:
        # --inputs int: each all-reduce input becomes a small integer, so sums are exact.
        if self.args.inputs == "int":
            return (t.float() * 4).round_().clamp_(-8, 8).to(t.dtype)
        return t

    def attn_partial(self, y: torch.Tensor, L: dict) -> torch.Tensor:
        T = y.shape[0]
        qkv = (y @ L["qkv"].t()).view(T, 3, self.hl, self.hd).permute(1, 2, 0, 3)
        o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        return self._exact(o.transpose(0, 1).reshape(T, self.hl * self.hd) @ L["o"].t())

    def mlp_partial(self, y: torch.Tensor, L: dict) -> torch.Tensor:
        gate, up = (y @ L["gate_up"].t()).chunk(2, dim=-1)
        return self._exact((F.silu(gate) * up) @ L["down"].t())

    def forward(self, x: torch.Tensor, backend: "Backend") -> torch.Tensor:
        eps = self.args.eps
        residual = x
        y, _ = art.add_rms_norm_reference(x, None, self.layers[0]["ln_attn"], eps)
        for i, L in enumerate(self.layers):
            nxt = self.layers[i + 1]["ln_attn"] if i + 1 < len(self.layers) else self.ln_final
            y, residual = backend.reduce_add_norm(self.attn_partial(y, L), residual, L["ln_mlp"], eps)
            y, residual = backend.reduce_add_norm(self.mlp_partial(y, L), residual, nxt, eps)
        return y


class Backend:
    """all-reduce, then residual add + RMSNorm (fused into one kernel where asked)."""

    def __init__(self, name: str, fused: bool, comm=None):
        self.name, self.fused, self.comm = name, fused, comm
        lib = anyreduce.library()
        # The NCCL reference of the fused path uses anyreduce's standalone add+RMSNorm kernel
        # (same arithmetic as the fused one); without it, a torch version (close, not exact).
        self.standalone = fused and lib.has_function("anyrAddRmsNorm")

    def reduce_add_norm(self, partial, residual, weight, eps):
        if self.name == "anyreduce" and self.fused:
            return self.comm.all_reduce_add_rms_norm(partial, residual, weight, eps)
        if self.name == "anyreduce":
            x = self.comm.all_reduce(partial)
        else:
            x = partial
            dist.all_reduce(x)
        if self.standalone:
            return art.add_rms_norm(x, residual, weight, eps)
        return art.add_rms_norm_reference(x, residual, weight, eps)


def time_it(fn, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def capture(fn):
    """CUDA graph of fn() (warmed up on a side stream first); returns (graph, output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def worker(local_rank: int, args, init_method: str, world: int, rank: int) -> int:
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world)
    # A CPU (gloo) group for the anyreduce rendezvous, the way vLLM and SGLang set up theirs.
    cpu_group = dist.new_group(backend="gloo")
    comm = art.Communicator.from_process_group(cpu_group, device=device)
    log = print if rank == 0 else (lambda *a, **k: None)

    model = TPDecoder(args, rank, world, device)
    g = torch.Generator().manual_seed(1234)  # the same input on every rank
    if args.inputs == "int":
        x = torch.randint(-4, 5, (args.tokens, args.hidden), generator=g).to(model.dtype).to(device)
    else:
        x = torch.randn(args.tokens, args.hidden, generator=g).to(model.dtype).to(device)

    fused_ok = True
    if args.fused and not anyreduce.library().has_function("anyrAllReduceAddRmsNorm"):
        log(f"--fused: {anyreduce.library_path()} has no anyrAllReduceAddRmsNorm yet; "
            "running unfused")
        fused_ok = False
    backends = {"nccl": Backend("nccl", args.fused and fused_ok),
                "anyreduce": Backend("anyreduce", args.fused and fused_ok, comm)}

    with torch.inference_mode():
        # Correctness: one forward per backend on the same input.
        out = {name: model.forward(x, b) for name, b in backends.items()}
        torch.cuda.synchronize()
        a, n = out["anyreduce"], out["nccl"]
        exact_expected = args.inputs == "int" and (not args.fused or backends["nccl"].standalone)
        ok = True
        if torch.equal(a, n):
            check = "anyreduce vs NCCL: outputs bit-identical"
        else:
            diff = (a.float() - n.float()).abs().max().item()
            close = torch.allclose(a.float(), n.float(), rtol=3e-2, atol=3e-2)
            ok = close and not exact_expected
            check = (f"anyreduce vs NCCL: max |diff| {diff:.3g} "
                     f"({'close' if close else 'NOT close'}"
                     f"{'; bit-identical was expected' if exact_expected else ''})")
        # Every rank must hold the same result (anyreduce's cross-rank guarantee).
        ref = a.clone()
        dist.broadcast(ref, src=0)
        same_on_ranks = torch.tensor([int(torch.equal(ref, a))], device=device)
        dist.all_reduce(same_on_ranks, op=dist.ReduceOp.MIN)
        ok = ok and bool(same_on_ranks.item())

        timed = ["nccl", "anyreduce"] if args.backend == "both" else [args.backend]
        rows = []
        for name in timed:
            b = backends[name]
            rows.append((name, "eager", time_it(lambda: model.forward(x, b), args.steps, args.warmup)))
        if args.graph:
            for name in timed:
                b = backends[name]
                graph, gout = capture(lambda: model.forward(x, b))
                graph.replay()
                torch.cuda.synchronize()
                if not torch.equal(gout, out[name]):
                    diff = (gout.float() - out[name].float()).abs().max().item()
                    log(f"note: {name} graph output differs from eager by up to {diff:.3g}")
                rows.append((name, "graph", time_it(graph.replay, args.steps, args.warmup)))

    log(f"tp_decoder: {world} ranks, {args.layers} layers, hidden {args.hidden}, "
        f"ffn {args.ffn}, {args.tokens} tokens, {args.dtype}, inputs {args.inputs}, "
        f"{'fused' if args.fused and fused_ok else 'unfused'} add+RMSNorm, "
        f"{2 * args.layers} all-reduces per step")
    log(f"{'backend':<10} {'mode':<6} {'step time':>10}")
    for name, mode, ms in rows:
        log(f"{name:<10} {mode:<6} {ms * 1000:>8.1f} us")
    log(("OK  " if ok else "FAIL ") + check
        + ("" if same_on_ranks.item() else "; ranks hold different results"))
    comm.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def _spawned(local_rank: int, args, port: int, world: int) -> None:
    if worker(local_rank, args, f"tcp://127.0.0.1:{port}", world, local_rank) != 0:
        raise SystemExit(1)


def main(argv=None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        return worker(int(os.environ.get("LOCAL_RANK", 0)), args, "env://",
                      int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]))
    world = args.nproc_per_node or torch.cuda.device_count()
    if world < 2:
        print(f"need at least 2 GPUs (found {torch.cuda.device_count()})", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp

    try:
        mp.spawn(_spawned, args=(args, port, world), nprocs=world, join=True)
    except mp.ProcessExitedException as e:
        print(f"a rank failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
