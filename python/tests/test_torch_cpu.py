"""The torch layer and the adapters where torch is installed but no GPU is usable: argument
checks, the reference math, and -- with 2 CPU processes over gloo -- that the adapters disable
themselves on every rank together and fall back to torch.distributed correctly. Skipped
without torch; the GPU behaviour is in test_gpu.py."""

from __future__ import annotations

import json
import socket

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CPU-only checks of anyreduce.torch)")

import anyreduce.torch as art  # noqa: E402


def _bare_communicator(device_index: int = 0) -> art.Communicator:
    c = art.Communicator.__new__(art.Communicator)  # no GPU needed for argument checks
    c.device = torch.device("cuda", device_index)
    c._index = device_index
    return c


def test_dtype_mapping():
    assert art.to_anyr_dtype(torch.bfloat16) is art.DataType.BFLOAT16
    assert art.to_anyr_dtype(torch.float16) is art.DataType.FLOAT16
    assert art.to_anyr_dtype(torch.float32) is art.DataType.FLOAT32
    with pytest.raises(TypeError, match="does not support torch.int32"):
        art.to_anyr_dtype(torch.int32)
    assert art.FUSED_DTYPES == {torch.bfloat16, torch.float16}


def test_cpu_tensors_are_refused_naming_the_argument():
    c = _bare_communicator()
    with pytest.raises(ValueError, match="tensor must be a CUDA tensor on cuda:0"):
        c.all_reduce(torch.ones(4))
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor"):
        c.all_reduce([1.0])
    with pytest.raises(ValueError, match="partial must be a CUDA tensor"):
        c.all_reduce_add_rms_norm(torch.ones(2, 128, dtype=torch.bfloat16), None,
                                  torch.ones(128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        art.add_rms_norm(torch.ones(2, 128, dtype=torch.bfloat16), None,
                         torch.ones(128, dtype=torch.bfloat16))


def test_reference_add_rms_norm_math():
    x = torch.tensor([[1.0, -2.0, 3.0, 4.0]])
    res = torch.tensor([[1.0, 2.0, 0.0, -4.0]])
    w = torch.tensor([1.0, 2.0, 0.5, 1.0])
    y, r = art.add_rms_norm_reference(x, res, w, eps=0.0)
    assert r.tolist() == [[2.0, 0.0, 3.0, 0.0]]
    rms = (13.0 / 4) ** 0.5
    assert torch.allclose(y, torch.tensor([[2 / rms, 0.0, 1.5 / rms, 0.0]]))
    y1, _ = art.add_rms_norm_reference(x, res, w, eps=0.0, weight_plus_one=True)
    assert torch.allclose(y1, torch.tensor([[4 / rms, 0.0, 4.5 / rms, 0.0]]))
    yb, rb = art.add_rms_norm_reference(x.bfloat16(), None, w.bfloat16())
    assert yb.dtype == rb.dtype == torch.bfloat16 and torch.equal(rb, x.bfloat16())


def _adapter_worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from anyreduce.adapters import CustomAllreduce, DeviceCommunicator

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    ca = CustomAllreduce(dist.group.WORLD, rank)  # no usable GPU: must disable, not hang
    t = torch.full((5,), float(rank + 1))
    dc = DeviceCommunicator(dist.group.WORLD, device=rank)
    out = dc.all_reduce(t)
    p = torch.full((2, 128), float(rank + 1))
    r = torch.ones(2, 128)
    y, res = dc.all_reduce_add_rms_norm(p, r, torch.ones(128))
    result = dict(disabled=ca.disabled, declined=ca.custom_all_reduce(t) is None,
                  fused_declined=ca.fused_allreduce_rmsnorm(p, r, torch.ones(128), 1e-6) is None,
                  sum=out.tolist(), input=t.tolist(), residual=res[0, :2].tolist(),
                  normed=y[0, :2].tolist())
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    ca.close()
    dc.destroy()
    dist.destroy_process_group()


def test_adapters_disable_together_and_fall_back(tmp_path, lib_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is usable here: the adapters would enable (test_gpu.py covers that)")
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_adapter_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["disabled"] and r["declined"] and r["fused_declined"]
        assert r["sum"] == [3.0] * 5  # fell back to torch.distributed
        assert r["input"] == [float(rank + 1)] * 5  # out of place
        assert r["residual"] == [4.0, 4.0]
        assert r["normed"] == pytest.approx([1.0, 1.0], rel=1e-5)
