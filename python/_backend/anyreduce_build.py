"""PEP 517 build backend of the anyreduce Python package: builds libanyreduce with CMake and
puts it in a platform wheel as anyreduce/_lib/libanyreduce.so, the one copy of the library in
the wheel (the real file, no soname links), which the binding loads by that path.

Standard library only (tomllib: Python 3.11 or newer, else an installed tomli), so pip's build
isolation has nothing to install: `pip install ./python` and `pip wheel ./python` work offline
with or without --no-build-isolation. The package metadata is read from pyproject.toml's
[project] table; a key of it this backend does not know is refused, not dropped.

Steering, by environment variable (pip passes its environment to the backend):
  ANYR_WHEEL_LIBRARY     an already-built libanyreduce.so to put in the wheel (symlinks are
                         resolved); CMake is then not run
  ANYR_WHEEL_BUILD_DIR   CMake build folder (default: build-wheel/), kept between builds so a
                         rebuild compiles only what changed
  ANYR_CUDA_ARCHS        CMAKE_CUDA_ARCHITECTURES (e.g. "90"); unset: the project's default
  ANYR_CUDA_FAMILY_TARGETS  ANYR_CUDA_FAMILY_TARGETS (e.g. "100f;120f"); unset: the project's
                         default with ANYR_CUDA_ARCHS unset, none with it set
  ANYR_CMAKE_ARGS        more arguments to the configure step (split like a shell would)
  CUDA_HOME              the toolkit whose nvcc compiles (default: CMake's search)
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: every CPU)

Relative paths in these variables are taken from the checkout's root (pip runs the backend in
python/, not where it was called). The library is built from the checkout that contains this
package (the parent of python/), where pip runs the backend (pip 21.3 and newer build a local
folder in place). The editable hooks make a wheel that points at the source package; the
library is then found as from the checkout (ANYREDUCE_LIBRARY or its build folders). There is
no sdist: the package alone cannot rebuild the library.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

PACKAGE = "anyreduce"
LIB_NAME = "libanyreduce.so"
LIB_ARCNAME = f"{PACKAGE}/_lib/{LIB_NAME}"
VERSION_FILE = f"{PACKAGE}/_version.py"
GENERATOR = "anyreduce_build 1"

# The [project] keys this backend turns into metadata; any other key is refused.
KNOWN_PROJECT_KEYS = {
    "name", "version", "dynamic", "description", "readme", "requires-python", "license",
    "authors", "maintainers", "keywords", "classifiers", "urls", "dependencies",
    "optional-dependencies", "scripts", "gui-scripts", "entry-points",
}


class UnsupportedOperation(Exception):
    """Raised by a hook this backend does not provide (pip's hook runner knows the name)."""


class BuildError(Exception):
    pass


# ---- pyproject.toml -> core metadata --------------------------------------------------------


def _load_toml(path: Path) -> dict:
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise BuildError(
                "building the anyreduce wheel reads pyproject.toml with tomllib (Python 3.11 or "
                "newer) or tomli: use Python 3.11+, or install tomli and pass "
                "--no-build-isolation") from None
    with open(path, "rb") as f:
        return tomllib.load(f)


def _read_version(source: Path) -> str:
    """__version__ of anyreduce/_version.py, read without importing the package."""
    tree = ast.parse((source / VERSION_FILE).read_text(encoding="utf-8"))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "__version__"
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    raise BuildError(f"{VERSION_FILE} assigns no __version__ string")


class Project:
    """The [project] table of pyproject.toml, checked, with the dynamic version filled in."""

    def __init__(self, source: Path) -> None:
        self.source = source
        data = _load_toml(source / "pyproject.toml")
        project = data.get("project")
        if not isinstance(project, dict):
            raise BuildError("pyproject.toml has no [project] table")
        unknown = sorted(set(project) - KNOWN_PROJECT_KEYS)
        if unknown:
            raise BuildError("pyproject.toml [project] has keys this backend does not turn into "
                             f"metadata: {', '.join(unknown)} (python/_backend/anyreduce_build.py)")
        dynamic = project.get("dynamic", [])
        others = sorted(set(dynamic) - {"version"})
        if others:
            raise BuildError(f"only the version may be dynamic, not {', '.join(others)}")
        self.p = project
        self.name: str = project["name"]
        if "version" in dynamic:
            if "version" in project:
                raise BuildError("the version is both given and dynamic in pyproject.toml")
            self.version = _read_version(source)
        else:
            self.version = project["version"]
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)*([a-z0-9.+!]*)", self.version):
            raise BuildError(f"version {self.version!r} is not a plain PEP 440 version")

    @property
    def dist_name(self) -> str:
        """The name as it appears in file names (PEP 427 / the binary distribution format)."""
        return re.sub(r"[-_.]+", "_", self.name).lower()

    @property
    def dist_info(self) -> str:
        return f"{self.dist_name}-{self.version}.dist-info"

    def metadata(self) -> str:
        p = self.p
        lines: List[Tuple[str, str]] = [("Metadata-Version", "2.1"), ("Name", self.name),
                                        ("Version", self.version)]
        if "description" in p:
            lines.append(("Summary", p["description"]))
        for key, field in (("authors", "Author"), ("maintainers", "Maintainer")):
            names = [a["name"] for a in p.get(key, []) if "name" in a and "email" not in a]
            emails = [f'{a["name"]} <{a["email"]}>' if "name" in a else a["email"]
                      for a in p.get(key, []) if "email" in a]
            if names:
                lines.append((field, ", ".join(names)))
            if emails:
                lines.append((field + "-email", ", ".join(emails)))
        if p.get("keywords"):
            lines.append(("Keywords", ",".join(p["keywords"])))
        lic = p.get("license")
        if isinstance(lic, str):
            lines.append(("License", lic))
        elif isinstance(lic, dict) and "text" in lic:
            lines.append(("License", lic["text"]))
        elif isinstance(lic, dict) and "file" in lic:
            lines.append(("License", (self.source / lic["file"]).read_text(encoding="utf-8")
                          .replace("\n", "\n        ")))
        lines += [("Classifier", c) for c in p.get("classifiers", [])]
        lines += [("Project-URL", f"{k}, {v}") for k, v in p.get("urls", {}).items()]
        if "requires-python" in p:
            lines.append(("Requires-Python", p["requires-python"]))
        lines += [("Requires-Dist", d) for d in p.get("dependencies", [])]
        for extra, deps in p.get("optional-dependencies", {}).items():
            lines.append(("Provides-Extra", extra))
            for d in deps:
                req, _, marker = d.partition(";")
                marker = marker.strip()
                cond = f'({marker}) and extra == "{extra}"' if marker else f'extra == "{extra}"'
                lines.append(("Requires-Dist", f"{req.strip()}; {cond}"))
        body = ""
        readme = p.get("readme")
        if readme is not None:
            if isinstance(readme, str):
                readme = {"file": readme}
            ctype = readme.get("content-type")
            if "file" in readme:
                body = (self.source / readme["file"]).read_text(encoding="utf-8")
                if ctype is None:
                    suffix = Path(readme["file"]).suffix.lower()
                    ctype = {".md": "text/markdown", ".rst": "text/x-rst"}.get(suffix,
                                                                               "text/plain")
            else:
                body = readme["text"]
            lines.append(("Description-Content-Type", ctype or "text/plain"))
        out = "".join(f"{k}: {v}\n" for k, v in lines)
        return out + ("\n" + body if body else "")

    def entry_points(self) -> str:
        groups: Dict[str, Mapping[str, str]] = {}
        if self.p.get("scripts"):
            groups["console_scripts"] = self.p["scripts"]
        if self.p.get("gui-scripts"):
            groups["gui_scripts"] = self.p["gui-scripts"]
        for group, entries in self.p.get("entry-points", {}).items():
            if group in ("console_scripts", "gui_scripts"):
                raise BuildError(f"[project.entry-points.{group}] is not allowed: use "
                                 "[project.scripts] / [project.gui-scripts]")
            groups[group] = entries
        return "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in e.items()) + "\n"
                       for g, e in groups.items())

    def dist_info_files(self, tag: str, purelib: bool) -> List[Tuple[str, bytes]]:
        wheel = (f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\n"
                 f"Root-Is-Purelib: {'true' if purelib else 'false'}\nTag: {tag}\n")
        files = [(f"{self.dist_info}/METADATA", self.metadata().encode()),
                 (f"{self.dist_info}/WHEEL", wheel.encode())]
        eps = self.entry_points()
        if eps:
            files.append((f"{self.dist_info}/entry_points.txt", eps.encode()))
        return files


# ---- the library ----------------------------------------------------------------------------


def _checkout_root(source: Path) -> Path:
    root = source.parent
    if not ((root / "CMakeLists.txt").is_file()
            and (root / "include" / "anyreduce" / "anyreduce.h").is_file()):
        raise BuildError(
            f"{source} is not the python/ folder of an anyreduce checkout, so the library cannot "
            "be built here (an older pip copies the folder elsewhere: use pip 21.3 or newer); "
            "or set ANYR_WHEEL_LIBRARY=/path/to/libanyreduce.so to package a built one")
    return root


def _path_from_env(var: str, source: Path) -> Optional[Path]:
    """The path in $var, relative ones taken from the checkout's root (else from python/)."""
    value = os.environ.get(var)
    if not value:
        return None
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    root = source.parent
    base = root if (root / "include" / "anyreduce" / "anyreduce.h").is_file() else source
    return base / path


def _run(cmd: List[str]) -> None:
    print("anyreduce_build: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    r = subprocess.run(cmd)
    if r.returncode != 0:
        raise BuildError(f"{cmd[0]} failed (exit {r.returncode}): " + " ".join(cmd))


def _cmake_build(source: Path) -> Path:
    """Configure and build the `anyreduce` target; return the built library file."""
    root = _checkout_root(source)
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake is not on PATH (Debian: apt-get install cmake; or run "
                         "scripts/deps.sh), or set ANYR_WHEEL_LIBRARY to a built library")
    build = (_path_from_env("ANYR_WHEEL_BUILD_DIR", source) or root / "build-wheel").resolve()
    cfg = [cmake, "-S", str(root), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
           "-DANYR_BUILD_TESTS=OFF"]
    if (not (build / "CMakeCache.txt").exists() and "CMAKE_GENERATOR" not in os.environ
            and shutil.which("ninja")):
        cfg += ["-G", "Ninja"]
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home:
        cfg.append(f"-DCMAKE_CUDA_COMPILER={Path(cuda_home) / 'bin' / 'nvcc'}")
    # Given on every configure, so a kept build folder follows the variables of this build
    # rather than those cached by an earlier one; unset means the project's default, which
    # CMakeLists.txt recomputes once the cached values are removed.
    archs = os.environ.get("ANYR_CUDA_ARCHS")
    family = os.environ.get("ANYR_CUDA_FAMILY_TARGETS")
    if archs:
        cfg += [f"-DCMAKE_CUDA_ARCHITECTURES={archs}", f"-DANYR_CUDA_FAMILY_TARGETS={family or ''}"]
    else:
        cfg.append("-UCMAKE_CUDA_ARCHITECTURES")
        cfg.append(f"-DANYR_CUDA_FAMILY_TARGETS={family}" if family is not None
                   else "-UANYR_CUDA_FAMILY_TARGETS")
    cfg += shlex.split(os.environ.get("ANYR_CMAKE_ARGS", ""))
    _run(cfg)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    _run([cmake, "--build", str(build), "--target", "anyreduce", "-j", jobs])
    lib = build / "src" / LIB_NAME
    if not lib.exists():
        raise BuildError(f"the build finished but {lib} does not exist")
    return lib


def _library_file(source: Path) -> Path:
    lib = _path_from_env("ANYR_WHEEL_LIBRARY", source)
    if lib is not None:
        if not lib.exists():
            raise BuildError(f"ANYR_WHEEL_LIBRARY={os.environ['ANYR_WHEEL_LIBRARY']}: no such "
                             f"file ({lib})")
    else:
        lib = _cmake_build(source)
    real = lib.resolve()
    with open(real, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise BuildError(f"{lib} ({real}) is not a shared library (no ELF header)")
    return real


def _check_library_version(lib: Path, version: str) -> None:
    """Refuse a library whose ANYR_VERSION_CODE is not the package's version (a stale
    ANYR_WHEEL_LIBRARY); say so, and go on, where it cannot be loaded here."""
    import ctypes

    m = re.match(r"([0-9]+)\.([0-9]+)\.([0-9]+)", version)
    if m is None:
        return
    want = int(m.group(1)) * 10000 + int(m.group(2)) * 100 + int(m.group(3))
    try:
        dll = ctypes.CDLL(str(lib))
    except OSError as e:
        print(f"anyreduce_build: note: {lib} cannot be loaded here ({e}); its version is not "
              "checked", file=sys.stderr, flush=True)
        return
    code = ctypes.c_int(-1)
    if not hasattr(dll, "anyrGetVersion") or dll.anyrGetVersion(ctypes.byref(code)) != 0:
        raise BuildError(f"{lib} does not answer anyrGetVersion: not a libanyreduce")
    if code.value != want:
        raise BuildError(f"{lib} is version code {code.value}, the package is {version} "
                         f"({want}): rebuild the library or point ANYR_WHEEL_LIBRARY at the "
                         "right one")


# ---- the wheel file -------------------------------------------------------------------------


def _platform_tag() -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())


def _package_files(source: Path) -> List[Tuple[str, Path]]:
    """Every file of the source package, minus caches and any library file lying in it (the
    wheel's one copy is the one built or given)."""
    out: List[Tuple[str, Path]] = []
    pkg = source / PACKAGE
    for path in sorted(pkg.rglob("*")):
        rel = path.relative_to(source)
        parts = rel.parts
        if (not path.is_file() or "__pycache__" in parts or path.suffix in (".pyc", ".pyo")
                or parts[1] == "_lib" or path.name.startswith(LIB_NAME)):
            continue
        out.append((rel.as_posix(), path))
    return out


def _zip_date() -> Tuple[int, int, int, int, int, int]:
    # SOURCE_DATE_EPOCH makes the archive reproducible; zip cannot hold dates before 1980.
    import time

    epoch = max(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")), 315532800)
    return time.gmtime(epoch)[:6]


def _write_wheel(path: Path, members: Iterable[Tuple[str, bytes, int]], dist_info: str) -> None:
    """members: (archive name, bytes, mode). RECORD is written last, with every hash."""
    date = _zip_date()
    record = io.StringIO()
    tmp = path.with_name(path.name + ".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name, date_time=date)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.write(f"{name},sha256={digest.decode()},{len(data)}\n")
        rec_name = f"{dist_info}/RECORD"
        record.write(f"{rec_name},,\n")
        info = zipfile.ZipInfo(rec_name, date_time=date)
        info.external_attr = (0o100644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, record.getvalue())
    os.replace(tmp, path)


def _write_metadata_dir(directory: str, project: Project, tag: str, purelib: bool) -> str:
    for name, data in project.dist_info_files(tag, purelib):
        target = Path(directory) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return project.dist_info


def _source() -> Path:
    # PEP 517: hooks run with the source tree (python/) as the current directory.
    return Path.cwd().resolve()


# ---- PEP 517 / PEP 660 hooks ----------------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings=None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings=None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings=None) -> str:
    return _write_metadata_dir(metadata_directory, Project(_source()),
                               f"py3-none-{_platform_tag()}", purelib=False)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings=None) -> str:
    return _write_metadata_dir(metadata_directory, Project(_source()), "py3-none-any",
                               purelib=True)


def build_wheel(wheel_directory: str, config_settings=None,
                metadata_directory: Optional[str] = None) -> str:
    source = _source()
    project = Project(source)
    lib = _library_file(source)
    _check_library_version(lib, project.version)
    tag = f"py3-none-{_platform_tag()}"
    members = [(name, path.read_bytes(), 0o644) for name, path in _package_files(source)]
    members.append((LIB_ARCNAME, lib.read_bytes(), 0o755))
    members += [(name, data, 0o644) for name, data in project.dist_info_files(tag, False)]
    filename = f"{project.dist_name}-{project.version}-{tag}.whl"
    Path(wheel_directory).mkdir(parents=True, exist_ok=True)
    _write_wheel(Path(wheel_directory) / filename, members, project.dist_info)
    print(f"anyreduce_build: {filename} holds {lib} as {LIB_ARCNAME}", flush=True)
    return filename


def build_editable(wheel_directory: str, config_settings=None,
                   metadata_directory: Optional[str] = None) -> str:
    """A wheel with one .pth file that puts the source folder (python/) on sys.path; no
    library is built or copied (the binding finds the checkout's build folders)."""
    source = _source()
    project = Project(source)
    tag = "py3-none-any"
    members = [(f"__editable__.{project.dist_name}.pth", (str(source) + "\n").encode(), 0o644)]
    members += [(name, data, 0o644) for name, data in project.dist_info_files(tag, True)]
    filename = f"{project.dist_name}-{project.version}-{tag}.whl"
    Path(wheel_directory).mkdir(parents=True, exist_ok=True)
    _write_wheel(Path(wheel_directory) / filename, members, project.dist_info)
    return filename


def build_sdist(sdist_directory: str, config_settings=None) -> str:
    raise UnsupportedOperation(
        "anyreduce has no sdist: the package alone cannot rebuild libanyreduce. Build the wheel "
        "from the checkout (pip wheel ./python) instead.")
