#!/usr/bin/env bash
# The main job: build the library and the `anyreduce` command ($BUILD/tools/anyreduce; not the
# tests: scripts/test.sh builds those), then probe every visible GPU and benchmark anyreduce
# against NCCL on all of them. Without a GPU it builds and says so; with one, it probes it and
# says why no benchmark ran.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" ${ANYR_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target anyreduce anyreduce_tool
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "anyreduce: no NVIDIA GPU on this machine; built the library and $BUILD/tools/anyreduce,"
  echo "           nothing to probe or benchmark."
  echo "           Run this script on a machine with GPUs (or see scripts/device.sh)."
  exit 0
fi
"$BUILD/tools/anyreduce" probe
# GPUs the benchmark would use (CUDA_VISIBLE_DEVICES narrows them).
ngpu=$(nvidia-smi -L | grep -c '^GPU')
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  ngpu=$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
fi
if [ "$ngpu" -lt 2 ] && [[ " $* " != *" --ranks"* && " $* " != *" --nranks"* ]]; then
  echo "anyreduce: $ngpu GPU visible: probed; an all-reduce benchmark needs two or more GPUs, so"
  echo "           none ran (bench --ranks N runs N ranks sharing the GPUs: correctness, not speed)."
  exit 0
fi
"$BUILD/tools/anyreduce" bench "$@"
