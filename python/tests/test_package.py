"""The package itself: imports without torch, GPU or library; finds the library in the
documented order; errors map onto the documented classes. CPU only."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import BUNDLED_LIBRARY, INSTALLED, PACKAGE_DIR, PACKAGE_PARENT, REPO_ROOT

import anyreduce
from anyreduce import _library


def run_python(code: str, *, cwd: Path, env_updates=None, pythonpath=None, drop_env=()):
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (pythonpath or [PACKAGE_PARENT]))
    env.update(env_updates or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_import_needs_no_torch_no_library_no_gpu(tmp_path):
    # A library path that does not exist: importing must still work, and must not load torch.
    r = run_python("""
        import sys
        import anyreduce
        assert "torch" not in sys.modules, "import anyreduce imported torch"
        assert "numpy" not in sys.modules, "import anyreduce imported numpy"
        assert anyreduce._library._library is None, "the library was loaded at import"
        print(anyreduce.__version__, anyreduce.DataType.BFLOAT16.c_name)
    """, cwd=tmp_path, env_updates={"ANYREDUCE_LIBRARY": str(tmp_path / "missing.so")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [anyreduce.__version__, "anyrBfloat16"]


def test_missing_library_raises_library_not_found_listing_places(tmp_path):
    r = run_python("""
        import anyreduce
        try:
            anyreduce.get_unique_id()
        except anyreduce.LibraryNotFoundError as e:
            assert isinstance(e, ImportError)
            print(len(e.tried)); print(e)
        else:
            raise SystemExit("no error")
    """, cwd=tmp_path, env_updates={"ANYREDUCE_LIBRARY": str(tmp_path / "missing.so")})
    assert r.returncode == 0, r.stderr
    assert "missing.so: no such file" in r.stdout
    assert "ANYREDUCE_LIBRARY is set, so no other place was searched" in r.stdout


def test_search_lists_every_place_when_nothing_is_found(tmp_path):
    # A copy of the package outside any checkout, run from an empty folder, no env var:
    # nothing can be found, and the error names every place of the documented order.
    pkg = tmp_path / "site"
    shutil.copytree(PACKAGE_DIR, pkg / "anyreduce",
                    ignore=shutil.ignore_patterns("_lib", "__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    r = run_python("""
        import anyreduce
        from anyreduce import _library
        try:
            _library.find_library()
        except anyreduce.LibraryNotFoundError as e:
            print(e)
        else:
            print("FOUND", _library.find_library()[0].path)
    """, cwd=work, pythonpath=[pkg], drop_env=("ANYREDUCE_LIBRARY", "LD_LIBRARY_PATH"))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    if out.startswith("FOUND"):
        pytest.skip(f"a libanyreduce is installed system-wide ({out.strip()}); cannot test "
                    "the not-found path here")
    order = ["$ANYREDUCE_LIBRARY: not set", "package _lib/ folder", "install prefix",
             "build folders: none", "system loader"]
    positions = [out.index(s) for s in order]
    assert positions == sorted(positions), out
    assert str(pkg / "anyreduce" / "_lib") in out
    assert f"{sys.prefix}/lib" in out


def test_package_lib_folder_wins_over_build_folders(lib_path, tmp_path):
    pkg = tmp_path / "site"
    shutil.copytree(PACKAGE_DIR, pkg / "anyreduce",
                    ignore=shutil.ignore_patterns("_lib", "__pycache__"))
    (pkg / "anyreduce" / "_lib").mkdir()
    bundled = pkg / "anyreduce" / "_lib" / "libanyreduce.so"
    shutil.copy2(os.path.realpath(lib_path), bundled)
    # Run from inside the checkout so its build folders are candidates too.
    r = run_python("""
        import anyreduce
        print(anyreduce.library_path()); print(anyreduce.version())
    """, cwd=REPO_ROOT, pythonpath=[pkg], drop_env=("ANYREDUCE_LIBRARY",))
    assert r.returncode == 0, r.stderr
    path, ver = r.stdout.split()
    assert path == str(bundled)
    assert ver == anyreduce.__version__


def test_checkout_build_folder_is_found_without_env(lib_path):
    if INSTALLED:
        pytest.skip("the installed package's own library comes before the checkout's build folders")
    if not any((REPO_ROOT / d / "src" / "libanyreduce.so").is_file()
               for d in ["build"] + [p.name for p in REPO_ROOT.glob("build-*")]):
        pytest.skip("the library under test is not in this checkout's build folders")
    r = run_python("""
        import anyreduce
        print(anyreduce.library_path())
    """, cwd=REPO_ROOT, drop_env=("ANYREDUCE_LIBRARY",))
    assert r.returncode == 0, r.stderr
    found = Path(r.stdout.strip())
    if found.parent.parent.parent != REPO_ROOT:
        pytest.skip(f"an installed libanyreduce ({found}) shadows this checkout's build folders; "
                    "cannot test finding the build folder here")
    assert found.parent.name == "src" and found.parent.parent.name.startswith("build"), found


def test_env_var_is_exclusive_and_exact(lib_path, tmp_path):
    r = run_python("""
        import anyreduce
        print(anyreduce.library_path())
    """, cwd=tmp_path, env_updates={"ANYREDUCE_LIBRARY": str(lib_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.abspath(lib_path)


def test_a_file_that_is_not_the_library_is_rejected(tmp_path):
    fake = tmp_path / "libanyreduce.so"
    fake.write_bytes(b"not an ELF file")
    with pytest.raises(anyreduce.LibraryNotFoundError) as ei:
        anyreduce.load_library(str(fake))
    assert "failed to load" in str(ei.value)
    assert ei.value.tried[0][0] == str(fake)


def test_error_classes_follow_result_codes():
    from anyreduce import Result

    expected = {
        Result.CUDA_ERROR: anyreduce.CudaError,
        Result.SYSTEM_ERROR: anyreduce.SystemCallError,
        Result.INTERNAL_ERROR: anyreduce.InternalError,
        Result.INVALID_ARGUMENT: anyreduce.InvalidArgument,
        Result.INVALID_USAGE: anyreduce.InvalidUsage,
        Result.REMOTE_ERROR: anyreduce.RemoteError,
        Result.TIMEOUT: anyreduce.Timeout,
        Result.ABORTED: anyreduce.Aborted,
        Result.NCCL_ERROR: anyreduce.NcclError,
        Result.UNSUPPORTED: anyreduce.Unsupported,
    }
    assert set(expected) == set(Result) - {Result.SUCCESS}
    for code, cls in expected.items():
        err = anyreduce.error_class(code)(code, "msg", "anyrX")
        assert type(err) is cls and isinstance(err, anyreduce.AnyreduceError)
        assert err.code is code and err.message == "msg" and err.function == "anyrX"
        assert code.c_name in str(err) and "msg" in str(err)
    assert issubclass(anyreduce.InvalidArgument, ValueError)
    assert issubclass(anyreduce.Timeout, TimeoutError)
    assert issubclass(anyreduce.FunctionNotAvailable, anyreduce.Unsupported)
    assert issubclass(anyreduce.FunctionNotAvailable, NotImplementedError)
    assert anyreduce.error_class(99) is anyreduce.AnyreduceError
    assert anyreduce.AnyreduceError(99, "x").code == 99


def test_errors_survive_pickling():
    # Errors cross torch.multiprocessing boundaries.
    e = anyreduce.Timeout(7, "anyrAllReduce: rank 3 did not arrive", "anyrAllReduce")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is anyreduce.Timeout and e2.code == anyreduce.Result.TIMEOUT
    assert str(e2) == str(e)


def test_enum_parsing():
    from anyreduce import Algo, DataType, Quant

    assert DataType.parse("bf16") is DataType.BFLOAT16
    assert DataType.parse("torch.float16") is DataType.FLOAT16
    assert DataType.parse(0) is DataType.FLOAT32
    assert Algo.parse("oneshot-pull") is Algo.ONE_SHOT_PULL
    assert Algo.parse("TWO_SHOT") is Algo.TWO_SHOT
    assert str(Algo.NCCL) == "nccl"
    assert Quant.parse(None) is Quant.NONE and Quant.parse("nvfp4") is Quant.NVFP4
    with pytest.raises(ValueError, match="unknown algorithm"):
        Algo.parse("butterfly")
    with pytest.raises(ValueError, match="unknown datatype"):
        DataType.parse("int8")


def test_config_rejects_values_that_do_not_fit_c():
    from anyreduce import Config, InvalidArgument

    with pytest.raises(InvalidArgument, match="config.timeout_ms"):
        Config(timeout_ms=2**40).to_c()
    with pytest.raises(InvalidArgument, match="config.chunk_bytes"):
        Config(chunk_bytes=-1).to_c()
    with pytest.raises(InvalidArgument, match="config.algorithm"):
        Config(algorithm="butterfly").to_c()
    with pytest.raises(InvalidArgument, match="config.max_blocks"):
        Config(max_blocks=-2**31).to_c()  # the C "undefined" sentinel itself
    with pytest.raises(InvalidArgument, match="config.fused_cluster"):
        Config(fused_cluster=2**40).to_c()


def test_a_shared_library_without_the_api_is_rejected():
    """A loadable shared object that lacks the required functions (libc here) is not taken
    for libanyreduce: the search moves on and the reason is recorded."""
    import ctypes.util

    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        pytest.skip("no libc found by ctypes.util")
    with pytest.raises(_library._Unusable, match="does not export anyrGetVersion"):
        _library.Library(libc_name)


def test_installed_wheel_finds_the_library_it_carries(tmp_path):
    """The installed wheel holds the library once, as the real file anyreduce/_lib/libanyreduce.so
    (no soname links), finds it from any folder without ANYREDUCE_LIBRARY, and
    ANYREDUCE_LIBRARY still overrides it."""
    if not INSTALLED:
        pytest.skip("checks an installed wheel: ANYREDUCE_TEST_INSTALLED=1 "
                    "(scripts/check-wheel.sh)")
    from importlib import metadata

    libs = [str(f) for f in metadata.files("anyreduce") or [] if "libanyreduce" in str(f)]
    assert libs == ["anyreduce/_lib/libanyreduce.so"], libs
    assert BUNDLED_LIBRARY.is_file() and not BUNDLED_LIBRARY.is_symlink()
    assert sorted(p.name for p in BUNDLED_LIBRARY.parent.iterdir()) == ["libanyreduce.so"]
    code = """
        import anyreduce
        print(anyreduce.library_path()); print(anyreduce.version())
    """
    r = run_python(code, cwd=tmp_path, drop_env=("ANYREDUCE_LIBRARY",))
    assert r.returncode == 0, r.stderr
    path, ver = r.stdout.split()
    assert path == str(BUNDLED_LIBRARY) and ver == anyreduce.__version__
    other = tmp_path / "elsewhere" / "libanyreduce.so"
    other.parent.mkdir()
    shutil.copy2(BUNDLED_LIBRARY, other)
    r = run_python(code, cwd=tmp_path, env_updates={"ANYREDUCE_LIBRARY": str(other)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == str(other)
