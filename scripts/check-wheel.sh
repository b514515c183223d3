#!/usr/bin/env bash
# Builds the Python wheel with pip (build isolation on, no index: the in-tree backend needs
# nothing installed), installs it into a fresh virtual environment, imports it from outside the
# source tree and runs the CPU Python tests against the installed copy.
#
# The wheel carries the library of $BUILD (ANYR_WHEEL_LIBRARY, default $BUILD/src/libanyreduce.so),
# so CMake does not compile it twice; ANYR_WHEEL_FROM_SOURCE=1 has the backend build it with
# CMake instead (into ANYR_WHEEL_BUILD_DIR, default build-wheel/; ANYR_CUDA_ARCHS picks the
# targets, default the project's).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
BUILD=${BUILD:-build}
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "${ANYR_WHEEL_FROM_SOURCE:-0}" = 1 ]; then
  unset ANYR_WHEEL_LIBRARY
  echo "wheel: building libanyreduce from source" \
    "(ANYR_CUDA_ARCHS=${ANYR_CUDA_ARCHS:-the project default})"
else
  export ANYR_WHEEL_LIBRARY=${ANYR_WHEEL_LIBRARY:-$repo/$BUILD/src/libanyreduce.so}
fi
start=$SECONDS
"$PY" -m pip wheel --no-deps --no-index --disable-pip-version-check -q -w "$tmp/dist" ./python
wheels=("$tmp"/dist/*.whl)
if [ ${#wheels[@]} -ne 1 ] || [[ "${wheels[0]}" != *-py3-none-linux_*.whl ]]; then
  echo "wheel: expected one platform wheel, got: ${wheels[*]}" >&2
  exit 1
fi
wheel=${wheels[0]}
echo "wheel: built $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) in $((SECONDS - start)) s"
# pytest comes from the distribution (python3-pytest), the package only from the wheel.
"$PY" -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --no-index --no-deps --disable-pip-version-check -q "$wheel"
cd "$tmp"
env -u ANYREDUCE_LIBRARY "$tmp/venv/bin/python" -c '
import sys, anyreduce
from pathlib import Path
pkg = Path(anyreduce.__file__).resolve().parent
assert Path(sys.prefix).resolve() in pkg.parents, f"imported {pkg}, not the installed wheel"
assert anyreduce.library_path() == str(pkg / "_lib" / "libanyreduce.so"), anyreduce.library_path()
print(f"wheel: imports {pkg}; library {anyreduce.library_path()}; version {anyreduce.version()}")
'
ANYREDUCE_TEST_INSTALLED=1 env -u ANYREDUCE_LIBRARY "$tmp/venv/bin/python" -m pytest -q -rs \
  -p no:cacheprovider "$repo/python/tests"
echo "wheel: ok (built, installed in a fresh virtual environment, CPU tests passed against it)"
