"""Python mirrors of the C types in include/anyreduce/anyreduce.h.

Enums are IntEnums whose member names are the C enumerator names without their prefix, in
UPPER_SNAKE_CASE (anyrCudaError -> Result.CUDA_ERROR, anyrAlgoOneShotPush ->
Algo.ONE_SHOT_PUSH); ``.c_name`` gives the C spelling back. The ctypes structures copy the
C field order exactly. python/tests/test_header.py parses the header and checks every value,
field and initializer here against it, so a change to the header that is not mirrored here
fails the tests instead of corrupting memory.
"""

from __future__ import annotations

import ctypes
import enum
import re
from dataclasses import dataclass
from typing import Optional, Union

# ---- constants (#define in anyreduce.h) ---------------------------------------------------

ANYR_MAJOR = 0
ANYR_MINOR = 1
ANYR_PATCH = 0
ANYR_VERSION_CODE = ANYR_MAJOR * 10000 + ANYR_MINOR * 100 + ANYR_PATCH
ANYR_UNIQUE_ID_BYTES = 128
ANYR_CONFIG_UNDEF_INT = -2147483647 - 1
ANYR_CONFIG_UNDEF_SIZE = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1
ANYR_CONFIG_MAGIC = 0x414E5952
ANYR_FUSED_MAGIC = 0x414E5946
ANYR_COUNTERS_MAGIC = 0x414E5943
ANYR_COUNTER_BUCKETS = 8  # message bytes: <4K, <16K, <64K, <256K, <1M, <4M, <16M, >=16M


def _snake(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).upper()


# C enumerator prefix per enum (the part before the member's own name).
_C_PREFIX = {"Algo": "anyrAlgo", "Quant": "anyrQuant", "Wire": "anyrWire",
             "PeerMemory": "anyrPeerMemory"}


class _CEnum(enum.IntEnum):
    """IntEnum that knows its C spelling."""

    @classmethod
    def c_prefix(cls) -> str:
        return _C_PREFIX.get(cls.__name__, "anyr")

    @property
    def c_name(self) -> str:
        return self.c_prefix() + "".join(p.capitalize() for p in self.name.split("_"))

    @classmethod
    def from_c_name(cls, c_name: str):
        prefix = cls.c_prefix()
        if not c_name.startswith(prefix):
            raise ValueError(f"{c_name!r} does not start with {prefix!r}")
        return cls[_snake(c_name[len(prefix):])]


class Result(_CEnum):
    """anyrResult_t."""

    SUCCESS = 0
    CUDA_ERROR = 1
    SYSTEM_ERROR = 2
    INTERNAL_ERROR = 3
    INVALID_ARGUMENT = 4
    INVALID_USAGE = 5
    REMOTE_ERROR = 6
    TIMEOUT = 7
    ABORTED = 8
    NCCL_ERROR = 9
    UNSUPPORTED = 10


class DataType(_CEnum):
    """anyrDataType_t."""

    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2

    @property
    def itemsize(self) -> int:
        return 4 if self is DataType.FLOAT32 else 2

    @classmethod
    def parse(cls, value: Union["DataType", int, str]) -> "DataType":
        """A DataType from a DataType, its int value, or a name such as "bf16", "float16"."""
        if isinstance(value, str):
            key = value.strip().lower().replace("torch.", "")
            try:
                return _DTYPE_NAMES[key]
            except KeyError:
                raise ValueError(
                    f"unknown datatype {value!r} (one of {', '.join(sorted(_DTYPE_NAMES))})"
                ) from None
        return cls(value)


_DTYPE_NAMES = {
    "float32": DataType.FLOAT32, "fp32": DataType.FLOAT32, "float": DataType.FLOAT32,
    "float16": DataType.FLOAT16, "fp16": DataType.FLOAT16, "half": DataType.FLOAT16,
    "bfloat16": DataType.BFLOAT16, "bf16": DataType.BFLOAT16,
}


class RedOp(_CEnum):
    """anyrRedOp_t."""

    SUM = 0


class Algo(_CEnum):
    """anyrAlgo_t. ``str(algo)`` / ``Algo.parse(name)`` use the library's short names.

    Each member is its C value and its short name, the one quoted in its enumerator's comment in
    the header (python/tests/test_header.py checks both; test_library.py checks the names
    against anyrAlgoName)."""

    def __new__(cls, value: int, short: str) -> "Algo":
        member = int.__new__(cls, value)
        member._value_ = value
        member._short = short
        return member

    AUTO = 0, "auto"
    ONE_SHOT_PUSH = 1, "oneshot-push"
    ONE_SHOT_PULL = 2, "oneshot-pull"
    TWO_SHOT = 3, "twoshot"
    NCCL = 4, "nccl"
    TWO_SHOT_PUSH = 5, "twoshot-push"
    HOST_ONE_SHOT = 6, "host-oneshot"
    HOST_TWO_SHOT = 7, "host-twoshot"
    HOST_COPY = 8, "host-copy"
    STAGED_PUSH = 9, "staged-push"
    STAGED_PULL = 10, "staged-pull"
    ISLANDS = 11, "islands"
    RING = 12, "ring"
    DOUBLING_PUSH = 13, "doubling-push"
    RING_COPY = 14, "ring-copy"

    @property
    def short_name(self) -> str:
        return self._short

    def __str__(self) -> str:
        return self.short_name

    @classmethod
    def parse(cls, value: Union["Algo", int, str]) -> "Algo":
        """An Algo from an Algo, its int value, its short name ("oneshot-push") or its
        member name ("ONE_SHOT_PUSH")."""
        if isinstance(value, str):
            key = value.strip()
            for algo in cls:
                if key.lower() == algo.short_name or key.upper() == algo.name:
                    return algo
            raise ValueError(
                f"unknown algorithm {value!r} (one of {', '.join(a.short_name for a in cls)})"
            )
        return cls(value)


class Wire(_CEnum):
    """anyrWire_t: wire format of the host-memory algorithms and one-shot pull (opt-in)."""

    NATIVE = 0
    FP8 = 1
    INT8 = 2

    @classmethod
    def parse(cls, value: Union["Wire", int, str]) -> "Wire":
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                raise ValueError(f"unknown wire format {value!r} ('native', 'fp8' or 'int8')") from None
        return cls(value)


class PeerMemory(_CEnum):
    """anyrPeerMemory_t: how the ranks of one host map each other's workspace."""

    NONE = 0
    AUTO = 1
    CUDA_IPC = 2
    VMM = 3

    @property
    def short_name(self) -> str:
        return self.name.lower().replace("_", "-")

    def __str__(self) -> str:
        return self.short_name

    @classmethod
    def parse(cls, value: Union["PeerMemory", int, str]) -> "PeerMemory":
        if isinstance(value, str):
            key = value.strip().lower()
            for kind in cls:
                if key == kind.short_name:
                    return kind
            raise ValueError(f"unknown peer memory kind {value!r} "
                             "('none', 'auto', 'cuda-ipc' or 'vmm')")
        return cls(value)


class Quant(_CEnum):
    """anyrQuant_t."""

    NONE = 0
    FP8 = 1
    NVFP4 = 2

    @classmethod
    def parse(cls, value: Union["Quant", int, str, None]) -> "Quant":
        if value is None:
            return cls.NONE
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                raise ValueError(f"unknown quantization {value!r} (None, 'fp8' or 'nvfp4')") from None
        return cls(value)


# The sentinel count entries (anyrNumResults, ...) are deliberately not members: they are
# not values a caller may pass. The header test knows to skip them.
NUM_SENTINELS = {
    "anyrNumResults": len(Result),
    "anyrNumTypes": len(DataType),
    "anyrNumOps": len(RedOp),
    "anyrNumAlgos": len(Algo),
    "anyrNumQuants": len(Quant),
    "anyrNumWires": len(Wire),
    "anyrNumPeerMemories": len(PeerMemory),
}

# ---- ctypes structures --------------------------------------------------------------------


class UniqueId(ctypes.Structure):
    """anyrUniqueId: typedef struct { char internal[ANYR_UNIQUE_ID_BYTES]; } anyrUniqueId;"""

    _fields_ = [("internal", ctypes.c_char * ANYR_UNIQUE_ID_BYTES)]

    @classmethod
    def from_bytes(cls, data: Union[bytes, bytearray, memoryview]) -> "UniqueId":
        data = bytes(data)
        if len(data) != ANYR_UNIQUE_ID_BYTES:
            raise ValueError(
                f"unique id must be {ANYR_UNIQUE_ID_BYTES} bytes (from get_unique_id()), "
                f"got {len(data)}"
            )
        uid = cls()
        ctypes.memmove(ctypes.addressof(uid), data, ANYR_UNIQUE_ID_BYTES)
        return uid

    def to_bytes(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self), ANYR_UNIQUE_ID_BYTES)


class anyrConfig_t(ctypes.Structure):  # noqa: N801 (C name)
    """anyrConfig_t, field for field."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("algorithm", ctypes.c_int),
        ("timeoutMs", ctypes.c_int),
        ("oneShotMaxBytes", ctypes.c_size_t),
        ("twoShotMaxBytes", ctypes.c_size_t),
        ("chunkBytes", ctypes.c_size_t),
        ("useNccl", ctypes.c_int),
        ("maxBlocks", ctypes.c_int),
        ("tuningFile", ctypes.c_void_p),  # const char*; ANYR_TUNING_FILE
        ("tuneBudgetMs", ctypes.c_int),  # ANYR_TUNE_BUDGET_MS
        ("wire", ctypes.c_int),
        ("fusedCluster", ctypes.c_int),  # ANYR_FUSED_CLUSTER
        ("peerMemory", ctypes.c_int),  # ANYR_PEER_MEMORY
    ]

    @classmethod
    def initializer(cls) -> "anyrConfig_t":
        """ANYR_CONFIG_INITIALIZER: every tunable at its "undefined" value."""
        u_int, u_size = ANYR_CONFIG_UNDEF_INT, ANYR_CONFIG_UNDEF_SIZE
        return cls(ctypes.sizeof(cls), ANYR_CONFIG_MAGIC, ANYR_VERSION_CODE, u_int, u_int,
                   u_size, u_size, u_size, u_int, u_int, None, u_int, u_int, u_int, u_int)


class anyrFusedOptions_t(ctypes.Structure):  # noqa: N801 (C name)
    """anyrFusedOptions_t, field for field (pointers as void*)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("weightPlusOne", ctypes.c_int),
        ("quant", ctypes.c_int),
        ("scale", ctypes.c_void_p),  # const float*
        ("quantOut", ctypes.c_void_p),
        ("blockScales", ctypes.c_void_p),
        ("blockScalesSwizzled", ctypes.c_void_p),
    ]

    @classmethod
    def initializer(cls) -> "anyrFusedOptions_t":
        """ANYR_FUSED_OPTIONS_INITIALIZER."""
        return cls(ctypes.sizeof(cls), ANYR_FUSED_MAGIC, 0, int(Quant.NONE), None, None, None, None)


# ---- Python-side configuration ------------------------------------------------------------

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


@dataclass
class Config:
    """Communicator configuration (anyrConfig_t). A field left at None keeps the C "undefined"
    sentinel, so the environment variable named below applies, and failing that the library's
    default. Explicit fields win over the environment. Range rules are the library's: a bad
    value comes back as InvalidArgument naming the field (e.g. 'config.maxBlocks').

    algorithm: Algo, int or short name to force        (ANYR_ALGO; default auto)
    timeout_ms: bound on every wait, ms                (ANYR_TIMEOUT_MS; default 30000)
    one_shot_max_bytes: largest one-shot message       (ANYR_ONESHOT_MAX_BYTES)
    two_shot_max_bytes: largest auto two-shot message  (ANYR_TWOSHOT_MAX_BYTES)
    chunk_bytes: staging size per rank                 (ANYR_CHUNK_BYTES; default 8 MiB)
    use_nccl: create/keep an NCCL communicator         (ANYR_USE_NCCL; default True)
    max_blocks: cap on thread blocks per kernel, 0=auto (ANYR_MAX_BLOCKS)
    wire: Wire, int or name: 'native', 'fp8', 'int8' (ANYR_WIRE; default native)
    fused_cluster: thread-block cluster size of the fused all-reduce + RMSNorm kernels:
        0=auto, 1=off, 2, 4 or 8 (ANYR_FUSED_CLUSTER; default 0)
    peer_memory: PeerMemory, int or name: 'none', 'auto', 'cuda-ipc', 'vmm' (ANYR_PEER_MEMORY;
        default auto: legacy CUDA IPC, else virtual-memory file descriptors where those map
        more pairs, as reported between containers without a shared PID namespace)
    """

    algorithm: Optional[Union[Algo, int, str]] = None
    timeout_ms: Optional[int] = None
    one_shot_max_bytes: Optional[int] = None
    two_shot_max_bytes: Optional[int] = None
    chunk_bytes: Optional[int] = None
    use_nccl: Optional[Union[bool, int]] = None
    max_blocks: Optional[int] = None
    wire: Optional[Union[Wire, int, str]] = None
    fused_cluster: Optional[int] = None
    peer_memory: Optional[Union[PeerMemory, int, str]] = None

    def to_c(self) -> anyrConfig_t:
        """The anyrConfig_t for this configuration (ANYR_CONFIG_INITIALIZER + set fields)."""
        from ._errors import InvalidArgument  # local: _errors imports this module

        c = anyrConfig_t.initializer()

        def int_field(name: str, value) -> int:
            if isinstance(value, bool):
                value = int(value)
            if not isinstance(value, int):
                raise InvalidArgument(Result.INVALID_ARGUMENT,
                                      f"argument 'config.{name}': must be an int, got {value!r}")
            if not (_INT32_MIN < value <= _INT32_MAX):  # INT32_MIN itself is the sentinel
                raise InvalidArgument(Result.INVALID_ARGUMENT,
                                      f"argument 'config.{name}': {value} does not fit a C int")
            return value

        def size_field(name: str, value) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgument(Result.INVALID_ARGUMENT,
                                      f"argument 'config.{name}': must be an int, got {value!r}")
            if not (0 <= value < ANYR_CONFIG_UNDEF_SIZE):
                raise InvalidArgument(Result.INVALID_ARGUMENT,
                                      f"argument 'config.{name}': {value} is not a valid size")
            return value

        def enum_field(name, value, kind):
            # A name (parsed by the enum: "twoshot-push", "fp8") or the enum's value.
            if isinstance(value, str):
                try:
                    value = kind.parse(value)
                except ValueError as e:
                    raise InvalidArgument(Result.INVALID_ARGUMENT,
                                          f"argument 'config.{name}': {e}") from None
            return int_field(name, int(value))

        if self.algorithm is not None:
            c.algorithm = enum_field("algorithm", self.algorithm, Algo)
        if self.timeout_ms is not None:
            c.timeoutMs = int_field("timeout_ms", self.timeout_ms)
        if self.one_shot_max_bytes is not None:
            c.oneShotMaxBytes = size_field("one_shot_max_bytes", self.one_shot_max_bytes)
        if self.two_shot_max_bytes is not None:
            c.twoShotMaxBytes = size_field("two_shot_max_bytes", self.two_shot_max_bytes)
        if self.chunk_bytes is not None:
            c.chunkBytes = size_field("chunk_bytes", self.chunk_bytes)
        if self.use_nccl is not None:
            c.useNccl = int_field("use_nccl", self.use_nccl)
        if self.max_blocks is not None:
            c.maxBlocks = int_field("max_blocks", self.max_blocks)
        if self.wire is not None:
            c.wire = enum_field("wire", self.wire, Wire)
        if self.fused_cluster is not None:
            c.fusedCluster = int_field("fused_cluster", self.fused_cluster)
        if self.peer_memory is not None:
            c.peerMemory = enum_field("peer_memory", self.peer_memory, PeerMemory)
        return c


@dataclass
class FusedOptions:
    """anyrFusedOptions_t for the raw-pointer fused calls. Pointers are ints (0 = NULL).

    weight_plus_one: y = r/rms * (1 + weight) (Gemma/Qwen) instead of r/rms * weight.
    quant: Quant.NONE, FP8 or NVFP4.
    scale: device pointer to one fp32: the FP8 per-tensor scale (q = y * (1 / scale)) or the NVFP4
        global scale g (dequantized y ~ q * block_scale * g).
    quant_out: FP8: tokens x hidden bytes; NVFP4: tokens x hidden/2 bytes (two e2m1 per byte,
        element 2i in the low nibble).
    block_scales: NVFP4 e4m3 block scales, row-major tokens x hidden/16 (or 0).
    block_scales_swizzled: the same in the 128x4 swizzled layout (rows padded to 128, scale
        columns to 4) (or 0).
    """

    weight_plus_one: bool = False
    quant: Union[Quant, int, str, None] = Quant.NONE
    scale: int = 0
    quant_out: int = 0
    block_scales: int = 0
    block_scales_swizzled: int = 0

    def to_c(self) -> anyrFusedOptions_t:
        o = anyrFusedOptions_t.initializer()
        o.weightPlusOne = 1 if self.weight_plus_one else 0
        o.quant = int(Quant.parse(self.quant))
        o.scale = self.scale or None
        o.quantOut = self.quant_out or None
        o.blockScales = self.block_scales or None
        o.blockScalesSwizzled = self.block_scales_swizzled or None
        return o


class anyrCounters_t(ctypes.Structure):  # noqa: N801 (C name)
    """anyrCounters_t, field for field."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("calls", (ctypes.c_ulonglong * ANYR_COUNTER_BUCKETS) * len(Algo)),
        ("bytes", (ctypes.c_ulonglong * ANYR_COUNTER_BUCKETS) * len(Algo)),
        ("fusedKernelCalls", ctypes.c_ulonglong),
        ("fusedComposedCalls", ctypes.c_ulonglong),
        ("forcedCalls", ctypes.c_ulonglong),
        ("capturedCalls", ctypes.c_ulonglong),
        ("fusedLaunchesByCluster", ctypes.c_ulonglong * 4),
    ]

    @classmethod
    def prepared(cls) -> "anyrCounters_t":
        """size and magic set, as the C API requires of the caller."""
        c = cls()
        c.size = ctypes.sizeof(cls)
        c.magic = ANYR_COUNTERS_MAGIC
        return c


# anyrTuneProgress_t: void (*)(int done, int total, const char* what, void* progressArg).
anyrTuneProgress_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                      ctypes.c_void_p)
ANYR_TUNE_MAGIC = 0x414E5954


class anyrTuneOptions_t(ctypes.Structure):  # noqa: N801 (C name)
    """anyrTuneOptions_t, field for field (the progress callback as anyrTuneProgress_t)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("minBytes", ctypes.c_size_t),
        ("maxBytes", ctypes.c_size_t),
        ("hidden", ctypes.c_int),
        ("maxTokens", ctypes.c_int),
        ("budgetMs", ctypes.c_int),
        ("calls", ctypes.c_int),
        ("samples", ctypes.c_int),
        ("progress", anyrTuneProgress_t),
        ("progressArg", ctypes.c_void_p),
    ]

    @classmethod
    def initializer(cls) -> "anyrTuneOptions_t":
        """ANYR_TUNE_OPTIONS_INITIALIZER (anyrCommTune's defaults)."""
        return cls(ctypes.sizeof(cls), ANYR_TUNE_MAGIC, 1024, 256 << 20, 6144, 2048, 0, 20, 9,
                   anyrTuneProgress_t(), None)
