#!/usr/bin/env bash
# Builds everything (CUDA kernels included, warnings as errors) and runs the tests. On a
# machine without a GPU the tests labelled `gpu` are excluded, and this says so.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" ${ANYR_CMAKE_ARGS:-}
cmake --build "$BUILD" -j"$(nproc)"
# Every kernel's shared memory per block for compute capability 12.0 (99 KB a block): fails
# above the limit.
/usr/bin/python3 scripts/check-smem.py --nvcc "$CUDA_HOME/bin/nvcc"
install_check() { BUILD="$BUILD" bash scripts/check-install.sh; }
# The Python package's tests run against the library just built (GPU ones skip without torch
# and two GPUs, and say so).
python_tests() {
  ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" /usr/bin/python3 -m pytest -q -rs python/tests
}
# The wheel, carrying the library just built, installed into a fresh virtual environment, and
# the CPU Python tests again, against the installed copy.
wheel_check() { BUILD="$BUILD" bash scripts/check-wheel.sh; }
select=()
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  n=$(ctest --test-dir "$BUILD" -N -L gpu | grep -c 'Test *#' || true)
  echo "No GPU on this machine: excluding the $n tests labelled 'gpu' (run them on a GPU machine: scripts/device.sh)."
  select=(-LE gpu)
fi
ctest --test-dir "$BUILD" --output-on-failure "${select[@]}"
python_tests
install_check
wheel_check
if [ ${#select[@]} -gt 0 ]; then
  echo "No GPU on this machine: the $n tests labelled 'gpu' were excluded, not run."
fi
