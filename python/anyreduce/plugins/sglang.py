"""The SGLang plugin: anyreduce as SGLang's custom all-reduce communicator, and behind its
CUDA fused all-reduce + residual add + RMSNorm, with ``ANYREDUCE=1``.

SGLang loads ``register`` (entry-point group ``sglang.srt.plugins``, filtered by
``SGLANG_PLUGINS``) early in every process, then applies the hooks registered with its
``HookRegistry``, which replaces a function in its module and in every module that imported it
by name. ``register`` registers two hooks:

1. REPLACE ``...device_communicators.custom_all_reduce.dispatch_custom_allreduce``: every
   ``GroupCoordinator`` built with custom all-reduce asks it for the class of its ``ca_comm``
   (through ``device_communicators.comm``, which re-imports it); the answer is ``Communicator``
   below, built on SGLang's ``BaseCommunicator`` where SGLang has it. Older versions called it
   without arguments; both forms are served.
2. AROUND ``sglang.srt.layers.flashinfer_comm_fusion.flashinfer_allreduce_residual_rmsnorm``:
   the group that call means (attention TP with ``use_attn_tp_group=True``, else the MoE EP
   group when EP > 1, else the MoE TP group, as SGLang resolves it) is looked up; when that
   group's ``ca_comm`` is an enabled anyreduce communicator built on that group and anyreduce
   takes the tensors, anyreduce's fused kernel serves the call; otherwise SGLang's function
   runs, unchanged (so with DP attention, whose attention-TP group has no custom all-reduce,
   FlashInfer keeps serving it). Under torch.compile tracing the original runs too, so
   compiled graphs keep SGLang's operator.

Written against SGLang main as recorded in docs/INTEGRATION.md; ``HOOKS`` lists every
upstream name used, and python/tests/test_upstream_contract.py checks them where SGLang is
installed.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import logging
import pkgutil
from typing import Any, Callable, Dict, Optional, Tuple

from . import ENV_VAR, Hooked, enabled, require_library, signature_mismatch

__all__ = ["register", "Communicator", "communicator_class", "dispatch_custom_allreduce",
           "fused_allreduce_residual_rmsnorm", "HOOKS"]

# SGLang's loggers propagate to the root logger it configures.
logger = logging.getLogger("sglang.srt.plugins.anyreduce")

COMM_PACKAGE = "sglang.srt.distributed.device_communicators"
BASE_MODULE = COMM_PACKAGE + ".base"
CAR_MODULE = COMM_PACKAGE + ".custom_all_reduce"
FUSION_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
DISTRIBUTED_MODULE = "sglang.srt.distributed"
HOOK_REGISTRY_MODULE = "sglang.srt.plugins.hook_registry"

DISPATCH_TARGET = CAR_MODULE + ".dispatch_custom_allreduce"
FUSED_TARGET = FUSION_MODULE + ".flashinfer_allreduce_residual_rmsnorm"

# SGLang's default custom all-reduce size limit on CUDA (CustomAllreduce._MAX_CAR_SIZE).
DEFAULT_MAX_SIZE = 8192 * 1024

FUSED_PARAMS = ("input_tensor", "residual", "weight", "eps", "max_token_num", "use_oneshot",
                "trigger_completion_at_end", "fp32_acc", "use_attn_tp_group")

# The public methods of SGLang's BaseCommunicator, all implemented by Communicator.
BASE_METHODS = ("graph_capture_context", "should_use_custom_op", "get_all_reduce_mode",
                "all_reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor",
                "reduce_scatter", "gather", "change_state")

HOOKS = (
    Hooked(HOOK_REGISTRY_MODULE, "HookRegistry.register", ("target", "hook", "hook_type")),
    Hooked(HOOK_REGISTRY_MODULE, "HookType", None, why="REPLACE and AROUND"),
    Hooked(CAR_MODULE, "dispatch_custom_allreduce", (),
           why="replaced; GroupCoordinator calls it (with group=, device= in current SGLang)"),
    Hooked(COMM_PACKAGE + ".comm", "dispatch_custom_allreduce", None, required=False,
           why="the re-import GroupCoordinator calls; the hook registry rebinds it"),
    Hooked(BASE_MODULE, "BaseCommunicator", ("world_size", "disabled"), required=False,
           why="the base class of current communicators"),
    Hooked(BASE_MODULE, "AllReduceMode", None, required=False),
    *(Hooked(BASE_MODULE, f"BaseCommunicator.{m}",
             ("input_",) if m in ("all_reduce", "get_all_reduce_mode") else None, required=False)
      for m in BASE_METHODS),
    Hooked(FUSION_MODULE, "flashinfer_allreduce_residual_rmsnorm", FUSED_PARAMS,
           why="wrapped (AROUND) so anyreduce serves it on its own group"),
    Hooked(DISTRIBUTED_MODULE, "get_attn_tp_group", ()),
    Hooked(DISTRIBUTED_MODULE, "get_moe_ep_group", ()),
    Hooked(DISTRIBUTED_MODULE, "get_moe_tp_group", ()),
    Hooked(DISTRIBUTED_MODULE, "get_moe_expert_parallel_world_size", ()),
)


def register() -> None:
    """The ``sglang.srt.plugins`` entry point. Does nothing unless ``ANYREDUCE=1``."""
    if not enabled():
        return
    path = require_library()
    registry = importlib.import_module(HOOK_REGISTRY_MODULE)
    # Resolve both targets now: a moved name raises here, naming it, instead of being one
    # more line in the hook registry's log.
    for target, params in ((DISPATCH_TARGET, None), (FUSED_TARGET, FUSED_PARAMS)):
        fn = pkgutil.resolve_name(target)
        if params is not None:
            problem = signature_mismatch(fn, params)
            if problem is not None:
                raise RuntimeError(f"{target}: {problem}; the anyreduce hook mirrors "
                                   f"({', '.join(params)})")
    registry.HookRegistry.register(DISPATCH_TARGET, dispatch_custom_allreduce,
                                   registry.HookType.REPLACE)
    logger.info("anyreduce (%s=1, %s): %s -> returns %s.Communicator", ENV_VAR, path,
                DISPATCH_TARGET, __name__)
    registry.HookRegistry.register(FUSED_TARGET, fused_allreduce_residual_rmsnorm,
                                   registry.HookType.AROUND)
    logger.info("anyreduce (%s=1, %s): %s wrapped: anyreduce on the group of its "
                "communicator, SGLang's function otherwise", ENV_VAR, path, FUSED_TARGET)


def dispatch_custom_allreduce(*_args: Any, **_kwargs: Any) -> type:
    """SGLang's ``dispatch_custom_allreduce(group, device)`` (older: no arguments): always the
    anyreduce communicator class."""
    return communicator_class()


def _make_adapter(group: Any, device: Any, max_size: Optional[int]) -> Any:
    """The object doing the work (anyreduce.adapters.CustomAllreduce, which needs torch).
    A module-level function so tests without torch can put a stand-in here."""
    from ..adapters import CustomAllreduce as Adapter

    return Adapter(group, device, max_size)


class _AllReduceMode(enum.Enum):
    """SGLang's AllReduceMode values, for SGLang versions without base.AllReduceMode (its
    dispatcher compares ``mode.value``)."""

    BOTH = "both"
    INPLACE = "inplace"
    OUTPLACE = "outplace"


class Communicator:
    """anyreduce as an SGLang communicator: the ``BaseCommunicator`` interface in full, plus the
    older custom all-reduce interface (``should_custom_ar``, ``custom_all_reduce``, ``capture``).

    Constructed collectively by every rank of a ``GroupCoordinator`` (SGLang passes its gloo CPU
    group). ``disabled`` is True on every rank when any rank could not create its communicator,
    or while ``change_state(False)`` holds; SGLang then asks the next communicator in its list.

    ``get_all_reduce_mode(x)`` is ``BOTH`` for a contiguous bf16/fp16/fp32 tensor on this device
    of at most ``max_size`` bytes whose anyreduce algorithm is not NCCL, and None otherwise; every
    part of that answer is a fact all ranks share. ``all_reduce`` works in place or out of place,
    in eager mode, in warm-up and inside CUDA-graph capture (anyreduce reduces from any device
    pointer: ``graph_capture_context`` registers nothing). ``should_use_custom_op()`` is True, so
    under torch.compile SGLang calls it through its opaque all-reduce operators.

    anyreduce does all-reduce only: the gather and reduce-scatter methods raise
    NotImplementedError (SGLang never lists a custom all-reduce communicator for them).
    """

    name = "anyreduce"
    _mode_enum: Any = _AllReduceMode

    def __init__(self, group: Any, device: Any, max_size: int = DEFAULT_MAX_SIZE,
                 **server_options: Any) -> None:
        if server_options:
            logger.info("anyreduce: ignoring communicator options %s", sorted(server_options))
        self.group = group
        self._impl = _make_adapter(group, device, max_size)
        self.world_size = self._impl.world_size
        self._disabled = False  # change_state's switch; the communicator's own state is _impl's

    # -- state --------------------------------------------------------------------------------

    @property
    def disabled(self) -> bool:
        return self._disabled or self._impl.disabled

    @disabled.setter
    def disabled(self, value: bool) -> None:
        # Older SGLang toggled ca_comm.disabled directly around piecewise CUDA-graph runs.
        self._disabled = bool(value)

    @contextlib.contextmanager
    def change_state(self, enable: bool):
        """Enable or disable within a context (SGLang's BaseCommunicator.change_state)."""
        old = self._disabled
        self._disabled = not enable
        try:
            yield
        finally:
            self._disabled = old

    @property
    def _IS_CAPTURING(self) -> bool:  # noqa: N802 -- SGLang reads this attribute
        return self._impl._IS_CAPTURING

    def __getattr__(self, name: str) -> Any:
        # rank, device, max_size, comm, ... of the adapter.
        if name == "_impl":
            raise AttributeError(name)
        return getattr(self._impl, name)

    # -- BaseCommunicator -----------------------------------------------------------------------

    def graph_capture_context(self) -> Any:
        return self._impl.capture()

    def should_use_custom_op(self) -> bool:
        return True

    def get_all_reduce_mode(self, input_: Any) -> Any:
        if self.disabled or not self._impl.should_custom_ar(input_):
            return None
        return self._mode_enum.BOTH

    def all_reduce(self, input_: Any, *, inplace: Optional[bool] = None, out: Any = None,
                   registered: bool = False) -> Any:
        """The sum of ``input_`` over the group: in place (returns ``input_``) with
        ``inplace=True``, else into a new tensor (or ``out``). ``registered`` is the older
        interface's keyword and means nothing to anyreduce. Precondition, as in SGLang's
        interface: ``get_all_reduce_mode(input_)`` is not None and the communicator is enabled
        (else RuntimeError / the library's argument error)."""
        if self.disabled:
            raise RuntimeError(f"{self.name} is disabled")
        if inplace:
            if out is not None:
                raise ValueError("all_reduce(inplace=True) takes no out=")
            return self._impl.comm.all_reduce(input_)
        return self._impl.all_reduce(input_, out=out, registered=registered)

    def _not_served(self, op: str):
        return NotImplementedError(f"the anyreduce communicator serves all-reduce only, not "
                                   f"{op}; SGLang's NCCL communicators do {op}")

    def all_gather_into_tensor(self, input_: Any, *, out: Any = None) -> Any:
        raise self._not_served("all_gather_into_tensor")

    def all_gather(self, input_: Any, *, out_list: Any = None) -> Any:
        raise self._not_served("all_gather")

    def reduce_scatter_tensor(self, input_: Any, *, out: Any = None) -> Any:
        raise self._not_served("reduce_scatter_tensor")

    def reduce_scatter(self, input_list: Any, *, out: Any = None) -> Any:
        raise self._not_served("reduce_scatter")

    def gather(self, input_: Any, dst: int, *, dim: int = 0) -> Any:
        raise self._not_served("gather")

    # -- the older custom all-reduce interface --------------------------------------------------

    def should_custom_ar(self, inp: Any) -> bool:
        return not self._disabled and self._impl.should_custom_ar(inp)

    def custom_all_reduce(self, input: Any) -> Any:  # noqa: A002 -- SGLang's parameter name
        """A new tensor with the sum, or None when anyreduce declines."""
        if self._disabled:
            return None
        return self._impl.custom_all_reduce(input)

    def capture(self) -> Any:
        return self._impl.capture()

    def register_buffer(self, inp: Any = None) -> None:
        """Nothing to register: anyreduce reduces from any device pointer."""

    def register_graph_buffers(self) -> None:
        """Nothing to register: anyreduce reduces from any device pointer."""

    def close(self) -> None:
        """Destroy the communicator (collective: every rank calls it)."""
        self._impl.close()

    # -- fused all-reduce + residual add + RMSNorm ------------------------------------------------

    def allreduce_residual_rmsnorm(self, input_tensor: Any, residual: Any, weight: Any,
                                   eps: float = 1e-6) -> Tuple[Any, Any]:
        """``(norm_out, residual_out)``, new tensors, or ``(None, None)`` when anyreduce
        declines."""
        if self._disabled:
            return None, None
        return self._impl.allreduce_residual_rmsnorm(input_tensor, residual, weight, eps)

    def fused_allreduce_rmsnorm(self, input_: Any, residual_inp_: Any, weight_: Any,
                                eps: float) -> Optional[Tuple[Any, Any]]:
        """``GroupCoordinator.fused_allreduce_rmsnorm``'s hook: ``(normed, residual_out)`` or
        None (SGLang then all-reduces and runs its own RMSNorm)."""
        normed, residual_out = self.allreduce_residual_rmsnorm(input_, residual_inp_, weight_, eps)
        return None if normed is None else (normed, residual_out)


# -- the class SGLang gets -------------------------------------------------------------------------

_classes: Dict[str, type] = {}


def communicator_class() -> type:
    """``Communicator`` with SGLang's ``BaseCommunicator`` as a further base where SGLang has it
    (so isinstance checks and the base's helpers hold), and SGLang's ``AllReduceMode`` as the
    mode it reports. Built once per process."""
    cls = _classes.get("class")
    if cls is not None:
        return cls
    try:
        base = importlib.import_module(BASE_MODULE)
    except ModuleNotFoundError as e:
        if e.name is None or not BASE_MODULE.startswith(e.name):
            raise
        base = None  # an SGLang from before BaseCommunicator: the older interface is used
    if base is not None:
        cls = type("Communicator", (Communicator, base.BaseCommunicator),
                   {"__module__": __name__, "__doc__": Communicator.__doc__,
                    "_mode_enum": base.AllReduceMode})
    else:
        cls = Communicator
    _classes["class"] = cls
    return cls


# -- the fused entry -------------------------------------------------------------------------------

class _FusedState:
    """Upstream functions the fused wrapper calls, resolved on its first call."""

    def __init__(self) -> None:
        self.resolved = False
        self.get_attn_tp_group: Optional[Callable[[], Any]] = None
        self.get_moe_ep_group: Optional[Callable[[], Any]] = None
        self.get_moe_tp_group: Optional[Callable[[], Any]] = None
        self.get_moe_ep_size: Optional[Callable[[], int]] = None
        self.is_compiling: Callable[[], bool] = lambda: False


_fused = _FusedState()


def _resolve_fused() -> None:
    distributed = importlib.import_module(DISTRIBUTED_MODULE)
    _fused.get_attn_tp_group = distributed.get_attn_tp_group
    _fused.get_moe_ep_group = distributed.get_moe_ep_group
    _fused.get_moe_tp_group = distributed.get_moe_tp_group
    _fused.get_moe_ep_size = distributed.get_moe_expert_parallel_world_size
    import torch

    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        _fused.is_compiling = compiler.is_compiling
    else:
        _fused.is_compiling = torch._dynamo.is_compiling
    _fused.resolved = True


def _group_communicator(use_attn_tp_group: bool) -> Optional[Communicator]:
    """The anyreduce communicator of the group SGLang's fused call means, or None."""
    if use_attn_tp_group:
        coordinator = _fused.get_attn_tp_group()
    elif _fused.get_moe_ep_size() > 1:
        coordinator = _fused.get_moe_ep_group()
    else:
        coordinator = _fused.get_moe_tp_group()
    ca = getattr(coordinator, "ca_comm", None)
    if (isinstance(ca, Communicator) and not ca.disabled
            and ca.group is getattr(coordinator, "cpu_group", None)):
        return ca
    return None


_ARG_INDEX = {name: i for i, name in enumerate(FUSED_PARAMS)}


def _arg(args: Tuple[Any, ...], kwargs: Dict[str, Any], name: str, default: Any) -> Any:
    i = _ARG_INDEX[name]
    if i < len(args):
        return args[i]
    return kwargs.get(name, default)


def fused_allreduce_residual_rmsnorm(original_fn: Callable[..., Any], *args: Any,
                                     **kwargs: Any) -> Any:
    """AROUND hook of SGLang's ``flashinfer_allreduce_residual_rmsnorm(input_tensor, residual,
    weight, eps=1e-6, max_token_num=..., use_oneshot=None, trigger_completion_at_end=False,
    fp32_acc=False, use_attn_tp_group=True)``: anyreduce's ``(norm_out, residual_out)`` when the
    meant group's communicator is anyreduce's and it takes the tensors, else
    ``original_fn(*args, **kwargs)`` exactly as called. Every reason to decline is a fact all
    ranks of the group share, so all of them take the same path."""
    if not _fused.resolved:
        _resolve_fused()
    if not _fused.is_compiling():
        ca = _group_communicator(bool(_arg(args, kwargs, "use_attn_tp_group", True)))
        if ca is not None:
            norm_out, residual_out = ca.allreduce_residual_rmsnorm(
                _arg(args, kwargs, "input_tensor", None), _arg(args, kwargs, "residual", None),
                _arg(args, kwargs, "weight", None), _arg(args, kwargs, "eps", 1e-6))
            if norm_out is not None:
                return norm_out, residual_out
    return original_fn(*args, **kwargs)

