"""libanyreduce_nccl.so preloaded into torch.distributed on one GPU (marker gpu_shared).

torch's wheels load their pinned libnccl.so.2 through RPATH; only a preload puts the
NCCL-compatible library in front of it. With one GPU the process group has one rank (NCCL
refuses two ranks on one GPU), which anyreduce does not serve: what this checks is the door
itself: the library is interposed in a real torch process, finds torch's own NCCL as the real
one, and forwards every call so that torch's collectives (eager and inside a CUDA graph) give
NCCL's results, and torch reports the real library's version. Serving two ranks needs two GPUs
(nccl/tests/test_gpu.cc)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import BUILT_LIBRARY

pytestmark = pytest.mark.gpu_shared

WORKER = textwrap.dedent(
    """
    import os, socket, sys
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    maps = open("/proc/self/maps").read()
    assert "libanyreduce_nccl.so" in maps, "the preloaded library is not mapped"

    g = torch.Generator(device="cpu").manual_seed(7)
    x = torch.randint(-8, 8, (4099,), generator=g).to(torch.bfloat16).to(dev)
    ref = x.clone()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert torch.equal(x, ref), "eager all-reduce of one rank changed the data"

    b = torch.full((33,), 5.0, device=dev)
    dist.broadcast(b, src=0)
    out = torch.empty(2 * 33, device=dev)
    dist.all_gather_into_tensor(out[:33], b)
    torch.cuda.synchronize()
    assert torch.equal(out[:33], b), "all_gather_into_tensor of one rank differs"

    y = torch.randint(-8, 8, (1 << 16,), generator=g).to(torch.float16).to(dev)
    y_ref = y.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_reduce(y)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(y)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, y_ref), "graph-replayed all-reduce of one rank changed the data"

    print("TORCH_NCCL_VERSION", ".".join(str(v) for v in torch.cuda.nccl.version()))
    dist.destroy_process_group()
    print("WORKER OK")
    """
)


def _shim():
    if BUILT_LIBRARY is None:
        return None
    p = BUILT_LIBRARY.parent.parent / "nccl" / "libanyreduce_nccl.so"
    return p if p.is_file() else None


def test_preloaded_into_torch_distributed_forwards_to_torchs_nccl(tmp_path):
    shim = _shim()
    if shim is None:
        pytest.skip("no libanyreduce_nccl.so beside the library under test "
                    "(configure with -DANYR_BUILD_NCCL_LIBRARY=ON)")
    env = dict(os.environ, LD_PRELOAD=str(shim), ANYR_DEBUG="INFO")
    env.pop("ANYR_NCCL_LIBRARY", None)  # the default: the process's own libnccl.so.2
    r = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True,
                       timeout=240)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log
    assert "WORKER OK" in r.stdout, log
    # The library announced the real NCCL it forwards to, and that is torch's own copy.
    lines = [ln for ln in r.stderr.splitlines() if "forwarding to the real NCCL library" in ln]
    assert lines, log
    # torch's reported version is the real library's (the version query is forwarded).
    version = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("TORCH_NCCL_VERSION")]
    assert version and version[0].count(".") == 2, log
    major = int(version[0].split(".")[0])
    assert major == 2, f"torch reports NCCL {version[0]} through the preloaded library"
