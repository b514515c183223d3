"""The torch.ops.anyreduce operators (anyreduce/_torch_ops.py), for torch.compile.

Without a GPU (torch needed): the schemas, the fake implementations' shapes and dtypes on meta
tensors, CPU tensors refused naming the argument, handles. With a GPU (marker `gpu_shared`: one
GPU is enough, two ranks then share it): every operator eagerly, under torch.compile
(aot_eager, static and dynamic shapes; inductor and mode="reduce-overhead" where triton
imports), captured in a CUDA graph, and through torch.library.opcheck, bit-identical to the Communicator calls they wrap
(per-rank bodies in _ops_worker.py). Skipped without torch, saying so."""

from __future__ import annotations

import gc
import json
import time
import weakref

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the torch.ops operators)")

import anyreduce.torch as art  # noqa: E402
from anyreduce import _torch_ops  # noqa: E402

OPS = torch.ops.anyreduce
TIMEOUT_S = 420


def test_every_operator_is_registered_with_its_schema():
    assert art.OPS_NAMESPACE == "anyreduce"
    assert art.registered_ops() == [f"anyreduce::{n}" for n in _torch_ops.SCHEMAS], \
        _torch_ops.NOT_REGISTERED_REASON
    for name, schema in _torch_ops.SCHEMAS.items():
        got = str(getattr(OPS, name).default._schema)
        assert got.startswith(f"anyreduce::{name}("), got
    mutable = {n: [a.name for a in getattr(OPS, n).default._schema.arguments
                   if a.alias_info is not None and a.alias_info.is_write]
               for n in _torch_ops.SCHEMAS}
    assert mutable == {"all_reduce": [], "all_reduce_inplace": ["tensor"],
                       "all_reduce_add_rms_norm": [],
                       "fused_add_rms_norm_inplace": ["partial", "residual"],
                       "all_reduce_add_rms_norm_fp8": [], "all_reduce_add_rms_norm_nvfp4": [],
                       "add_rms_norm": []}


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fake_implementations_give_shapes_and_dtypes():
    p, w = _meta(5, 7, 256), _meta(256)
    g = _meta(1, dtype=torch.float32)
    y = OPS.all_reduce(_meta(3, 333, dtype=torch.float16), 1)
    assert (y.shape, y.dtype) == ((3, 333), torch.float16)
    assert OPS.all_reduce_inplace(_meta(9), 1) is None
    normed, r = OPS.all_reduce_add_rms_norm(p, None, w, 1e-6, 1)
    assert normed.shape == r.shape == p.shape and normed.dtype == r.dtype == torch.bfloat16
    assert OPS.fused_add_rms_norm_inplace(p, _meta(5, 7, 256), w, 1e-6, 1) is None
    q, r = OPS.all_reduce_add_rms_norm_fp8(p, p, w, 1e-6, g, 1)
    fp8 = art.FP8_DTYPE if art.FP8_DTYPE is not None else torch.uint8
    assert (q.shape, q.dtype, r.shape) == (p.shape, fp8, p.shape)
    q, s, r = OPS.all_reduce_add_rms_norm_nvfp4(p, None, w, 1e-6, g, 1)  # swizzled
    assert (q.shape, q.dtype) == ((5, 7, 128), torch.uint8)
    assert (s.shape, s.dtype) == ((128, 16), fp8)  # 35 rows -> 128; 16 blocks -> 16
    q, s, r = OPS.all_reduce_add_rms_norm_nvfp4(_meta(130, 6160), None, _meta(6160), 1e-6, g, 1,
                                                False, True)
    assert s.shape == (256, 388)  # 130 -> 256 rows; 385 blocks -> 388
    q, s, r = OPS.all_reduce_add_rms_norm_nvfp4(p, None, w, 1e-6, g, 1, False, False)
    assert s.shape == (5, 7, 16)
    with pytest.raises(ValueError, match="argument 'partial'.*multiple of 16"):
        OPS.all_reduce_add_rms_norm_nvfp4(_meta(2, 264), None, _meta(264), 1e-6, g, 1)
    a, b = OPS.add_rms_norm(p, None, w, 1e-6)
    assert a.shape == b.shape == p.shape


def test_cpu_tensors_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"anyreduce::all_reduce: argument 'tensor': must be a "
                                         r"CUDA tensor, got a tensor on cpu"):
        OPS.all_reduce(torch.ones(4), 1)
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_inplace: argument 'partial'"):
        OPS.fused_add_rms_norm_inplace(torch.ones(2, 128), torch.ones(2, 128), torch.ones(128),
                                       1e-6, 1)


def test_handles_name_open_communicators_only():
    class Fake:
        pass

    c = Fake()
    h = _torch_ops.register(c)
    h2 = _torch_ops.register(Fake())
    assert h != h2
    assert _torch_ops.communicator(h, "all_reduce") is c
    _torch_ops.unregister(h)
    _torch_ops.unregister(h2)
    _torch_ops.unregister(None)
    with pytest.raises(ValueError, match=rf"anyreduce::all_reduce: argument 'comm': {h} is not "
                                         "the handle of an open communicator"):
        _torch_ops.communicator(h, "all_reduce")


def test_handles_keep_no_communicator_alive():
    class Fake:
        pass

    c = Fake()
    h = _torch_ops.register(c)
    alive = weakref.ref(c)
    del c
    gc.collect()
    assert alive() is None
    assert h not in _torch_ops._open  # the entry went with it
    with pytest.raises(ValueError, match=rf"argument 'comm': {h} is not the handle of an open"):
        _torch_ops.communicator(h, "all_reduce")


@pytest.mark.gpu_shared
def test_unknown_handle_is_refused_on_cuda():
    with pytest.raises(ValueError, match="argument 'comm': 987654 is not the handle"):
        OPS.all_reduce(torch.ones(4, device="cuda"), 987654)


@pytest.mark.gpu_shared
def test_calls_go_to_torchs_current_stream():
    from anyreduce.torch import _current_stream

    i = torch.cuda.current_device()
    assert _current_stream(i) == torch.cuda.current_stream(i).cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert _current_stream(i) == side.cuda_stream != torch.cuda.default_stream(i).cuda_stream
    assert _current_stream(i) == torch.cuda.current_stream(i).cuda_stream


@pytest.mark.gpu_shared
def test_operators_eager_compiled_graphed_and_opchecked(tmp_path):
    import torch.multiprocessing as mp

    from _ops_worker import run

    world = 2
    ctx = mp.start_processes(run, args=(world, str(tmp_path)), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=5):  # raises ProcessRaisedException with the rank's traceback
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"the ranks did not finish within {TIMEOUT_S} s")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    not_run = [r["skipped_checks"] for r in results]
    assert all(n == not_run[0] for n in not_run), f"ranks disagree on the checks not run: {not_run}"
    if not_run[0]:
        pytest.skip("every other check passed; not run: "
                    + "; ".join(f"{what} ({why})" for what, why in not_run[0]))
