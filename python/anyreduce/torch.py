"""anyreduce on torch tensors.

    import anyreduce.torch as art
    comm = art.Communicator.from_process_group(group)        # collective over `group`
    comm.all_reduce(t)                                        # in place, returns t
    normed, residual = comm.all_reduce_add_rms_norm(partial, residual, weight, 1e-6)

Every operation is enqueued on ``torch.cuda.current_stream(comm.device)``, never synchronizes
the host, and can be captured in ``torch.cuda.graph``. Arguments are checked before anything
is launched: a tensor on the wrong device, or not contiguous, raises ValueError naming the
argument; a wrong dtype raises TypeError. These checks are the same on every rank for the same
shapes, so a rejected call is rejected everywhere and no rank is left waiting.

This module imports torch; ``import anyreduce`` alone never does.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from . import _core
from ._core import Comm, get_unique_id
from ._errors import AnyreduceError, make_error
from ._library import library
from ._types import Algo, Config, DataType, FusedOptions, Quant, anyrFusedOptions_t

__all__ = [
    "Communicator",
    "add_rms_norm",
    "add_rms_norm_reference",
    "to_anyr_dtype",
    "ALL_REDUCE_DTYPES",
    "FUSED_DTYPES",
    "FP8_DTYPE",
    "OPS_NAMESPACE",
    "registered_ops",
]

_TO_ANYR = {
    torch.float32: DataType.FLOAT32,
    torch.float16: DataType.FLOAT16,
    torch.bfloat16: DataType.BFLOAT16,
}
ALL_REDUCE_DTYPES = frozenset(_TO_ANYR)
FUSED_DTYPES = frozenset({torch.bfloat16, torch.float16})
# e4m3 outputs are torch.float8_e4m3fn where torch has it, raw uint8 bytes otherwise.
FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)
_FP4_PACKED = getattr(torch, "float4_e2m1fn_x2", None)
_BYTE_DTYPES = tuple(d for d in (torch.uint8, FP8_DTYPE) if d is not None)
_FP4_DTYPES = tuple(d for d in (torch.uint8, _FP4_PACKED) if d is not None)

DeviceLike = Union[torch.device, int, str, None]

# The current stream of a device as a cudaStream_t int. torch's private raw getter (the one its
# compiled code uses) costs a fraction of torch.cuda.current_stream(d).cuda_stream, which builds
# a Stream object each call: 3-8 us of an eager call's host time (docs/PERFORMANCE.md, "Host time").
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def to_anyr_dtype(dtype: torch.dtype) -> DataType:
    """The anyrDataType_t of a torch dtype (TypeError for one anyreduce cannot reduce)."""
    try:
        return _TO_ANYR[dtype]
    except KeyError:
        raise TypeError(f"anyreduce does not support {dtype} "
                        "(torch.bfloat16, torch.float16, torch.float32)") from None


def _resolve_device(device: DeviceLike) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    if isinstance(device, int):
        return torch.device("cuda", device)
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {d}")
    if d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def _names(dtypes) -> str:
    return ", ".join(sorted(str(d) for d in dtypes))


def _check(t: Any, name: str, device: torch.device, dtypes=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor on {device}, got a tensor on {t.device}")
        raise ValueError(f"{name} is on {t.device}, but the communicator's device is {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first); "
                         f"got shape {tuple(t.shape)} with strides {t.stride()}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {_names(dtypes)}")


def _check_like(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str,
                device: torch.device) -> None:
    _check(t, name, device)
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, {ref_name} has {ref.dtype}; they must match")
    if t.shape != ref.shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, {ref_name} has "
                         f"{tuple(ref.shape)}; they must match")


def _require(lib, function: str) -> None:
    """Raise FunctionNotAvailable (after the argument checks, before any launch) if the
    library lacks `function`."""
    if not lib.has_function(function):
        getattr(lib, function)  # raises FunctionNotAvailable naming the library file


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _empty_bytes(shape: Sequence[int], device: torch.device, zero: bool = False,
                 as_fp8: bool = True) -> torch.Tensor:
    t = (torch.zeros if zero else torch.empty)(tuple(shape), dtype=torch.uint8, device=device)
    return t.view(FP8_DTYPE) if as_fp8 and FP8_DTYPE is not None else t


# The C options of an unquantized fused call, built once per form (the library only reads
# them): building them per call was several us of an eager call's host time.
_PLAIN_OPTIONS = {w: FusedOptions(weight_plus_one=w).to_c() for w in (False, True)}


class _Fused:
    """Checked arguments and outputs of one anyrAllReduceAddRmsNorm / anyrAddRmsNorm call."""

    __slots__ = ("c_args", "result")

    def __init__(self, device: torch.device, x: torch.Tensor, x_name: str,
                 residual: Optional[torch.Tensor], weight: torch.Tensor, eps: float, *,
                 residual_out: Optional[torch.Tensor], out: Optional[torch.Tensor],
                 weight_plus_one: bool, quant: Union[str, Quant, None],
                 scale: Optional[torch.Tensor], swizzled: bool,
                 quant_out: Optional[torch.Tensor], scales_out: Optional[torch.Tensor],
                 fused: bool) -> None:
        _check(x, x_name, device, FUSED_DTYPES)
        if x.dim() < 1 or x.shape[-1] == 0:
            raise ValueError(f"{x_name} must have shape (tokens, hidden) with hidden > 0, "
                             f"got {tuple(x.shape)}")
        hidden = x.shape[-1]
        tokens = x.numel() // hidden
        if residual is not None:
            _check_like(residual, "residual", x, x_name, device)
        _check(weight, "weight", device)
        if weight.dtype != x.dtype:
            raise TypeError(f"weight has dtype {weight.dtype}, {x_name} has {x.dtype}; "
                            "they must match")
        if weight.dim() != 1 or weight.shape[0] != hidden:
            raise ValueError(f"weight must have shape ({hidden},) (hidden), got {tuple(weight.shape)}")
        if residual_out is None:
            residual_out = torch.empty_like(x)
        else:
            _check_like(residual_out, "residual_out", x, x_name, device)
            if fused and residual_out.data_ptr() == x.data_ptr() and x.numel() > 0:
                raise ValueError(f"residual_out must not alias {x_name}: peers may still be "
                                 f"reading {x_name} while this rank writes its results")
        try:
            q = Quant.parse(quant)
        except ValueError as e:
            raise ValueError(str(e)) from None
        if out is None:
            # With quantization the library needs no normed output: skip writing it.
            out = torch.empty_like(x) if q is Quant.NONE else None
        else:
            # May be `x` itself (in place); a partial overlap is the library's to refuse.
            _check_like(out, "out", x, x_name, device)

        if q is Quant.NONE:
            if scale is not None or quant_out is not None or scales_out is not None:
                raise ValueError("scale, quant_out and scales_out are only for quant='fp8'/'nvfp4'")
            result: Tuple[torch.Tensor, ...] = (out, residual_out)
            opts: Union[FusedOptions, anyrFusedOptions_t] = _PLAIN_OPTIONS[bool(weight_plus_one)]
        else:
            opts = FusedOptions(weight_plus_one=bool(weight_plus_one), quant=q)
            if scale is None:
                raise ValueError(f"scale is required for quant={q.name.lower()!r}: a CUDA float32 "
                                 "tensor of one element")
            _check(scale, "scale", device, (torch.float32,))
            if scale.numel() != 1:
                raise ValueError(f"scale must have one element (per-tensor), got {scale.numel()}")
            opts.scale = scale.data_ptr()
            lead = tuple(x.shape[:-1])
            if q is Quant.FP8:
                if scales_out is not None:
                    raise ValueError("scales_out is only for quant='nvfp4'")
                if quant_out is None:
                    quant_out = _empty_bytes(x.shape, device)
                else:
                    _check(quant_out, "quant_out", device, _BYTE_DTYPES)
                    if quant_out.shape != x.shape:
                        raise ValueError(f"quant_out must have shape {tuple(x.shape)}, "
                                         f"got {tuple(quant_out.shape)}")
                opts.quant_out = quant_out.data_ptr()
                result = (quant_out, scale, residual_out)
            else:  # NVFP4
                if hidden % 16 != 0:
                    raise ValueError(f"quant='nvfp4' needs hidden to be a multiple of 16, got {hidden}")
                q_shape = lead + (hidden // 2,)
                if quant_out is None:
                    quant_out = torch.empty(q_shape, dtype=torch.uint8, device=device)
                else:
                    _check(quant_out, "quant_out", device, _FP4_DTYPES)
                    if tuple(quant_out.shape) != q_shape:
                        raise ValueError(f"quant_out must have shape {q_shape} (two e2m1 values "
                                         f"per byte), got {tuple(quant_out.shape)}")
                opts.quant_out = quant_out.data_ptr()
                if swizzled:
                    s_shape: Tuple[int, ...] = (_round_up(tokens, 128), _round_up(hidden // 16, 4))
                else:
                    s_shape = lead + (hidden // 16,)
                if scales_out is None:
                    # Swizzled padding is zeroed: NVFP4 GEMMs read the whole padded tile.
                    scales_out = _empty_bytes(s_shape, device, zero=swizzled)
                else:
                    _check(scales_out, "scales_out", device, _BYTE_DTYPES)
                    if scales_out.numel() != math.prod(s_shape):
                        raise ValueError(f"scales_out must hold {math.prod(s_shape)} e4m3 scales "
                                         f"(shape {s_shape}{' swizzled 128x4' if swizzled else ''}), "
                                         f"got {scales_out.numel()}")
                if swizzled:
                    opts.block_scales_swizzled = scales_out.data_ptr()
                else:
                    opts.block_scales = scales_out.data_ptr()
                result = (quant_out, scales_out, residual_out)
        self.c_args = (x.data_ptr(), residual.data_ptr() if residual is not None else 0,
                       residual_out.data_ptr(), weight.data_ptr(), float(eps),
                       out.data_ptr() if out is not None else 0,
                       tokens, hidden, _TO_ANYR[x.dtype], opts)
        self.result = result


def add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                 eps: float = 1e-6, *, residual_out: Optional[torch.Tensor] = None,
                 out: Optional[torch.Tensor] = None, weight_plus_one: bool = False,
                 quant: Union[str, Quant, None] = None, scale: Optional[torch.Tensor] = None,
                 swizzled: bool = True, quant_out: Optional[torch.Tensor] = None,
                 scales_out: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
    """The standalone add + RMSNorm (+ quantization) kernel (anyrAddRmsNorm) on an already
    all-reduced ``x``: what an unfused pipeline runs after its all-reduce. No communicator
    needed; runs on ``x``'s device's current stream. ``out`` may be ``x`` (in place).
    Arguments and results as in ``Communicator.all_reduce_add_rms_norm``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cuda":
        raise ValueError(f"x must be a CUDA tensor, got a tensor on {x.device}")
    call = _Fused(x.device, x, "x", residual, weight, eps, residual_out=residual_out, out=out,
                  weight_plus_one=weight_plus_one, quant=quant, scale=scale, swizzled=swizzled,
                  quant_out=quant_out, scales_out=scales_out, fused=False)
    _require(library(), "anyrAddRmsNorm")
    with torch.cuda.device(x.device):
        _core.add_rms_norm(*call.c_args, stream=_current_stream(x.device.index))
    return call.result


def add_rms_norm_reference(x: torch.Tensor, residual: Optional[torch.Tensor],
                           weight: torch.Tensor, eps: float = 1e-6,
                           weight_plus_one: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch add + RMSNorm with the library's arithmetic contract (fp32 math, r rounded
    to the dtype before the mean): returns (normed, r). The unfused fallback of the adapters
    and the reference of the tests."""
    r = x.float() if residual is None else x.float() + residual.float()
    r = r.to(x.dtype)
    rf = r.float()
    w = weight.float() + 1.0 if weight_plus_one else weight.float()
    y = rf * torch.rsqrt(rf.pow(2).mean(dim=-1, keepdim=True) + eps) * w
    return y.to(x.dtype), r


class Communicator:
    """An anyreduce communicator bound to one CUDA device, working on torch tensors.

    Create it collectively with ``from_process_group`` (or ``from_unique_id``). ``close()``
    is collective too; use the communicator as a context manager or call close() on every
    rank. ``comm`` is the low-level ``anyreduce.Comm``.
    """

    def __init__(self, comm: Comm, device: DeviceLike = None, group: Any = None) -> None:
        self.comm = comm
        self.device = torch.device("cuda", comm.device) if device is None else _resolve_device(device)
        if self.device.index != comm.device:
            raise ValueError(f"device {self.device} is not the communicator's device cuda:{comm.device}")
        self.group = group
        self.rank = comm.rank
        self.world_size = comm.count
        self._index = self.device.index
        # The operators' name for it (op_handle), taken now: a read under torch.compile then
        # finds a plain attribute, no registration to trace.
        self._handle: Optional[int] = _torch_ops.register(self)

    # -- creation ----------------------------------------------------------------------------

    @classmethod
    def from_process_group(cls, group: Any = None, device: DeviceLike = None,
                           config: Optional[Config] = None) -> "Communicator":
        """Create the communicator of this rank of `group` (default: the world), collectively.

        Group rank 0 makes the unique id; it is broadcast over `group` itself
        (``dist.broadcast_object_list`` with the global rank of group rank 0 as source), so
        any group works: the world, a tensor-parallel sub-group of a DP x TP layout, a gloo
        CPU group (as vLLM and SGLang use for setup) or an NCCL group. Every rank of `group`
        must call this. `device` defaults to the current CUDA device; ranks of one
        communicator must use distinct GPUs.
        """
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call "
                               "dist.init_process_group() first, or use from_unique_id()")
        if group is None:
            group = dist.group.WORLD
        rank = dist.get_rank(group)
        size = dist.get_world_size(group)
        if rank < 0:
            raise ValueError("this process is not a member of `group`")
        dev = _resolve_device(device)
        src = _global_rank(group, 0)
        payload: list = [None]
        local_error: Optional[BaseException] = None
        if rank == 0:
            try:
                payload[0] = ("id", get_unique_id())
            except Exception as e:  # tell the other ranks instead of leaving them waiting
                local_error = e
                code = int(e.code) if isinstance(e, AnyreduceError) else -1
                payload[0] = ("error", code, f"{type(e).__name__}: {e}")
        with torch.cuda.device(dev):
            dist.broadcast_object_list(payload, src=src, group=group)
            if local_error is not None:
                raise local_error
            if payload[0][0] == "error":
                _, code, msg = payload[0]
                text = f"group rank 0 (global rank {src}) could not create the unique id: {msg}"
                if code >= 0:
                    raise make_error(code, text, "anyrGetUniqueId")
                raise RuntimeError(text)
            comm = Comm.init_rank(size, payload[0][1], rank, config)
        return cls(comm, dev, group)

    @classmethod
    def from_unique_id(cls, nranks: int, unique_id: bytes, rank: int, device: DeviceLike = None,
                       config: Optional[Config] = None) -> "Communicator":
        """Create from a unique id distributed by the caller (no torch.distributed needed)."""
        dev = _resolve_device(device)
        with torch.cuda.device(dev):
            comm = Comm.init_rank(nranks, unique_id, rank, config)
        return cls(comm, dev)

    @property
    def op_handle(self) -> int:
        """An int naming this communicator to the ``torch.ops.anyreduce`` operators (for
        torch.compile; see ``anyreduce._torch_ops``), given when the communicator is created.
        The same for the communicator's life; refused by the operators once it is closed (or
        garbage-collected: the operators keep no reference to it)."""
        if self.comm.closed or self._handle is None:
            raise ValueError("the communicator is closed: it has no handle")
        return self._handle

    def close(self) -> None:
        """Destroy the communicator (collective; idempotent)."""
        try:
            with torch.cuda.device(self._index):
                self.comm.close()
        finally:
            if self.comm.closed:  # not when another thread's call kept it open
                _torch_ops.unregister(self._handle)
                self._handle = None

    def abort(self) -> None:
        self.comm.abort()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not self.comm.closed:
            try:
                self.comm.abort()
            except AnyreduceError:
                pass
        self.close()

    # -- helpers -----------------------------------------------------------------------------

    def _stream(self) -> int:
        return _current_stream(self._index)

    def _launch(self, fn, *args) -> None:
        # Kernels go to the communicator's device; make it current for the call if it is not.
        if torch.cuda.current_device() == self._index:
            fn(*args, stream=self._stream())
        else:
            with torch.cuda.device(self._index):
                fn(*args, stream=self._stream())

    # -- operations --------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Sum `tensor` over the ranks: in place when `out` is None, else into `out` (same
        shape and dtype; `tensor` is left untouched). Returns the result tensor.
        dtypes: bfloat16, float16, float32. Any element count, any shape (contiguous)."""
        device = self.device
        _check(tensor, "tensor", device, ALL_REDUCE_DTYPES)
        if out is None:
            out = tensor
        else:
            _check_like(out, "out", tensor, "tensor", device)
        self._launch(self.comm.all_reduce, tensor.data_ptr(), out.data_ptr(), tensor.numel(),
                     _TO_ANYR[tensor.dtype])
        return out

    def all_reduce_add_rms_norm(self, partial: torch.Tensor, residual: Optional[torch.Tensor],
                                weight: torch.Tensor, eps: float = 1e-6, *,
                                residual_out: Optional[torch.Tensor] = None,
                                out: Optional[torch.Tensor] = None,
                                weight_plus_one: bool = False,
                                quant: Union[str, Quant, None] = None,
                                scale: Optional[torch.Tensor] = None, swizzled: bool = True,
                                quant_out: Optional[torch.Tensor] = None,
                                scales_out: Optional[torch.Tensor] = None
                                ) -> Tuple[torch.Tensor, ...]:
        """Fused all-reduce + residual add + RMSNorm (+ FP8/NVFP4 quantization), one kernel:

            x = all_reduce(partial);  r = x + residual (r = x when residual is None)
            residual_out = r;         y = r / sqrt(mean(r^2) + eps) * w,
            w = weight, or 1 + weight with weight_plus_one=True (Gemma/Qwen).

        Shapes: partial (tokens, hidden) (more leading dims are flattened into tokens);
        residual, residual_out, out: same shape and dtype; weight: (hidden,), same dtype.
        dtypes: bfloat16 or float16; hidden: a multiple of 8 in 128..16384 (the library's
        rule, reported as InvalidArgument/Unsupported).

        ``residual_out`` defaults to a new tensor; pass ``residual_out=residual`` to update
        the residual in place (vLLM's fused_add_rms_norm habit); it must not alias
        ``partial``. ``out`` receives y (a new tensor by default); ``out=partial`` is allowed
        and normalizes in place.

        Returns:
          quant=None:    (normed, residual_out)              normed: y in partial's dtype
          quant='fp8':   (q, scale, residual_out)            q: partial's shape, e4m3
                         (torch.float8_e4m3fn), q = clamp(y * (1 / scale), -448, 448); scale: the
                         given per-tensor fp32 scale (one element)
          quant='nvfp4': (q, block_scales, residual_out)     q: (..., hidden/2) uint8, two
                         e2m1 values per byte, element 2i in the low nibble; block_scales: e4m3
                         (float8_e4m3fn), one per 16 elements: with swizzled=True the 128x4
                         swizzled layout NVFP4 GEMMs read, shape (round_up(tokens, 128),
                         round_up(hidden/16, 4)), padding zeroed; with swizzled=False
                         row-major (..., hidden/16). `scale` is the fp32 global scale g:
                         y ~ q * block_scale * g. A caller-given swizzled ``scales_out``
                         must arrive with its padding zeroed: the kernel does not write it.
        With quantization, y itself is written only when ``out`` is given.

        Raises FunctionNotAvailable (an Unsupported, and NotImplementedError) when the loaded
        library does not have the fused kernel yet.
        """
        call = _Fused(self.device, partial, "partial", residual, weight, eps,
                      residual_out=residual_out, out=out, weight_plus_one=weight_plus_one,
                      quant=quant, scale=scale, swizzled=swizzled, quant_out=quant_out,
                      scales_out=scales_out, fused=True)
        _require(self.comm._lib, "anyrAllReduceAddRmsNorm")
        self._launch(self.comm.all_reduce_add_rms_norm, *call.c_args)
        return call.result

    def add_rms_norm(self, x: torch.Tensor, residual: Optional[torch.Tensor],
                     weight: torch.Tensor, eps: float = 1e-6, **kwargs) -> Tuple[torch.Tensor, ...]:
        """The standalone add + RMSNorm kernel on this communicator's device (no
        communication); see ``anyreduce.torch.add_rms_norm``."""
        _check(x, "x", self.device)
        return add_rms_norm(x, residual, weight, eps, **kwargs)

    # -- algorithm control and diagnostics -----------------------------------------------------

    def set_algorithm(self, algorithm: Union[Algo, int, str]) -> None:
        """Force an algorithm (collective; Algo.AUTO / "auto" restores the choice)."""
        self.comm.set_algorithm(algorithm)

    def query_algorithm(self, tensor_or_count: Union[torch.Tensor, int],
                        dtype: Optional[torch.dtype] = None) -> Union[Algo, int]:
        """The algorithm all_reduce would use for this tensor (or count + torch dtype)."""
        if isinstance(tensor_or_count, torch.Tensor):
            count, dtype = tensor_or_count.numel(), tensor_or_count.dtype
        else:
            count = tensor_or_count
            if dtype is None:
                raise TypeError("query_algorithm(count, dtype) needs a dtype")
        return self.comm.query_algorithm(count, to_anyr_dtype(dtype))

    def explain(self) -> dict:
        """Topology, admission of every algorithm with its reason, thresholds (a dict)."""
        return self.comm.explain()

    def async_error(self) -> Optional[AnyreduceError]:
        return self.comm.async_error()

    def __repr__(self) -> str:
        state = "closed" if self.comm.closed else f"rank {self.rank}/{self.world_size}"
        return f"<anyreduce.torch.Communicator {state} on {self.device}>"


def _global_rank(group: Any, group_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank
    get = getattr(dist, "get_global_rank", None)
    if get is not None:
        return get(group, group_rank)
    return dist.get_process_group_ranks(group)[group_rank]


# The torch.ops.anyreduce operators (torch.compile); registered when this module is imported.
from . import _torch_ops  # noqa: E402  (it uses the definitions above)

OPS_NAMESPACE = "anyreduce"  # _torch_ops.NAMESPACE (which may still be importing this module)


def registered_ops() -> list:
    """The qualified names of the operators this module registered (``anyreduce::all_reduce``,
    ...), or [] when another copy of anyreduce in the process registered them first
    (``anyreduce._torch_ops.NOT_REGISTERED_REASON`` says so)."""
    return list(_torch_ops.REGISTERED)
