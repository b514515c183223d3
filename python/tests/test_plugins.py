"""The vLLM and SGLang plugins against stand-ins of the servers (tests/_fake_upstream.py, written
from reading upstream): what ``ANYREDUCE`` switches, what each plugin replaces, and that the
servers' own call paths then reach anyreduce -- and fall back to their own paths where anyreduce
declines or the group is not anyreduce's. No torch, GPU or library needed (the anyreduce work is
a recording stand-in); the operator registration that needs torch skips without it."""

from __future__ import annotations

import inspect
import logging
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import _fake_upstream as fake
from _fake_upstream import FakeTensor, StubAdapter
from conftest import PYTHON_DIR

import anyreduce.plugins as plugins
from anyreduce.plugins import sglang as sglang_plugin
from anyreduce.plugins import vllm as vllm_plugin


@pytest.fixture
def stub_adapters(monkeypatch):
    """Communicators built by the plugins get a StubAdapter (listed here) instead of the real
    anyreduce adapter; the library check passes."""
    made = []

    def make(group, device, max_size):
        made.append(StubAdapter(group, device, max_size))
        return made[-1]

    monkeypatch.setattr(vllm_plugin, "_make_adapter", make)
    monkeypatch.setattr(sglang_plugin, "_make_adapter", make)
    monkeypatch.setattr(vllm_plugin, "require_library", lambda: "/stub/libanyreduce.so")
    monkeypatch.setattr(sglang_plugin, "require_library", lambda: "/stub/libanyreduce.so")
    return made


@pytest.fixture
def fresh_vllm_fusion(monkeypatch):
    """A fresh fusion state, and an operator registration that needs no torch."""
    monkeypatch.setattr(vllm_plugin, "_fusion", vllm_plugin._FusionState())
    monkeypatch.setattr(vllm_plugin, "_register_operator", lambda original_op: "anyreduce_vllm-op")
    return vllm_plugin._fusion


@pytest.fixture
def fresh_sglang(monkeypatch):
    monkeypatch.setattr(sglang_plugin, "_classes", {})
    monkeypatch.setattr(sglang_plugin, "_fused", sglang_plugin._FusedState())


# ---- the switch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value,expected", [(None, False), ("", False), ("0", False),
                                            ("off", False), ("1", True), ("TRUE", True),
                                            (" yes ", True), ("on", True)])
def test_switch_values(value, expected):
    env = {} if value is None else {"ANYREDUCE": value}
    assert plugins.enabled(env) is expected


def test_switch_refuses_a_typo():
    with pytest.raises(ValueError, match=r"ANYREDUCE='2'.*ANYREDUCE=1"):
        plugins.enabled({"ANYREDUCE": "2"})


def test_entry_points_are_declared_and_resolve():
    tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ to read pyproject.toml")
    meta = tomllib.loads((PYTHON_DIR / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]
    assert eps["vllm.general_plugins"] == {"anyreduce": "anyreduce.plugins.vllm:register"}
    assert eps["sglang.srt.plugins"] == {"anyreduce": "anyreduce.plugins.sglang:register"}
    # The wheel's backend carries the whole package tree, subpackages included; resolving the
    # entry points below imports them from wherever the package was loaded.
    assert (PYTHON_DIR / "anyreduce" / "plugins" / "__init__.py").is_file()
    for value in (eps["vllm.general_plugins"]["anyreduce"], eps["sglang.srt.plugins"]["anyreduce"]):
        module, _, attr = value.partition(":")
        fn = getattr(__import__(module, fromlist=[attr]), attr)
        assert callable(fn) and not inspect.signature(fn).parameters  # the loaders call fn()


def test_plugin_modules_import_neither_torch_nor_servers(tmp_path):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        import anyreduce.plugins.vllm, anyreduce.plugins.sglang
        loaded = [m for m in ("torch", "vllm", "sglang") if m in sys.modules]
        assert not loaded, loaded
    """)], cwd=tmp_path, env={"PYTHONPATH": str(PYTHON_DIR)}, capture_output=True, text=True,
        timeout=60)
    assert r.returncode == 0, r.stderr


def test_missing_library_with_switch_on_raises_at_register(tmp_path):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import anyreduce
        from anyreduce.plugins import vllm
        try:
            vllm.register()
        except anyreduce.LibraryNotFoundError as e:
            print("raised:", e)
        else:
            raise SystemExit("register() did not raise")
    """)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(PYTHON_DIR), "ANYREDUCE": "1",
             "ANYREDUCE_LIBRARY": str(tmp_path / "missing.so")})
    assert r.returncode == 0, r.stderr
    assert "missing.so" in r.stdout


# ---- vLLM ----------------------------------------------------------------------------------------


def test_vllm_switch_off_touches_nothing(monkeypatch, stub_adapters):
    monkeypatch.delenv("ANYREDUCE", raising=False)
    modules = fake.install_vllm(monkeypatch)
    vllm_plugin.register()
    assert modules[fake.VLLM_CAR].CustomAllreduce is fake.VllmCustomAllreduce


def test_vllm_replaces_the_class_cuda_communicator_imports(monkeypatch, stub_adapters, caplog,
                                                           fresh_vllm_fusion):
    monkeypatch.setenv("ANYREDUCE", "1")
    modules = fake.install_vllm(monkeypatch)
    with caplog.at_level(logging.INFO, logger="vllm.plugins.anyreduce"):
        vllm_plugin.register()
    assert modules[fake.VLLM_CAR].CustomAllreduce is vllm_plugin.CustomAllreduce
    assert any("custom_all_reduce.CustomAllreduce -> anyreduce.plugins.vllm.CustomAllreduce"
               in r.getMessage() for r in caplog.records)

    # vLLM's own path: CudaCommunicator imports the class lazily and builds ca_comm for "tp".
    cc = modules[fake.VLLM_CUDA_COMM].CudaCommunicator("gloo-tp", "cuda:0", None, "tp:0")
    assert isinstance(cc.ca_comm, vllm_plugin.CustomAllreduce)
    adapter = stub_adapters[-1]
    assert (adapter.group, adapter.device, adapter.max_size) == ("gloo-tp", "cuda:0",
                                                                 vllm_plugin.DEFAULT_MAX_SIZE)
    cc.finalize_p2p_check()
    out = cc.all_reduce(FakeTensor("x"))
    assert out.name == "sum(x)" and cc.pynccl_calls == []
    # Declined tensors go to vLLM's pynccl.
    assert cc.all_reduce(FakeTensor("big", eligible=False)).name == "pynccl(big)"
    with cc.ca_comm.capture():
        assert cc.ca_comm._IS_CAPTURING
    assert not cc.ca_comm._IS_CAPTURING
    assert cc.ca_comm.world_size == 2  # adapter attributes show through
    cc.ca_comm.close()
    assert cc.ca_comm.disabled and adapter.calls[-1] == ("close",)


def test_vllm_disabled_communicator_leaves_everything_to_vllm(monkeypatch, stub_adapters,
                                                               fresh_vllm_fusion):
    monkeypatch.setenv("ANYREDUCE", "1")
    monkeypatch.setattr(vllm_plugin, "_make_adapter",
                        lambda g, d, m: StubAdapter(g, d, m, disabled=True))
    modules = fake.install_vllm(monkeypatch)
    vllm_plugin.register()
    cc = modules[fake.VLLM_CUDA_COMM].CudaCommunicator("gloo-tp", "cuda:0", None, "tp:0")
    assert cc.ca_comm.disabled
    assert cc.all_reduce(FakeTensor("x")).name == "pynccl(x)"
    assert not fresh_vllm_fusion.attempted  # the fusion pass is left alone too


def test_vllm_older_dispatch_path(monkeypatch, stub_adapters, fresh_vllm_fusion):
    monkeypatch.setenv("ANYREDUCE", "1")
    modules = fake.install_vllm(monkeypatch, older=True)
    lines = vllm_plugin.install()
    assert any("dispatch_custom_allreduce" in line for line in lines)
    cc = modules[fake.VLLM_CUDA_COMM].CudaCommunicator("gloo-tp", "cuda:0", None, "tp:0")
    assert isinstance(cc.ca_comm, vllm_plugin.CustomAllreduce)
    assert vllm_plugin.install() == ["already installed in this process"]


def test_vllm_refuses_a_moved_constructor(monkeypatch):
    modules = fake.install_vllm(monkeypatch)

    class Moved:
        def __init__(self, process_group, device):
            pass

    modules[fake.VLLM_CAR].CustomAllreduce = Moved
    with pytest.raises(RuntimeError, match=r"CustomAllreduce: expected parameters "
                                            r"\(group, device, max_size\)"):
        vllm_plugin.install()


def test_vllm_class_mirrors_upstream_methods():
    ours, theirs = vllm_plugin.CustomAllreduce, fake.VllmCustomAllreduce
    for name, member in vars(theirs).items():
        if name.startswith("_") and name != "__init__":
            continue
        if not callable(member) and not isinstance(member, property):
            continue
        mine = getattr(ours, name)
        expected = [p for p in inspect.signature(member).parameters if p != "self"]
        assert plugins.signature_mismatch(mine, expected) is None, name


def _tp(ca_comm):
    return fake.VllmGroupCoordinator(type("CC", (), {"ca_comm": ca_comm})())


def test_vllm_fusion_installs_where_flashinfer_is(monkeypatch, stub_adapters, fresh_vllm_fusion):
    monkeypatch.setenv("ANYREDUCE", "1")
    modules = fake.install_vllm(monkeypatch)
    fusion = modules[fake.VLLM_FUSION]
    uuid_before = fusion.AllReduceFusionPass(None).uuid()
    vllm_plugin.register()
    cc = modules[fake.VLLM_CUDA_COMM].CudaCommunicator("gloo-tp", "cuda:0", None, "tp:0")
    assert fresh_vllm_fusion.installed
    assert fusion.flashinfer_trtllm_fused_allreduce_norm == "anyreduce_vllm-op"
    assert fusion.AllReduceFusionPass(None).uuid() != uuid_before
    modules[fake.VLLM_PARALLEL_STATE]._state["tp"] = _tp(cc.ca_comm)

    recorder = fusion._recorder
    patterns = fake.FlashInferPatterns
    x = FakeTensor("x")
    vllm_plugin.fused_allreduce_norm(x, "res", "w", 1e-6, 2, True, True, 1024,
                                     patterns.kARResidualRMSNormFP8Quant, quant_out="q",
                                     scale_factor="s")
    assert recorder.calls == []
    _, args, kwargs = stub_adapters[-1].calls[-1]
    assert args is x and kwargs["quant"] == "fp8" and kwargs["quant_out"] == "q"

    # Declined tensors, and patterns anyreduce has no kernel for, run vLLM's FlashInfer call.
    declined = FakeTensor("declined", eligible=False)
    vllm_plugin.fused_allreduce_norm(declined, "res", "w", 1e-6, 2, True, True, 1024,
                                     patterns.kARResidualRMSNorm, weight_bias=1.0)
    vllm_plugin.fused_allreduce_norm(x, "res", "w", 1e-6, 2, True, True, 1024,
                                     patterns.kAllReduce)
    assert recorder.calls == [(declined, patterns.kARResidualRMSNorm, None, 1.0),
                              (x, patterns.kAllReduce, None, 0.0)]

    # A tensor-parallel group whose ca_comm is not anyreduce's: FlashInfer's.
    modules[fake.VLLM_PARALLEL_STATE]._state["tp"] = _tp(fake.VllmCustomAllreduce("g", "d"))
    vllm_plugin.fused_allreduce_norm(x, "res", "w", 1e-6, 2, True, True, 1024,
                                     patterns.kARResidualRMSNorm)
    assert len(recorder.calls) == 3


def test_vllm_fusion_says_why_it_is_off_without_flashinfer(monkeypatch, fresh_vllm_fusion):
    fake.install_vllm(monkeypatch, flashinfer=False)
    assert "only with FlashInfer's fusion API" in vllm_plugin.install_fusion()
    assert not fresh_vllm_fusion.installed


def test_vllm_fusion_says_why_it_is_off_without_the_pass_module(monkeypatch, fresh_vllm_fusion):
    fake.install_vllm(monkeypatch, fusion_module=False)
    assert "this vLLM has no vllm.compilation.passes" in vllm_plugin.install_fusion()


def test_vllm_fusion_refuses_a_moved_signature(monkeypatch, fresh_vllm_fusion):
    modules = fake.install_vllm(monkeypatch)

    def moved(allreduce_in, residual, rms_gamma, rms_eps, world_rank, world_size):
        pass

    modules[fake.VLLM_FUSION].call_trtllm_fused_allreduce_norm = moved
    with pytest.raises(RuntimeError, match="call_trtllm_fused_allreduce_norm: expected"):
        vllm_plugin.install_fusion()


def test_vllm_fused_operator_copies_vllms_schema():
    torch = pytest.importorskip("torch", reason="torch is not installed: the operator "
                                                "registration needs torch.library")
    if not hasattr(torch.library, "register_fake"):
        pytest.skip(f"torch {torch.__version__} has no torch.library.register_fake (2.4+), "
                    "which the operator registration uses, as vLLM's torch does")
    lib = torch.library.Library("anyreduce_test_vllm", "FRAGMENT")
    lib.define("flashinfer_trtllm_fused_allreduce_norm" + fake.VLLM_FUSED_SCHEMA)
    original = torch.ops.anyreduce_test_vllm.flashinfer_trtllm_fused_allreduce_norm.default
    state = vllm_plugin._fusion
    saved = state.library
    try:
        op = vllm_plugin._register_operator(original)
        assert str(op._schema).split("(", 1)[1] == str(original._schema).split("(", 1)[1]
        assert str(op._schema).startswith(vllm_plugin.FUSED_OP)
    finally:
        state.library = saved


# ---- SGLang --------------------------------------------------------------------------------------


def test_sglang_switch_off_registers_nothing(monkeypatch, stub_adapters):
    monkeypatch.delenv("ANYREDUCE", raising=False)
    fake.install_sglang(monkeypatch)
    sglang_plugin.register()
    assert fake.HookRegistry._hooks == {}


def _register_and_apply(monkeypatch, caplog=None, **install):
    monkeypatch.setenv("ANYREDUCE", "1")
    modules = fake.install_sglang(monkeypatch, **install)
    sglang_plugin.register()
    fake.HookRegistry.apply_hooks()  # what SGLang's load_plugins does after the plugins ran
    return modules


def test_sglang_hooks_registered_and_logged(monkeypatch, stub_adapters, caplog, fresh_sglang):
    with caplog.at_level(logging.INFO, logger="sglang.srt.plugins.anyreduce"):
        _register_and_apply(monkeypatch)
    hooks = fake.HookRegistry._hooks
    assert [h[0] for h in hooks[sglang_plugin.DISPATCH_TARGET]] == [fake.HookType.REPLACE]
    assert [h[0] for h in hooks[sglang_plugin.FUSED_TARGET]] == [fake.HookType.AROUND]
    text = " ".join(r.getMessage() for r in caplog.records)
    assert sglang_plugin.DISPATCH_TARGET in text and sglang_plugin.FUSED_TARGET in text


def test_sglang_group_coordinator_gets_the_anyreduce_communicator(monkeypatch, stub_adapters,
                                                                  fresh_sglang):
    _register_and_apply(monkeypatch)
    tp = fake.SglGroupCoordinator("tp:0")  # dispatches through device_communicators.comm
    ca = tp.ca_comm
    assert isinstance(ca, sglang_plugin.Communicator)
    assert isinstance(ca, fake.BaseCommunicator)  # built on SGLang's base class
    assert ca.group == "gloo-group-tp:0" and stub_adapters[-1].max_size == 8192 * 1024
    assert ca.get_all_reduce_mode(FakeTensor("x")) is fake.AllReduceMode.BOTH
    assert ca.should_use_custom_op() and ca.name == "anyreduce"

    # SGLang's dispatcher prefers in place when the communicator may choose.
    x = FakeTensor("x")
    assert tp.all_reduce(x) is x
    assert stub_adapters[-1].calls[-1] == ("comm.all_reduce", x, None)
    assert tp.all_reduce(x, inplace=False).name == "sum(x)"
    # Declined: the next communicator (torch) does it.
    big = FakeTensor("big", eligible=False)
    assert ca.get_all_reduce_mode(big) is None
    assert tp.all_reduce(big) is big and tp.torch_comm.calls == [big]

    # change_state, graph capture, the older interface.
    with ca.change_state(False):
        assert ca.disabled and ca.get_all_reduce_mode(x) is None
        assert ca.custom_all_reduce(x) is None
    assert not ca.disabled
    with ca.graph_capture_context():
        assert ca._IS_CAPTURING
    assert ca.custom_all_reduce(x).name == "sum(x)" and ca.should_custom_ar(x)
    ca.disabled = True  # older SGLang assigned it
    assert ca.disabled and not ca.should_custom_ar(x)
    with pytest.raises(RuntimeError, match="anyreduce is disabled"):
        ca.all_reduce(x)
    ca.disabled = False
    for op in ("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "reduce_scatter"):
        with pytest.raises(NotImplementedError, match="all-reduce only"):
            getattr(ca, op)(x)
    with pytest.raises(NotImplementedError):
        ca.gather(x, 0)


def test_sglang_without_base_class(monkeypatch, stub_adapters, fresh_sglang):
    _register_and_apply(monkeypatch, with_base=False)
    ca = fake.SglGroupCoordinator("tp:0").ca_comm
    assert type(ca) is sglang_plugin.Communicator
    assert ca.get_all_reduce_mode(FakeTensor("x")).value == "both"


def test_sglang_communicator_implements_the_whole_base_interface():
    for name, member in vars(fake.BaseCommunicator).items():
        if name.startswith("_") or not (callable(member) or isinstance(member, property)):
            continue
        if name.startswith("allocate_"):  # helpers the base class gives its subclasses
            continue
        mine = vars(sglang_plugin.Communicator).get(name)
        assert mine is not None, f"Communicator does not define {name}"
        if callable(member):
            expected = [p for p in inspect.signature(member).parameters if p != "self"]
            assert plugins.signature_mismatch(mine, expected) is None, name
    assert set(sglang_plugin.BASE_METHODS) <= set(vars(sglang_plugin.Communicator))


def _coordinator(name, ca_comm=None):
    c = fake.SglGroupCoordinator(name, use_custom_allreduce=False)
    c.ca_comm = ca_comm
    return c


@pytest.fixture
def sgl_fused(monkeypatch, stub_adapters, fresh_sglang):
    """SGLang with the plugin applied: a TP group whose ca_comm is anyreduce's, fused getters
    resolved without torch."""
    modules = _register_and_apply(monkeypatch)
    tp = fake.SglGroupCoordinator("tp:0")
    groups = modules[fake.SGL_DISTRIBUTED].groups
    groups.update(attn_tp=tp, moe_ep=tp, moe_tp=tp)
    distributed = modules[fake.SGL_DISTRIBUTED]
    state = sglang_plugin._fused
    state.get_attn_tp_group = distributed.get_attn_tp_group
    state.get_moe_ep_group = distributed.get_moe_ep_group
    state.get_moe_tp_group = distributed.get_moe_tp_group
    state.get_moe_ep_size = distributed.get_moe_expert_parallel_world_size
    state.resolved = True
    return modules, tp, groups, modules[fake.SGL_FUSION]._recorder


def test_sglang_fused_served_on_the_communicators_group(sgl_fused):
    modules, tp, groups, recorder = sgl_fused
    # The wrapper reached the defining module and the module that imported the name.
    inputs = []
    for name in (fake.SGL_FUSION, fake.SGL_FUSION_CALLER):
        fn = modules[name].flashinfer_allreduce_residual_rmsnorm
        inputs.append(FakeTensor("x"))
        norm, res = fn(inputs[-1], "res", "w", 1e-5)
        assert (norm.name, res.name) == ("anyreduce-normed", "anyreduce-residual")
    assert recorder.calls == []
    # Each call reached the communicator with the caller's own input tensor and epsilon.
    assert tp.ca_comm._impl.calls == [("allreduce_residual_rmsnorm", x, 1e-5) for x in inputs]


def test_sglang_fused_falls_back_with_the_callers_arguments(sgl_fused):
    modules, tp, groups, recorder = sgl_fused
    fn = modules[fake.SGL_FUSION_CALLER].flashinfer_allreduce_residual_rmsnorm
    declined = FakeTensor("declined", eligible=False)
    norm, _ = fn(declined, "res", "w", eps=1e-6, max_token_num=128)
    assert norm.name == "flashinfer-normed"
    assert recorder.calls == [(declined, 1e-6, 128, True)]


def test_sglang_fused_dp_attention_group_without_custom_allreduce(sgl_fused):
    modules, tp, groups, recorder = sgl_fused
    groups["attn_tp"] = _coordinator("attention_tp")  # DP attention: no ca_comm there
    fn = modules[fake.SGL_FUSION].flashinfer_allreduce_residual_rmsnorm
    x = FakeTensor("x")
    assert fn(x, "res", "w")[0].name == "flashinfer-normed"
    # The MoE side is still the TP group: anyreduce serves it.
    assert fn(x, "res", "w", use_attn_tp_group=False)[0].name == "anyreduce-normed"
    # MoE EP > 1 means the EP group; its ca_comm built on another group is not used.
    groups["moe_ep_size"] = 2
    groups["moe_ep"] = _coordinator("moe_ep", ca_comm=tp.ca_comm)
    assert fn(x, "res", "w", 1e-6, 2048, None, False, False, False)[0].name == "flashinfer-normed"
    assert [c[3] for c in recorder.calls] == [True, False]


def test_sglang_fused_under_compilation_keeps_sglangs_operator(sgl_fused):
    modules, tp, groups, recorder = sgl_fused
    sglang_plugin._fused.is_compiling = lambda: True
    fn = modules[fake.SGL_FUSION].flashinfer_allreduce_residual_rmsnorm
    assert fn(FakeTensor("x"), "res", "w")[0].name == "flashinfer-normed"


def test_sglang_refuses_a_moved_fused_signature(monkeypatch, stub_adapters):
    monkeypatch.setenv("ANYREDUCE", "1")
    modules = fake.install_sglang(monkeypatch)

    def moved(input_tensor, residual, weight, eps, group):
        pass

    modules[fake.SGL_FUSION].flashinfer_allreduce_residual_rmsnorm = moved
    with pytest.raises(RuntimeError, match="flashinfer_allreduce_residual_rmsnorm: expected"):
        sglang_plugin.register()
    assert fake.HookRegistry._hooks == {}


# ---- the tables of hooked names against the stand-ins --------------------------------------------


@pytest.mark.parametrize("plugin", [vllm_plugin, sglang_plugin], ids=["vllm", "sglang"])
def test_stand_ins_have_every_hooked_name(monkeypatch, plugin):
    """The stand-ins follow the tables (test_upstream_contract.py checks the tables against the
    real servers where they are installed)."""
    fake.install_vllm(monkeypatch)
    fake.install_sglang(monkeypatch)
    for hooked in plugin.HOOKS:
        target = f"{hooked.module}:{hooked.name}"
        try:
            obj = pkgutil.resolve_name(target)
        except (ImportError, AttributeError):
            assert not hooked.required, target
            continue
        if hooked.params is not None:
            assert plugins.signature_mismatch(obj, hooked.params) is None, target
