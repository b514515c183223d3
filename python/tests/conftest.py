"""Shared setup of the anyreduce Python tests.

* Tests import the package from this checkout (python/), unless ANYREDUCE_TEST_INSTALLED=1
  asks for the installed one (a wheel installed in the running environment); then importing it
  from python/ is an error. PACKAGE_DIR is the package under test.
* The library under test: $ANYREDUCE_LIBRARY when set (it must exist, else the library tests
  fail); else, for the installed package, the library its wheel carries (not exported, so
  spawned processes find it as users do); else the newest build/src or
  build-*/src/libanyreduce.so of this checkout (then exported as ANYREDUCE_LIBRARY, so spawned
  workers load the same file). With none, the tests that need the library skip and say why.
* `gpu` tests need torch and 2 CUDA GPUs; `gpu_shared` tests need torch and one (their ranks
  share GPUs where there are fewer than 2). Both skip with the reason otherwise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Tuple

import pytest

TESTS_DIR = Path(__file__).resolve().parent
PYTHON_DIR = TESTS_DIR.parent
REPO_ROOT = PYTHON_DIR.parent
HEADER_PATH = REPO_ROOT / "include" / "anyreduce" / "anyreduce.h"

INSTALLED = os.environ.get("ANYREDUCE_TEST_INSTALLED") == "1"
if not INSTALLED:
    sys.path.insert(0, str(PYTHON_DIR))
sys.path.insert(0, str(TESTS_DIR))  # _header, _gpu_worker

import anyreduce as _package  # noqa: E402  (after the path is set)

PACKAGE_DIR = Path(_package.__file__).resolve().parent
# The folder to put on PYTHONPATH for a subprocess to import the same package.
PACKAGE_PARENT = PACKAGE_DIR.parent
if INSTALLED and PYTHON_DIR in PACKAGE_DIR.parents:
    raise RuntimeError(f"ANYREDUCE_TEST_INSTALLED=1 but anyreduce was imported from {PACKAGE_DIR}, "
                       "the checkout: run pytest from outside it with the installed package first "
                       "on sys.path")
BUNDLED_LIBRARY = PACKAGE_DIR / "_lib" / "libanyreduce.so"


def _built_library() -> Tuple[Optional[Path], str]:
    env = os.environ.get("ANYREDUCE_LIBRARY")
    if env:
        # Absolute, so subprocesses started in other folders load the same file.
        os.environ["ANYREDUCE_LIBRARY"] = os.path.abspath(env)
        return Path(os.path.abspath(env)), "$ANYREDUCE_LIBRARY"
    if INSTALLED:
        if BUNDLED_LIBRARY.is_file():
            return BUNDLED_LIBRARY, "the installed package's _lib/"
        return None, ""
    found = [p for d in [REPO_ROOT / "build", *REPO_ROOT.glob("build-*")]
             for p in [d / "src" / "libanyreduce.so"] if p.is_file()]
    if not found:
        return None, ""
    newest = max(found, key=lambda p: p.stat().st_mtime)
    return newest, f"newest build folder ({newest.parent.parent.name})"


BUILT_LIBRARY, BUILT_LIBRARY_SOURCE = _built_library()
if BUILT_LIBRARY is not None and "ANYREDUCE_LIBRARY" not in os.environ and not INSTALLED:
    os.environ["ANYREDUCE_LIBRARY"] = str(BUILT_LIBRARY)

NO_LIBRARY_REASON = (
    "no libanyreduce.so built: set ANYREDUCE_LIBRARY=/path/to/libanyreduce.so, or build the "
    "`anyreduce` target into build/ (cmake -S . -B build && cmake --build build --target anyreduce)"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs torch and at least 2 CUDA GPUs (skipped otherwise)")
    config.addinivalue_line("markers", "gpu_shared: needs torch and a CUDA GPU; ranks share GPUs "
                            "where there are fewer than 2 (skipped otherwise)")


def gpu_skip_reason(min_gpus: int = 2) -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    n = torch.cuda.device_count()
    if n < min_gpus:
        return f"needs {min_gpus} CUDA GPUs, torch sees {n}"
    if BUILT_LIBRARY is None:
        return NO_LIBRARY_REASON
    return None


def pytest_collection_modifyitems(config: pytest.Config, items) -> None:
    for marker, min_gpus in (("gpu", 2), ("gpu_shared", 1)):
        marked = [item for item in items if marker in item.keywords]
        reason = gpu_skip_reason(min_gpus) if marked else None
        if reason is not None:
            for item in marked:
                item.add_marker(pytest.mark.skip(reason=f"{marker} test: {reason}"))


@pytest.fixture(scope="session")
def header():
    from _header import Header

    if not HEADER_PATH.is_file():
        pytest.skip(f"header not found at {HEADER_PATH} (tests run outside the source checkout)")
    return Header.load(HEADER_PATH)


@pytest.fixture(scope="session")
def lib_path() -> Path:
    if BUILT_LIBRARY is None:
        pytest.skip(NO_LIBRARY_REASON)
    if not BUILT_LIBRARY.is_file():
        pytest.fail(f"ANYREDUCE_LIBRARY={BUILT_LIBRARY} does not exist")
    return BUILT_LIBRARY


@pytest.fixture()
def ar(lib_path):
    """The anyreduce package with the library under test loaded."""
    import anyreduce

    anyreduce.load_library(str(lib_path))
    return anyreduce


def have_gpu_device_nodes() -> bool:
    """Whether this machine has NVIDIA device nodes (a driver and a GPU, as far as we can tell
    without CUDA)."""
    return Path("/dev/nvidiactl").exists() and any(Path("/dev").glob("nvidia[0-9]*"))
