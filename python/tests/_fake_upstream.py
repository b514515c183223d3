"""Stand-ins for the parts of vLLM and SGLang the anyreduce plugins touch, written here from
reading upstream main (the versions docs/INTEGRATION.md records), with upstream's names,
signatures and call paths and nothing else: no upstream code is copied. They need no torch.

``install_vllm(monkeypatch, ...)`` / ``install_sglang(monkeypatch, ...)`` put the module trees
into ``sys.modules`` for one test (monkeypatch undoes it), so a test can run a plugin's
``register`` and then drive the server's own call path (CudaCommunicator's lazy import of
CustomAllreduce; GroupCoordinator's dispatch through ``device_communicators.comm``; SGLang's
communicator list) and see what it reaches. ``StubAdapter`` stands in for
``anyreduce.adapters.CustomAllreduce`` (which needs torch and a GPU) and records calls.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import pkgutil
import sys
import types
from typing import Any, Callable, Dict, List, Optional


class FakeTensor:
    """What the stand-ins pass around: a name, and whether anyreduce would take it."""

    def __init__(self, name: str, eligible: bool = True) -> None:
        self.name = name
        self.eligible = eligible

    def __repr__(self) -> str:
        return f"FakeTensor({self.name})"


class StubAdapter:
    """anyreduce.adapters.CustomAllreduce's surface, recording calls; declines FakeTensors with
    eligible=False."""

    def __init__(self, group: Any, device: Any, max_size: Optional[int],
                 disabled: bool = False, world_size: int = 2) -> None:
        self.group, self.device, self.max_size = group, device, max_size
        self.disabled = disabled
        self.world_size = world_size
        self.rank = 0
        self._IS_CAPTURING = False
        self.calls: List[tuple] = []
        adapter = self

        class _Comm:
            def all_reduce(self, tensor, out=None):
                adapter.calls.append(("comm.all_reduce", tensor, out))
                return tensor if out is None else out

        self.comm = _Comm()

    def should_custom_ar(self, inp):
        return not self.disabled and inp.eligible

    def custom_all_reduce(self, inp):
        if not self.should_custom_ar(inp):
            return None
        return self.all_reduce(inp)

    def all_reduce(self, inp, *, out=None, registered=False):
        self.calls.append(("all_reduce", inp, out, registered))
        return FakeTensor(f"sum({inp.name})")

    @contextlib.contextmanager
    def capture(self):
        self._IS_CAPTURING = True
        try:
            yield
        finally:
            self._IS_CAPTURING = False

    def close(self):
        self.calls.append(("close",))
        self.disabled = True

    def fused_allreduce_norm_(self, allreduce_in, residual, rms_gamma, rms_eps, **kwargs):
        self.calls.append(("fused_allreduce_norm_", allreduce_in, kwargs))
        return allreduce_in.eligible

    def allreduce_residual_rmsnorm(self, input_tensor, residual, weight, eps=1e-6):
        self.calls.append(("allreduce_residual_rmsnorm", input_tensor, eps))
        if not input_tensor.eligible:
            return None, None
        return FakeTensor("anyreduce-normed"), FakeTensor("anyreduce-residual")


def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def _install(monkeypatch, modules: Dict[str, types.ModuleType]) -> Dict[str, types.ModuleType]:
    for name in list(modules):
        parts = name.split(".")
        for i in range(1, len(parts)):  # every parent package, so dotted imports resolve
            parent = ".".join(parts[:i])
            if parent not in modules:
                modules[parent] = _module(parent)
    for name, module in sorted(modules.items()):
        if "." in name:
            parent, _, child = name.rpartition(".")
            setattr(modules[parent], child, module)
        monkeypatch.setitem(sys.modules, name, module)
    return modules


# ---- vLLM ----------------------------------------------------------------------------------------

VLLM_CAR = "vllm.distributed.device_communicators.custom_all_reduce"
VLLM_CUDA_COMM = "vllm.distributed.device_communicators.cuda_communicator"
VLLM_PARALLEL_STATE = "vllm.distributed.parallel_state"
VLLM_FUSION = "vllm.compilation.passes.fusion.allreduce_rms_fusion"


class VllmCustomAllreduce:
    """vLLM's CustomAllreduce: constructor and the methods its callers use."""

    _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]

    def __init__(self, group, device, max_size=8192 * 1024, symm_mem_enabled=False) -> None:
        self.disabled = True

    def finalize_p2p(self) -> None: ...

    @contextlib.contextmanager
    def capture(self):
        yield

    def register_graph_buffers(self): ...

    def should_custom_ar(self, inp):
        return False

    def all_reduce(self, inp, *, out=None, registered=False): ...

    def custom_all_reduce(self, input):  # noqa: A002
        return None

    def close(self): ...


class VllmCudaCommunicator:
    """vLLM's CudaCommunicator: imports CustomAllreduce from custom_all_reduce inside __init__
    (so only that module's attribute matters) and tries ca_comm before pynccl."""

    def __init__(self, cpu_group, device=None, device_group=None, unique_name="",
                 global_ranks=None, global_world_size=None, tcp_store_group=None) -> None:
        self.cpu_group, self.device, self.unique_name = cpu_group, device, unique_name
        self.world_size = 2
        from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce

        self.ca_comm = None
        if "tp" in unique_name and self.world_size > 1:
            self.ca_comm = CustomAllreduce(group=self.cpu_group, device=self.device,
                                           symm_mem_enabled=False)
        self.pynccl_calls: List[Any] = []

    def finalize_p2p_check(self) -> None:
        if self.ca_comm is not None:
            self.ca_comm.finalize_p2p()

    def all_reduce(self, input_):
        ca_comm = self.ca_comm
        if ca_comm is not None and not ca_comm.disabled and ca_comm.should_custom_ar(input_):
            out = ca_comm.custom_all_reduce(input_)
            assert out is not None
            return out
        self.pynccl_calls.append(input_)
        return FakeTensor(f"pynccl({input_.name})")


class OlderVllmCudaCommunicator(VllmCudaCommunicator):
    """Older vLLM: the class came from cuda_communicator.dispatch_custom_allreduce()."""

    def __init__(self, cpu_group, device=None, device_group=None, unique_name="") -> None:
        self.cpu_group, self.device, self.unique_name = cpu_group, device, unique_name
        self.world_size = 2
        import vllm.distributed.device_communicators.cuda_communicator as cc

        CustomAllreduce = cc.dispatch_custom_allreduce()  # noqa: N806
        self.ca_comm = CustomAllreduce(group=self.cpu_group, device=self.device)
        self.pynccl_calls = []


def vllm_dispatch_custom_allreduce():
    from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce

    return CustomAllreduce


class FlashInferPatterns:
    """flashinfer.comm.AllReduceFusionPattern's codes."""

    kAllReduce = 0
    kARResidualRMSNorm = 1
    kARResidualRMSNormFP8Quant = 2
    kARResidualRMSNormFP4Quant = 3


# The schema torch infers for vLLM's call_trtllm_fused_allreduce_norm (its operator
# vllm::flashinfer_trtllm_fused_allreduce_norm mutates the five tensors it may write).
VLLM_FUSED_SCHEMA = (
    "(Tensor(a0!) allreduce_in, Tensor(a1!) residual, Tensor rms_gamma, float rms_eps, "
    "int world_size, bool launch_with_pdl, bool fp32_acc, int max_token_num, int pattern_code, "
    "Tensor(a9!)? norm_out=None, Tensor(a10!)? quant_out=None, Tensor(a11!)? scale_out=None, "
    "Tensor? scale_factor=None, float weight_bias=0.0) -> ()")


class FusionRecorder:
    """vLLM's call_trtllm_fused_allreduce_norm (FlashInfer), recording calls."""

    def __init__(self) -> None:
        self.calls: List[tuple] = []

        def call_trtllm_fused_allreduce_norm(allreduce_in, residual, rms_gamma, rms_eps,
                                             world_size, launch_with_pdl, fp32_acc,
                                             max_token_num, pattern_code, norm_out=None,
                                             quant_out=None, scale_out=None, scale_factor=None,
                                             weight_bias=0.0):
            self.calls.append((allreduce_in, pattern_code, norm_out, weight_bias))

        self.fn = call_trtllm_fused_allreduce_norm


class VllmAllReduceFusionPass:
    def __init__(self, config) -> None:
        self.config = config

    def uuid(self) -> str:
        return "fusion-pass-source-hash"


class VllmGroupCoordinator:
    def __init__(self, device_communicator) -> None:
        self.device_communicator = device_communicator


def install_vllm(monkeypatch, *, older: bool = False, flashinfer: bool = True,
                 fusion_module: bool = True) -> Dict[str, types.ModuleType]:
    """The vLLM module tree: current (CustomAllreduce imported lazily by CudaCommunicator) or
    older (dispatch_custom_allreduce); the fusion module with or without FlashInfer's API."""
    state = {"tp": None}
    modules = {
        "vllm": _module("vllm"),
        VLLM_CAR: _module(VLLM_CAR, CustomAllreduce=VllmCustomAllreduce),
        VLLM_PARALLEL_STATE: _module(VLLM_PARALLEL_STATE, get_tp_group=lambda: state["tp"],
                                     _state=state),
    }
    if older:
        modules[VLLM_CUDA_COMM] = _module(
            VLLM_CUDA_COMM, CudaCommunicator=OlderVllmCudaCommunicator,
            dispatch_custom_allreduce=vllm_dispatch_custom_allreduce)
    else:
        modules[VLLM_CUDA_COMM] = _module(VLLM_CUDA_COMM, CudaCommunicator=VllmCudaCommunicator)
    if fusion_module:
        # A class per install: the plugin marks the pass class's uuid.
        attrs: Dict[str, Any] = {"AllReduceFusionPass": type("AllReduceFusionPass",
                                                             (VllmAllReduceFusionPass,), {})}
        if flashinfer:
            recorder = FusionRecorder()
            attrs.update(call_trtllm_fused_allreduce_norm=recorder.fn,
                         flashinfer_trtllm_fused_allreduce_norm="vllm::flashinfer_op",
                         flashinfer_comm=types.SimpleNamespace(
                             AllReduceFusionPattern=FlashInferPatterns),
                         _recorder=recorder)
        modules[VLLM_FUSION] = _module(VLLM_FUSION, **attrs)
    return _install(monkeypatch, modules)


# ---- SGLang --------------------------------------------------------------------------------------

SGL_COMM_PACKAGE = "sglang.srt.distributed.device_communicators"
SGL_BASE = SGL_COMM_PACKAGE + ".base"
SGL_CAR = SGL_COMM_PACKAGE + ".custom_all_reduce"
SGL_COMM = SGL_COMM_PACKAGE + ".comm"
SGL_FUSION = "sglang.srt.layers.flashinfer_comm_fusion"
SGL_FUSION_CALLER = "sglang.srt.layers.communicator"
SGL_DISTRIBUTED = "sglang.srt.distributed"
SGL_HOOKS = "sglang.srt.plugins.hook_registry"


class HookType(enum.Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class HookRegistry:
    """SGLang's HookRegistry: register(target, hook, hook_type, *, source) now, apply_hooks()
    later, which rebinds the target in its module and in every module holding the original."""

    _hooks: Dict[str, List[tuple]] = {}
    _patched: set = set()

    @classmethod
    def register(cls, target, hook, hook_type=HookType.AFTER, *, source=None):
        if isinstance(hook, type) and hook_type != HookType.REPLACE:
            raise TypeError("classes only with REPLACE")
        cls._hooks.setdefault(target, []).append((hook_type, hook, source))

    @classmethod
    def apply_hooks(cls):
        for target, hooks in sorted(cls._hooks.items()):
            if target in cls._patched:
                continue
            owner_path, attr = target.rsplit(".", 1)
            owner = pkgutil.resolve_name(owner_path)
            original = getattr(owner, attr)
            wrapped = original
            for hook_type, hook, _ in sorted(hooks, key=lambda h: h[0] != HookType.REPLACE):
                wrapped = _wrap(wrapped, hook, hook_type)
            setattr(owner, attr, wrapped)
            for module in list(sys.modules.values()):
                if module is owner or not isinstance(module, types.ModuleType):
                    continue
                for name, value in list(vars(module).items()):
                    if value is original:
                        setattr(module, name, wrapped)
            cls._patched.add(target)

    @classmethod
    def reset(cls):
        cls._hooks = {}
        cls._patched = set()


def _wrap(original: Callable, hook: Callable, hook_type: HookType) -> Callable:
    if hook_type == HookType.REPLACE:
        @functools.wraps(original)
        def replaced(*args, **kwargs):
            return hook(*args, **kwargs)
        return replaced
    if hook_type == HookType.AROUND:
        @functools.wraps(original)
        def around(*args, **kwargs):
            return hook(original, *args, **kwargs)
        return around
    raise ValueError(hook_type)


class AllReduceMode(enum.Enum):
    BOTH = "both"
    INPLACE = "inplace"
    OUTPLACE = "outplace"


class BaseCommunicator:
    """SGLang's BaseCommunicator interface."""

    name: str

    def __init__(self, world_size: int, disabled: bool = False) -> None:
        self.world_size = world_size
        self._disabled = disabled

    @property
    def disabled(self) -> bool:
        return self._disabled

    @contextlib.contextmanager
    def change_state(self, enable: bool):
        old = self._disabled
        self._disabled = not enable
        try:
            yield
        finally:
            self._disabled = old

    def allocate_all_gather(self, input_):
        return ("allocated", input_)

    def graph_capture_context(self):
        return None

    def should_use_custom_op(self) -> bool:
        return False

    def get_all_reduce_mode(self, input_):
        raise NotImplementedError()

    def all_reduce(self, input_, *, inplace=None):
        raise NotImplementedError()

    def all_gather_into_tensor(self, input_, *, out=None):
        raise NotImplementedError()

    def all_gather(self, input_, *, out_list=None):
        raise NotImplementedError()

    def reduce_scatter_tensor(self, input_, *, out=None):
        raise NotImplementedError()

    def reduce_scatter(self, input_list, *, out=None):
        raise NotImplementedError()

    def gather(self, input_, dst, *, dim=0):
        raise NotImplementedError()


class SglCustomAllreduce(BaseCommunicator):
    name = "custom_all_reduce"

    def __init__(self, group, device, max_size=8192 * 1024) -> None:
        super().__init__(world_size=2)


class SglTorchCommunicator(BaseCommunicator):
    """SGLang's TorchDefaultCommunicator: in place, always available."""

    name = "torch_native"

    def __init__(self) -> None:
        super().__init__(world_size=2)
        self.calls: List[Any] = []

    def get_all_reduce_mode(self, input_):
        return AllReduceMode.INPLACE

    def all_reduce(self, input_, *, inplace=None):
        self.calls.append(input_)
        return input_


def sgl_impl_all_reduce(comms: List[Any], input_, *, inplace: Optional[bool] = None):
    """CommunicatorImpl.all_reduce: the first enabled communicator whose mode fits (in place
    preferred when it may choose); custom-op communicators are reached through SGLang's
    inplace/outplace operators, which call all_reduce(input_, inplace=True/False)."""
    for comm in comms:
        if comm.disabled:
            continue
        mode = comm.get_all_reduce_mode(input_)
        if mode is None:
            continue
        if inplace is not None and mode.value == ("outplace" if inplace else "inplace"):
            continue
        if not comm.should_use_custom_op():
            return comm.all_reduce(input_, inplace=inplace)
        use_inplace = (mode.value != "outplace") if inplace is None else inplace
        if use_inplace:
            comm.all_reduce(input_, inplace=True)
            return input_
        return comm.all_reduce(input_, inplace=False)
    raise ValueError("No compatible all-reduce communicator found")


class SglGroupCoordinator:
    """The parts of GroupCoordinator the plugin reads: cpu_group and ca_comm, built the way
    __init__ builds it (through device_communicators.comm)."""

    def __init__(self, name: str, use_custom_allreduce: bool = True, cpu_group: Any = None,
                 device: Any = "cuda:0") -> None:
        self.unique_name = name
        self.cpu_group = f"gloo-group-{name}" if cpu_group is None else cpu_group
        self.device = device
        self.ca_comm = None
        if use_custom_allreduce:
            import sglang.srt.distributed.device_communicators.comm as comm

            ca_class = comm.dispatch_custom_allreduce(group=self.cpu_group, device=self.device)
            self.ca_comm = ca_class(group=self.cpu_group, device=self.device)
        self.torch_comm = SglTorchCommunicator()

    def all_reduce(self, input_, *, inplace=None):
        comms = [c for c in (self.ca_comm, self.torch_comm) if c is not None]
        return sgl_impl_all_reduce(comms, input_, inplace=inplace)


class SglFusion:
    """flashinfer_comm_fusion.flashinfer_allreduce_residual_rmsnorm, recording calls."""

    def __init__(self) -> None:
        self.calls: List[tuple] = []

        def flashinfer_allreduce_residual_rmsnorm(input_tensor, residual, weight, eps=1e-6,
                                                  max_token_num=2048, use_oneshot=None,
                                                  trigger_completion_at_end=False,
                                                  fp32_acc=False, use_attn_tp_group=True):
            self.calls.append((input_tensor, eps, max_token_num, use_attn_tp_group))
            return FakeTensor("flashinfer-normed"), FakeTensor("flashinfer-residual")

        self.fn = flashinfer_allreduce_residual_rmsnorm


def install_sglang(monkeypatch, *, with_base: bool = True) -> Dict[str, types.ModuleType]:
    """The SGLang module tree. ``groups`` (a dict in the distributed module) holds the
    coordinators the distributed getters return: "attn_tp", "moe_ep", "moe_tp", and
    "moe_ep_size"."""
    HookRegistry.reset()

    # Made per install: the hook registry rebinds every module attribute holding the original,
    # and this module must not hold one.
    def dispatch_custom_allreduce(group, device):
        return SglCustomAllreduce

    groups: Dict[str, Any] = {"attn_tp": None, "moe_ep": None, "moe_tp": None, "moe_ep_size": 1}
    fusion = SglFusion()
    modules = {
        SGL_HOOKS: _module(SGL_HOOKS, HookRegistry=HookRegistry, HookType=HookType),
        SGL_CAR: _module(SGL_CAR, dispatch_custom_allreduce=dispatch_custom_allreduce,
                         CustomAllreduce=SglCustomAllreduce),
        SGL_COMM: _module(SGL_COMM, dispatch_custom_allreduce=dispatch_custom_allreduce),
        SGL_DISTRIBUTED: _module(
            SGL_DISTRIBUTED, groups=groups,
            get_attn_tp_group=lambda: groups["attn_tp"],
            get_moe_ep_group=lambda: groups["moe_ep"],
            get_moe_tp_group=lambda: groups["moe_tp"],
            get_moe_expert_parallel_world_size=lambda: groups["moe_ep_size"]),
        SGL_FUSION: _module(SGL_FUSION, flashinfer_allreduce_residual_rmsnorm=fusion.fn,
                            _recorder=fusion),
        # A caller that imported the fused function by name (as SGLang's layers do).
        SGL_FUSION_CALLER: _module(SGL_FUSION_CALLER,
                                   flashinfer_allreduce_residual_rmsnorm=fusion.fn),
    }
    if with_base:
        modules[SGL_BASE] = _module(SGL_BASE, BaseCommunicator=BaseCommunicator,
                                    AllReduceMode=AllReduceMode)
    return _install(monkeypatch, modules)
