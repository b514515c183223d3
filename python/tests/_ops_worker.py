"""Per-rank body of test_torch_ops.py's multi-rank test: the torch.ops.anyreduce operators
eagerly, under torch.compile and in a captured CUDA graph, each against the Communicator call it
wraps (bit-identical) and against sums every rank can compute itself.

Ranks join by a unique id, not torch.distributed, so two ranks may share one GPU (rank r on GPU
r % device_count): a correctness run, not a speed run. Every rank runs the same sections in
the same order; a section that fails is recorded and the next one still runs (the failures
are deterministic, so the ranks stay in step), and the parent reports every failure.
"""

import json
import traceback
from pathlib import Path

SKIPPED_CHECKS: list = []  # [what, why] of each sub-check this rank could not run


def rank_ints(shape, dtype, rank: int, salt: int):
    """Rank `rank`'s small-integer input (any rank can compute any rank's)."""
    import torch

    g = torch.Generator().manual_seed(rank * 100003 + salt)
    return torch.randint(-8, 9, tuple(shape), generator=g).to(dtype).cuda()


def summed(shape, dtype, world: int, salt: int):
    import torch

    total = sum(rank_ints(shape, dtype, r, salt).float() for r in range(world))
    return total.to(dtype)  # exact: small integers


def same(got, want, what: str) -> None:
    import torch

    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{what}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} "
                             f"{tuple(want.shape)}")
    if got.dtype.itemsize == 1:  # fp8 and packed fp4: compare the bytes
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    if not torch.equal(got, want):
        diff = (got.float() - want.float()).abs()
        raise AssertionError(f"{what}: not bit-identical; {int((diff > 0).sum())} of "
                             f"{got.numel()} differ, max |diff| {float(diff.max())}")


def fused_inputs(world: int, rank: int, tokens: int, hidden: int, salt: int):
    import torch

    p = rank_ints((tokens, hidden), torch.bfloat16, rank, salt)
    # The residual and the weight are the same on every rank, as in a decoder layer.
    res = rank_ints((tokens, hidden), torch.bfloat16, 99, salt)
    w = (rank_ints((hidden,), torch.bfloat16, 98, salt).float() / 8 + 1).to(torch.bfloat16)
    return p, res, w


# ---- sections ------------------------------------------------------------------------------


def eager_all_reduce(comm, rank, world):
    import torch

    ops, h = torch.ops.anyreduce, comm.op_handle
    assert comm.op_handle == h, "op_handle changed"
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for n in (1, 1000, 65541):
            x = rank_ints((n,), dtype, rank, n)
            x0 = x.clone()
            want = summed((n,), dtype, world, n)
            y = ops.all_reduce(x, h)
            same(y, want, f"all_reduce {dtype} n={n}")
            same(x, x0, f"all_reduce {dtype} n={n}: input modified")
            assert y.data_ptr() != x.data_ptr(), "all_reduce returned its input"
            ops.all_reduce_inplace(x, h)
            same(x, want, f"all_reduce_inplace {dtype} n={n}")
    # A non-contiguous input: the functional operator reduces a contiguous copy.
    x = rank_ints((64, 130), torch.bfloat16, rank, 7)
    same(ops.all_reduce(x.t(), h), summed((64, 130), torch.bfloat16, world, 7).t().contiguous(),
         "all_reduce of a transposed view")


def eager_fused(comm, rank, world):
    import torch

    import anyreduce.torch as art

    ops, h = torch.ops.anyreduce, comm.op_handle
    for tokens, hidden in ((1, 6144), (3, 256), (129, 2048)):
        p, res, w = fused_inputs(world, rank, tokens, hidden, tokens)
        want_r = (summed((tokens, hidden), torch.bfloat16, world, tokens).float()
                  + res.float()).to(torch.bfloat16)
        for wpo in (False, True):
            what = f"{tokens}x{hidden} weight_plus_one={wpo}"
            normed, r = ops.all_reduce_add_rms_norm(p, res, w, 1e-6, h, wpo)
            d_normed, d_r = comm.all_reduce_add_rms_norm(p, res, w, 1e-6, weight_plus_one=wpo)
            same(normed, d_normed, f"all_reduce_add_rms_norm {what}: normed")
            same(r, want_r, f"all_reduce_add_rms_norm {what}: residual")
            ref, _ = art.add_rms_norm_reference(want_r, None, w, 1e-6, weight_plus_one=wpo)
            torch.testing.assert_close(normed, ref, rtol=2e-2, atol=2e-2)
            n0, r0 = ops.all_reduce_add_rms_norm(p, None, w, 1e-6, h, wpo)
            same(r0, summed((tokens, hidden), torch.bfloat16, world, tokens),
                 f"{what}: no residual")
            d0, _ = comm.all_reduce_add_rms_norm(p, None, w, 1e-6, weight_plus_one=wpo)
            same(n0, d0, f"{what}: no residual, normed")
            # vLLM's in-place form: partial becomes the normed rows, residual the sum.
            p2, res2 = p.clone(), res.clone()
            ops.fused_add_rms_norm_inplace(p2, res2, w, 1e-6, h, wpo)
            same(p2, normed, f"fused_add_rms_norm_inplace {what}: normed")
            same(res2, want_r, f"fused_add_rms_norm_inplace {what}: residual")
        scale = torch.tensor([0.0375], dtype=torch.float32, device=p.device)
        q, r = ops.all_reduce_add_rms_norm_fp8(p, res, w, 1e-6, scale, h, False)
        d_q, _, _ = comm.all_reduce_add_rms_norm(p, res, w, 1e-6, quant="fp8", scale=scale)
        same(q, d_q, f"fp8 {tokens}x{hidden}")
        same(r, want_r, f"fp8 {tokens}x{hidden}: residual")
        g = torch.tensor([0.01], dtype=torch.float32, device=p.device)
        for swz in (True, False):
            q, s, r = ops.all_reduce_add_rms_norm_nvfp4(p, res, w, 1e-6, g, h, False, swz)
            d_q, d_s, _ = comm.all_reduce_add_rms_norm(p, res, w, 1e-6, quant="nvfp4", scale=g,
                                                        swizzled=swz)
            same(q, d_q, f"nvfp4 {tokens}x{hidden} swizzled={swz}: values")
            same(s, d_s, f"nvfp4 {tokens}x{hidden} swizzled={swz}: block scales")
            same(r, want_r, f"nvfp4 {tokens}x{hidden} swizzled={swz}: residual")
        # The standalone kernel, no communication.
        x = want_r
        a, b = ops.add_rms_norm(x, res, w, 1e-6, False)
        d_a, d_b = art.add_rms_norm(x, res, w, 1e-6)
        same(a, d_a, f"add_rms_norm {tokens}x{hidden}")
        same(b, d_b, f"add_rms_norm {tokens}x{hidden}: residual")


def _compiled_checks(comm, rank, world, backend: str, dynamic: bool):
    import torch

    ops, h = torch.ops.anyreduce, comm.op_handle

    def layer(p, res, w, g):
        s = ops.all_reduce(p, h) * 2  # the operator between ordinary torch operations
        normed, r = ops.all_reduce_add_rms_norm(p, res, w, 1e-6, h, False)
        q, scales, r4 = ops.all_reduce_add_rms_norm_nvfp4(p, res, w, 1e-6, g, h, False, True)
        return s, normed, r, q, scales, r4

    def in_place(p, res, w):
        ops.fused_add_rms_norm_inplace(p, res, w, 1e-6, h, False)
        x = p.float().sum(dim=-1)
        ops.all_reduce_inplace(x, h)
        return x

    torch._dynamo.reset()
    c_layer = torch.compile(layer, backend=backend, fullgraph=True, dynamic=dynamic)
    c_in_place = torch.compile(in_place, backend=backend, fullgraph=True, dynamic=dynamic)
    for tokens in ((3, 5) if dynamic else (4,)):
        p, res, w = fused_inputs(world, rank, tokens, 512, 40 + tokens)
        g = torch.tensor([0.02], dtype=torch.float32, device=p.device)
        got = c_layer(p, res, w, g)
        want = layer(p, res, w, g)
        for name, a, b in zip(("all_reduce*2", "normed", "residual", "nvfp4 values",
                               "nvfp4 scales", "nvfp4 residual"), got, want):
            same(a, b, f"compiled ({backend}, dynamic={dynamic}) {tokens} tokens: {name}")
        p1, r1, p2, r2 = p.clone(), res.clone(), p.clone(), res.clone()
        x1 = c_in_place(p1, r1, w)
        x2 = in_place(p2, r2, w)
        what = f"compiled in-place ({backend}, dynamic={dynamic}) {tokens} tokens"
        same(p1, p2, f"{what}: partial (normed)")
        same(r1, r2, f"{what}: residual")
        same(x1, x2, f"{what}: all_reduce_inplace of a graph intermediate")


def compiled_aot_eager(comm, rank, world):
    _compiled_checks(comm, rank, world, "aot_eager", dynamic=False)
    _compiled_checks(comm, rank, world, "aot_eager", dynamic=True)


def compiled_inductor(comm, rank, world):
    try:
        import triton  # noqa: F401
    except ImportError as e:
        SKIPPED_CHECKS.append(["torch.compile with inductor", f"triton not importable: {e}"])
        return
    _compiled_checks(comm, rank, world, "inductor", dynamic=False)


def compiled_reduce_overhead(comm, rank, world):
    """inductor's CUDA graphs (mode="reduce-overhead"): the first calls run eagerly and record,
    the later ones replay; every call's outputs (copied before the next call, which reuses
    their memory) bit-identical to the eager layer's on the same fresh inputs."""
    import torch

    try:
        import triton  # noqa: F401
    except ImportError as e:
        SKIPPED_CHECKS.append(["torch.compile mode='reduce-overhead'", f"triton: {e}"])
        return
    ops, h = torch.ops.anyreduce, comm.op_handle

    def layer(p, res, w):
        s = ops.all_reduce(p, h)
        normed, r = ops.all_reduce_add_rms_norm(p, res, w, 1e-6, h, False)
        return s + 1, normed, r

    torch._dynamo.reset()
    c_layer = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    for call in range(4):
        p, res, w = fused_inputs(world, rank, 2, 1024, 80 + call)
        got = [t.clone() for t in c_layer(p, res, w)]
        want = layer(p, res, w)
        for name, a, b in zip(("all_reduce+1", "normed", "residual"), got, want):
            same(a, b, f"reduce-overhead call {call}: {name}")


def cuda_graph(comm, rank, world):
    import torch

    from _gpu_worker import capture_after_warm_up

    ops, h = torch.ops.anyreduce, comm.op_handle
    p, res, w = fused_inputs(world, rank, 8, 1024, 60)
    x = rank_ints((5000,), torch.float16, rank, 61)

    def step():
        return (ops.all_reduce(x, h),) + tuple(ops.all_reduce_add_rms_norm(p, res, w, 1e-6, h,
                                                                           False))

    graph, (y, normed, r) = capture_after_warm_up(step)
    for salt in (62, 63):  # replays on fresh inputs
        x.copy_(rank_ints((5000,), torch.float16, rank, salt))
        p2, res2, _ = fused_inputs(world, rank, 8, 1024, salt)
        p.copy_(p2)
        res.copy_(res2)
        graph.replay()
        torch.cuda.synchronize()
        same(y, summed((5000,), torch.float16, world, salt), f"graph replay {salt}: all_reduce")
        d_normed, d_r = comm.all_reduce_add_rms_norm(p, res, w, 1e-6)
        same(normed, d_normed, f"graph replay {salt}: normed")
        same(r, d_r, f"graph replay {salt}: residual")


def opcheck(comm, rank, world):
    import torch

    if not hasattr(torch.library, "opcheck"):
        SKIPPED_CHECKS.append(["torch.library.opcheck", f"torch {torch.__version__} lacks it"])
        return
    ops, h = torch.ops.anyreduce, comm.op_handle
    p, res, w = fused_inputs(world, rank, 5, 256, 70)
    g = torch.tensor([0.02], dtype=torch.float32, device=p.device)
    cases = [
        (ops.all_reduce.default, (rank_ints((333,), torch.bfloat16, rank, 71), h)),
        (ops.all_reduce_inplace.default, (rank_ints((333,), torch.float32, rank, 72), h)),
        (ops.all_reduce_add_rms_norm.default, (p, res, w, 1e-6, h, False)),
        (ops.fused_add_rms_norm_inplace.default, (p.clone(), res.clone(), w, 1e-6, h, True)),
        (ops.all_reduce_add_rms_norm_fp8.default, (p, res, w, 1e-6, g, h, False)),
        (ops.all_reduce_add_rms_norm_nvfp4.default, (p, None, w, 1e-6, g, h, False, True)),
        (ops.all_reduce_add_rms_norm_nvfp4.default, (p, res, w, 1e-6, g, h, False, False)),
        (ops.add_rms_norm.default, (p, res, w, 1e-6, False)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


SECTIONS = [eager_all_reduce, eager_fused, compiled_aot_eager, compiled_inductor,
            compiled_reduce_overhead, cuda_graph, opcheck]


def run(rank: int, world: int, out_dir: str) -> None:
    import torch

    import anyreduce
    import anyreduce.torch as art

    device = rank % torch.cuda.device_count()
    torch.cuda.set_device(device)
    failures = []
    unique_id = anyreduce.share_unique_id(Path(out_dir, "unique_id"), rank)
    comm = art.Communicator.from_unique_id(world, unique_id, rank, device=device)
    # Registered at creation, before any read of op_handle (nothing for torch.compile to trace).
    if anyreduce._torch_ops.communicator(comm._handle, "all_reduce") is not comm:
        failures.append("a new communicator was not registered for the operators")
    h = comm.op_handle
    for section in SECTIONS:
        try:
            section(comm, rank, world)
        except Exception:  # noqa: BLE001 -- reported to the parent with the traceback
            failures.append(f"{section.__name__}: {traceback.format_exc()}")
    torch.cuda.synchronize()
    comm.close()
    # After close the handle is refused by name, and the communicator has none.
    try:
        torch.ops.anyreduce.all_reduce(torch.ones(4, device="cuda"), h)
        failures.append("the handle of a closed communicator was accepted")
    except ValueError as e:
        if "is not the handle of an open communicator" not in str(e):
            failures.append(f"closed handle: unexpected message {e}")
    try:
        comm.op_handle
        failures.append("a closed communicator gave an op_handle")
    except ValueError:
        pass
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "failures": failures, "skipped_checks": SKIPPED_CHECKS,
         "sections": [s.__name__ for s in SECTIONS]}))
