#!/usr/bin/env bash
# Installs what the build needs from distribution packages, only where it is missing:
# CMake, a C++17 compiler, CLI11, nlohmann-json, GoogleTest, OpenSSL's libcrypto with its
# headers (the bootstrap's authentication), libnuma with its headers (the host segment's NUMA
# placement), clang (libFuzzer, for scripts/fuzz.sh), pytest, pip and venv (the Python tests,
# the wheel), chromium (the doctor report's test opens the report in it headless; without it
# that test is skipped, not passed). The CUDA toolkit (with NCCL) is expected at
# /usr/local/cuda (or CUDA_HOME); it is not installed here.
set -euo pipefail
missing=()
have_header() { [ -e "/usr/include/$1" ] || [ -e "/usr/local/include/$1" ]; }
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
command -v pkg-config >/dev/null || missing+=(pkg-config)
have_header CLI/CLI.hpp || missing+=(libcli11-dev)
have_header nlohmann/json.hpp || missing+=(nlohmann-json3-dev)
have_header gtest/gtest.h || missing+=(libgtest-dev)
have_header openssl/evp.h || missing+=(libssl-dev)
have_header numa.h || missing+=(libnuma-dev)
command -v clang-format >/dev/null || missing+=(clang-format)
# clang with libFuzzer and the sanitizer runtimes, for scripts/fuzz.sh.
command -v clang++ >/dev/null || missing+=(clang)
/usr/bin/python3 -c "import pytest" 2>/dev/null || missing+=(python3-pytest)
# pip and venv (ensurepip), for scripts/check-wheel.sh: the wheel built and installed into a
# fresh virtual environment.
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
/usr/bin/python3 -c "import ensurepip" 2>/dev/null || missing+=(python3-venv)
# Headless Chromium, for the doctor report's browser test (tests/doctor_report_browser.sh).
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}"
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  echo "deps: the CUDA toolkit (12.8 or newer, with NCCL) is needed at $CUDA_HOME (nvcc not found)" >&2
  exit 1
fi
echo "deps: ok (nvcc: $("$CUDA_HOME/bin/nvcc" --version | tail -2 | head -1))"
