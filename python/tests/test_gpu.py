"""Multi-rank tests: 2 ranks spawned with torch.multiprocessing, each on its own GPU where there
are two (NCCL's torch.distributed all-reduce the reference), sharing one where there is one
(gloo's, summing on the CPU; a correctness run): anyreduce against it, bit-exact on small
integers (marker gpu_shared; the example, which needs NCCL on two GPUs, is marked gpu).
The per-rank bodies are in _gpu_worker.py. Skipped, with the reason, without torch, without 2
GPUs or without a built library (see conftest.py). A scenario some of whose sub-checks could
not run here (an algorithm not admitted, no FP8 dtype in torch, ...) still runs every other
check, and then is reported as skipped, naming each sub-check not run and why."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.gpu_shared

WORLD = 2
TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(scenario: str, out_dir: Path, world: int = WORLD, check=None):
    """Runs `scenario` on `world` ranks; fails on any rank's failure; then `check(results)`
    (the test's own cross-rank assertions); then skips, with the reasons, if any sub-check
    was not run."""
    import torch.multiprocessing as mp

    from _gpu_worker import run

    ctx = mp.start_processes(run, args=(world, _free_port(), scenario, str(out_dir)),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=5):  # raises ProcessRaisedException with the rank's traceback
        if time.monotonic() > deadline:
            for p in ctx.processes:  # only the processes this test started
                if p.is_alive():
                    p.kill()
            pytest.fail(f"scenario {scenario!r} did not finish within {TIMEOUT_S} s")
    results = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]
    skipped = [r for r in results if r["status"] == "skip"]
    if skipped:
        assert len(skipped) == world, f"ranks disagree on skipping: {results}"
        pytest.skip(skipped[0]["reason"])
    assert all(r["status"] == "ok" for r in results), results
    if check is not None:
        check(results)
    not_run = [r["skipped_checks"] for r in results]
    assert all([w for w, _ in n] == [w for w, _ in not_run[0]] for n in not_run), \
        f"ranks disagree on the sub-checks not run: {not_run}"
    if not_run[0]:
        pytest.skip(f"scenario {scenario!r}: every other check passed; not run: "
                    + "; ".join(f"{what} ({why})" for what, why in not_run[0]))
    return results


def test_all_reduce_matches_nccl_all_dtypes_in_place_and_out(tmp_path):
    def ranks_agree(results):  # on the admitted algorithms
        assert results[0]["forced"] == results[1]["forced"], results

    spawn("allreduce", tmp_path, check=ranks_agree)


def test_cuda_graph_capture_and_replay(tmp_path):
    spawn("graph", tmp_path)


def test_sub_group_and_one_rank_groups(tmp_path):
    spawn("subgroup", tmp_path)


def test_fused_all_reduce_add_rms_norm_vs_torch_reference(tmp_path):
    spawn("fused", tmp_path)


def test_argument_errors(tmp_path):
    spawn("errors", tmp_path)


def test_server_adapters(tmp_path):
    def ranks_agree(results):  # on taking the fused hooks
        assert results[0]["fused_taken"] == results[1]["fused_taken"], results

    spawn("adapters", tmp_path, check=ranks_agree)


def test_server_plugins(tmp_path):
    """The vLLM and SGLang plugins with the real adapter, through the servers' call paths."""
    def ranks_agree(results):  # on taking the fused paths
        assert len({r["fused_taken"] for r in results}) == 1, results

    spawn("plugins", tmp_path, check=ranks_agree)


@pytest.mark.gpu
def test_example_tp_decoder_agrees_with_nccl():
    """examples/tp_decoder.py, self-spawning, small sizes: anyreduce == NCCL bit for bit."""
    example = REPO_ROOT / "examples" / "tp_decoder.py"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "python"), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(example), "--nproc-per-node", str(WORLD),
                        "--layers", "2", "--hidden", "1024", "--tokens", "8", "--steps", "5",
                        "--graph"], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bit-identical" in r.stdout, r.stdout
