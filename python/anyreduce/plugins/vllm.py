"""The vLLM plugin: anyreduce as vLLM's custom all-reduce, and behind its fused
all-reduce + RMSNorm, with ``ANYREDUCE=1``.

vLLM loads ``register`` (entry-point group ``vllm.general_plugins``, filtered by
``VLLM_PLUGINS``) in every process it starts, before any model-parallel group exists.
``register`` then:

1. replaces ``vllm.distributed.device_communicators.custom_all_reduce.CustomAllreduce``, the
   class ``CudaCommunicator.__init__`` imports when it builds the tensor-parallel group's
   ``ca_comm``, by ``CustomAllreduce`` below (same constructor, same methods). Older vLLM
   versions chose the class through ``cuda_communicator.dispatch_custom_allreduce()``, or
   imported it into ``cuda_communicator`` at module level; where those names exist they are
   replaced too.
2. when the first communicator is created (in a worker, on the tensor-parallel group), points
   vLLM's all-reduce fusion pass at anyreduce: the pass's pattern replacements emit
   ``flashinfer_trtllm_fused_allreduce_norm`` (a name of the pass's module); that name is
   rebound to ``torch.ops.anyreduce_vllm.fused_allreduce_norm``, an operator with the same
   schema whose kernel runs anyreduce's fused kernel where anyreduce takes the tensors, and
   vLLM's own ``call_trtllm_fused_allreduce_norm`` (FlashInfer) otherwise. The pass exists only
   where vLLM enables it: FlashInfer installed with its fusion API, a tensor-parallel size
   FlashInfer supports (2, 4, 8), a FlashInfer workspace that could be created, and
   ``pass_config.fuse_allreduce_rms`` on (docs/INTEGRATION.md).

Written against vLLM main as recorded in docs/INTEGRATION.md; ``HOOKS`` lists every upstream
name used, and python/tests/test_upstream_contract.py checks them where vLLM is installed.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from typing import Any, Callable, Dict, List, Optional

from . import ENV_VAR, Hooked, enabled, require_library, signature_mismatch

__all__ = ["register", "install", "CustomAllreduce", "HOOKS", "FUSED_OP"]

# vLLM configures the "vllm" logger (and only it): a child logger's lines appear in the
# server's log with its format.
logger = logging.getLogger("vllm.plugins.anyreduce")

CAR_MODULE = "vllm.distributed.device_communicators.custom_all_reduce"
CUDA_COMM_MODULE = "vllm.distributed.device_communicators.cuda_communicator"
FUSION_MODULE = "vllm.compilation.passes.fusion.allreduce_rms_fusion"
PARALLEL_STATE_MODULE = "vllm.distributed.parallel_state"

# vLLM's default custom all-reduce size limit (its constructor's max_size default).
DEFAULT_MAX_SIZE = 8192 * 1024

# The parameters of vLLM's call_trtllm_fused_allreduce_norm, which the anyreduce operator
# mirrors (its schema is copied from vLLM's operator at run time).
FUSED_PARAMS = ("allreduce_in", "residual", "rms_gamma", "rms_eps", "world_size",
                "launch_with_pdl", "fp32_acc", "max_token_num", "pattern_code", "norm_out",
                "quant_out", "scale_out", "scale_factor", "weight_bias")

FUSED_OP_NAMESPACE = "anyreduce_vllm"
FUSED_OP_NAME = "fused_allreduce_norm"
FUSED_OP = f"{FUSED_OP_NAMESPACE}::{FUSED_OP_NAME}"

HOOKS = (
    Hooked(CAR_MODULE, "CustomAllreduce", ("group", "device", "max_size"),
           why="replaced; CudaCommunicator imports it from this module when it builds ca_comm"),
    Hooked(CAR_MODULE, "CustomAllreduce.should_custom_ar", ("inp",)),
    Hooked(CAR_MODULE, "CustomAllreduce.custom_all_reduce", ("input",)),
    Hooked(CAR_MODULE, "CustomAllreduce.all_reduce", ("inp",)),
    Hooked(CAR_MODULE, "CustomAllreduce.capture", ()),
    Hooked(CAR_MODULE, "CustomAllreduce.close", ()),
    Hooked(CAR_MODULE, "CustomAllreduce.finalize_p2p", (), required=False,
           why="newer vLLM defers the peer check to this collective call"),
    Hooked(CUDA_COMM_MODULE, "CudaCommunicator.__init__",
           ("cpu_group", "device", "device_group", "unique_name"),
           why="builds ca_comm = CustomAllreduce(group=cpu_group, device=device, ...) for 'tp'"),
    Hooked(CUDA_COMM_MODULE, "dispatch_custom_allreduce", (), required=False,
           why="older vLLM chose the class through it"),
    Hooked(PARALLEL_STATE_MODULE, "get_tp_group", (),
           why="the fused operator finds the tensor-parallel ca_comm through it"),
    Hooked(FUSION_MODULE, "AllReduceFusionPass", ("config",), required=False,
           why="the fusion pass; its uuid gets an anyreduce mark"),
    Hooked(FUSION_MODULE, "call_trtllm_fused_allreduce_norm", FUSED_PARAMS, required=False,
           why="defined only with FlashInfer's fusion API installed; the fallback of the "
               "anyreduce operator"),
    Hooked(FUSION_MODULE, "flashinfer_trtllm_fused_allreduce_norm", None, required=False,
           why="the operator the pass's replacements emit; rebound to the anyreduce operator"),
)


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Does nothing unless ``ANYREDUCE=1``."""
    if not enabled():
        return
    path = require_library()
    for line in install():
        logger.info("anyreduce (%s=1, %s): %s", ENV_VAR, path, line)


def install() -> List[str]:
    """Replace vLLM's custom all-reduce class (and the older dispatch function where it
    exists). Returns one sentence per replacement. Idempotent."""
    done: List[str] = []
    car = importlib.import_module(CAR_MODULE)
    current = getattr(car, "CustomAllreduce")  # AttributeError names it if it moved
    if current is not CustomAllreduce:
        problem = signature_mismatch(current.__init__, ("group", "device", "max_size"))
        if problem is not None:
            raise RuntimeError(f"{CAR_MODULE}.CustomAllreduce: {problem}; anyreduce's "
                               "replacement mirrors (group, device, max_size, symm_mem_enabled)")
        car.CustomAllreduce = CustomAllreduce
        done.append(f"{CAR_MODULE}.CustomAllreduce -> {__name__}.CustomAllreduce")
    cc = importlib.import_module(CUDA_COMM_MODULE)
    if hasattr(cc, "dispatch_custom_allreduce") and cc.dispatch_custom_allreduce is not _dispatch:
        cc.dispatch_custom_allreduce = _dispatch
        done.append(f"{CUDA_COMM_MODULE}.dispatch_custom_allreduce -> returns "
                    f"{__name__}.CustomAllreduce (older vLLM)")
    if hasattr(cc, "CustomAllreduce") and cc.CustomAllreduce is not CustomAllreduce:
        cc.CustomAllreduce = CustomAllreduce
        done.append(f"{CUDA_COMM_MODULE}.CustomAllreduce -> {__name__}.CustomAllreduce "
                    "(older vLLM)")
    if not done:
        done.append("already installed in this process")
    return done


def _dispatch(*_args: Any, **_kwargs: Any) -> type:
    """Older vLLM's ``dispatch_custom_allreduce()``: always anyreduce's class."""
    return CustomAllreduce


def _make_adapter(group: Any, device: Any, max_size: Optional[int]) -> Any:
    """The object doing the work (anyreduce.adapters.CustomAllreduce, which needs torch).
    A module-level function so tests without torch can put a stand-in here."""
    from ..adapters import CustomAllreduce as Adapter

    return Adapter(group, device, max_size)


class CustomAllreduce:
    """anyreduce with the constructor and methods of vLLM's ``CustomAllreduce``.

    Constructed collectively by every rank of the tensor-parallel group (vLLM passes its gloo
    CPU group). ``disabled`` is True on every rank when any rank could not create its
    communicator (the vote is anyreduce.adapters'); vLLM then uses its own NCCL path.

    ``should_custom_ar(inp)`` is True for a contiguous bf16/fp16/fp32 tensor on this device of
    at most ``max_size`` bytes whose anyreduce algorithm is not NCCL (for those vLLM's pynccl
    does the work). Every such answer depends only on facts all ranks share, so all ranks take
    the same path. ``custom_all_reduce`` returns a new tensor (vLLM registers the all-reduce as a
    non-mutating operator), in eager mode, in warm-up and inside CUDA-graph capture: anyreduce
    reduces from any device pointer, so ``capture()`` has nothing to register afterwards.

    ``symm_mem_enabled`` is accepted: vLLM uses it to shrink its own size limit in favour of its
    symmetric-memory all-reduce; anyreduce declines the sizes where it would run NCCL instead,
    which leaves them to the next communicator in vLLM's chain in the same way.
    """

    def __init__(self, group: Any, device: Any, max_size: int = DEFAULT_MAX_SIZE,
                 symm_mem_enabled: bool = False, **server_options: Any) -> None:
        # server_options: keywords a later vLLM may add; accepted, logged, not used.
        if server_options:
            logger.info("anyreduce: ignoring CustomAllreduce options %s", sorted(server_options))
        self.group = group
        self.symm_mem_enabled = symm_mem_enabled
        self._impl = _make_adapter(group, device, max_size)
        if not self._impl.disabled and self._impl.world_size > 1:
            _install_fusion_once()

    # -- state vLLM reads ---------------------------------------------------------------------

    @property
    def disabled(self) -> bool:
        return self._impl.disabled

    @disabled.setter
    def disabled(self, value: bool) -> None:
        self._impl.disabled = bool(value)

    @property
    def _IS_CAPTURING(self) -> bool:  # noqa: N802 -- vLLM's attribute name
        return self._impl._IS_CAPTURING

    def __getattr__(self, name: str) -> Any:
        # rank, world_size, device, max_size, comm, ... of the adapter.
        if name == "_impl":
            raise AttributeError(name)
        return getattr(self._impl, name)

    # -- vLLM's interface ---------------------------------------------------------------------

    def should_custom_ar(self, inp: Any) -> bool:
        return self._impl.should_custom_ar(inp)

    def custom_all_reduce(self, input: Any) -> Any:  # noqa: A002 -- vLLM's parameter name
        """A new tensor with the sum, or None when anyreduce declines."""
        return self._impl.custom_all_reduce(input)

    def all_reduce(self, inp: Any, *, out: Any = None, registered: bool = False) -> Any:
        """Out-of-place all-reduce into ``out`` (allocated when None); ``registered`` is
        accepted and means nothing to anyreduce."""
        return self._impl.all_reduce(inp, out=out, registered=registered)

    def capture(self) -> Any:
        """Context manager vLLM enters around CUDA-graph capture."""
        return self._impl.capture()

    def register_graph_buffers(self) -> None:
        """Nothing to register: anyreduce reduces from any device pointer."""

    def finalize_p2p(self) -> None:
        """Nothing deferred: peer access was checked, and self-tested, at creation."""

    def close(self) -> None:
        """Destroy the communicator (collective: every rank calls it)."""
        self._impl.close()

    # The fused entry the anyreduce operator calls (vLLM's in-place semantics; False: declined).
    def fused_allreduce_norm_(self, *args: Any, **kwargs: Any) -> bool:
        return self._impl.fused_allreduce_norm_(*args, **kwargs)


# -- the fused all-reduce + RMSNorm (+ quantization) operator -------------------------------------


class _FusionState:
    """What install_fusion found and made (one per process)."""

    def __init__(self) -> None:
        self.attempted = False
        self.installed = False
        self.original: Optional[Callable[..., None]] = None  # call_trtllm_fused_allreduce_norm
        self.quant_by_pattern: Dict[int, Optional[str]] = {}
        self.get_tp_group: Optional[Callable[[], Any]] = None
        self.library: Any = None  # the torch.library.Library holding the operator alive
        self.op: Any = None


_fusion = _FusionState()


def _tp_custom_allreduce() -> Optional[CustomAllreduce]:
    """The tensor-parallel group's ca_comm when it is an enabled anyreduce one."""
    get_tp_group = _fusion.get_tp_group
    if get_tp_group is None:
        return None
    communicator = getattr(get_tp_group(), "device_communicator", None)
    ca = getattr(communicator, "ca_comm", None)
    if isinstance(ca, CustomAllreduce) and not ca.disabled:
        return ca
    return None


def fused_allreduce_norm(allreduce_in: Any, residual: Any, rms_gamma: Any, rms_eps: float,
                         world_size: int, launch_with_pdl: bool, fp32_acc: bool,
                         max_token_num: int, pattern_code: int, norm_out: Any = None,
                         quant_out: Any = None, scale_out: Any = None, scale_factor: Any = None,
                         weight_bias: float = 0.0) -> None:
    """The kernel of ``anyreduce_vllm::fused_allreduce_norm``: vLLM's in-place semantics of
    ``call_trtllm_fused_allreduce_norm`` (norm_out None: allreduce_in <- normed, residual <-
    sum; norm_out given: norm_out <- normed, allreduce_in <- sum; quant patterns also fill
    quant_out / scale_out), served by anyreduce when the tensor-parallel ca_comm is anyreduce's
    and it takes these tensors, by vLLM's FlashInfer function otherwise. Every reason to decline
    is a fact all ranks share (pattern, dtypes, shapes, the library), so all ranks take the same
    path."""
    ca = _tp_custom_allreduce()
    if ca is not None and pattern_code in _fusion.quant_by_pattern:
        quant = _fusion.quant_by_pattern[pattern_code]
        if ca.fused_allreduce_norm_(allreduce_in, residual, rms_gamma, rms_eps,
                                    norm_out=norm_out, quant=quant, quant_out=quant_out,
                                    scale_out=scale_out, scale_factor=scale_factor,
                                    weight_bias=weight_bias):
            return
    original = _fusion.original
    if original is None:
        raise RuntimeError(f"{FUSED_OP} ran before the anyreduce vLLM plugin installed it")
    original(allreduce_in, residual, rms_gamma, rms_eps, world_size, launch_with_pdl, fp32_acc,
             max_token_num, pattern_code, norm_out=norm_out, quant_out=quant_out,
             scale_out=scale_out, scale_factor=scale_factor, weight_bias=weight_bias)


def _quant_by_pattern(flashinfer_comm: Any) -> Dict[int, Optional[str]]:
    """FlashInfer's pattern codes vLLM's pass emits -> the anyreduce quantization."""
    patterns = flashinfer_comm.AllReduceFusionPattern
    return {int(patterns.kARResidualRMSNorm): None,
            int(patterns.kARResidualRMSNormFP8Quant): "fp8",
            int(patterns.kARResidualRMSNormFP4Quant): "nvfp4"}


def _fake_fused_allreduce_norm(*_args: Any, **_kwargs: Any) -> None:
    return None


def _register_operator(original_op: Any) -> Any:
    """Define ``anyreduce_vllm::fused_allreduce_norm`` with the schema of vLLM's operator
    (mutations included) and ``fused_allreduce_norm`` as its CUDA kernel."""
    import torch

    schema = str(original_op._schema)
    signature = schema[schema.index("("):]
    lib = torch.library.Library(FUSED_OP_NAMESPACE, "FRAGMENT")
    lib.define(FUSED_OP_NAME + signature)
    lib.impl(FUSED_OP_NAME, fused_allreduce_norm, "CUDA")
    # It returns nothing and only writes its arguments: shape propagation has nothing to do.
    torch.library.register_fake(FUSED_OP, _fake_fused_allreduce_norm, lib=lib)
    _fusion.library = lib
    return getattr(getattr(torch.ops, FUSED_OP_NAMESPACE), FUSED_OP_NAME).default


def _mark_pass_uuid(pass_class: Any) -> None:
    """Give the fusion pass a uuid of its own while anyreduce's operator replaces vLLM's, so an
    Inductor cache entry compiled with one is not reused with the other."""
    original_uuid = pass_class.uuid
    if getattr(original_uuid, "_anyreduce", False):
        return

    def uuid(self: Any) -> str:
        base = original_uuid(self)
        return hashlib.sha256(f"{base}|{FUSED_OP}".encode()).hexdigest()

    uuid._anyreduce = True  # type: ignore[attr-defined]
    pass_class.uuid = uuid


def install_fusion(module: Any = None) -> str:
    """Point vLLM's all-reduce fusion pass at anyreduce (see the module docstring). Returns a
    sentence saying what was done, or why nothing was: no fusion module in this vLLM, or no
    FlashInfer fusion API (then vLLM defines neither the function nor the operator and its pass
    stays off). Raises when the names exist but their signature moved."""
    if _fusion.installed:
        return "fused all-reduce + RMSNorm: already installed"
    if module is None:
        try:
            module = importlib.import_module(FUSION_MODULE)
        except ModuleNotFoundError as e:
            if e.name is not None and FUSION_MODULE.startswith(e.name):
                return (f"fused all-reduce + RMSNorm not installed: this vLLM has no "
                        f"{FUSION_MODULE}")
            raise
    original = getattr(module, "call_trtllm_fused_allreduce_norm", None)
    original_op = getattr(module, "flashinfer_trtllm_fused_allreduce_norm", None)
    flashinfer_comm = getattr(module, "flashinfer_comm", None)
    if original is None or original_op is None or flashinfer_comm is None:
        return ("fused all-reduce + RMSNorm not installed: vLLM defines its fused operator only "
                "with FlashInfer's fusion API installed, so its fusion pass is off here")
    problem = signature_mismatch(original, FUSED_PARAMS)
    if problem is not None:
        raise RuntimeError(f"{module.__name__}.call_trtllm_fused_allreduce_norm: {problem}; "
                           f"{FUSED_OP} mirrors ({', '.join(FUSED_PARAMS)})")
    parallel_state = importlib.import_module(PARALLEL_STATE_MODULE)
    _fusion.get_tp_group = parallel_state.get_tp_group
    _fusion.quant_by_pattern = _quant_by_pattern(flashinfer_comm)
    _fusion.original = original
    _fusion.op = _register_operator(original_op)
    module.flashinfer_trtllm_fused_allreduce_norm = _fusion.op
    pass_class = getattr(module, "AllReduceFusionPass", None)
    if pass_class is not None:
        _mark_pass_uuid(pass_class)
    _fusion.installed = True
    return (f"{module.__name__}.flashinfer_trtllm_fused_allreduce_norm -> {FUSED_OP} "
            "(anyreduce where it takes the tensors, FlashInfer otherwise; in effect where "
            "vLLM's AllReduceFusionPass is enabled)")


def _install_fusion_once() -> None:
    if _fusion.attempted:
        return
    _fusion.attempted = True
    logger.info("anyreduce: %s", install_fusion())
