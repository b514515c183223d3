"""Adapters with the shapes of vLLM's and SGLang's all-reduce interfaces.

Neither server is imported: these classes follow their interfaces by duck typing, so a
server (or a fork, or a plugin) can put anyreduce where it calls its custom all-reduce:

* ``CustomAllreduce`` -- vLLM ``vllm.distributed.device_communicators.custom_all_reduce.
  CustomAllreduce`` and SGLang ``sglang.srt.distributed.device_communicators.
  custom_all_reduce.CustomAllreduce``: ``disabled``, ``should_custom_ar(inp)``,
  ``custom_all_reduce(inp) -> Tensor | None``, ``all_reduce(inp, *, out=None,
  registered=False)``, ``capture()``, ``close()`` (plus the no-op registration methods the
  servers call: anyreduce needs no buffer registration, in eager mode or in graphs).
  ``custom_all_reduce`` returns None, exactly like the originals, whenever anyreduce
  declines (unsupported dtype or device, non-contiguous, above ``max_size``, or -- with
  ``decline_nccl`` -- when anyreduce itself would only run NCCL): the caller then runs its
  own NCCL path, as it already does for the originals.
* ``DeviceCommunicator`` -- vLLM ``DeviceCommunicatorBase`` / ``CudaCommunicator``:
  ``all_reduce(input_) -> Tensor`` (out of place) trying anyreduce, then the caller's
  ``fallback`` (e.g. its PyNcclCommunicator.all_reduce, which returns None when disabled),
  then ``torch.distributed.all_reduce`` on the device group.
* fused all-reduce + residual add + RMSNorm hooks on ``CustomAllreduce``:
  ``fused_allreduce_rmsnorm`` is the method SGLang's ``GroupCoordinator.
  fused_allreduce_rmsnorm`` looks for on its ``ca_comm`` (returns ``(normed,
  residual_out)`` or None to fall back); ``allreduce_residual_rmsnorm`` has the shape of
  SGLang's ``flashinfer_allreduce_residual_rmsnorm`` (returns ``(norm_out, residual_out)``,
  or ``(None, None)`` to make the caller fall back to all-reduce + its own RMSNorm);
  ``fused_allreduce_norm_`` has the in-place semantics of vLLM's
  ``flashinfer_trtllm_fused_allreduce_norm`` custom op (returns False to decline).

Every decision to decline depends only on things all ranks share (dtype, shape, the library,
the communicator's agreed algorithm choice), so all ranks decline together and none is left
waiting in a collective the others skipped.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ._errors import InvalidUsage, LibraryNotFoundError, Unsupported
from ._library import library
from ._types import Algo, Config
from .torch import (
    _BYTE_DTYPES,
    ALL_REDUCE_DTYPES,
    FUSED_DTYPES,
    Communicator,
    _resolve_device,
    add_rms_norm_reference,
)

logger = logging.getLogger("anyreduce.adapters")

__all__ = ["CustomAllreduce", "VllmCustomAllreduce", "SglangCustomAllreduce", "DeviceCommunicator"]

# The fused kernel's rule on hidden (anyreduce.h): a multiple of 8 in 128..16384.
FUSED_HIDDEN_MIN, FUSED_HIDDEN_MAX, FUSED_HIDDEN_MULTIPLE = 128, 16384, 8


def _all_agree(ok: bool, group: Any, device: torch.device) -> bool:
    """True iff every rank of `group` passes ok=True (MIN all-reduce over the group)."""
    if dist.get_world_size(group) == 1:
        return ok
    backend = str(dist.get_backend(group)).lower()
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32,
                        device=device if backend == "nccl" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _gather_objects(obj: Any, group: Any, device: torch.device) -> List[Any]:
    """Every rank's `obj`, in group-rank order: one broadcast_object_list per rank, as vLLM
    and SGLang do (all_gather_object misbehaves on gloo under inference mode)."""
    ranks = dist.get_process_group_ranks(group)
    me = dist.get_rank(group)
    out: List[Any] = []
    for i, global_rank in enumerate(ranks):
        box = [obj if i == me else None]
        backend = str(dist.get_backend(group)).lower()
        if backend == "nccl":
            with torch.cuda.device(device):
                dist.broadcast_object_list(box, src=global_rank, group=group)
        else:
            dist.broadcast_object_list(box, src=global_rank, group=group)
        out.append(box[0])
    return out


class CustomAllreduce:
    """anyreduce behind the custom all-reduce interface of vLLM and SGLang.

    Args:
        group: the process group (vLLM/SGLang pass their gloo CPU group; an NCCL group works
            too). Collective: every rank of `group` constructs this object.
        device: this rank's CUDA device (int, "cuda:N" or torch.device).
        max_size: decline messages larger than this many bytes (None: no limit; anyreduce
            picks its algorithm by size, and large ones are left to the caller's NCCL by
            ``decline_nccl``).
        config: anyreduce.Config for the communicator (None: environment / defaults).
        decline_nccl: decline a message when anyreduce's own choice for it is NCCL, so the
            caller's NCCL communicator does that work (instead of a second one).
        allow_multi_host: also create the communicator when the group spans hosts (the
            rendezvous then needs ANYR_SOCKET_ADDR / ANYR_SOCKET_IFNAME on group rank 0);
            by default such a group stays disabled, like the originals.
    """

    def __init__(self, group: Any, device: Any, max_size: Optional[int] = None, *,
                 config: Optional[Config] = None, decline_nccl: bool = True,
                 allow_multi_host: bool = False, **_server_options: Any) -> None:
        # _server_options: keywords newer servers pass to their own class (vLLM's
        # symm_mem_enabled, ...); accepted and ignored.
        self._IS_CAPTURING = False
        self.disabled = True
        self.group = group
        self.comm: Optional[Communicator] = None
        self.max_size = max_size
        self.decline_nccl = decline_nccl
        self._choice: Dict[Tuple[int, torch.dtype], bool] = {}
        self._fused_ok: Optional[bool] = None
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = _resolve_device(device)
        if self.world_size == 1:
            return  # like the originals: nothing to reduce, the caller skips all-reduce

        # Before any rank enters the rendezvous: every rank must find the library, and the
        # group must live on one host unless the caller allows otherwise (across hosts the
        # library would only run NCCL, which the caller already has).
        try:
            library()
            ok = True
        except LibraryNotFoundError as e:
            logger.warning("anyreduce disabled: %s", e)
            ok = False
        facts = _gather_objects((ok, socket.gethostname()), group, self.device)
        if not all(f[0] for f in facts):
            return
        if len({f[1] for f in facts}) > 1 and not allow_multi_host:
            logger.warning("anyreduce disabled: the group spans hosts %s (pass "
                           "allow_multi_host=True to use it anyway)", sorted({f[1] for f in facts}))
            return
        comm = None
        try:
            comm = Communicator.from_process_group(group, self.device, config)
        except Exception as e:  # noqa: BLE001 -- any failure: disable on every rank together
            logger.warning("anyreduce disabled on rank %d: %s", self.rank, e)
        if not _all_agree(comm is not None, group, self.device):
            if comm is not None:  # another rank failed: leave together, without a barrier
                comm.abort()
                comm.close()
            logger.warning("anyreduce disabled: communicator creation failed on some rank")
            return
        self.comm = comm
        self.disabled = False

    # -- the interface ------------------------------------------------------------------------

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        """Whether custom_all_reduce would take `inp` (False means: use your NCCL)."""
        if self.disabled:
            return False
        if inp.dtype not in ALL_REDUCE_DTYPES or inp.device != self.device:
            return False
        if not inp.is_contiguous():
            return False
        if self.max_size is not None and inp.numel() * inp.element_size() > self.max_size:
            return False
        if self.decline_nccl:
            key = (inp.numel(), inp.dtype)
            take = self._choice.get(key)
            if take is None:
                take = self.comm.query_algorithm(inp) != Algo.NCCL
                if len(self._choice) < 4096:
                    self._choice[key] = take
            return take
        return True

    def custom_all_reduce(self, input: torch.Tensor,  # noqa: A002
                          **_server_options: Any) -> Optional[torch.Tensor]:
        """Out-of-place all-reduce, or None when anyreduce declines (then use your NCCL).
        Capturable in CUDA graphs, in and outside ``capture()``. Extra keywords some
        servers pass (e.g. use_new) are ignored."""
        if not self.should_custom_ar(input):
            return None
        return self.all_reduce(input)

    def all_reduce(self, inp: torch.Tensor, *, out: Optional[torch.Tensor] = None,
                   registered: bool = False) -> torch.Tensor:
        """Out-of-place all-reduce into `out` (allocated when None). `registered` is
        accepted for interface compatibility; anyreduce needs no registered buffers."""
        if out is None:
            out = torch.empty_like(inp)
        return self.comm.all_reduce(inp, out=out)

    # SGLang (ROCm) spellings.
    def all_reduce_reg(self, inp: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.all_reduce(inp, out=out)

    def all_reduce_unreg(self, inp: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.all_reduce(inp, out=out)

    @contextlib.contextmanager
    def capture(self):
        """The servers wrap CUDA-graph capture in this. anyreduce works on any device pointer,
        so there are no graph buffers to register afterwards."""
        try:
            self._IS_CAPTURING = True
            yield
        finally:
            self._IS_CAPTURING = False

    def register_graph_buffers(self) -> None:
        """No-op: anyreduce needs no registration."""

    def register_buffer(self, inp: Any = None) -> None:
        """No-op: anyreduce needs no registration."""

    def finalize_p2p(self) -> None:
        """No-op: peer access is checked (and confirmed with a self-test) at creation."""

    def close(self) -> None:
        """Destroy the communicator (collective, like the originals' close()). If another
        thread is inside a call on it, InvalidUsage is raised, nothing is freed, and close()
        may be called again."""
        comm = self.comm
        self.disabled = True
        if comm is None:
            return
        try:
            comm.close()
        except InvalidUsage:
            raise
        except BaseException:
            self.comm = None
            raise
        self.comm = None

    # -- fused all-reduce + residual add + RMSNorm ------------------------------------------

    def should_fuse(self, x: torch.Tensor, residual: Optional[torch.Tensor],
                    weight: torch.Tensor) -> bool:
        """Whether the fused hooks would take these tensors (False: run your unfused path)."""
        if self.disabled or self._fused_ok is False:
            return False
        if x.dtype not in FUSED_DTYPES or weight.dtype != x.dtype or x.device != self.device:
            return False
        if x.dim() < 1 or not x.is_contiguous() or not weight.is_contiguous():
            return False
        if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype
                                     or not residual.is_contiguous()):
            return False
        hidden = x.shape[-1]
        if (hidden % FUSED_HIDDEN_MULTIPLE or not FUSED_HIDDEN_MIN <= hidden <= FUSED_HIDDEN_MAX
                or weight.shape != (hidden,)):
            return False
        if self.max_size is not None and x.numel() * x.element_size() > self.max_size:
            return False
        if self._fused_ok is None:
            self._fused_ok = self.comm.comm._lib.has_function("anyrAllReduceAddRmsNorm")
            if not self._fused_ok:
                logger.warning("anyreduce: this libanyreduce has no fused all-reduce + RMSNorm "
                               "kernel; the fused hooks decline")
        return self._fused_ok

    def _fused(self, *args, **kwargs):
        try:
            return self.comm.all_reduce_add_rms_norm(*args, **kwargs)
        except Unsupported as e:
            # A capability answer (same on every rank, given before anything is launched).
            logger.warning("anyreduce: fused all-reduce + RMSNorm unsupported here (%s); "
                           "declining from now on", e)
            self._fused_ok = False
            return None

    def allreduce_residual_rmsnorm(self, input_tensor: torch.Tensor, residual: torch.Tensor,
                                   weight: torch.Tensor, eps: float = 1e-6,
                                   weight_plus_one: bool = False, **_ignored: Any
                                   ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """SGLang's ``flashinfer_allreduce_residual_rmsnorm`` shape: returns new tensors
        ``(norm_out, residual_out)``, or ``(None, None)`` when anyreduce declines (the caller
        then all-reduces and runs its own RMSNorm). Extra keyword arguments of the SGLang
        function (max_token_num, use_oneshot, ...) are accepted and ignored."""
        if not self.should_fuse(input_tensor, residual, weight):
            return None, None
        res = self._fused(input_tensor, residual, weight, eps, weight_plus_one=weight_plus_one)
        if res is None:
            return None, None
        norm_out, residual_out = res
        return norm_out, residual_out

    def fused_allreduce_rmsnorm(self, input_: torch.Tensor, residual_inp_: torch.Tensor,
                                weight_: torch.Tensor, eps: float, **_server_options: Any
                                ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """SGLang ``GroupCoordinator.fused_allreduce_rmsnorm`` hook (it calls
        ``ca_comm.fused_allreduce_rmsnorm(input_, residual_inp_, weight_, eps)`` when the
        communicator has it): ``(normed, residual_out)``, or None to make SGLang fall back to
        all-reduce + its own RMSNorm."""
        normed, residual_out = self.allreduce_residual_rmsnorm(input_, residual_inp_, weight_, eps)
        return None if normed is None else (normed, residual_out)

    def fused_allreduce_norm_(self, allreduce_in: torch.Tensor, residual: torch.Tensor,
                              rms_gamma: torch.Tensor, rms_eps: float, *,
                              norm_out: Optional[torch.Tensor] = None,
                              quant: Optional[str] = None,
                              quant_out: Optional[torch.Tensor] = None,
                              scale_out: Optional[torch.Tensor] = None,
                              scale_factor: Optional[torch.Tensor] = None,
                              weight_bias: float = 0.0,
                              nvfp4_scale_is_inverse: bool = True) -> bool:
        """vLLM's ``flashinfer_trtllm_fused_allreduce_norm`` semantics, in place:

        * norm_out None: ``allreduce_in`` <- RMSNorm(allreduce(allreduce_in) + residual),
          ``residual`` <- allreduce(allreduce_in) + residual;
        * norm_out given: ``norm_out`` <- the normed value, ``allreduce_in`` <-
          allreduce(allreduce_in) + residual (vLLM passes a zero residual there).
        * quant 'fp8': ``quant_out`` <- e4m3(y * (1 / scale_factor)) (vLLM's static FP8 scale);
          quant 'nvfp4': ``quant_out`` (packed uint8) and ``scale_out`` (swizzled 128x4 e4m3
          block scales); ``scale_factor`` is vLLM's NVFP4 global scale (448 * 6 / amax),
          the inverse of anyreduce's g, unless ``nvfp4_scale_is_inverse=False``.
        * weight_bias: 0.0, or 1.0 for Gemma-style (1 + weight).

        Returns True when done, False when anyreduce declines (nothing was written: run the
        unfused path)."""
        if weight_bias not in (0.0, 1.0):
            return False
        if not self.should_fuse(allreduce_in, residual, rms_gamma):
            return False
        # Shapes and arguments the quantized outputs need: declined, not raised (the unfused
        # path can still run them).
        if quant not in (None, "fp8", "nvfp4") or (quant is not None and scale_factor is None):
            return False
        if quant == "nvfp4" and allreduce_in.shape[-1] % 16 != 0:
            return False
        scale = scale_factor
        if quant == "nvfp4" and scale_factor is not None and nvfp4_scale_is_inverse:
            scale = torch.reciprocal(scale_factor.float()).reshape(1)
        if scale_out is not None and scale_out.dtype not in _BYTE_DTYPES:
            scale_out = scale_out.view(torch.uint8)  # vLLM allocates block scales as int32
        if quant_out is not None and quant == "nvfp4" and quant_out.dtype != torch.uint8:
            quant_out = quant_out.view(torch.uint8)
        # norm_out None: normalize in place into allreduce_in (the library allows normOut ==
        # partial) and update residual in place. norm_out given: the sum r goes to
        # allreduce_in, through a temporary (residualOut must not alias partial).
        normed = allreduce_in if norm_out is None else norm_out
        res_out = residual if norm_out is None else torch.empty_like(allreduce_in)
        kwargs: Dict[str, Any] = dict(residual_out=res_out, out=normed,
                                      weight_plus_one=weight_bias == 1.0)
        if quant is not None:
            kwargs.update(quant=quant, scale=scale, quant_out=quant_out)
            if quant == "nvfp4":
                kwargs.update(scales_out=scale_out, swizzled=True)
        if self._fused(allreduce_in, residual, rms_gamma, rms_eps, **kwargs) is None:
            return False
        if norm_out is not None:
            allreduce_in.copy_(res_out)
        return True


# Both servers' classes have the same shape; the aliases say which interface is meant.
VllmCustomAllreduce = CustomAllreduce
SglangCustomAllreduce = CustomAllreduce


class DeviceCommunicator:
    """vLLM ``DeviceCommunicatorBase``-shaped all-reduce with fallbacks.

    ``all_reduce(input_)`` returns a new tensor: anyreduce's when it takes the message, else
    ``fallback(input_)`` when given and not None (pass e.g. a PyNcclCommunicator's
    ``all_reduce``), else ``torch.distributed.all_reduce`` on a clone over ``device_group``
    (or ``cpu_group`` when no device group was given).
    """

    def __init__(self, cpu_group: Any, device: Any = None, device_group: Any = None,
                 unique_name: str = "", *, config: Optional[Config] = None,
                 max_size: Optional[int] = None,
                 fallback: Optional[Callable[[torch.Tensor], Optional[torch.Tensor]]] = None) -> None:
        self.cpu_group = cpu_group
        self.device_group = device_group
        self.unique_name = unique_name
        self.device = _resolve_device(device)
        self.rank = dist.get_rank(cpu_group)
        self.world_size = dist.get_world_size(cpu_group)
        self.ranks = dist.get_process_group_ranks(cpu_group)
        self.fallback = fallback
        self.ca_comm: Optional[CustomAllreduce] = None
        if self.world_size > 1:
            self.ca_comm = CustomAllreduce(cpu_group, self.device, max_size, config=config)

    def _nccl_all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.fallback is not None:
            out = self.fallback(input_)
            if out is not None:
                return out
        out = input_.clone()
        dist.all_reduce(out, group=self.device_group if self.device_group is not None
                        else self.cpu_group)
        return out

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        ca = self.ca_comm
        if ca is not None and not ca.disabled and ca.should_custom_ar(input_):
            out = ca.custom_all_reduce(input_)
            assert out is not None
            return out
        return self._nccl_all_reduce(input_)

    def all_reduce_add_rms_norm(self, input_: torch.Tensor, residual: Optional[torch.Tensor],
                                weight: torch.Tensor, eps: float = 1e-6,
                                weight_plus_one: bool = False
                                ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(normed, residual_out): fused when anyreduce takes it, else all_reduce + a torch
        add + RMSNorm with the same arithmetic."""
        ca = self.ca_comm
        if ca is not None:
            normed, res = ca.allreduce_residual_rmsnorm(input_, residual, weight, eps,
                                                        weight_plus_one=weight_plus_one)
            if normed is not None:
                return normed, res
        return add_rms_norm_reference(self.all_reduce(input_), residual, weight, eps,
                                      weight_plus_one)

    def destroy(self) -> None:
        if self.ca_comm is not None:
            self.ca_comm.close()
            self.ca_comm = None
