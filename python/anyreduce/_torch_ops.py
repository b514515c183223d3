"""anyreduce's operations as PyTorch operators (namespace ``anyreduce``), for torch.compile.

A ctypes call is opaque to torch.compile: it breaks the graph (or fails under
``fullgraph=True``). These operators are registered with PyTorch's dispatcher instead, each
with a schema and a fake (shape-only) implementation, so compiled graphs keep them as single
nodes, and functionalization sees which arguments they write::

    import anyreduce.torch as art
    comm = art.Communicator.from_process_group(tp_group)
    h = comm.op_handle                                # an int naming `comm` to the operators

    @torch.compile(fullgraph=True)
    def layer(partial, residual, weight):
        normed, residual = torch.ops.anyreduce.all_reduce_add_rms_norm(
            partial, residual, weight, 1e-6, h)
        return normed, residual

A communicator is named by its ``op_handle`` (an int, since operator schemas take no Python
objects; every communicator has one from its creation); a graph holds the int, so the
communicator must stay open (and referenced) while the graph runs.
The handle of a closed communicator is refused by name. Each operator runs the same checked
call as the ``Communicator`` method it wraps, on the current stream, and so may be captured
in CUDA graphs. The operators are registered directly for the CUDA dispatch key
(``Library.impl``, as vLLM registers its own), not through ``torch.library.custom_op``'s extra
Python layer; the two were not compared here.
"""

import itertools
import threading
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import torch as art

NAMESPACE = "anyreduce"

# name -> the schema after the name. The schemas are the
# operators' contract: out-of-place operators return new tensors and write nothing they are
# given; the *_inplace ones write only the arguments marked (a!) / (b!) and return nothing.
SCHEMAS: Dict[str, str] = {
    "all_reduce": "(Tensor tensor, int comm) -> Tensor",
    "all_reduce_inplace": "(Tensor(a!) tensor, int comm) -> ()",
    "all_reduce_add_rms_norm": (
        "(Tensor partial, Tensor? residual, Tensor weight, float eps, int comm, "
        "bool weight_plus_one=False) -> (Tensor, Tensor)"),
    "fused_add_rms_norm_inplace": (
        "(Tensor(a!) partial, Tensor(b!) residual, Tensor weight, float eps, int comm, "
        "bool weight_plus_one=False) -> ()"),
    "all_reduce_add_rms_norm_fp8": (
        "(Tensor partial, Tensor? residual, Tensor weight, float eps, Tensor scale, int comm, "
        "bool weight_plus_one=False) -> (Tensor, Tensor)"),
    "all_reduce_add_rms_norm_nvfp4": (
        "(Tensor partial, Tensor? residual, Tensor weight, float eps, Tensor scale, int comm, "
        "bool weight_plus_one=False, bool swizzled=True) -> (Tensor, Tensor, Tensor)"),
    "add_rms_norm": (
        "(Tensor x, Tensor? residual, Tensor weight, float eps, bool weight_plus_one=False) "
        "-> (Tensor, Tensor)"),
}

# ---- handles -------------------------------------------------------------------------------
# Every Communicator takes its handle when it is created (Communicator.__init__), so reading
# op_handle needs no lock and nothing torch.compile would have to trace. The table holds weak
# references: registering keeps no communicator alive, and the handle of one that was collected
# is refused as a closed one's is.

_lock = threading.Lock()
_numbers = itertools.count(1)
_open: Dict[int, "weakref.ReferenceType[art.Communicator]"] = {}


def register(comm: "art.Communicator") -> int:
    """A new handle for `comm` (Communicator.__init__ calls this once per communicator)."""
    with _lock:
        handle = next(_numbers)
        # The entry goes when the communicator is collected (the callback takes no lock: the
        # collector may run it in a thread that holds _lock; dict.pop is atomic by itself).
        _open[handle] = weakref.ref(comm, lambda _ref, h=handle: _open.pop(h, None))
    return handle


def unregister(handle: Optional[int]) -> None:
    if handle is not None:
        with _lock:
            _open.pop(handle, None)


def communicator(handle: int, op: str) -> "art.Communicator":
    """The open communicator named by `handle`, or ValueError naming the operator's argument."""
    with _lock:
        ref = _open.get(handle)
    comm = ref() if ref is not None else None
    if comm is None:
        raise ValueError(f"{NAMESPACE}::{op}: argument 'comm': {handle} is not the handle of an "
                         "open communicator (use Communicator.op_handle of one that is not closed)")
    return comm


# ---- real implementations (CUDA) -----------------------------------------------------------


def _all_reduce(tensor: torch.Tensor, comm: int) -> torch.Tensor:
    c = communicator(comm, "all_reduce")
    x = tensor.contiguous()
    return c.all_reduce(x, out=torch.empty_like(x))


def _all_reduce_inplace(tensor: torch.Tensor, comm: int) -> None:
    communicator(comm, "all_reduce_inplace").all_reduce(tensor)


def _contiguous(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.contiguous()


def _fused(partial, residual, weight, eps, comm, weight_plus_one, op, **kwargs):
    c = communicator(comm, op)
    return c.all_reduce_add_rms_norm(partial.contiguous(), _contiguous(residual),
                                     weight.contiguous(), eps,
                                     weight_plus_one=weight_plus_one, **kwargs)


def _all_reduce_add_rms_norm(partial, residual, weight, eps, comm, weight_plus_one=False):
    return _fused(partial, residual, weight, eps, comm, weight_plus_one,
                  "all_reduce_add_rms_norm")


def _fused_add_rms_norm_inplace(partial, residual, weight, eps, comm, weight_plus_one=False):
    c = communicator(comm, "fused_add_rms_norm_inplace")
    c.all_reduce_add_rms_norm(partial, residual, weight.contiguous(), eps,
                              residual_out=residual, out=partial,
                              weight_plus_one=weight_plus_one)


def _all_reduce_add_rms_norm_fp8(partial, residual, weight, eps, scale, comm,
                                 weight_plus_one=False):
    q, _, residual_out = _fused(partial, residual, weight, eps, comm, weight_plus_one,
                                "all_reduce_add_rms_norm_fp8", quant="fp8", scale=scale)
    return q, residual_out  # not `scale`: an operator's outputs may not alias its inputs


def _all_reduce_add_rms_norm_nvfp4(partial, residual, weight, eps, scale, comm,
                                   weight_plus_one=False, swizzled=True):
    return _fused(partial, residual, weight, eps, comm, weight_plus_one,
                  "all_reduce_add_rms_norm_nvfp4", quant="nvfp4", scale=scale,
                  swizzled=swizzled)


def _add_rms_norm(x, residual, weight, eps, weight_plus_one=False):
    return art.add_rms_norm(x.contiguous(), _contiguous(residual), weight.contiguous(), eps,
                            weight_plus_one=weight_plus_one)


# ---- fake implementations (shapes and dtypes only, for tracing) ----------------------------


def _like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _bytes(shape, device, fp8: bool) -> torch.Tensor:
    dtype = art.FP8_DTYPE if fp8 and art.FP8_DTYPE is not None else torch.uint8
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def _fake_all_reduce(tensor, comm):
    return _like(tensor)


def _fake_nothing(*args, **kwargs):
    return None


def _fake_fused(partial, residual, weight, eps, comm, weight_plus_one=False):
    return _like(partial), _like(partial)


def _fake_add_rms_norm(x, residual, weight, eps, weight_plus_one=False):
    return _like(x), _like(x)


def _fake_fp8(partial, residual, weight, eps, scale, comm, weight_plus_one=False):
    return _bytes(partial.shape, partial.device, fp8=True), _like(partial)


def _fake_nvfp4(partial, residual, weight, eps, scale, comm, weight_plus_one=False,
                swizzled=True):
    hidden = partial.shape[-1]
    if hidden % 16 != 0:
        raise ValueError(f"{NAMESPACE}::all_reduce_add_rms_norm_nvfp4: argument 'partial': "
                         f"quant='nvfp4' needs hidden to be a multiple of 16, got {hidden}")
    lead = tuple(partial.shape[:-1])
    tokens = partial.numel() // hidden
    if swizzled:
        scales_shape = ((tokens + 127) // 128 * 128, (hidden // 16 + 3) // 4 * 4)
    else:
        scales_shape = lead + (hidden // 16,)
    return (torch.empty(lead + (hidden // 2,), dtype=torch.uint8, device=partial.device),
            _bytes(scales_shape, partial.device, fp8=True), _like(partial))


# ---- registration --------------------------------------------------------------------------

_IMPLS: Dict[str, Tuple[Callable, Callable]] = {
    "all_reduce": (_all_reduce, _fake_all_reduce),
    "all_reduce_inplace": (_all_reduce_inplace, _fake_nothing),
    "all_reduce_add_rms_norm": (_all_reduce_add_rms_norm, _fake_fused),
    "fused_add_rms_norm_inplace": (_fused_add_rms_norm_inplace, _fake_nothing),
    "all_reduce_add_rms_norm_fp8": (_all_reduce_add_rms_norm_fp8, _fake_fp8),
    "all_reduce_add_rms_norm_nvfp4": (_all_reduce_add_rms_norm_nvfp4, _fake_nvfp4),
    "add_rms_norm": (_add_rms_norm, _fake_add_rms_norm),
}


def _refuse_non_cuda(name: str) -> Callable:
    """The CPU kernel: names the first argument that is not a CUDA tensor."""

    def refuse(*args, **kwargs):
        schema = getattr(getattr(torch.ops, NAMESPACE), name).default._schema
        for arg, value in zip(schema.arguments, args):
            if isinstance(value, torch.Tensor) and value.device.type != "cuda":
                raise ValueError(f"{NAMESPACE}::{name}: argument '{arg.name}': must be a CUDA "
                                 f"tensor, got a tensor on {value.device}")
        raise ValueError(f"{NAMESPACE}::{name}: its tensors must be CUDA tensors")

    return refuse


def _register_fake(lib, qualname: str, name: str, fn: Callable) -> None:
    if hasattr(torch.library, "register_fake"):  # torch >= 2.4
        torch.library.register_fake(qualname, fn, lib=lib)
    elif hasattr(torch.library, "impl_abstract"):  # torch 2.2 and 2.3
        torch.library.impl_abstract(qualname, fn, lib=lib)
    else:  # meta tensors stand in for fake ones
        lib.impl(name, fn, "Meta")


def _register() -> Tuple[Optional[object], List[str], str]:
    existing = [n for n in SCHEMAS if hasattr(getattr(torch.ops, NAMESPACE), n)]
    if existing:
        return None, [], (f"torch.ops.{NAMESPACE}.{existing[0]} is already registered (by "
                          "another copy of anyreduce in this process); this copy's operators "
                          "are not registered")
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    # Declares that the operators pass torch.library.opcheck (python/tests/test_torch_ops.py).
    compliant = getattr(torch.Tag, "pt2_compliant_tag", None)
    names = []
    for name, schema in SCHEMAS.items():
        if compliant is not None:
            lib.define(name + schema, tags=(compliant,))
        else:
            lib.define(name + schema)
        real, fake = _IMPLS[name]
        lib.impl(name, real, "CUDA")
        lib.impl(name, _refuse_non_cuda(name), "CPU")
        _register_fake(lib, f"{NAMESPACE}::{name}", name, fake)
        names.append(f"{NAMESPACE}::{name}")
    return lib, names, ""


# The Library object owns the registrations: it lives as long as this module.
_LIBRARY, REGISTERED, NOT_REGISTERED_REASON = _register()
