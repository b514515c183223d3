"""Finding and loading libanyreduce.so, and the table of its C functions.

The table follows vLLM's ctypes wrapper habit: one entry per C function of
include/anyreduce/anyreduce.h, with the C prototype quoted above it, from which the ctypes
argtypes/restype are set. python/tests/test_header.py parses the header and checks that the
table and the header list the same functions with the same argument types.

Search order for the library (the first that loads and exports every required function wins):
  1. $ANYREDUCE_LIBRARY (a file; when set, it is the only place tried)
  2. inside the package: anyreduce/_lib/libanyreduce.so, where the wheel puts the library it
     carries (python/_backend/anyreduce_build.py)
  3. the install prefix: <sys.prefix>/lib, lib64 and lib/<multiarch>
  4. the build folders of the source checkout this package sits in (and of the checkout that
     contains the current directory): build/src, then build-*/src, newest library first
  5. the system loader (LD_LIBRARY_PATH, ldconfig cache): "libanyreduce.so.<major>",
     "libanyreduce.so"
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import sysconfig
import threading
from ctypes import POINTER, c_char_p, c_float, c_int, c_longlong, c_size_t, c_void_p
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._errors import FunctionNotAvailable, LibraryNotFoundError, make_error
from ._types import (
    ANYR_MAJOR,
    Result,
    UniqueId,
    anyrConfig_t,
    anyrCounters_t,
    anyrFusedOptions_t,
    anyrTuneOptions_t,
)

ENV_VAR = "ANYREDUCE_LIBRARY"
LIB_NAME = "libanyreduce.so"

# C type aliases, so the table below reads like the header.
anyrResult_t = c_int
anyrComm_t = c_void_p
anyrDataType_t = c_int
anyrRedOp_t = c_int
anyrAlgo_t = c_int
anyrPeerMemory_t = c_int
cudaStream_t = c_void_p


class Function(NamedTuple):
    name: str
    restype: Any
    argtypes: Tuple[Any, ...]
    # Declared in the header but possibly absent from an older library: looked up on first
    # use; calling it then raises FunctionNotAvailable instead of failing the load.
    lazy: bool = False


FUNCTIONS: List[Function] = [
    # anyrResult_t anyrGetVersion(int* version);
    Function("anyrGetVersion", anyrResult_t, (POINTER(c_int),)),
    # anyrResult_t anyrGetUniqueId(anyrUniqueId* uniqueId);
    Function("anyrGetUniqueId", anyrResult_t, (POINTER(UniqueId),)),
    # anyrResult_t anyrCommInitRank(anyrComm_t* comm, int nranks, anyrUniqueId uniqueId,
    #                               int rank);
    Function("anyrCommInitRank", anyrResult_t, (POINTER(anyrComm_t), c_int, UniqueId, c_int)),
    # anyrResult_t anyrCommInitRankConfig(anyrComm_t* comm, int nranks, anyrUniqueId uniqueId,
    #                                     int rank, const anyrConfig_t* config);
    Function("anyrCommInitRankConfig", anyrResult_t,
             (POINTER(anyrComm_t), c_int, UniqueId, c_int, POINTER(anyrConfig_t))),
    # anyrResult_t anyrCommInitFromNccl(anyrComm_t* comm, void* ncclComm,
    #                                   const anyrConfig_t* config);
    Function("anyrCommInitFromNccl", anyrResult_t,
             (POINTER(anyrComm_t), c_void_p, POINTER(anyrConfig_t))),
    # anyrResult_t anyrCommDestroy(anyrComm_t comm);
    Function("anyrCommDestroy", anyrResult_t, (anyrComm_t,)),
    # anyrResult_t anyrCommAbort(anyrComm_t comm);
    Function("anyrCommAbort", anyrResult_t, (anyrComm_t,)),
    # anyrResult_t anyrCommGetAsyncError(anyrComm_t comm, anyrResult_t* asyncError);
    Function("anyrCommGetAsyncError", anyrResult_t, (anyrComm_t, POINTER(anyrResult_t))),
    # anyrResult_t anyrCommCount(const anyrComm_t comm, int* count);
    Function("anyrCommCount", anyrResult_t, (anyrComm_t, POINTER(c_int))),
    # anyrResult_t anyrCommUserRank(const anyrComm_t comm, int* rank);
    Function("anyrCommUserRank", anyrResult_t, (anyrComm_t, POINTER(c_int))),
    # anyrResult_t anyrCommCuDevice(const anyrComm_t comm, int* device);
    Function("anyrCommCuDevice", anyrResult_t, (anyrComm_t, POINTER(c_int))),
    # anyrResult_t anyrCommGetNcclComm(const anyrComm_t comm, void** ncclComm);
    Function("anyrCommGetNcclComm", anyrResult_t, (anyrComm_t, POINTER(c_void_p))),
    # anyrResult_t anyrAllReduce(const void* sendbuff, void* recvbuff, size_t count,
    #                            anyrDataType_t datatype, anyrRedOp_t op, anyrComm_t comm,
    #                            cudaStream_t stream);
    Function("anyrAllReduce", anyrResult_t,
             (c_void_p, c_void_p, c_size_t, anyrDataType_t, anyrRedOp_t, anyrComm_t,
              cudaStream_t)),
    # anyrResult_t anyrAllReduceAddRmsNorm(const void* partial, const void* residualIn,
    #                                      void* residualOut, const void* weight, float epsilon,
    #                                      void* normOut, size_t tokens, size_t hidden,
    #                                      anyrDataType_t datatype,
    #                                      const anyrFusedOptions_t* options, anyrComm_t comm,
    #                                      cudaStream_t stream);
    Function("anyrAllReduceAddRmsNorm", anyrResult_t,
             (c_void_p, c_void_p, c_void_p, c_void_p, c_float, c_void_p, c_size_t, c_size_t,
              anyrDataType_t, POINTER(anyrFusedOptions_t), anyrComm_t, cudaStream_t),
             lazy=True),
    # anyrResult_t anyrAddRmsNorm(const void* x, const void* residualIn, void* residualOut,
    #                             const void* weight, float epsilon, void* normOut,
    #                             size_t tokens, size_t hidden, anyrDataType_t datatype,
    #                             const anyrFusedOptions_t* options, cudaStream_t stream);
    Function("anyrAddRmsNorm", anyrResult_t,
             (c_void_p, c_void_p, c_void_p, c_void_p, c_float, c_void_p, c_size_t, c_size_t,
              anyrDataType_t, POINTER(anyrFusedOptions_t), cudaStream_t),
             lazy=True),
    # anyrResult_t anyrCommSetAlgorithm(anyrComm_t comm, anyrAlgo_t algorithm);
    Function("anyrCommSetAlgorithm", anyrResult_t, (anyrComm_t, anyrAlgo_t)),
    # anyrResult_t anyrCommQueryAlgorithm(const anyrComm_t comm, size_t count,
    #                                     anyrDataType_t datatype, anyrAlgo_t* algorithm);
    Function("anyrCommQueryAlgorithm", anyrResult_t,
             (anyrComm_t, c_size_t, anyrDataType_t, POINTER(anyrAlgo_t))),
    # anyrResult_t anyrCommExplain(const anyrComm_t comm, char* buf, size_t len,
    #                              size_t* needed);
    Function("anyrCommExplain", anyrResult_t, (anyrComm_t, c_char_p, c_size_t, POINTER(c_size_t))),
    # anyrResult_t anyrCommTune(anyrComm_t comm, int budgetMs, const char* savePath);
    Function("anyrCommTune", anyrResult_t, (anyrComm_t, c_int, c_char_p)),
    # anyrResult_t anyrCommGetCounters(const anyrComm_t comm, anyrCounters_t* counters);
    Function("anyrCommGetCounters", anyrResult_t, (anyrComm_t, POINTER(anyrCounters_t))),
    # anyrResult_t anyrCommResetCounters(anyrComm_t comm);
    Function("anyrCommResetCounters", anyrResult_t, (anyrComm_t,)),
    # const char* anyrPeerMemoryName(anyrPeerMemory_t kind);
    Function("anyrPeerMemoryName", c_char_p, (anyrPeerMemory_t,)),
    # anyrResult_t anyrParseSize(const char* text, size_t* bytes);
    Function("anyrParseSize", anyrResult_t, (c_char_p, POINTER(c_size_t))),
    # anyrResult_t anyrConfigCheckField(const char* field, long long value, int* valid,
    #                                   const char** rule);
    Function("anyrConfigCheckField", anyrResult_t,
             (c_char_p, c_longlong, POINTER(c_int), POINTER(c_char_p))),
    # anyrResult_t anyrGetEnvParams(char* buf, size_t len, size_t* needed);
    Function("anyrGetEnvParams", anyrResult_t, (c_char_p, c_size_t, POINTER(c_size_t))),
    # anyrResult_t anyrCheckDevices(int* count);
    Function("anyrCheckDevices", anyrResult_t, (POINTER(c_int),)),
    # anyrResult_t anyrProbeTopology(int measure, const char* savePath, char* buf, size_t len,
    #                                size_t* needed);
    Function("anyrProbeTopology", anyrResult_t,
             (c_int, c_char_p, c_char_p, c_size_t, POINTER(c_size_t))),
    # anyrResult_t anyrDescribeTopology(const char* path, char* buf, size_t len,
    #                                   size_t* needed);
    Function("anyrDescribeTopology", anyrResult_t,
             (c_char_p, c_char_p, c_size_t, POINTER(c_size_t))),
    # anyrResult_t anyrExplainTopology(const char* path, int nranks, int ncclAvailable,
    #                                  const char* tuningFile, const anyrConfig_t* config,
    #                                  char* buf, size_t len, size_t* needed);
    Function("anyrExplainTopology", anyrResult_t,
             (c_char_p, c_int, c_int, c_char_p, POINTER(anyrConfig_t), c_char_p, c_size_t,
              POINTER(c_size_t))),
    # anyrResult_t anyrCommDescribePaths(const anyrComm_t comm, char* buf, size_t len,
    #                                    size_t* needed);
    Function("anyrCommDescribePaths", anyrResult_t,
             (anyrComm_t, c_char_p, c_size_t, POINTER(c_size_t))),
    # anyrResult_t anyrCommForcePath(anyrComm_t comm, const char* op, const char* path);
    Function("anyrCommForcePath", anyrResult_t, (anyrComm_t, c_char_p, c_char_p)),
    # anyrResult_t anyrCommQueryPath(const anyrComm_t comm, const char* op, size_t bytes,
    #                                char* buf, size_t len, size_t* needed);
    Function("anyrCommQueryPath", anyrResult_t,
             (anyrComm_t, c_char_p, c_size_t, c_char_p, c_size_t, POINTER(c_size_t))),
    # anyrResult_t anyrCommTuneWithOptions(anyrComm_t comm, const anyrTuneOptions_t* options,
    #                                      const char* savePath);
    Function("anyrCommTuneWithOptions", anyrResult_t,
             (anyrComm_t, POINTER(anyrTuneOptions_t), c_char_p)),
    # const char* anyrAlgoName(anyrAlgo_t algorithm);
    Function("anyrAlgoName", c_char_p, (anyrAlgo_t,)),
    # const char* anyrGetErrorString(anyrResult_t result);
    Function("anyrGetErrorString", c_char_p, (anyrResult_t,)),
    # const char* anyrGetLastError(anyrComm_t comm);
    Function("anyrGetLastError", c_char_p, (anyrComm_t,)),
]

FUNCTIONS_BY_NAME: Dict[str, Function] = {f.name: f for f in FUNCTIONS}


class _Unusable(Exception):
    """A candidate file that exists but cannot serve (fails to load, lacks functions)."""


class Library:
    """A loaded libanyreduce.so with every table entry bound as an attribute of the same
    name (``lib.anyrAllReduce(...)``). Lazy entries are bound on first access."""

    def __init__(self, path: str, dll: Optional[ctypes.CDLL] = None) -> None:
        self.path = path
        try:
            self._dll = dll if dll is not None else ctypes.CDLL(path)
        except OSError as e:
            raise _Unusable(f"found but failed to load: {e}") from None
        missing = [f.name for f in FUNCTIONS if not f.lazy and not self._bind(f)]
        if missing:
            raise _Unusable(
                "loaded but does not export " + ", ".join(missing)
                + " (not a libanyreduce.so of this version?)"
            )

    def _bind(self, f: Function) -> bool:
        try:
            fn = getattr(self._dll, f.name)
        except AttributeError:
            return False
        fn.restype = f.restype
        fn.argtypes = list(f.argtypes)
        setattr(self, f.name, fn)  # instance attribute: later lookups skip __getattr__
        return True

    def has_function(self, name: str) -> bool:
        """Whether the library exports the table entry `name` (binding it if so)."""
        if name in self.__dict__:
            return True
        f = FUNCTIONS_BY_NAME.get(name)
        return f is not None and self._bind(f)

    def __getattr__(self, name: str):
        # Only reached for names not bound yet: the lazy entries, or unknown names.
        f = FUNCTIONS_BY_NAME.get(name)
        if f is None:
            raise AttributeError(name)
        if not self._bind(f):
            raise FunctionNotAvailable(
                Result.UNSUPPORTED,
                f"{name} is declared in anyreduce.h but {self.path} does not export it "
                "(the library was built before this function existed; rebuild libanyreduce)",
                name,
            )
        return self.__dict__[name]

    # -- error helpers ----------------------------------------------------------------------

    def last_error(self, comm: Optional[int] = None) -> str:
        msg = self.anyrGetLastError(comm)
        return msg.decode("utf-8", "replace") if msg else ""

    def message_for(self, result: int, function: str, comm: Optional[int] = None) -> str:
        """The library's message for a failure `function` just returned. The library prefixes
        every recorded message with the C function's name; a message without it is left over
        from an earlier failure (the call recorded none), so it is not used."""
        msg = self.last_error(comm)
        if msg.startswith(function):
            return msg
        desc = self.anyrGetErrorString(int(result))
        desc = desc.decode("utf-8", "replace") if desc else f"result {int(result)}"
        return (f"{function}: {desc} (the library recorded no message for this call; "
                "its log on stderr (ANYR_DEBUG=WARN or INFO) may say more)")

    def check(self, result: int, function: str, comm: Optional[int] = None) -> None:
        """Raise the AnyreduceError for a non-success result, with the library's message."""
        if result != 0:
            raise make_error(result, self.message_for(result, function, comm), function)

    def __repr__(self) -> str:
        return f"<anyreduce.Library {self.path}>"


# ---- search -------------------------------------------------------------------------------


def _versioned_files(folder: Path) -> List[Path]:
    """libanyreduce.so, then libanyreduce.so.<major>, then any other libanyreduce.so.* in
    `folder` (existing files only)."""
    out: List[Path] = []
    for name in (LIB_NAME, f"{LIB_NAME}.{ANYR_MAJOR}"):
        p = folder / name
        if p.is_file():
            out.append(p)
    for p in sorted(folder.glob(f"{LIB_NAME}.*")):
        if p.is_file() and p not in out:
            out.append(p)
    return out


def _is_checkout(root: Path) -> bool:
    return (root / "include" / "anyreduce" / "anyreduce.h").is_file()


def _checkout_roots() -> List[Path]:
    roots: List[Path] = []
    here = Path(__file__).resolve().parent  # .../python/anyreduce
    cwd = Path.cwd().resolve()
    for cand in [here.parent.parent, cwd, *cwd.parents]:
        if _is_checkout(cand) and cand not in roots:
            roots.append(cand)
    return roots


def _build_dirs(root: Path) -> List[Path]:
    dirs = [root / "build" / "src"]

    def newest(d: Path) -> float:
        files = _versioned_files(d)
        return max((f.stat().st_mtime for f in files), default=0.0)

    others = [Path(p) / "src" for p in glob.glob(str(root / "build-*")) if Path(p).is_dir()]
    dirs += sorted(others, key=newest, reverse=True)
    return dirs


def _prefix_dirs() -> List[Path]:
    dirs: List[Path] = []
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for prefix in dict.fromkeys([sys.prefix, sys.base_prefix]):
        base = Path(prefix)
        for sub in ["lib", "lib64"] + ([f"lib/{multiarch}"] if multiarch else []):
            if base / sub not in dirs:
                dirs.append(base / sub)
    return dirs


_NO_CHECKOUT = Path("<no source checkout>")


def search_places() -> List[Tuple[str, Optional[Path]]]:
    """Every (description, folder) searched after $ANYREDUCE_LIBRARY, in order; folder None
    means the system loader."""
    places: List[Tuple[str, Optional[Path]]] = [
        ("package _lib/ folder", Path(__file__).resolve().parent / "_lib")
    ]
    places += [("install prefix", d) for d in _prefix_dirs()]
    roots = _checkout_roots()
    for root in roots:
        places += [("build folder", d) for d in _build_dirs(root)]
    if not roots:
        places.append(("build folders", _NO_CHECKOUT))
    places.append(("system loader", None))
    return places


def find_library() -> Tuple[Library, List[Tuple[str, str]]]:
    """Search in the documented order; return (library, places tried before it). Raise
    LibraryNotFoundError listing every place searched when nothing usable is found."""
    tried: List[Tuple[str, str]] = []
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        place = f"${ENV_VAR}={env}"
        if not p.is_file():
            tried.append((place, "no such file"))
        else:
            try:
                return Library(os.path.abspath(p)), tried
            except _Unusable as e:
                tried.append((place, str(e)))
        raise LibraryNotFoundError(
            tried,
            f"${ENV_VAR} is set, so no other place was searched; point it at a built "
            f"{LIB_NAME} or unset it.",
        )
    tried.append((f"${ENV_VAR}", "not set"))

    for desc, folder in search_places():
        if folder is None:
            names = [f"{LIB_NAME}.{ANYR_MAJOR}", LIB_NAME]
            found = ctypes.util.find_library("anyreduce")
            if found and found not in names:
                names.append(found)
            for name in names:
                try:
                    dll = ctypes.CDLL(name)
                except OSError as e:
                    tried.append((f"{desc} ({name})", f"not found ({e})"))
                    continue
                try:
                    return Library(name, dll), tried
                except _Unusable as e:
                    tried.append((f"{desc} ({name})", str(e)))
            continue
        if folder is _NO_CHECKOUT:
            tried.append((desc, "none: neither the package nor the current directory is inside "
                                "an anyreduce source checkout"))
            continue
        files = _versioned_files(folder) if folder.is_dir() else []
        if not files:
            tried.append((f"{desc} {folder}", "no " + LIB_NAME + "*"))
            continue
        for f in files:
            try:
                return Library(str(f), None), tried
            except _Unusable as e:
                tried.append((f"{desc} {f}", str(e)))
    raise LibraryNotFoundError(tried)


_lock = threading.Lock()
_library: Optional[Library] = None


def library() -> Library:
    """The process-wide library, loaded on first use (so `import anyreduce` never fails)."""
    global _library
    lib = _library
    if lib is None:
        with _lock:
            if _library is None:
                _library, _ = find_library()
            lib = _library
    return lib


def library_path() -> str:
    """Path (or loader name) of the loaded libanyreduce."""
    return library().path


def load_library(path: Optional[str] = None) -> Library:
    """Load the library now (from `path` if given, else by the search order) and make it the
    process-wide one. Raises LibraryNotFoundError."""
    global _library
    with _lock:
        if path is not None:
            p = Path(path).expanduser()
            if not p.is_file():
                raise LibraryNotFoundError([(str(p), "no such file")], "load_library() was given "
                                           "a path that does not exist.")
            try:
                _library = Library(os.path.abspath(p))
            except _Unusable as e:
                raise LibraryNotFoundError([(str(p), str(e))]) from None
        else:
            _library, _ = find_library()
        return _library


def declared_functions() -> Sequence[str]:
    return [f.name for f in FUNCTIONS]
