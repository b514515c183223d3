"""The build backend python/_backend/anyreduce_build.py: a platform wheel that carries the
library once, metadata from pyproject.toml, a RECORD that matches the files; the editable and
sdist hooks; refusals. CPU only; the wheel is built around a built library (ANYR_WHEEL_LIBRARY),
CMake is not run here (scripts/check-wheel.sh builds a wheel with pip, installs it into a fresh
virtual environment and runs these tests against it)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import PYTHON_DIR

BACKEND_FILE = PYTHON_DIR / "_backend" / "anyreduce_build.py"


def _have_toml() -> bool:
    for name in ("tomllib", "tomli"):
        if importlib.util.find_spec(name) is not None:
            return True
    return False


pytestmark = pytest.mark.skipif(not _have_toml(), reason="the backend reads pyproject.toml with "
                                "tomllib (Python 3.11+) or tomli; neither is here")


@pytest.fixture(scope="module")
def backend():
    spec = importlib.util.spec_from_file_location("anyreduce_build", BACKEND_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def in_source(monkeypatch):
    # PEP 517: hooks run in the source tree.
    monkeypatch.chdir(PYTHON_DIR)
    for var in ("ANYR_WHEEL_LIBRARY", "ANYR_WHEEL_BUILD_DIR", "ANYR_CUDA_ARCHS"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def pyproject() -> dict:
    try:
        import tomllib
    except ImportError:
        import tomli as tomllib
    with open(PYTHON_DIR / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def read_metadata(text: str):
    head, _, body = text.partition("\n\n")
    fields = {}
    for line in head.splitlines():
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    return fields, body


def check_record(z: zipfile.ZipFile, dist_info: str) -> None:
    rows = [line.split(",") for line in z.read(f"{dist_info}/RECORD").decode().splitlines()]
    listed = {name: (digest, size) for name, digest, size in rows}
    assert set(listed) == set(z.namelist()), "RECORD does not list exactly the wheel's files"
    assert listed.pop(f"{dist_info}/RECORD") == ("", "")
    for name, (digest, size) in listed.items():
        data = z.read(name)
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={want}" and int(size) == len(data), name


def test_wheel_carries_the_library_once(backend, in_source, lib_path, tmp_path):
    in_source.setenv("ANYR_WHEEL_LIBRARY", str(lib_path))  # a build folder's soname link
    name = backend.build_wheel(str(tmp_path))
    project = pyproject()["project"]
    version = backend._read_version(PYTHON_DIR)
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert name == f"anyreduce-{version}-py3-none-{plat}.whl"
    dist_info = f"anyreduce-{version}.dist-info"
    with zipfile.ZipFile(tmp_path / name) as z:
        names = z.namelist()
        libs = [n for n in names if "libanyreduce" in n]
        assert libs == ["anyreduce/_lib/libanyreduce.so"]
        real = Path(os.path.realpath(lib_path)).read_bytes()
        assert z.read(libs[0]) == real
        assert (z.getinfo(libs[0]).external_attr >> 16) & 0o777 == 0o755
        sources = sorted(p.relative_to(PYTHON_DIR).as_posix()
                         for p in (PYTHON_DIR / "anyreduce").rglob("*")
                         if p.is_file() and "__pycache__" not in p.parts
                         and not p.name.startswith("libanyreduce.so"))
        assert sorted(n for n in names if n.startswith("anyreduce/") and n not in libs) == sources
        assert not [n for n in names if not n.startswith(("anyreduce/", dist_info + "/"))]
        wheel = z.read(f"{dist_info}/WHEEL").decode()
        assert "Root-Is-Purelib: false\n" in wheel and f"Tag: py3-none-{plat}\n" in wheel
        check_record(z, dist_info)
        fields, body = read_metadata(z.read(f"{dist_info}/METADATA").decode())
        assert fields["Name"] == [project["name"]] and fields["Version"] == [version]
        assert fields["Requires-Python"] == [project["requires-python"]]
        assert fields["Provides-Extra"] == list(project.get("optional-dependencies", {}))
        assert fields.get("Classifier", []) == project.get("classifiers", [])
        assert body == (PYTHON_DIR / project["readme"]).read_text(encoding="utf-8")
        groups = dict(project.get("entry-points", {}))
        if project.get("scripts"):
            groups["console_scripts"] = project["scripts"]
        if groups:
            eps = z.read(f"{dist_info}/entry_points.txt").decode()
            for group, entries in groups.items():
                assert f"[{group}]" in eps
                for key, value in entries.items():
                    assert f"{key} = {value}" in eps
        else:
            assert f"{dist_info}/entry_points.txt" not in names
    # prepare_metadata_for_build_wheel writes what the wheel holds.
    meta = tmp_path / "meta"
    assert backend.prepare_metadata_for_build_wheel(str(meta)) == dist_info
    with zipfile.ZipFile(tmp_path / name) as z:
        for f in (meta / dist_info).iterdir():
            assert f.read_bytes() == z.read(f"{dist_info}/{f.name}")
    # Nothing written into the source tree, no CMake build folder made.
    assert not (PYTHON_DIR / "anyreduce" / "_lib").exists()


def test_a_missing_or_foreign_library_is_refused(backend, in_source, tmp_path):
    in_source.setenv("ANYR_WHEEL_LIBRARY", str(tmp_path / "missing.so"))
    with pytest.raises(backend.BuildError, match="missing.so: no such file"):
        backend.build_wheel(str(tmp_path))
    # A relative path is taken from the checkout's root, not from python/ where pip runs.
    in_source.setenv("ANYR_WHEEL_LIBRARY", "no-such-build/src/libanyreduce.so")
    with pytest.raises(backend.BuildError, match=re.escape(str(PYTHON_DIR.parent / "no-such-build"))):
        backend.build_wheel(str(tmp_path))
    fake = tmp_path / "libanyreduce.so"
    fake.write_bytes(b"not an ELF file")
    in_source.setenv("ANYR_WHEEL_LIBRARY", str(fake))
    with pytest.raises(backend.BuildError, match="not a shared library"):
        backend.build_wheel(str(tmp_path))
    assert not list(tmp_path.glob("*.whl"))


def test_editable_wheel_points_at_the_source(backend, in_source, tmp_path):
    name = backend.build_editable(str(tmp_path))
    assert name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(tmp_path / name) as z:
        pth = [n for n in z.namelist() if n.endswith(".pth")]
        assert len(pth) == 1 and z.read(pth[0]).decode() == f"{PYTHON_DIR}\n"
        assert not [n for n in z.namelist() if "libanyreduce" in n or n.startswith("anyreduce/")]
        check_record(z, name.split("-py3")[0] + ".dist-info")


def test_no_sdist_and_no_build_requirements(backend, in_source, tmp_path):
    with pytest.raises(backend.UnsupportedOperation, match="no sdist"):
        backend.build_sdist(str(tmp_path))
    # Nothing to install: pip's build isolation needs no index.
    assert pyproject()["build-system"]["requires"] == []
    assert backend.get_requires_for_build_wheel() == []
    assert backend.get_requires_for_build_editable() == []


def test_unknown_project_keys_and_dynamic_fields_are_refused(backend, tmp_path):
    for name in ("README.md", "pyproject.toml"):
        (tmp_path / name).write_text((PYTHON_DIR / name).read_text(encoding="utf-8"))
    (tmp_path / "anyreduce").mkdir()
    (tmp_path / "anyreduce" / "_version.py").write_text('__version__ = "1.2.3"\n')
    assert backend.Project(tmp_path).version == "1.2.3"
    text = (tmp_path / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text.replace("[project]\n",
                                                          "[project]\nimport-names = []\n"))
    with pytest.raises(backend.BuildError, match="import-names"):
        backend.Project(tmp_path)
    (tmp_path / "pyproject.toml").write_text(text.replace('dynamic = ["version"]',
                                                          'dynamic = ["version", "dependencies"]'))
    with pytest.raises(backend.BuildError, match="only the version may be dynamic"):
        backend.Project(tmp_path)
