"""Per-rank bodies of the GPU tests (test_gpu.py spawns one process per rank running `run`).

Every scenario checks anyreduce against torch.distributed's all-reduce on inputs of small
integers, whose sums are exact in every dtype, so results must be bit-identical. With a GPU per
rank the process group is NCCL's; with fewer GPUs than ranks, rank r runs on GPU r % GPUs (the
ranks share it: a correctness run) and the group is gloo's, the reference sums then taken on
the CPU in float64 or int64 (exact for these inputs). A scenario
that cannot run (e.g. the library has no fused kernel yet) raises Skip with the library's
message; the parent turns that into pytest.skip. A sub-check that cannot run while the rest of
the scenario does is recorded with skip_check(what, why): the scenario runs to the end, and the
parent then reports the test as skipped, naming every sub-check not run and why (never as a
pass).
"""

from __future__ import annotations

import json
from pathlib import Path


class Skip(Exception):
    pass


SKIPPED_CHECKS: list = []  # [what, why] of each sub-check this rank could not run
DEVICE = 0  # this rank's GPU (run() sets it)


def skip_check(what: str, why: str) -> None:
    """Record that sub-check `what` did not run, and why (the parent reports it as a skip)."""
    SKIPPED_CHECKS.append([what, why])


def run(rank: int, world: int, port: int, scenario: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    global DEVICE
    gpus = torch.cuda.device_count()
    DEVICE = rank % gpus
    torch.cuda.set_device(DEVICE)
    # NCCL needs a GPU per rank; ranks sharing a GPU meet over gloo.
    backend = "nccl" if gpus >= world else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    result = {"status": "ok", "rank": rank, "skipped_checks": SKIPPED_CHECKS}
    try:
        extra = SCENARIOS[scenario](rank, world)
        if extra:
            result.update(extra)
    except Skip as e:
        result = {"status": "skip", "rank": rank, "reason": str(e)}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


# ---- helpers ---------------------------------------------------------------------------------


def ints(shape, dtype, seed: int, lo: int = -8, hi: int = 8):
    """Small integers as `dtype` on the current GPU (sums of a few stay exact)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, tuple(shape), generator=g).to(dtype).cuda()


def nccl_sum(x, group=None):
    """torch.distributed's sum of x over `group`: NCCL's on the GPU, or (ranks sharing a GPU,
    a gloo group) the CPU's in float64 / int64, cast back: exact for small integers."""
    import torch
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y
    wide = x.detach().to("cpu", torch.float64 if x.is_floating_point() else torch.int64)
    dist.all_reduce(wide, group=group)
    return wide.to(x.dtype).to(x.device)


def capture_after_warm_up(step):
    """Runs `step` once on a side stream (the warm-up outside capture torch recommends), then
    captures it in a CUDA graph: returns (graph, what the captured step returned)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def assert_equal(got, want, what: str) -> None:
    import torch

    if not torch.equal(got, want):
        diff = (got.float() - want.float()).abs()
        raise AssertionError(f"{what}: not bit-identical; {int((diff > 0).sum())} of "
                             f"{got.numel()} differ, max |diff| {float(diff.max())}")


def tol(dtype):
    import torch

    return {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}[dtype]


# ---- scenarios -------------------------------------------------------------------------------


def scenario_allreduce(rank: int, world: int):
    """bf16/fp16/fp32, in place and out of place, sizes across every threshold, input left
    untouched, every admitted algorithm forced in turn. Rendezvous over a gloo group."""
    import torch
    import torch.distributed as dist

    import anyreduce
    from anyreduce.torch import Communicator

    gloo = dist.new_group(backend="gloo")
    comm = Communicator.from_process_group(gloo)
    assert (comm.rank, comm.world_size) == (rank, world)
    assert comm.device == torch.device("cuda", DEVICE)
    sizes = [0, 1, 7, 1000, 4099, 65536 + 3, 1 << 20, (3 << 20) + 5]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for n in sizes:
            x = ints((n,), dtype, seed=rank * 7919 + n)
            ref = nccl_sum(x)
            x0 = x.clone()
            out = torch.empty_like(x)
            assert comm.all_reduce(x, out=out) is out
            assert_equal(out, ref, f"{dtype} n={n} out of place")
            assert_equal(x, x0, f"{dtype} n={n} input modified")
            y = x.clone()
            assert comm.all_reduce(y) is y
            assert_equal(y, ref, f"{dtype} n={n} in place")
    # 2-D tensors and a view at an element (not 16-byte) aligned offset.
    x = ints((33, 257), torch.bfloat16, seed=rank)
    assert_equal(comm.all_reduce(x.clone()), nccl_sum(x), "2-D")
    base = ints((4097,), torch.float16, seed=rank + 5)
    view = base[1:]
    ref = nccl_sum(view.contiguous())
    assert_equal(comm.all_reduce(view), ref, "offset view")

    # Every algorithm the library says it admitted (explain's "admission") must be accepted
    # by set_algorithm and be exact; one it rejected must be refused, and its forced check is
    # reported as skipped with the library's reason.
    admission = comm.explain()["admission"]
    forced = []
    for algo in anyreduce.Algo:
        if algo is anyreduce.Algo.AUTO or anyreduce.algo_name(algo) is None:
            continue  # AUTO, or an algorithm newer than the loaded library
        name = anyreduce.algo_name(algo)
        assert name in admission, f"explain() has no admission entry for {name}: {admission}"
        try:
            comm.set_algorithm(algo)
        except anyreduce.Unsupported as e:
            assert not admission[name]["admitted"], \
                f"{name} is admitted per explain() but set_algorithm refused it: {e}"
            skip_check(f"forced {algo}", f"not admitted here: {e}")
            continue
        assert admission[name]["admitted"], \
            f"set_algorithm accepted {name}, which explain() says is rejected: {admission[name]}"
        forced.append(str(algo))
        for n in (1000, (1 << 18) + 1, (5 << 20) + 3):
            x = ints((n,), torch.bfloat16, seed=rank * 31 + n)
            assert_equal(comm.all_reduce(x.clone()), nccl_sum(x), f"forced {algo} n={n}")
    comm.set_algorithm("auto")
    assert forced, "no algorithm could be forced"
    info = comm.explain()
    assert isinstance(info, dict) and info
    assert isinstance(comm.query_algorithm(1024, torch.bfloat16), (anyreduce.Algo, int))
    torch.cuda.synchronize()
    assert comm.async_error() is None
    comm.close()
    return {"forced": forced}


def scenario_graph(rank: int, world: int):
    """Capture all-reduces (out of place, in place, two sizes) in torch.cuda.graph and replay
    with new inputs. Rendezvous over the default (NCCL) group."""
    import torch

    from anyreduce.torch import Communicator

    comm = Communicator.from_process_group()
    small = torch.zeros(4096 + 5, dtype=torch.bfloat16, device="cuda")
    big = torch.zeros((2 << 20) + 1, dtype=torch.float16, device="cuda")
    out = torch.empty_like(small)
    inplace = torch.empty_like(small)

    def step():
        comm.all_reduce(small, out=out)
        inplace.copy_(small)
        comm.all_reduce(inplace)
        comm.all_reduce(big)
        return inplace * 2

    g, doubled = capture_after_warm_up(step)
    for it in range(4):
        small.copy_(ints(small.shape, small.dtype, seed=rank * 100 + it))
        big_in = ints(big.shape, big.dtype, seed=rank * 100 + it + 50)
        big.copy_(big_in)
        g.replay()
        ref = nccl_sum(small)
        assert_equal(out, ref, f"graph replay {it} out of place")
        assert_equal(inplace, ref, f"graph replay {it} in place")
        assert_equal(doubled, ref * 2, f"graph replay {it} following op")
        assert_equal(big, nccl_sum(big_in), f"graph replay {it} large")
    torch.cuda.synchronize()
    comm.close()


def scenario_subgroup(rank: int, world: int):
    """A communicator over a dist.new_group sub-group (NCCL), and one over each process's own
    1-rank group (group rank 0 is then global rank `rank`: checks the broadcast source)."""
    import torch
    import torch.distributed as dist

    from anyreduce.torch import Communicator

    pair = dist.new_group(list(range(world)))
    singles = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    singles_gloo = [dist.new_group([r], backend="gloo") for r in range(world)]
    comm = Communicator.from_process_group(pair)
    x = ints((70001,), torch.bfloat16, seed=rank)
    assert_equal(comm.all_reduce(x.clone()), nccl_sum(x, pair), "sub-group")
    for groups in (singles, singles_gloo):
        solo = Communicator.from_process_group(groups[rank])
        assert (solo.rank, solo.world_size) == (0, 1)
        y = ints((1025,), torch.float32, seed=rank + 3)
        assert_equal(solo.all_reduce(y.clone()), y, "1-rank in place")
        out = torch.empty_like(y)
        assert_equal(solo.all_reduce(y, out=out), y, "1-rank out of place")
        solo.close()
    comm.close()


def _unpack_e2m1(q):
    import torch

    table = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float32, device=q.device)
    lo, hi = (q & 0xF).long(), (q >> 4).long()
    nib = torch.stack([lo, hi], dim=-1).reshape(*q.shape[:-1], q.shape[-1] * 2)
    mag = table[nib & 7]
    return torch.where(nib >= 8, -mag, mag)


def ref_fp8(y, scale):
    """e4m3 bytes of y * (1 / scale) (fp32 reciprocal; RNE, saturating to +-448), as the
    library defines FP8."""
    import torch

    import anyreduce.torch as art

    return (y.float() * (1.0 / scale)).clamp(-448, 448).to(art.FP8_DTYPE).view(torch.uint8)


def ref_nvfp4(y, g):
    """(packed e2m1 bytes, e4m3 block-scale bytes) of y, following the library's definition
    (epilogue.cuh): s = e4m3(amax * (1 / (6 g))), d = s * g, q = e2m1(y * (1 / d)) (fp32
    reciprocals; RNE, ties to even, saturating at 6, sign kept), whole block 0 when d is not
    > 0."""
    import torch

    import anyreduce.torch as art

    T, H = y.shape
    yb = y.float().reshape(T, H // 16, 16)
    amax = yb.abs().amax(-1)
    g32 = torch.as_tensor(g, dtype=torch.float32, device=y.device)
    s = (amax * (1.0 / (6.0 * g32))).clamp(max=448).to(art.FP8_DTYPE)
    d = s.float() * g32
    dinv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    v = yb * dinv.unsqueeze(-1)
    a = v.abs()
    code = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
            + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int())
    code = code | (torch.signbit(v).int() << 3)
    code = torch.where((d > 0).unsqueeze(-1), code, torch.zeros_like(code)).reshape(T, H)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return packed, s.view(torch.uint8)


def _unswizzle(sw, rows: int, cols: int):
    """128x4 swizzled scale layout -> row-major (rows, cols)."""
    mt, kt = sw.shape[0] // 128, sw.shape[1] // 4
    t = sw.reshape(mt, kt, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(mt * 128, kt * 4)
    return t[:rows, :cols]


def scenario_fused(rank: int, world: int):
    """all_reduce_add_rms_norm vs NCCL all-reduce + a torch add + RMSNorm reference, and vs
    the standalone add_rms_norm kernel (bit-identical by contract); FP8 and NVFP4 outputs
    dequantized and bounded."""
    import torch

    import anyreduce
    import anyreduce.torch as art
    from anyreduce.torch import Communicator, add_rms_norm_reference

    comm = Communicator.from_process_group()
    lib = comm.comm._lib
    if not lib.has_function("anyrAllReduceAddRmsNorm"):
        try:
            getattr(lib, "anyrAllReduceAddRmsNorm")
        except anyreduce.FunctionNotAvailable as e:
            comm.close()
            raise Skip(str(e)) from None
    has_standalone = lib.has_function("anyrAddRmsNorm")
    if not has_standalone:
        skip_check("fused vs standalone add_rms_norm (bit-identical by contract)",
                   "the library does not export anyrAddRmsNorm")
    if art.FP8_DTYPE is None:
        why = f"torch {torch.__version__} has no float8_e4m3fn for the reference"
        skip_check("FP8 bytes vs torch reference", why)
        skip_check("NVFP4 values and block scales vs torch reference", why)
    eps = 1e-5
    try:
        for dtype in (torch.bfloat16, torch.float16):
            for tokens, hidden in [(1, 128), (7, 4096), (33, 5128), (130, 2048), (0, 256)]:
                seed = rank * 1000 + tokens
                partial = ints((tokens, hidden), dtype, seed)
                residual = ints((tokens, hidden), dtype, seed + 1)
                g = torch.Generator().manual_seed(tokens + hidden)  # same weight on all ranks
                weight = (torch.rand(hidden, generator=g) + 0.5).to(dtype).cuda()
                p0 = partial.clone()
                x = nccl_sum(partial)
                for wpo in (False, True):
                    ref_y, ref_r = add_rms_norm_reference(x, residual, weight, eps, wpo)
                    y, r = comm.all_reduce_add_rms_norm(partial, residual, weight, eps,
                                                        weight_plus_one=wpo)
                    what = f"{dtype} {tokens}x{hidden} weight_plus_one={wpo}"
                    assert_equal(r, ref_r, f"{what} residual_out")
                    torch.testing.assert_close(y, ref_y, rtol=tol(dtype)[0], atol=tol(dtype)[1],
                                               msg=lambda m: f"{what} normed: {m}")
                    assert_equal(partial, p0, f"{what} partial modified")
                    if has_standalone:
                        y2, r2 = art.add_rms_norm(x, residual, weight, eps, weight_plus_one=wpo)
                        assert_equal(y2, y, f"{what} fused vs standalone normed")
                        assert_equal(r2, r, f"{what} fused vs standalone residual")
                # No residual: r = x. In-place residual update.
                y, r = comm.all_reduce_add_rms_norm(partial, None, weight, eps)
                assert_equal(r, x, f"{dtype} {tokens}x{hidden} no residual")
                res = residual.clone()
                y3, r3 = comm.all_reduce_add_rms_norm(partial, res, weight, eps, residual_out=res)
                assert r3 is res
                assert_equal(res, add_rms_norm_reference(x, residual, weight, eps)[1], "in place")
                # Normalizing in place into partial (normOut == partial is allowed).
                y_sep, _ = comm.all_reduce_add_rms_norm(partial, residual, weight, eps)
                pc = partial.clone()
                y4, _ = comm.all_reduce_add_rms_norm(pc, residual, weight, eps, out=pc)
                assert y4 is pc
                assert_equal(pc, y_sep, f"{dtype} {tokens}x{hidden} out=partial")

        # FP8 (per-tensor scale): q = e4m3(y * (1 / scale)), RNE, saturating, from the ROUNDED y
        # (the library's contract), so a torch reference gives the same bytes.
        tokens, hidden = 19, 4096
        partial = ints((tokens, hidden), torch.bfloat16, rank + 11)
        residual = ints((tokens, hidden), torch.bfloat16, rank + 12)
        g = torch.Generator().manual_seed(7)
        weight = (torch.rand(hidden, generator=g) + 0.5).to(torch.bfloat16).cuda()
        scale = torch.tensor([0.02], dtype=torch.float32, device="cuda")
        y_out = torch.empty_like(partial)
        q, s, r = comm.all_reduce_add_rms_norm(partial, residual, weight, eps, quant="fp8",
                                               scale=scale, out=y_out)
        assert q.shape == partial.shape and s is scale
        y_plain, _ = comm.all_reduce_add_rms_norm(partial, residual, weight, eps)
        assert_equal(y_out, y_plain, "normed output with and without FP8")
        if art.FP8_DTYPE is not None:
            assert q.dtype == art.FP8_DTYPE
            assert_equal(q.view(torch.uint8), ref_fp8(y_out, scale), "FP8 bytes vs torch")
        q_only, _, _ = comm.all_reduce_add_rms_norm(partial, residual, weight, eps, quant="fp8",
                                                    scale=scale)  # no normed output at all
        assert_equal(q_only.view(torch.uint8), q.view(torch.uint8), "FP8 without out")

        # NVFP4: global scale g, e4m3 block scales per 16 elements, e2m1 values.
        hidden = 2048
        partial = ints((tokens, hidden), torch.bfloat16, rank + 21)
        residual = ints((tokens, hidden), torch.bfloat16, rank + 22)
        weight = (torch.rand(hidden, generator=g) + 0.5).to(torch.bfloat16).cuda()
        y_out = torch.empty_like(partial)
        y_ref, _ = add_rms_norm_reference(nccl_sum(partial), residual, weight, eps)
        gt = torch.tensor([float(y_ref.float().abs().max()) / (6 * 448)], device="cuda")
        q, bs, r = comm.all_reduce_add_rms_norm(partial, residual, weight, eps, quant="nvfp4",
                                                scale=gt, swizzled=False, out=y_out)
        assert q.shape == (tokens, hidden // 2) and q.dtype == torch.uint8
        assert bs.shape == (tokens, hidden // 16)
        if art.FP8_DTYPE is not None:
            want_q, want_s = ref_nvfp4(y_out, gt)
            assert_equal(bs.view(torch.uint8), want_s, "NVFP4 block scales vs torch")
            assert_equal(q, want_q, "NVFP4 values vs torch")
        # Dequantized values stay within half a step of the e2m1 grid (plus scale rounding).
        deq = _unpack_e2m1(q).reshape(tokens, hidden // 16, 16) \
            * bs.float().reshape(tokens, hidden // 16, 1) * gt
        yb = y_out.float().reshape(tokens, hidden // 16, 16)
        bound = bs.float().reshape(tokens, -1, 1) * gt * 1.0 \
            + yb.abs().amax(-1, keepdim=True) * 0.07 + 1e-3
        assert bool(((deq - yb).abs() <= bound).all()), "NVFP4 dequantization off"
        q2, bs2, _ = comm.all_reduce_add_rms_norm(partial, residual, weight, eps, quant="nvfp4",
                                                  scale=gt, swizzled=True)
        assert bs2.shape == (128, hidden // 16)  # (round_up(19, 128), round_up(128, 4))
        assert_equal(q2, q, "NVFP4 values, swizzled vs row-major call")
        assert_equal(_unswizzle(bs2.view(torch.uint8), tokens, hidden // 16),
                     bs.view(torch.uint8), "NVFP4 swizzled scales")
        pad_rows = _unswizzle(bs2.view(torch.uint8), 128, hidden // 16)[tokens:]
        assert int(pad_rows.count_nonzero()) == 0, "swizzled padding rows not zero"
    except anyreduce.Unsupported as e:
        comm.close()
        raise Skip(f"fused all-reduce + RMSNorm unsupported here: {e}") from None
    torch.cuda.synchronize()
    comm.close()


def scenario_errors(rank: int, world: int):
    """Bad tensors are refused before anything is launched (ValueError / TypeError naming the
    argument); library-side argument errors come back as InvalidArgument and, since the peers
    may have made the refused call, stop the communicator on every rank (later calls raise
    InvalidUsage, never a wrong sum); a closed one raises InvalidUsage."""
    import torch

    import anyreduce
    from anyreduce.torch import Communicator

    def raises(exc, match, fn):
        import re

        try:
            fn()
        except exc as e:
            assert re.search(match, str(e)), f"{exc.__name__} message {str(e)!r} lacks {match!r}"
            return
        raise AssertionError(f"expected {exc.__name__} matching {match!r}")

    comm = Communicator.from_process_group()
    x = torch.ones(64, dtype=torch.bfloat16, device="cuda")
    raises(ValueError, "contiguous", lambda: comm.all_reduce(torch.ones(8, 8, device="cuda").t()))
    raises(TypeError, "tensor has dtype torch.int32",
           lambda: comm.all_reduce(torch.ones(8, dtype=torch.int32, device="cuda")))
    raises(ValueError, "tensor must be a CUDA tensor", lambda: comm.all_reduce(torch.ones(8)))
    raises(ValueError, "out has shape", lambda: comm.all_reduce(x, out=torch.empty(65, dtype=x.dtype, device="cuda")))
    raises(TypeError, "out has dtype", lambda: comm.all_reduce(x, out=torch.empty(64, dtype=torch.float16, device="cuda")))
    if torch.cuda.device_count() > 1:
        raises(ValueError, "communicator's device",
               lambda: comm.all_reduce(torch.ones(8, device=f"cuda:{(DEVICE + 1) % world}")))
    else:
        skip_check("a tensor on another GPU refused", "one GPU: no other GPU to put it on")
    raises(TypeError, "torch.Tensor", lambda: comm.all_reduce([1.0, 2.0]))
    w = torch.ones(256, dtype=torch.bfloat16, device="cuda")
    p = torch.ones(4, 256, dtype=torch.bfloat16, device="cuda")
    raises(TypeError, "partial has dtype torch.float32",
           lambda: comm.all_reduce_add_rms_norm(p.float(), None, w.float(), 1e-6))
    raises(ValueError, "weight must have shape", lambda: comm.all_reduce_add_rms_norm(p, None, w[:128], 1e-6))
    raises(TypeError, "weight has dtype", lambda: comm.all_reduce_add_rms_norm(p, None, w.half(), 1e-6))
    raises(ValueError, "residual has shape", lambda: comm.all_reduce_add_rms_norm(p, p[:2], w, 1e-6))
    raises(ValueError, "scale is required", lambda: comm.all_reduce_add_rms_norm(p, None, w, 1e-6, quant="fp8"))
    raises(ValueError, "unknown quantization", lambda: comm.all_reduce_add_rms_norm(p, None, w, 1e-6, quant="int4"))
    raises(ValueError, "must not alias",
           lambda: comm.all_reduce_add_rms_norm(p, None, w, 1e-6, residual_out=p))
    raises(ValueError, "multiple of 16", lambda: comm.all_reduce_add_rms_norm(
        torch.ones(4, 264, dtype=torch.bfloat16, device="cuda"), None,
        torch.ones(264, dtype=torch.bfloat16, device="cuda"), 1e-6, quant="nvfp4",
        scale=torch.ones(1, device="cuda")))
    # The Python-side refusals above launched nothing and reached no rank: still healthy.
    y = ints((5000,), torch.bfloat16, seed=rank)
    assert_equal(comm.all_reduce(y.clone()), nccl_sum(y), "after Python-side errors")
    # Library-side checks (same on every rank, before any communication). A refusal there may
    # have been matched by the peers, so it stops the communicator on every rank
    # (docs/RELIABILITY.md, 3c): arguments are still judged first, then every call is refused.
    stream = torch.cuda.current_stream().cuda_stream
    raises(anyreduce.InvalidArgument, "aligned",
           lambda: comm.comm.all_reduce(x.data_ptr() + 1, x.data_ptr() + 1, 4, "bf16", stream))
    raises(anyreduce.InvalidArgument, "datatype",
           lambda: comm.comm.all_reduce(x.data_ptr(), x.data_ptr(), 4, 17, stream))
    raises(anyreduce.InvalidUsage, "communicator has failed: rank %d refused its call" % rank,
           lambda: comm.all_reduce(y.clone()))
    comm.close()
    raises(anyreduce.InvalidUsage, "closed", lambda: comm.all_reduce(y))


def scenario_adapters(rank: int, world: int):
    """The vLLM/SGLang-shaped adapters: take what anyreduce supports, return None/False (so
    the caller's NCCL runs) for the rest, work under capture(), fall back correctly."""
    import torch
    import torch.distributed as dist

    import anyreduce
    from anyreduce.adapters import CustomAllreduce, DeviceCommunicator
    from anyreduce.torch import add_rms_norm_reference

    gloo = dist.new_group(backend="gloo")
    ca = CustomAllreduce(gloo, DEVICE)
    assert not ca.disabled
    x = ints((4096,), torch.bfloat16, seed=rank)
    x0 = x.clone()
    assert ca.should_custom_ar(x)
    out = ca.custom_all_reduce(x)
    assert out is not None and out.data_ptr() != x.data_ptr()
    assert_equal(out, nccl_sum(x), "custom_all_reduce")
    assert_equal(x, x0, "custom_all_reduce input modified")
    i32 = torch.ones(16, dtype=torch.int32, device="cuda")
    assert not ca.should_custom_ar(i32) and ca.custom_all_reduce(i32) is None
    nc = torch.ones(8, 8, dtype=torch.bfloat16, device="cuda").t()
    assert ca.custom_all_reduce(nc) is None
    small = CustomAllreduce(gloo, DEVICE, max_size=1024)
    assert small.custom_all_reduce(x) is None  # 8 KB > max_size
    assert small.custom_all_reduce(x[:256]) is not None
    small.close()

    static = torch.zeros(2048, dtype=torch.float16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with ca.capture():
        with torch.cuda.stream(s):
            ca.custom_all_reduce(static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            graph_out = ca.custom_all_reduce(static)
    for it in range(3):
        inp = ints(static.shape, static.dtype, seed=rank * 10 + it)
        static.copy_(inp)
        g.replay()
        assert_equal(graph_out, nccl_sum(inp), f"adapter graph replay {it}")

    dc = DeviceCommunicator(gloo, device=DEVICE, device_group=dist.group.WORLD)
    assert dc.ca_comm is not None and not dc.ca_comm.disabled  # else every call would be NCCL's
    assert_equal(dc.all_reduce(x), nccl_sum(x), "DeviceCommunicator bf16")
    xi = ints((100,), torch.int32, seed=rank)
    assert_equal(dc.all_reduce(xi), nccl_sum(xi), "DeviceCommunicator int32 fallback")
    calls = []
    dc2 = DeviceCommunicator(gloo, device=DEVICE, device_group=dist.group.WORLD,
                             fallback=lambda t: calls.append(t) or None)
    assert_equal(dc2.all_reduce(xi), nccl_sum(xi), "fallback returning None")
    assert len(calls) == 1

    # Fused hooks: taken (and right) when the library exports the fused op and admits it for
    # these tensors, declined (and nothing changed) otherwise. Whether it is admitted is asked
    # of the communicator directly first: the same call, outside the adapter; Unsupported
    # (FunctionNotAvailable included) is a capability answer, the same on every rank.
    tokens, hidden = 5, 1024
    partial = ints((tokens, hidden), torch.bfloat16, seed=rank + 40)
    residual = ints((tokens, hidden), torch.bfloat16, seed=rank + 41)
    weight = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
    ref_y, ref_r = add_rms_norm_reference(nccl_sum(partial), residual, weight, 1e-6)
    try:
        ca.comm.all_reduce_add_rms_norm(partial, residual, weight, 1e-6)
        declined_why = None
    except anyreduce.Unsupported as e:
        declined_why = str(e)
    normed, res = ca.allreduce_residual_rmsnorm(partial, residual, weight, 1e-6)
    fused_taken = normed is not None
    if declined_why is None:
        assert fused_taken, "the library exports and admits the fused op, yet the hook declined"
        assert_equal(res, ref_r, "sglang hook residual")
        torch.testing.assert_close(normed, ref_y, rtol=2e-2, atol=2e-2)
    else:
        assert not fused_taken and res is None, \
            f"the hook returned a result for an op the library refused: {declined_why}"
        skip_check("adapter fused hooks (sglang, vllm, DeviceCommunicator) vs reference",
                   f"the library declines the fused op: {declined_why}")
    assert ca.allreduce_residual_rmsnorm(partial.float(), residual.float(), weight.float()) == (None, None)
    ai, rr = partial.clone(), residual.clone()
    done = ca.fused_allreduce_norm_(ai, rr, weight, 1e-6)
    assert done == fused_taken
    if done:
        torch.testing.assert_close(ai, ref_y, rtol=2e-2, atol=2e-2)
        assert_equal(rr, ref_r, "vllm hook residual in place")
    else:
        assert_equal(ai, partial, "declined vllm hook wrote allreduce_in")
        assert_equal(rr, residual, "declined vllm hook wrote residual")
    # DeviceCommunicator: fused when taken (the fused counters of its communicator show it),
    # else its fallback (anyreduce all-reduce + add_rms_norm_reference): then this comparison
    # checks only the fallback's wiring, and the fused path is reported as skipped above.
    dc_comm = dc.ca_comm.comm.comm

    def fused_calls():
        c = dc_comm.counters()
        return c["fused_kernel_calls"] + c["fused_composed_calls"]

    before = fused_calls()
    y, r = dc.all_reduce_add_rms_norm(partial, residual, weight, 1e-6)
    assert fused_calls() == before + (1 if fused_taken else 0), \
        f"DeviceCommunicator fused path taken: expected {fused_taken}"
    assert_equal(r, ref_r, "DeviceCommunicator add_rms_norm residual")
    torch.testing.assert_close(y, ref_y, rtol=2e-2, atol=2e-2)
    torch.cuda.synchronize()
    ca.close()
    dc.destroy()
    dc2.destroy()
    return {"fused_taken": fused_taken}


def scenario_plugins(rank: int, world: int):
    """The vLLM and SGLang plugins with the real anyreduce adapter, driven through the
    servers' own call paths (tests/_fake_upstream.py): vLLM's CudaCommunicator builds anyreduce's
    CustomAllreduce and all-reduces through it, eagerly and in a captured graph; vLLM's fused
    operator, rebound by the plugin, serves through anyreduce or vLLM's FlashInfer function;
    SGLang's group coordinator gets the anyreduce communicator, all-reduces in place through it,
    and its fused call is served on that group."""
    import os

    import pytest
    import torch
    import torch.distributed as dist

    import _fake_upstream as fake
    from anyreduce.plugins import sglang as sglang_plugin
    from anyreduce.plugins import vllm as vllm_plugin
    from anyreduce.torch import add_rms_norm_reference

    gloo = dist.new_group(backend="gloo")
    device = torch.device("cuda", DEVICE)
    mp = pytest.MonkeyPatch()
    os.environ["ANYREDUCE"] = "1"
    try:
        # vLLM: the tensor-parallel all-reduce. Where torch can register the fused operator,
        # the stand-in of vLLM's fusion module gets a real operator with vLLM's schema.
        can_register = hasattr(torch.library, "register_fake")
        modules = fake.install_vllm(mp, flashinfer=can_register)
        if can_register:
            lib = torch.library.Library("anyreduce_test_vllm_gpu", "FRAGMENT")
            lib.define("flashinfer_trtllm_fused_allreduce_norm" + fake.VLLM_FUSED_SCHEMA)
            modules[fake.VLLM_FUSION].flashinfer_trtllm_fused_allreduce_norm = \
                torch.ops.anyreduce_test_vllm_gpu.flashinfer_trtllm_fused_allreduce_norm.default
        vllm_plugin.register()
        cc = modules[fake.VLLM_CUDA_COMM].CudaCommunicator(gloo, device, None, "tp:0")
        assert isinstance(cc.ca_comm, vllm_plugin.CustomAllreduce) and not cc.ca_comm.disabled
        x = ints((4096,), torch.bfloat16, seed=rank)
        assert_equal(cc.all_reduce(x), nccl_sum(x), "vLLM CudaCommunicator.all_reduce")
        assert cc.pynccl_calls == []
        static = torch.zeros(2048, dtype=torch.float16, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with cc.ca_comm.capture():
            with torch.cuda.stream(s):
                cc.all_reduce(static)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                graph_out = cc.all_reduce(static)
        for it in range(2):
            inp = ints(static.shape, static.dtype, seed=rank * 10 + it)
            static.copy_(inp)
            g.replay()
            assert_equal(graph_out, nccl_sum(inp), f"vLLM plugin graph replay {it}")

        # vLLM: the fused operator, where torch can register it.
        tokens, hidden = 5, 1024
        partial = ints((tokens, hidden), torch.bfloat16, seed=rank + 40)
        residual = ints((tokens, hidden), torch.bfloat16, seed=rank + 41)
        weight = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
        ref_y, ref_r = add_rms_norm_reference(nccl_sum(partial), residual, weight, 1e-6)
        fused_taken = None
        if can_register:
            assert vllm_plugin._fusion.installed
            modules[fake.VLLM_PARALLEL_STATE]._state["tp"] = fake.VllmGroupCoordinator(cc)
            op = vllm_plugin._fusion.op
            ai, rr = partial.clone(), residual.clone()
            op(ai, rr, weight, 1e-6, world, True, True, 64,
               fake.FlashInferPatterns.kARResidualRMSNorm)
            recorder = modules[fake.VLLM_FUSION]._recorder
            fused_taken = not recorder.calls
            if fused_taken:
                torch.testing.assert_close(ai, ref_y, rtol=2e-2, atol=2e-2)
                assert_equal(rr, ref_r, "vLLM fused operator residual in place")
            else:
                skip_check("vLLM fused operator through anyreduce",
                           "anyreduce declined the fused op here; vLLM's function was called")
        else:
            skip_check("vLLM fused operator", "torch has no torch.library.register_fake (2.4+)")

        # SGLang: the communicator and the fused call on its group.
        modules = fake.install_sglang(mp)
        sglang_plugin._classes.clear()
        sglang_plugin.register()
        fake.HookRegistry.apply_hooks()
        tp = fake.SglGroupCoordinator("tp:0", cpu_group=gloo, device=device)
        assert isinstance(tp.ca_comm, sglang_plugin.Communicator) and not tp.ca_comm.disabled
        y = ints((4096,), torch.bfloat16, seed=rank + 7)
        want = nccl_sum(y)
        assert tp.all_reduce(y) is y  # in place, SGLang's preference
        assert_equal(y, want, "SGLang all_reduce in place")
        z = ints((4096,), torch.float32, seed=rank + 8)
        assert_equal(tp.all_reduce(z, inplace=False), nccl_sum(z), "SGLang out of place")
        assert tp.torch_comm.calls == []
        groups = modules[fake.SGL_DISTRIBUTED].groups
        groups.update(attn_tp=tp, moe_ep=tp, moe_tp=tp)
        fused = modules[fake.SGL_FUSION].flashinfer_allreduce_residual_rmsnorm
        normed, res = fused(partial, residual, weight, 1e-6)
        if isinstance(normed, torch.Tensor):  # anyreduce's (the stand-in returns FakeTensors)
            torch.testing.assert_close(normed, ref_y, rtol=2e-2, atol=2e-2)
            assert_equal(res, ref_r, "SGLang fused residual")
        else:
            skip_check("SGLang fused call through anyreduce",
                       "anyreduce declined the fused op here; SGLang's function was called")
        torch.cuda.synchronize()
        cc.ca_comm.close()
        tp.ca_comm.close()
    finally:
        os.environ.pop("ANYREDUCE", None)
        mp.undo()
    return {"fused_taken": fused_taken}


SCENARIOS = {
    "allreduce": scenario_allreduce,
    "graph": scenario_graph,
    "subgroup": scenario_subgroup,
    "fused": scenario_fused,
    "errors": scenario_errors,
    "adapters": scenario_adapters,
    "plugins": scenario_plugins,
}

