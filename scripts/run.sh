#!/usr/bin/env bash
# The main job: build, then probe every visible GPU and benchmark anyreduce against NCCL on
# all of them. Without a GPU it builds and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" ${ANYR_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "anyreduce: no NVIDIA GPU on this machine; built everything, nothing to probe or benchmark."
  echo "           Run this script on a machine with GPUs (or see scripts/device.sh)."
  exit 0
fi
"$BUILD/tools/anyreduce" probe
"$BUILD/tools/anyreduce" bench "$@"
