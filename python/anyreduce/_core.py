"""Low-level layer: the C API as Python functions and a ``Comm`` class, on raw pointers.

Nothing here knows about torch or numpy: buffers and streams are integers (device addresses
and cudaStream_t values, 0 meaning NULL / the legacy default stream). ``anyreduce.torch``
builds the tensor-level API on top of this.
"""

from __future__ import annotations

import ctypes
import json
import operator
import os
import time
import warnings
from ctypes import byref, c_int, c_size_t, c_void_p
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from ._errors import AnyreduceError, InvalidArgument, InvalidUsage, make_error
from ._library import Library, library
from ._types import (
    ANYR_UNIQUE_ID_BYTES,
    Algo,
    Config,
    DataType,
    FusedOptions,
    RedOp,
    Result,
    UniqueId,
    anyrConfig_t,
    anyrFusedOptions_t,
)

UniqueIdLike = Union[bytes, bytearray, memoryview, UniqueId]
ConfigLike = Union[Config, Mapping[str, Any], anyrConfig_t, None]
DTypeLike = Union[DataType, int, str]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _arg_error(function: str, arg: str, rule: str) -> InvalidArgument:
    return InvalidArgument(Result.INVALID_ARGUMENT, f"{function}: argument '{arg}': {rule}", function)


def _c_int(function: str, arg: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _arg_error(function, arg, f"must be an int, got {type(value).__name__}")
    if not (_INT32_MIN <= value <= _INT32_MAX):
        raise _arg_error(function, arg, f"{value} does not fit a C int")
    return value


_SIZE_T_END = 2**64


def _c_size(function: str, arg: str, value: Any) -> int:
    """A size_t argument: an int in 0 .. 2**64 - 1 (ctypes would wrap a larger one)."""
    if isinstance(value, bool):
        raise _arg_error(function, arg, "must be an int, got bool")
    try:
        value = operator.index(value)  # int, or an integer type such as numpy's
    except TypeError:
        raise _arg_error(function, arg, f"must be an int, got {type(value).__name__}") from None
    if value < 0:
        raise _arg_error(function, arg, "must be >= 0")
    if value >= _SIZE_T_END:
        raise _arg_error(function, arg, f"{value} does not fit a size_t")
    return value


def _as_unique_id(value: UniqueIdLike, function: str) -> UniqueId:
    if isinstance(value, UniqueId):
        return value
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise _arg_error(function, "unique_id",
                         f"must be the {ANYR_UNIQUE_ID_BYTES} bytes of get_unique_id(), "
                         f"got {type(value).__name__}")
    try:
        return UniqueId.from_bytes(value)
    except ValueError as e:
        raise _arg_error(function, "unique_id", str(e)) from None


def _as_config(config: ConfigLike) -> Optional[anyrConfig_t]:
    if config is None:
        return None
    if isinstance(config, anyrConfig_t):
        return config
    if isinstance(config, Mapping):
        config = Config(**config)
    if not isinstance(config, Config):
        raise TypeError(f"config must be an anyreduce.Config (or a dict of its fields), "
                        f"got {type(config).__name__}")
    return config.to_c()


def _dtype_arg(dtype: DTypeLike, function: str) -> int:
    if isinstance(dtype, str):
        try:
            return int(DataType.parse(dtype))
        except ValueError as e:
            raise _arg_error(function, "datatype", str(e)) from None
    return int(dtype)  # unknown ints go to the library, which names them


def _enum_or_int(enum_cls, value: int):
    try:
        return enum_cls(value)
    except ValueError:
        return value


# ---- library-wide calls ---------------------------------------------------------------------


def version_code() -> int:
    """The loaded library's ANYR_VERSION_CODE (major * 10000 + minor * 100 + patch)."""
    lib = library()
    v = c_int(0)
    lib.check(lib.anyrGetVersion(byref(v)), "anyrGetVersion")
    return v.value


def version_info() -> Tuple[int, int, int]:
    """The loaded library's (major, minor, patch)."""
    code = version_code()
    return code // 10000, code // 100 % 100, code % 100


def version() -> str:
    """The loaded library's version as "major.minor.patch"."""
    return "%d.%d.%d" % version_info()


def get_unique_id() -> bytes:
    """A new unique id (128 bytes) for a communicator: rank 0's bootstrap address, a port and a
    random secret. Call it in the process that will be rank 0 and hand the bytes to the others
    by any means. Needs no GPU: it only opens a listening socket."""
    lib = library()
    uid = UniqueId()
    lib.check(lib.anyrGetUniqueId(byref(uid)), "anyrGetUniqueId")
    return uid.to_bytes()


def share_unique_id(path: Union[str, "os.PathLike[str]"], rank: int,
                    timeout_s: float = 60.0) -> bytes:
    """The unique id of a communicator, handed over through a file every rank can reach: rank 0
    makes it (get_unique_id; its process then listens on the id's address) and writes it to
    `path` atomically, readable by its owner only (the id holds the bootstrap secret); every
    other rank waits for the file, at most `timeout_s` seconds, and reads it. `path` must not
    exist before the run (use a fresh name per run): a rank that started first would read an
    old id. Raises TimeoutError naming the rank and the path."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"share_unique_id: argument 'rank': must be an int >= 0, got {rank!r}")
    if not timeout_s > 0:
        raise ValueError(f"share_unique_id: argument 'timeout_s': must be > 0, got {timeout_s!r}")
    path = os.fspath(path)
    if rank == 0:
        uid = get_unique_id()
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(uid)
        os.replace(tmp, path)
        return uid
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"share_unique_id: rank {rank}: rank 0 wrote no unique id to "
                               f"{path} within {timeout_s} s")
        time.sleep(0.01)
    with open(path, "rb") as f:
        uid = f.read()
    if len(uid) != ANYR_UNIQUE_ID_BYTES:
        raise ValueError(f"share_unique_id: {path} holds {len(uid)} bytes, not a unique id "
                         f"({ANYR_UNIQUE_ID_BYTES} bytes)")
    return uid


def check_devices() -> int:
    """anyrCheckDevices: the number of visible GPUs, every one able to run this build's
    kernels. Raises CudaError where no NVIDIA driver was found, the driver is older than the
    library's CUDA runtime, or no GPU is visible, and Unsupported for a GPU the library was
    built without kernels for; the message says what to do. Initializes CUDA in this process."""
    lib = library()
    n = c_int(0)
    lib.check(lib.anyrCheckDevices(byref(n)), "anyrCheckDevices")
    return n.value


def algo_name(algorithm: Union[Algo, int]) -> Optional[str]:
    """The library's short name of an algorithm ("oneshot-push", ...), or None if invalid."""
    name = library().anyrAlgoName(int(algorithm))
    return name.decode() if name is not None else None


def error_string(result: Union[Result, int]) -> str:
    """The library's one-line description of a result code."""
    s = library().anyrGetErrorString(int(result))
    return s.decode() if s else ""


def last_error() -> str:
    """Message of this thread's last failed anyreduce call."""
    return library().last_error(None)


def _fused_options(options: Optional[FusedOptions]) -> anyrFusedOptions_t:
    if options is None:
        return anyrFusedOptions_t.initializer()
    if isinstance(options, anyrFusedOptions_t):
        return options
    if not isinstance(options, FusedOptions):
        raise TypeError(f"options must be an anyreduce.FusedOptions, got {type(options).__name__}")
    return options.to_c()


def _sizes(function: str, tokens: int, hidden: int) -> Tuple[int, int]:
    return _c_size(function, "tokens", tokens), _c_size(function, "hidden", hidden)


def add_rms_norm(x: int, residual_in: int, residual_out: int, weight: int, epsilon: float,
                 norm_out: int, tokens: int, hidden: int, dtype: DTypeLike,
                 options: Optional[FusedOptions] = None, stream: int = 0) -> None:
    """anyrAddRmsNorm on raw device pointers: residual add + RMSNorm (+ quantization) of an
    already all-reduced tensor, no communication. See anyrAllReduceAddRmsNorm for the rules."""
    lib = library()
    tokens, hidden = _sizes("anyrAddRmsNorm", tokens, hidden)
    opts = _fused_options(options)
    r = lib.anyrAddRmsNorm(x or None, residual_in or None, residual_out or None, weight or None,
                           float(epsilon), norm_out or None, tokens, hidden,
                           _dtype_arg(dtype, "anyrAddRmsNorm"), byref(opts), stream or None)
    lib.check(r, "anyrAddRmsNorm")


# ---- communicator ---------------------------------------------------------------------------


class Comm:
    """An anyreduce communicator (anyrComm_t).

    Create it with ``Comm.init_rank`` (unique-id rendezvous) or ``Comm.from_nccl``. Creation,
    ``all_reduce``, ``set_algorithm`` and ``close`` are collective: every rank calls them in
    the same order with the same arguments. ``close`` (also run by ``with Comm... as c:``)
    frees the communicator; it is not run by the garbage collector, because a collective
    teardown started by one rank's GC would wait for the others.
    """

    def __init__(self, handle: int, lib: Optional[Library] = None) -> None:
        if not handle:
            raise ValueError("Comm needs a non-NULL anyrComm_t; use Comm.init_rank or Comm.from_nccl")
        self._lib = lib if lib is not None else library()
        self._handle: Optional[int] = handle
        self._all_reduce = self._lib.anyrAllReduce  # hot path: one attribute lookup less
        self._info: Dict[str, int] = {}

    # -- creation / teardown -----------------------------------------------------------------

    @classmethod
    def init_rank(cls, nranks: int, unique_id: UniqueIdLike, rank: int,
                  config: ConfigLike = None) -> "Comm":
        """anyrCommInitRank(Config): rank `rank` of `nranks`, on the current CUDA device.
        Blocks until every rank arrived or the timeout expired (the error then names the
        ranks that never arrived)."""
        lib = library()
        fn = "anyrCommInitRank"
        nranks = _c_int(fn, "nranks", nranks)
        rank = _c_int(fn, "rank", rank)
        uid = _as_unique_id(unique_id, fn)
        cfg = _as_config(config)
        handle = c_void_p()
        if cfg is None:
            r = lib.anyrCommInitRank(byref(handle), nranks, uid, rank)
        else:
            r = lib.anyrCommInitRankConfig(byref(handle), nranks, uid, rank, byref(cfg))
        lib.check(r, fn)
        return cls(handle.value, lib)

    @classmethod
    def from_nccl(cls, nccl_comm: int, config: ConfigLike = None) -> "Comm":
        """anyrCommInitFromNccl: a communicator over the ranks of an existing ncclComm_t
        (passed as an int address). The NCCL communicator must outlive this one."""
        lib = library()
        if isinstance(nccl_comm, c_void_p):
            nccl_comm = nccl_comm.value or 0
        if isinstance(nccl_comm, bool) or not isinstance(nccl_comm, int):
            raise _arg_error("anyrCommInitFromNccl", "ncclComm",
                             f"must be the ncclComm_t's address as an int (or a ctypes.c_void_p), "
                             f"got {type(nccl_comm).__name__}")
        cfg = _as_config(config)
        handle = c_void_p()
        r = lib.anyrCommInitFromNccl(byref(handle), nccl_comm or None,
                                     byref(cfg) if cfg is not None else None)
        lib.check(r, "anyrCommInitFromNccl")
        return cls(handle.value, lib)

    def close(self) -> None:
        """anyrCommDestroy (collective). Idempotent. The handle is freed even on error, except
        when another thread is inside a call on it (InvalidUsage): then nothing was freed and
        close() may be called again once that call returned."""
        h = self._handle
        if h is None:
            return
        r = self._lib.anyrCommDestroy(h)
        if r != int(Result.INVALID_USAGE):
            self._handle = None
        self._lib.check(r, "anyrCommDestroy")

    destroy = close

    def abort(self) -> None:
        """anyrCommAbort: release every waiting kernel; only close() is allowed afterwards.
        Safe from any thread."""
        self._check(self._lib.anyrCommAbort(self.handle), "anyrCommAbort")

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self._handle is not None:
            # A failure on this rank may leave the others waiting: release them first.
            try:
                self.abort()
            except AnyreduceError:
                pass
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            try:
                warnings.warn("anyreduce.Comm was never closed (close() is collective, so it is "
                              "not run by the garbage collector)", ResourceWarning, stacklevel=1)
            except Exception:  # noqa: BLE001 -- interpreter shutdown
                pass

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def handle(self) -> int:
        """The anyrComm_t as an int."""
        if self._handle is None:
            raise InvalidUsage(Result.INVALID_USAGE, "the communicator was closed")
        return self._handle

    def _check(self, r: int, function: str) -> None:
        self._lib.check(r, function, self._handle)

    # -- queries -----------------------------------------------------------------------------

    def _int_query(self, fn_name: str) -> int:
        v = self._info.get(fn_name)
        if v is None:
            out = c_int(0)
            self._check(getattr(self._lib, fn_name)(self.handle, byref(out)), fn_name)
            v = self._info[fn_name] = out.value
        return v

    @property
    def count(self) -> int:
        """Number of ranks (anyrCommCount)."""
        return self._int_query("anyrCommCount")

    size = count

    @property
    def rank(self) -> int:
        """This rank (anyrCommUserRank)."""
        return self._int_query("anyrCommUserRank")

    @property
    def device(self) -> int:
        """CUDA device index of this rank (anyrCommCuDevice)."""
        return self._int_query("anyrCommCuDevice")

    @property
    def nccl_comm(self) -> Optional[int]:
        """The communicator's ncclComm_t as an int, or None when it has none."""
        out = c_void_p()
        self._check(self._lib.anyrCommGetNcclComm(self.handle, byref(out)), "anyrCommGetNcclComm")
        return out.value

    def async_error(self) -> Optional[AnyreduceError]:
        """State of the communicator's device work without synchronizing: None while healthy,
        else the failure as an (unraised) AnyreduceError carrying its code and message."""
        out = c_int(0)
        self._check(self._lib.anyrCommGetAsyncError(self.handle, byref(out)), "anyrCommGetAsyncError")
        if out.value == 0:
            return None
        return make_error(out.value, self._lib.last_error(self._handle), "anyrCommGetAsyncError")

    def raise_if_async_error(self) -> None:
        err = self.async_error()
        if err is not None:
            raise err

    @property
    def last_error(self) -> str:
        """Message of the communicator's last failure."""
        return self._lib.last_error(self.handle)

    def set_algorithm(self, algorithm: Union[Algo, int, str]) -> None:
        """anyrCommSetAlgorithm (collective): force an algorithm; Algo.AUTO restores the
        choice. Raises Unsupported, naming why, for one this hardware does not admit."""
        if isinstance(algorithm, str):
            try:
                algorithm = Algo.parse(algorithm)
            except ValueError as e:
                raise _arg_error("anyrCommSetAlgorithm", "algorithm", str(e)) from None
        self._check(self._lib.anyrCommSetAlgorithm(self.handle, int(algorithm)), "anyrCommSetAlgorithm")

    def query_algorithm(self, count: int, dtype: DTypeLike) -> Union[Algo, int]:
        """The algorithm all_reduce would use for `count` elements of `dtype`."""
        _c_size("anyrCommQueryAlgorithm", "count", count)
        out = c_int(0)
        self._check(self._lib.anyrCommQueryAlgorithm(
            self.handle, count, _dtype_arg(dtype, "anyrCommQueryAlgorithm"), byref(out)),
            "anyrCommQueryAlgorithm")
        return _enum_or_int(Algo, out.value)

    def explain_json(self) -> str:
        """anyrCommExplain as text: topology, admission of every algorithm with its reason,
        and the thresholds in use."""
        needed = c_size_t(0)
        self._check(self._lib.anyrCommExplain(self.handle, None, 0, byref(needed)), "anyrCommExplain")
        while True:
            buf = ctypes.create_string_buffer(max(needed.value, 1))
            self._check(self._lib.anyrCommExplain(self.handle, buf, len(buf), byref(needed)),
                        "anyrCommExplain")
            if needed.value <= len(buf):
                return buf.value.decode("utf-8", "replace")

    def tune(self, budget_ms: int = 0, save_path: Optional[str] = None) -> None:
        """anyrCommTune: measure every admitted path per operation and size bucket, agree on
        the fastest (slowest rank counts) and dispatch by it from now on. Collective. budget_ms
        > 0 bounds the time; save_path (rank 0) receives the table for ANYR_TUNING_FILE."""
        budget_ms = _c_int("anyrCommTune", "budgetMs", budget_ms)
        if budget_ms < 0:
            raise _arg_error("anyrCommTune", "budgetMs", "must be >= 0 (0 = no limit)")
        path = save_path.encode() if save_path is not None else None
        self._check(self._lib.anyrCommTune(self.handle, int(budget_ms), path), "anyrCommTune")

    def counters(self) -> Dict[str, Any]:
        """anyrCommGetCounters: calls and bytes per algorithm (by name) and size bucket
        (``bucket_bytes`` gives each bucket's lower bound), and the fused/forced/captured
        totals. Counted on the host at dispatch, so graph replays are not counted."""
        from ._types import ANYR_COUNTER_BUCKETS, anyrCounters_t

        c = anyrCounters_t.prepared()
        self._check(self._lib.anyrCommGetCounters(self.handle, byref(c)), "anyrCommGetCounters")
        per_algo = {}
        for a in Algo:
            if a == Algo.AUTO:
                continue
            calls = [int(c.calls[int(a)][b]) for b in range(ANYR_COUNTER_BUCKETS)]
            nbytes = [int(c.bytes[int(a)][b]) for b in range(ANYR_COUNTER_BUCKETS)]
            if any(calls):
                per_algo[a.short_name] = {"calls": calls, "bytes": nbytes}
        return {
            "bucket_bytes": [0] + [4096 << (2 * i) for i in range(ANYR_COUNTER_BUCKETS - 1)],
            "algorithms": per_algo,
            "fused_kernel_calls": int(c.fusedKernelCalls),
            "fused_composed_calls": int(c.fusedComposedCalls),
            "forced_calls": int(c.forcedCalls),
            "captured_calls": int(c.capturedCalls),
            # fused-kernel launches by thread-block cluster size (1: a block per row)
            "fused_launches_by_cluster": {
                size: int(c.fusedLaunchesByCluster[i]) for i, size in enumerate((1, 2, 4, 8))
            },
        }

    def reset_counters(self) -> None:
        """anyrCommResetCounters."""
        self._check(self._lib.anyrCommResetCounters(self.handle), "anyrCommResetCounters")

    def explain(self) -> Dict[str, Any]:
        """anyrCommExplain parsed: ``json.loads`` of explain_json()."""
        return json.loads(self.explain_json())

    # -- collectives -------------------------------------------------------------------------

    def all_reduce(self, sendbuf: int, recvbuf: int, count: int, dtype: DTypeLike,
                   stream: int = 0, op: Union[RedOp, int] = RedOp.SUM) -> None:
        """anyrAllReduce: sum of `count` elements from device address `sendbuf` into
        `recvbuf` (equal addresses: in place), asynchronously on `stream` (a cudaStream_t as
        int; 0 = legacy default stream). Never synchronizes the host; capturable in CUDA
        graphs."""
        if count.__class__ is not int or not 0 <= count < _SIZE_T_END:
            count = _c_size("anyrAllReduce", "count", count)
        if dtype.__class__ is not DataType:
            dtype = _dtype_arg(dtype, "anyrAllReduce")
        if op.__class__ is not RedOp:
            op = _c_int("anyrAllReduce", "op", op)
        h = self._handle
        if h is None:
            raise InvalidUsage(Result.INVALID_USAGE, "the communicator was closed")
        r = self._all_reduce(sendbuf or None, recvbuf or None, count, dtype, op, h, stream or None)
        if r != 0:
            raise make_error(r, self._lib.message_for(r, "anyrAllReduce", h), "anyrAllReduce")

    def all_reduce_add_rms_norm(self, partial: int, residual_in: int, residual_out: int,
                                weight: int, epsilon: float, norm_out: int, tokens: int,
                                hidden: int, dtype: DTypeLike,
                                options: Optional[FusedOptions] = None, stream: int = 0) -> None:
        """anyrAllReduceAddRmsNorm on raw device pointers (0 = NULL):
        x = allreduce(partial); r = x + residual_in; residual_out = r;
        norm_out = r / sqrt(mean(r^2) + eps) * w (+ quantization per `options`).
        Raises FunctionNotAvailable if the loaded library predates this function."""
        fn = "anyrAllReduceAddRmsNorm"
        if not (tokens.__class__ is int and hidden.__class__ is int
                and 0 <= tokens < _SIZE_T_END and 0 <= hidden < _SIZE_T_END):
            tokens, hidden = _sizes(fn, tokens, hidden)
        call = self._lib.anyrAllReduceAddRmsNorm  # FunctionNotAvailable when not exported
        opts = _fused_options(options)
        if dtype.__class__ is not DataType:
            dtype = _dtype_arg(dtype, fn)
        h = self._handle
        if h is None:
            raise InvalidUsage(Result.INVALID_USAGE, "the communicator was closed")
        r = call(partial or None, residual_in or None, residual_out or None, weight or None,
                 float(epsilon), norm_out or None, tokens, hidden, dtype, byref(opts), h,
                 stream or None)
        if r != 0:
            raise make_error(r, self._lib.message_for(r, fn, h), fn)

    def __repr__(self) -> str:
        if self._handle is None:
            return "<anyreduce.Comm closed>"
        try:
            return f"<anyreduce.Comm rank {self.rank}/{self.count} device {self.device}>"
        except AnyreduceError:
            return f"<anyreduce.Comm 0x{self._handle:x}>"
