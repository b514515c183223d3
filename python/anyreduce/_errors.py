"""Exceptions of the anyreduce package.

Every failure the C library reports becomes an ``AnyreduceError`` (or one of its subclasses,
chosen by the result code) whose text is the library's own message (anyrGetLastError), so
the Python user reads exactly what a C user would. ``LibraryNotFoundError`` is separate: it
means no usable libanyreduce.so was found, and it lists every place searched.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple, Type

from ._types import Result


class AnyreduceError(Exception):
    """A call into libanyreduce failed.

    Attributes:
        code: the anyrResult_t of the failure (a ``Result``, or a plain int for a code this
            package does not know).
        message: the library's message (anyrGetLastError); names the argument or the rank.
        function: the C function that failed (e.g. ``"anyrCommInitRank"``), when known.
    """

    def __init__(self, code: int, message: str, function: Optional[str] = None) -> None:
        try:
            code = Result(code)
        except ValueError:
            pass
        self.code = code
        self.message = message
        self.function = function
        super().__init__(self._text())

    def _text(self) -> str:
        name = self.code.c_name if isinstance(self.code, Result) else f"result {int(self.code)}"
        msg = self.message or "(the library gave no message)"
        if self.function and not msg.startswith(self.function):
            msg = f"{self.function}: {msg}"
        return f"{msg} [{name}]"

    def __reduce__(self):  # picklable, so errors cross torch.multiprocessing boundaries
        return (type(self), (int(self.code), self.message, self.function))


class CudaError(AnyreduceError):
    """anyrCudaError: a CUDA runtime call failed (also what "no GPU / no driver" looks like)."""


class SystemCallError(AnyreduceError):
    """anyrSystemError: an operating-system call failed (socket, fork, memory)."""


class InternalError(AnyreduceError):
    """anyrInternalError: a bug in anyreduce; please report it."""


class InvalidArgument(AnyreduceError, ValueError):
    """anyrInvalidArgument: an argument broke a documented rule; the message names it."""


class InvalidUsage(AnyreduceError):
    """anyrInvalidUsage: the call is not allowed in this state (e.g. after destroy)."""


class RemoteError(AnyreduceError):
    """anyrRemoteError: another rank failed or sent something invalid."""


class Timeout(AnyreduceError, TimeoutError):
    """anyrTimeout: a bounded wait expired; the message names the rank waited for."""


class Aborted(AnyreduceError):
    """anyrAborted: the communicator was aborted."""


class NcclError(AnyreduceError):
    """anyrNcclError: an NCCL call failed."""


class Unsupported(AnyreduceError):
    """anyrUnsupported: this hardware or build cannot do what was asked."""


class FunctionNotAvailable(Unsupported, NotImplementedError):
    """The loaded libanyreduce.so does not export a function that anyreduce.h declares
    (a library built before that function existed). Code: anyrUnsupported."""


ERROR_CLASSES: Dict[Result, Type[AnyreduceError]] = {
    Result.CUDA_ERROR: CudaError,
    Result.SYSTEM_ERROR: SystemCallError,
    Result.INTERNAL_ERROR: InternalError,
    Result.INVALID_ARGUMENT: InvalidArgument,
    Result.INVALID_USAGE: InvalidUsage,
    Result.REMOTE_ERROR: RemoteError,
    Result.TIMEOUT: Timeout,
    Result.ABORTED: Aborted,
    Result.NCCL_ERROR: NcclError,
    Result.UNSUPPORTED: Unsupported,
}


def error_class(code: int) -> Type[AnyreduceError]:
    """The exception class for an anyrResult_t (``AnyreduceError`` for unknown codes)."""
    try:
        return ERROR_CLASSES.get(Result(code), AnyreduceError)
    except ValueError:
        return AnyreduceError


def make_error(code: int, message: str, function: Optional[str] = None) -> AnyreduceError:
    return error_class(code)(code, message, function)


class LibraryNotFoundError(ImportError):
    """No usable libanyreduce.so was found. ``tried`` lists (place, reason) for every place
    searched, in search order."""

    def __init__(self, tried: Sequence[Tuple[str, str]], hint: str = "") -> None:
        self.tried = list(tried)
        lines = ["libanyreduce.so could not be loaded. Searched, in order:"]
        for i, (place, why) in enumerate(self.tried, 1):
            lines.append(f"  {i}. {place}: {why}")
        lines.append(
            hint
            or "Build it (cmake -S . -B build && cmake --build build --target anyreduce) and set "
            "ANYREDUCE_LIBRARY=/path/to/libanyreduce.so, or install the wheel, which carries it "
            "(pip install ./python)."
        )
        super().__init__("\n".join(lines))
