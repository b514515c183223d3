"""anyreduce: all-reduce for tensor-parallel inference on any NVIDIA GPU and link.

Python binding of libanyreduce (ctypes; no compiled extension, no torch or numpy needed).

Layers:
  * this module: the C API on raw device pointers -- ``get_unique_id``, ``Comm``,
    ``version``, enums mirroring the C ones, ``Config`` (anyrConfig_t), errors;
  * ``anyreduce.torch`` (import it explicitly; needs torch): ``Communicator`` on tensors,
    created from a torch.distributed process group;
  * ``anyreduce.adapters``: drop-in shapes of vLLM's and SGLang's custom all-reduce
    interfaces, falling back to the caller's NCCL when anyreduce declines.
  * ``anyreduce.plugins``: the vLLM and SGLang plugins (entry points the servers load by
    themselves), which install the adapters when ``ANYREDUCE=1``.

The library is found on first use (see ``anyreduce._library`` for the search order;
``ANYREDUCE_LIBRARY`` overrides it), so importing this package never needs a GPU or the
library itself.
"""

from ._core import (
    Comm,
    add_rms_norm,
    algo_name,
    check_devices,
    error_string,
    get_unique_id,
    last_error,
    share_unique_id,
    version,
    version_code,
    version_info,
)
from ._errors import (
    Aborted,
    AnyreduceError,
    CudaError,
    FunctionNotAvailable,
    InternalError,
    InvalidArgument,
    InvalidUsage,
    LibraryNotFoundError,
    NcclError,
    RemoteError,
    SystemCallError,
    Timeout,
    Unsupported,
    error_class,
)
from ._library import ENV_VAR as LIBRARY_ENV_VAR
from ._library import library, library_path, load_library
from ._types import (
    ANYR_UNIQUE_ID_BYTES,
    ANYR_VERSION_CODE,
    Algo,
    Config,
    DataType,
    FusedOptions,
    PeerMemory,
    Quant,
    RedOp,
    Result,
    Wire,
)
from ._version import __version__

UNIQUE_ID_BYTES = ANYR_UNIQUE_ID_BYTES

__all__ = [
    "__version__",
    # calls
    "Comm", "get_unique_id", "share_unique_id", "version", "version_code", "version_info", "algo_name",
    "error_string", "last_error", "add_rms_norm", "check_devices",
    # library
    "library", "library_path", "load_library", "LIBRARY_ENV_VAR",
    # types
    "Algo", "Config", "DataType", "FusedOptions", "PeerMemory", "Quant", "RedOp", "Result",
    "Wire",
    "UNIQUE_ID_BYTES", "ANYR_VERSION_CODE",
    # errors
    "AnyreduceError", "CudaError", "SystemCallError", "InternalError", "InvalidArgument",
    "InvalidUsage", "RemoteError", "Timeout", "Aborted", "NcclError", "Unsupported",
    "FunctionNotAvailable", "LibraryNotFoundError", "error_class",
]
