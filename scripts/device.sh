#!/usr/bin/env bash
# Everything that needs GPUs, in one call: build on the GPU machine, run the GPU tests, probe,
# benchmark anyreduce against NCCL (and PyTorch symmetric memory) on all visible GPUs.
# Logs and JSON go to $OUT (or ./device-out). Every multi-process step runs under `timeout`.
#
#   scripts/device.sh [quick|full|final|fused|reliability]     (default: full)
#   reliability: build, then only the reliability GPU tests at full size (100000 stress calls,
#   20 kill -9 trials; docs/RELIABILITY.md), then exit with their status.
set -uo pipefail
MODE=${1:-full}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ARCH=${ANYR_CUDA_ARCHS:-native}
JOBS=$(nproc)
BUILD=${BUILD:-build-device}

step() { echo; echo "=== $* ($(date +%T))"; }

step "machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m 2>&1 | tee -a "$OUT/gpus.txt" | head -12

step "build (CUDA architectures: $ARCH)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$BUILD" -j"$JOBS" >"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "built"

if [ "$MODE" = reliability ]; then
  T="$BUILD/tests/anyr_gpu_tests"
  RC=0
  step "reliability: stress, 100000 random calls with canaries"
  ANYR_TEST_STRESS_CALLS=100000 timeout -k 10 560 "$T" --gtest_filter='ReliabilityGpu.Stress*' 2>&1 | tee "$OUT/reliability-stress.log" | grep -E "info|OK|FAIL|Failure|PASSED" | tail -12
  [ "${PIPESTATUS[0]}" = 0 ] || RC=1
  step "reliability: kill -9 one rank, 20 trials"
  ANYR_TEST_KILL_TRIALS=20 timeout -k 10 560 "$T" --gtest_filter='ReliabilityGpu.Kill*' 2>&1 | tee "$OUT/reliability-kill.log" | grep -E "info|OK|FAIL|Failure|PASSED" | tail -12
  [ "${PIPESTATUS[0]}" = 0 ] || RC=1
  step "reliability: self-test, fault injection, skipped call, abort, 200 create/destroy"
  timeout -k 10 560 "$T" --gtest_filter='ReliabilityGpu.*:-ReliabilityGpu.Stress*:ReliabilityGpu.Kill*' 2>&1 | tee "$OUT/reliability-other.log" | grep -E "info|OK|FAIL|Failure|PASSED" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || RC=1
  step "reliability: call discipline (validation mode, threads, streams, devices)"
  timeout -k 10 560 ctest --test-dir "$BUILD" -L gpu -R 'ReliabilityCalls' --output-on-failure --timeout 300 2>&1 | tee "$OUT/reliability-calls.log" | tail -15
  [ "${PIPESTATUS[0]}" = 0 ] || RC=1
  step "reliability: anyreduce explain with a corrupted peer mapping on rank 1 (self-test reasons)"
  ANYR_FAULT_INJECT=corrupt-peer:1 timeout -k 10 300 "$BUILD/tools/anyreduce" explain 2>&1 | tee "$OUT/reliability-explain-injected.json" | grep -E '"reason"|self-test|"ms"' | head -20
  step "done (reliability: $([ $RC = 0 ] && echo passed || echo FAILED))"
  exit $RC
fi

step "GPU tests"
# GPU_TEST_EXCLUDE: a ctest -E regex, to leave out suites already run on this commit's kernels.
EXCL=()
[ -n "${GPU_TEST_EXCLUDE:-}" ] && EXCL=(-E "$GPU_TEST_EXCLUDE")
timeout -k 10 900 ctest --test-dir "$BUILD" -L gpu "${EXCL[@]}" --output-on-failure --timeout 600 2>&1 | tee "$OUT/gpu-tests.log" | tail -40
if [ "$MODE" != final ]; then
  step "CPU tests"
  timeout -k 10 300 ctest --test-dir "$BUILD" -LE gpu -j8 2>&1 | tail -5
  step "probe"
  timeout -k 10 300 "$BUILD/tools/anyreduce" probe --json "$OUT/topology.json" 2>&1 | tee "$OUT/probe.txt"
fi

if [ "$MODE" = final ]; then
  step "bench bf16 1K..64M, all algorithms"
  timeout -k 10 300 "$BUILD/tools/anyreduce" bench -b 1K -e 64M -f 4 --samples 15 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  step "fused all-reduce + add + RMSNorm"
  timeout -k 10 300 "$BUILD/tools/anyreduce" bench --op add-rmsnorm --hidden 6144,7168 --tokens 1,8,32,128,512,2048 --samples 15 --json "$OUT/fused.json" 2>&1 | tee "$OUT/fused.txt"
  for q in fp8 nvfp4; do
    timeout -k 10 200 "$BUILD/tools/anyreduce" bench --op add-rmsnorm --quant $q --hidden 6144 --tokens 1,32,128,2048 --samples 15 2>&1 | tee "$OUT/fused-$q.txt"
  done
  step "python GPU tests"
  timeout -k 10 300 env ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" python3 -m pytest -q -rs -x python/tests 2>&1 | tail -25
elif [ "$MODE" = fused ]; then
  step "fused all-reduce + add + RMSNorm: hidden 4096..8192, tokens 1..2048"
  timeout -k 10 500 "$BUILD/tools/anyreduce" bench --op add-rmsnorm --hidden 4096,6144,7168,8192 \
    --tokens 1,2,3,4,8,16,32,64,129,128,256,512,1024,2048 --samples 11 --json "$OUT/fused.json" 2>&1 | tee "$OUT/fused.txt"
  for q in fp8 nvfp4; do
    timeout -k 10 200 "$BUILD/tools/anyreduce" bench --op add-rmsnorm --quant $q --hidden 6144,7168 \
      --tokens 1,8,32,128,2048 --samples 11 2>&1 | tee "$OUT/fused-$q.txt"
  done
  step "python GPU tests"
  timeout -k 10 300 env ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" python3 -m pytest -q -rs python/tests 2>&1 | tail -15
  step "examples/tp_decoder.py (int inputs: bit-identical check; then timing)"
  for f in "" --fused; do
    timeout -k 10 240 env ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" PYTHONPATH="$PWD/python" \
      python3 examples/tp_decoder.py --nproc-per-node 2 --graph $f --layers 8 --hidden 6144 --tokens 8 \
      --steps 100 2>&1 | grep -v Warning | tee -a "$OUT/tp_decoder.txt"
  done
elif [ "$MODE" = quick ]; then
  step "bench (quick)"
  timeout -k 10 600 "$BUILD/tools/anyreduce" bench -b 1K -e 64M -f 4 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  step "push chunking check: without and with a fence after the pushes"
  timeout -k 10 120 "$BUILD/tools/anyreduce" bench -a oneshot-push -b 4M -e 16M -f 4 --samples 5 2>&1 | tail -3
  ANYR_PUSH_FENCE=1 timeout -k 10 120 "$BUILD/tools/anyreduce" bench -a oneshot-push,twoshot-push -b 1K -e 16M -f 4 --samples 11 2>&1 | tail -20
  step "fused all-reduce + add + RMSNorm"
  timeout -k 10 300 "$BUILD/tools/anyreduce" bench --op add-rmsnorm --hidden 6144,7168 --tokens 1,8,32,128,512,2048 --json "$OUT/fused.json" 2>&1 | tee "$OUT/fused.txt"
  for q in fp8 nvfp4; do
    timeout -k 10 200 "$BUILD/tools/anyreduce" bench --op add-rmsnorm --quant $q --hidden 6144 --tokens 1,32,128,2048 2>&1 | tee "$OUT/fused-$q.txt"
  done
  step "torch symmetric memory, same machine"
  timeout -k 10 300 python3 tools/peers/torch_symm_bench.py --max-bytes 4194304 --samples 15 2>&1 | grep -v Warning | tee "$OUT/torch-symm.txt"
else
  step "bench bf16 1K..256M, all algorithms"
  timeout -k 10 900 "$BUILD/tools/anyreduce" bench -b 1K -e 256M -f 2 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  step "bench fp32 / fp16 (auto and nccl)"
  timeout -k 10 300 "$BUILD/tools/anyreduce" bench -b 1K -e 16M -f 4 -d fp16,fp32 -a auto 2>&1 | tee "$OUT/bench-dtypes.txt"
  step "bench eager launches"
  timeout -k 10 300 "$BUILD/tools/anyreduce" bench -b 1K -e 16M -f 4 -a auto --no-graph 2>&1 | tee "$OUT/bench-eager.txt"
  step "torch symmetric memory, same machine"
  timeout -k 10 300 python3 tools/peers/torch_symm_bench.py --json "$OUT/torch-symm.json" 2>&1 | grep -v Warning | tee "$OUT/torch-symm.txt"
fi
step "doctor: synthetic decode step, NCCL + separate add+RMSNorm vs anyreduce fused (glm preset)"
timeout -k 10 400 "$BUILD/tools/anyreduce" doctor --preset glm --batch 1,8,32 --json "$OUT/doctor-glm.json" --html "$OUT/doctor-glm.html" 2>&1 | tee "$OUT/doctor-glm.txt"
step "doctor: GLM-4.5-Air (fits two GPUs: a real TP2 deployment)"
timeout -k 10 400 "$BUILD/tools/anyreduce" doctor --preset glm-air --batch 1,8,32 --json "$OUT/doctor-glm-air.json" --html "$OUT/doctor-glm-air.html" 2>&1 | tee "$OUT/doctor-glm-air.txt"
step "doctor: glm with the per-GPU shapes of an 8-way deployment (all-reduce still over these GPUs)"
timeout -k 10 400 "$BUILD/tools/anyreduce" doctor --preset glm --shard-as 8 --batch 1,8,32 --json "$OUT/doctor-glm-tp8.json" --html "$OUT/doctor-glm-tp8.html" 2>&1 | tee "$OUT/doctor-glm-tp8.txt"
step "dispatch: tune, explain, bench --check-dispatch (seed only, then tuned)"
# Seed first (no table), then a table measured here; the check fails (non-zero) when the
# dispatched path is over 1.10x NCCL (seed) or 1.03x the fastest candidate (tuned).
timeout -k 10 600 env -u ANYR_TUNING_FILE "$BUILD/tools/anyreduce" bench --check-dispatch --samples 11 --json "$OUT/check-dispatch-seed.json" 2>&1 | tee "$OUT/check-dispatch-seed.txt" | tail -45
echo "check-dispatch (seed) exit: ${PIPESTATUS[0]}"
timeout -k 10 900 "$BUILD/tools/anyreduce" tune -o "$OUT/tuning.json" 2>&1 | tee "$OUT/tune.txt" | tail -70
echo "tune exit: ${PIPESTATUS[0]}"
ANYR_TUNING_FILE="$OUT/tuning.json" timeout -k 10 120 "$BUILD/tools/anyreduce" explain 2>&1 | tee "$OUT/explain.txt" | head -60
ANYR_TUNING_FILE="$OUT/tuning.json" timeout -k 10 600 "$BUILD/tools/anyreduce" bench --check-dispatch --samples 11 --json "$OUT/check-dispatch-tuned.json" 2>&1 | tee "$OUT/check-dispatch-tuned.txt" | tail -45
echo "check-dispatch (tuned) exit: ${PIPESTATUS[0]}"
ANYR_TUNING_FILE="$OUT/tuning.json" timeout -k 10 300 "$BUILD/tools/anyreduce" bench --check-dispatch --quant fp8 --minbytes 1K --maxbytes 1K --samples 11 2>&1 | tee "$OUT/check-dispatch-fp8.txt" | tail -16
echo "check-dispatch (fp8, tuned) exit: ${PIPESTATUS[0]}"
step "host-memory transport vs NCCL through host memory (NCCL_P2P_DISABLE=1 for the whole process)"
# The variable is set for the bench process, so the NCCL communicator it creates (the baseline
# column, and anyreduce's own NCCL fallback) goes through host memory too: the comparison the
# host transport is for. Targets (2 x H200): >= 2x NCCL up to 64 KB, >= 1.2x 256 KB..16 MB.
# The shared segment lives in /dev/shm: about n x (2 + 2/n) x ANYR_CHUNK_BYTES (48 MiB for 2
# ranks at the default 8 MiB); a smaller /dev/shm makes the host algorithms "not admitted".
df -h /dev/shm | tail -1
timeout -k 10 600 env NCCL_P2P_DISABLE=1 "$BUILD/tools/anyreduce" bench -a host-oneshot,host-twoshot,nccl \
  -b 1K -e 16M -f 4 --samples 15 --json "$OUT/bench-host.json" 2>&1 | tee "$OUT/bench-host.txt"
step "as a machine without peer access: ANYR_PEER_MEMORY=0, automatic choice vs NCCL without P2P"
timeout -k 10 600 env ANYR_PEER_MEMORY=0 NCCL_P2P_DISABLE=1 "$BUILD/tools/anyreduce" bench -a auto,nccl \
  -b 1K -e 64M -f 4 --samples 15 --json "$OUT/bench-nop2p-auto.json" 2>&1 | tee "$OUT/bench-nop2p-auto.txt"
step "host-memory transport: compressed wire at 16 MB (target: fp8 >= 1.6x native)"
for w in native fp8 int8; do
  timeout -k 10 300 env NCCL_P2P_DISABLE=1 "$BUILD/tools/anyreduce" bench -a host-oneshot,host-twoshot \
    -b 4M -e 16M -f 4 --samples 15 --wire $w --json "$OUT/bench-host-wire-$w.json" 2>&1 | tee "$OUT/bench-host-wire-$w.txt"
done
step "host one-shot pipelining depth (ANYR_HOST_ROUND vectors per thread per round)"
for r in 1 2 4 8; do
  echo "# ANYR_HOST_ROUND=$r"
  timeout -k 10 200 env ANYR_HOST_ROUND=$r "$BUILD/tools/anyreduce" bench -a host-oneshot \
    -b 256K -e 16M -f 4 --samples 11 2>&1 | grep -v "^#" | tee -a "$OUT/bench-host-round.txt"
done
step "host-memory transport: fused all-reduce + add + RMSNorm (composition)"
timeout -k 10 300 env ANYR_ALGO=host-oneshot "$BUILD/tools/anyreduce" bench --op add-rmsnorm --hidden 6144 \
  --tokens 1,32,128,2048 --samples 15 2>&1 | tee "$OUT/fused-host.txt"
step "done"
