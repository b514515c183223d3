#!/usr/bin/env bash
# Everything that needs GPUs, in one script: build on the GPU machine, run the GPU tests, probe,
# benchmark anyreduce against NCCL (and PyTorch symmetric memory) on all visible GPUs.
# Logs and JSON go to $OUT (or ./device-out). Every multi-process step runs under `timeout`.
#
#   scripts/device.sh [SECTION ...]        (default: all)
#
# Sections (in this order when several are given):
#   tests        every gpu-labelled ctest (GPU_TEST_EXCLUDE / GPU_TEST_ONLY: ctest -E / -R regex)
#   probe        anyreduce probe (topology, link checks, bandwidth, latency) + CPU tests
#   bench        all-reduce 1 KB..256 MB, every algorithm vs NCCL; dtypes; eager launches
#   torch        PyTorch symmetric memory on the same machine
#   fused        fused all-reduce + add + RMSNorm (+FP8/NVFP4) vs NCCL + kernel and own + kernel
#   python       Python package GPU tests, examples/tp_decoder.py
#   reliability  full-size stress (100,000 calls), 20 kill -9 trials, self-test injection, ...
#   dispatch     bench --check-dispatch (seed), anyreduce tune, explain, check again (tuned)
#   host         host-memory transport vs NCCL through host memory; compressed wire
#   hostphases   anyr_host_phases alone (built alone): where a 1..256 KiB all-reduce through host
#                memory spends its time (write, flag release, flag seen, read) on 2 GPUs
#   doctor       anyreduce doctor (synthetic decode step, power) for the GLM-like presets
#   profile      anyr_fused_floor: the fused one-shot (1..64 rows, quantized or not) against an
#                empty kernel, the standalone epilogue and the plain one-shot push (where the us go);
#                then 80 and 128 rows in clusters of two at two blocks per SM (--pairs), each
#                fused output first checked against the composition's
#   pdl          programmatic dependent launch (ANYR_PDL, on by default; ANYR_PDL_EARLY): the GPU
#                tests with it off and without the early release, then the all-reduce and fused
#                benches off, on releasing at exit, and on releasing early, alternating, in one run
#   fusedpaths   the fused bench with the one-shot and the two-shot push forced (ANYR_ALGO): each
#                fused kernel against the composition on the same algorithm
#   clusters     the fused one-shot's cluster form (ANYR_FUSED_CLUSTER): its GPU tests, then the
#                fused bench with clusters off (1), automatic (0) and forced to 2, 4, 8, in one run;
#                bench --fused-cluster / --max-blocks reach the config (over invalid variables)
#   pairs        clusters of two at two blocks per SM (67-128 rows on 132 SMs): their GPU test,
#                then the fused bench at 64-128 tokens with them (default) and without them
#                (ANYR_MAX_BLOCKS = the SM count), none / FP8 / NVFP4, alternating two rounds
#   clustertune  cluster sizes measured by `anyreduce tune`: the tuning GPU tests, tune at hidden
#                7168 and 6144 (TUNE_HIDDENS), explain, then the fused bench without and with each
#                table, alternating (CT_ROUNDS rounds; CT_TUNE=0 skips the tests and tuning)
#   worlds       world sizes 3, 4, 5, 8 (WORLDS; those the machine has) on the first W GPUs: GPU
#                tests, all-reduce and fused benches against NCCL, the doctor's GLM preset at 8
#   shared       ranks sharing one GPU (a correctness run, not a speed claim): for each world size
#                in SHARED_WORLDS (default 2..8), the all-reduce bench of every admitted algorithm
#                (SHARED_ALGOS, default every one) over SHARED_SIZES (-b/-e/-f), each size checked exact
#                before it is timed, JSON per world size; the times sit beside the all-to-all forms
#                measured in the same run, on contexts that time-slice one GPU
#   oldtargets   the code paths of older GPUs on this one: the GPU tests built from PTX of compute
#                capability 7.5 and 8.0 only (OLD_TARGETS), JIT-compiled here at load; the standalone
#                kernel's tests and fp64 matrix, the all-reduce and fused op at three ranks on the
#                first GPU. Correctness of those targets' code, not their speed.
#   ncu          Nsight Compute on the one-token kernels at world size 1 (stall reasons per SASS
#                instruction; NCU_HIDDEN, default 6144; NCU_QUANT: none|fp8|nvfp4; NCU_KERNELS:
#                the kernel names, space-separated, each a regex (addRmsNorm: the standalone
#                kernel in whichever form it takes); NCU_ARGS: more anyr_fused_floor arguments,
#                e.g. "--twoshot --rows 128")
#   ncutorch     Nsight Compute on the standalone add + RMSNorm (anyr_epilogue_bench, variant
#                NCUT_VARIANT, default auto) and on torch.compile's kernel for the same function
#                (tools/peers/torch_epilogue_bench.py), per shape of NCUT_SHAPES (HIDDENxTOKENS,
#                default "6144x128 4096x512"), dtype NCUT_DTYPE (bf16): one launch of each, with
#                the caches flushed before it (--cache-control all, so both start cold) and as
#                each process left them (none); duration, instructions, registers, L2 hits, the
#                SASS of both side by side; builds only the tool and the library
#   namespaces   peer memory across Linux namespaces: two ranks (tools/peers/namespace_check.py),
#                rank 1 in a new PID namespace, IPC namespace or both (unshare; as containers that
#                share none), with ANYR_PEER_MEMORY auto, cuda-ipc and vmm: the kind each maps,
#                and every admitted peer algorithm exact; then rank 1 with a host name of its own
#                (UTS namespace), without and with a shared ANYR_HOST_ID
#   torchops     the torch.ops.anyreduce operators (torch.compile): their tests (two ranks, sharing
#                the GPU where there is one), the torch CPU tests, and the host time per eager
#                call through each Python door (tools/peers/torch_ops_overhead.py) and through the C
#                API beside the CUDA calls it is made of (anyr_host_overhead); builds only those
#   targets      the performance targets of the open issues, judged in one call: the fused bench
#                (none / FP8 / NVFP4, hidden 6144 and 7168, 1..2048 tokens) and the host-memory
#                transport without peer access (NCCL_P2P_DISABLE=1, 1 KB..16 MB, the FP8 wire at
#                16 MB) on the first 2 GPUs; with 8 GPUs also the all-reduce (1 KB..256 MB) and the
#                fused op at 8 ranks; then tools/targets/check_targets.py prints MET / MISSED / NOT
#                MEASURED per target, each from figures of one run (peer in the same process)
#   epilogue     the standalone add + RMSNorm (+ FP8 / NVFP4) at the memory roofline, on the first
#                GPU: anyr_epilogue_bench (each kernel form of EPI_VARIANTS, an empty kernel and a
#                device-to-device copy of the same bytes, every variant checked against the fp64
#                reference first; EPI_DTYPES, EPI_HIDDEN, EPI_TOKENS, EPI_QUANT narrow it), then
#                tools/peers/torch_epilogue_bench.py (eager PyTorch and torch.compile beside
#                anyreduce.torch.add_rms_norm, the same shapes; EPI_COMPILE=static|dynamic shapes;
#                EPI_TORCH=0 skips it, EPI_BENCH=0 the first), then issue 46's targets per variant
#                (check_targets.py);
#                builds only the tool and the library; JSON in $OUT
#   all          all of the above (longer than one 10-minute call: split it)
set -uo pipefail
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(all)
want() { local x; for x in "${SECTIONS[@]}"; do [ "$x" = "$1" ] || [ "$x" = all ] && return 0; done; return 1; }
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ARCH=${ANYR_CUDA_ARCHS:-native}
JOBS=$(nproc)
BUILD=${BUILD:-build-device}
A="$BUILD/tools/anyreduce"
RC=0
step() { echo; echo "=== $* ($(date +%T))"; }
# Records a failed step (the script goes on, and exits non-zero at the end).
check() { if [ "$1" != 0 ]; then echo "FAILED ($2): exit $1"; RC=1; fi; }
# A GoogleTest run whose filter matched nothing exits 0: record that as a failure too.
ran_tests() {
  grep -qE '^\[==========\] [1-9][0-9]* tests? from .* ran' "$1" || { echo "FAILED ($2): no test ran"; RC=1; }
}

step "machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m 2>&1 | tee -a "$OUT/gpus.txt" | head -12

step "build (CUDA architectures: $ARCH)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
# A section that runs one diagnostic alone builds only that tool.
ONLY=()
case "${SECTIONS[*]}" in
  hostphases) ONLY=(--target anyr_host_phases) ;;
  ncu | profile) ONLY=(--target anyr_fused_floor) ;;
  torchops) ONLY=(--target anyreduce anyr_host_overhead) ;;
  epilogue | ncutorch) ONLY=(--target anyreduce anyr_epilogue_bench) ;;
esac
cmake --build "$BUILD" -j"$JOBS" "${ONLY[@]}" >"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "built"

if want tests; then
  step "GPU tests"
  SEL=()
  [ -n "${GPU_TEST_EXCLUDE:-}" ] && SEL+=(-E "$GPU_TEST_EXCLUDE")
  [ -n "${GPU_TEST_ONLY:-}" ] && SEL+=(-R "$GPU_TEST_ONLY")
  timeout -k 10 900 ctest --test-dir "$BUILD" -L gpu --no-tests=error "${SEL[@]}" --output-on-failure --timeout 600 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "Test +#|tests passed|FAILED|Failure" | tail -60
  check "${PIPESTATUS[0]}" "GPU tests"
fi

if want probe; then
  step "CPU tests"
  timeout -k 10 300 ctest --test-dir "$BUILD" -LE gpu -j8 2>&1 | tail -3
  check "${PIPESTATUS[0]}" "CPU tests"
  step "probe"
  timeout -k 10 300 "$A" probe --json "$OUT/topology.json" 2>&1 | tee "$OUT/probe.txt"
fi

if want bench; then
  step "bench bf16 1K..256M, all algorithms vs NCCL"
  timeout -k 10 500 "$A" bench -b 1K -e 256M -f 4 --samples 11 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  check "${PIPESTATUS[0]}" "bench"
  step "bench fp32 / fp16 (auto and nccl)"
  timeout -k 10 300 "$A" bench -b 1K -e 16M -f 4 -d fp16,fp32 --algos auto --samples 11 2>&1 | tee "$OUT/bench-dtypes.txt"
  step "bench eager launches"
  timeout -k 10 300 "$A" bench -b 1K -e 16M -f 4 --algos auto --no-graph --samples 11 2>&1 | tee "$OUT/bench-eager.txt"
fi

if want torch; then
  step "torch symmetric memory, same machine"
  timeout -k 10 300 python3 tools/peers/torch_symm_bench.py --json "$OUT/torch-symm.json" 2>&1 | grep -v Warning | tee "$OUT/torch-symm.txt"
fi

if want fused; then
  step "fused all-reduce + add + RMSNorm: hidden 4096..8192, tokens 1..2048"
  timeout -k 10 500 "$A" bench --op add-rmsnorm --hidden 4096,6144,7168,8192 \
    --tokens 1,2,3,8,16,32,64,128,129,256,512,1024,2048 --samples 11 --json "$OUT/fused.json" 2>&1 | tee "$OUT/fused.txt"
  check "${PIPESTATUS[0]}" "fused bench"
  for q in fp8 nvfp4; do
    timeout -k 10 200 "$A" bench --op add-rmsnorm --quant $q --hidden 6144,7168 \
      --tokens 1,8,32,128,2048 --samples 11 2>&1 | tee "$OUT/fused-$q.txt"
    check "${PIPESTATUS[0]}" "fused $q bench"
    # The quantized output alone (normOut NULL), as a layer feeding an FP8 / NVFP4 GEMM runs it.
    timeout -k 10 200 "$A" bench --op add-rmsnorm --quant $q --quant-only --hidden 6144,7168 \
      --tokens 1,8,32,128,256,512 --samples 11 2>&1 | tee "$OUT/fused-$q-only.txt"
    check "${PIPESTATUS[0]}" "fused $q --quant-only bench"
  done
fi

if want python; then
  step "python GPU tests"
  timeout -k 10 560 env ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" python3 -m pytest -q -rs python/tests 2>&1 | tail -15
  check "${PIPESTATUS[0]}" "python tests"
  step "examples/tp_decoder.py (int inputs: bit-identical check; then timing)"
  # The example compares against NCCL, which needs a GPU per rank.
  if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then
    echo "one GPU: the example needs two; not run"
  else
    for f in "" --fused; do
      timeout -k 10 240 env ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" PYTHONPATH="$PWD/python" \
        python3 examples/tp_decoder.py --nproc-per-node 2 --graph $f --layers 8 --hidden 6144 --tokens 8 \
        --steps 100 2>&1 | grep -v Warning | tee -a "$OUT/tp_decoder.txt"
      check "${PIPESTATUS[0]}" "tp_decoder $f"
    done
  fi
fi

if want torchops; then
  step "torch.ops.anyreduce operators: tests (eager, torch.compile, CUDA graph, opcheck)"
  timeout -k 10 540 env ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" python3 -m pytest -v -rs \
    python/tests/test_torch_ops.py python/tests/test_torch_cpu.py 2>&1 | tee "$OUT/torch-ops-tests.txt" | tail -30
  check "${PIPESTATUS[0]}" "torch ops tests"
  step "host time per eager call through each Python door"
  timeout -k 10 200 env ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" PYTHONPATH="$PWD/python" \
    python3 tools/peers/torch_ops_overhead.py --json "$OUT/torch-ops-overhead.json" 2>&1 | grep -v Warning | tee "$OUT/torch-ops-overhead.txt"
  check "${PIPESTATUS[0]}" "torch ops overhead"
  timeout -k 10 150 "$BUILD/tests/diag/anyr_host_overhead" 2>&1 | tee "$OUT/host-overhead.txt"
  check "${PIPESTATUS[0]}" "anyr_host_overhead"
fi

if want reliability; then
  T="$BUILD/tests/anyr_gpu_tests"
  step "reliability: stress, 100000 random calls with canaries"
  ANYR_TEST_STRESS_CALLS=100000 timeout -k 10 560 "$T" --gtest_filter='ReliabilityGpu.Stress*' 2>&1 | tee "$OUT/reliability-stress.log" | grep -E "info|OK|FAIL|Failure|PASSED|SKIPPED" | tail -12
  check "${PIPESTATUS[0]}" "stress"
  ran_tests "$OUT/reliability-stress.log" "stress"
  step "reliability: kill -9 one rank, 20 trials"
  ANYR_TEST_KILL_TRIALS=20 timeout -k 10 560 "$T" --gtest_filter='ReliabilityGpu.Kill*' 2>&1 | tee "$OUT/reliability-kill.log" | grep -E "info|OK|FAIL|Failure|PASSED|SKIPPED" | tail -12
  check "${PIPESTATUS[0]}" "kill trials"
  ran_tests "$OUT/reliability-kill.log" "kill trials"
  if [ -z "${RELIABILITY_SHORT:-}" ]; then
    step "reliability: self-test, fault injection, skipped call, abort, 200 create/destroy"
    timeout -k 10 560 "$T" --gtest_filter='ReliabilityGpu.*:-ReliabilityGpu.Stress*:ReliabilityGpu.Kill*' 2>&1 | tee "$OUT/reliability-other.log" | grep -E "info|OK|FAIL|Failure|PASSED|SKIPPED" | tail -40
    check "${PIPESTATUS[0]}" "reliability (other)"
    ran_tests "$OUT/reliability-other.log" "reliability (other)"
    step "reliability: call discipline (validation mode, threads, streams, devices)"
    timeout -k 10 560 ctest --test-dir "$BUILD" -L gpu --no-tests=error -R 'ReliabilityCalls' --output-on-failure --timeout 300 2>&1 | tee "$OUT/reliability-calls.log" | tail -15
    check "${PIPESTATUS[0]}" "reliability (calls)"
  fi
  step "reliability: anyreduce explain with a corrupted peer mapping on rank 1 (self-test reasons)"
  ANYR_FAULT_INJECT=corrupt-peer:1 timeout -k 10 300 "$A" explain 2>&1 | tee "$OUT/reliability-explain-injected.txt" | grep -E 'self-test|REJECTED' | head -20
fi

if want dispatch; then
  step "dispatch: bench --check-dispatch (seed only), tune, explain, check again (tuned)"
  # The check fails (non-zero) when the dispatched path is over 1.10x NCCL (seed) or 1.03x the
  # fastest candidate (tuned).
  timeout -k 10 600 env -u ANYR_TUNING_FILE "$A" bench --check-dispatch --samples 11 --json "$OUT/check-dispatch-seed.json" 2>&1 | tee "$OUT/check-dispatch-seed.txt" | tail -45
  check "${PIPESTATUS[0]}" "check-dispatch (seed)"
  timeout -k 10 900 "$A" tune -o "$OUT/tuning.json" 2>&1 | tee "$OUT/tune.txt" | tail -40
  check "${PIPESTATUS[0]}" "tune"
  ANYR_TUNING_FILE="$OUT/tuning.json" timeout -k 10 120 "$A" explain 2>&1 | tee "$OUT/explain.txt" | head -60
  ANYR_TUNING_FILE="$OUT/tuning.json" timeout -k 10 600 "$A" bench --check-dispatch --samples 11 --json "$OUT/check-dispatch-tuned.json" 2>&1 | tee "$OUT/check-dispatch-tuned.txt" | tail -45
  check "${PIPESTATUS[0]}" "check-dispatch (tuned)"
fi

if want host; then
  step "host-memory transport vs NCCL through host memory (NCCL_P2P_DISABLE=1 for the whole process)"
  # The variable is set for the bench process, so the NCCL communicator it creates (the baseline
  # column, and anyreduce's own NCCL fallback) goes through host memory too: the comparison the
  # host transport is for. Targets (2 x H200): >= 2x NCCL up to 64 KB, >= 1.2x 256 KB..16 MB.
  # The shared segment lives in /dev/shm (about 67 MiB for 2 ranks at the default 8 MiB chunk:
  # host-copy's copy buffer adds a launch plus a copy chunk per rank).
  df -h /dev/shm | tail -1
  step "host-memory link: copy engines, SM stores/loads, flag round trip (the transport's ceiling)"
  timeout -k 10 120 "$BUILD/tests/diag/anyr_host_link_bw" 2>&1 | tee "$OUT/host-link-bw.txt"
  check "${PIPESTATUS[0]}" "host link bandwidth"
  timeout -k 10 180 "$BUILD/tests/diag/anyr_host_phases" 2>&1 | tee "$OUT/host-phases.txt"
  check "${PIPESTATUS[0]}" "host phases"
  timeout -k 10 500 env NCCL_P2P_DISABLE=1 "$A" bench --algos host-oneshot,host-twoshot,host-copy,nccl \
    -b 1K -e 16M -f 4 --samples 11 --json "$OUT/bench-host.json" 2>&1 | tee "$OUT/bench-host.txt"
  check "${PIPESTATUS[0]}" "host bench"
  step "host-memory transport: compressed wire at 4 and 16 MB (target: fp8 >= 1.6x native at 16 MB)"
  for w in native fp8 int8; do
    timeout -k 10 300 env NCCL_P2P_DISABLE=1 "$A" bench --algos host-oneshot,host-twoshot,host-copy \
      -b 4M -e 16M -f 4 --samples 11 --wire $w 2>&1 | tee "$OUT/bench-host-wire-$w.txt"
  done
  step "host-copy: copy-engine chunk size (ANYR_HOST_COPY_CHUNK_BYTES) at 1, 4 and 16 MB"
  # HOST_QUICK=1 skips this sweep and the fused compositions at the end.
  [ -n "${HOST_QUICK:-}" ] || for c in 256K 512K 1M 2M 4M; do
    timeout -k 10 200 env NCCL_P2P_DISABLE=1 ANYR_HOST_COPY_CHUNK_BYTES=$c "$A" bench --algos host-copy \
      -b 1M -e 16M -f 4 --samples 11 2>&1 | tee "$OUT/bench-host-copy-chunk-$c.txt"
  done
  # A 16 MB message is one launch at the default ANYR_HOST_LAUNCH_BYTES (16M); two 8 MB launches
  # show what a drain and refill of the pipeline costs, 64 MB what four launches cost.
  timeout -k 10 200 env NCCL_P2P_DISABLE=1 ANYR_HOST_LAUNCH_BYTES=8M "$A" bench --algos host-copy,host-twoshot,nccl \
    -b 4M -e 16M -f 4 --samples 11 2>&1 | tee "$OUT/bench-host-copy-launch8M.txt"
  timeout -k 10 300 env NCCL_P2P_DISABLE=1 "$A" bench --algos host-copy,host-twoshot,nccl \
    -b 16M -e 64M -f 4 --samples 11 2>&1 | tee "$OUT/bench-host-copy-launch16M.txt"
  step "as a machine without peer access: ANYR_PEER_MEMORY=0, automatic choice vs NCCL without P2P"
  timeout -k 10 300 env ANYR_PEER_MEMORY=0 NCCL_P2P_DISABLE=1 "$A" bench --algos auto,nccl \
    -b 1K -e 64M -f 4 --samples 11 2>&1 | tee "$OUT/bench-nop2p-auto.txt"
  step "host-memory transport: fused all-reduce + add + RMSNorm (composition)"
  [ -n "${HOST_QUICK:-}" ] || for a in host-oneshot host-copy; do
    timeout -k 10 300 env ANYR_ALGO=$a NCCL_P2P_DISABLE=1 "$A" bench --op add-rmsnorm --hidden 6144 \
      --tokens 1,32,128,2048 --samples 11 2>&1 | tee "$OUT/fused-$a.txt"
  done
fi

if want hostphases && ! want host; then
  step "host-memory all-reduce phases: write, flag release, flag seen, read (anyr_host_phases)"
  timeout -k 10 180 "$BUILD/tests/diag/anyr_host_phases" 2>&1 | tee "$OUT/host-phases.txt"
  check "${PIPESTATUS[0]}" "host phases"
fi

if want doctor; then
  for preset in ${DOCTOR_PRESETS:-glm glm-air}; do
    step "doctor: $preset preset, NCCL + separate add+RMSNorm vs anyreduce fused"
    timeout -k 10 400 "$A" doctor --preset "$preset" --batch 1,8,32 --json "$OUT/doctor-$preset.json" \
      --html "$OUT/doctor-$preset.html" 2>&1 | tee "$OUT/doctor-$preset.txt"
    check "${PIPESTATUS[0]}" "doctor $preset"
  done
fi

if want profile; then
  step "profile: where the fused one-shot's time goes at one token (anyr_fused_floor)"
  # Empty kernel, standalone add+RMSNorm, plain one-shot push and the fused kernel, at world
  # size 1 (no peer) and 2, in one process (nsys is not installed on the GPU machine).
  timeout -k 10 120 "$BUILD/tests/diag/anyr_fused_floor" --pdl 2>&1 | tee "$OUT/fused-floor.txt"
  check "${PIPESTATUS[0]}" "anyr_fused_floor"
  # Rows (where the 8..32-token time goes) and the quantized epilogues, hidden 6144.
  # The cluster form (--cluster 8: each row over the 8 blocks of a cluster) beside each.
  for args in "--rows 8" "--rows 32" "--rows 64" "--quant fp8" "--quant nvfp4" "--rows 32 --quant fp8" \
    "--cluster 8" "--rows 8 --cluster 8" "--quant nvfp4 --cluster 8"; do
    timeout -k 10 60 "$BUILD/tests/diag/anyr_fused_floor" --pdl --hidden 6144 $args 2>&1 |
      tee -a "$OUT/fused-floor.txt" | grep -v "^empty"
    check "${PIPESTATUS[0]}" "anyr_fused_floor $args"
  done
  # Beyond one block per SM: clusters of two at two blocks per SM (--pairs: the ordinary kernel
  # where it holds them, else the pair kernel), one-shot and two-shot, every quantization, hidden
  # 6144 and 7168; the block-per-row kernel and the dense two-shot beside them. Each
  # invocation first checks the fused outputs against the composition's, byte for byte.
  for q in none fp8 nvfp4; do
    for args in "--rows 80" "--rows 80 --cluster 2 --pairs" "--rows 128 --cluster 2 --pairs" \
      "--twoshot --dense --rows 128" "--twoshot --rows 128 --cluster 2 --pairs"; do
      for h in 6144 7168; do
        timeout -k 10 60 "$BUILD/tests/diag/anyr_fused_floor" --pdl --hidden $h --quant $q $args 2>&1 |
          tee -a "$OUT/fused-floor.txt" | grep -vE "^empty|^#"
        check "${PIPESTATUS[0]}" "anyr_fused_floor --hidden $h --quant $q $args"
      done
    done
  done
fi

if want pdl; then
  step "programmatic dependent launch (ANYR_PDL): correctness, then the same benches off and on"
  timeout -k 10 300 ctest --test-dir "$BUILD" -L gpu --no-tests=error -R 'ProgrammaticLaunch' --output-on-failure \
    --timeout 280 2>&1 | tee "$OUT/pdl-tests.log" | grep -E "INFO|Passed|Failed|tests passed"
  check "${PIPESTATUS[0]}" "PDL test"
  # Plain launches, programmatic launch releasing only at exit, and with the early release
  # (the default), alternating over two rounds in one run.
  for round in 1 2; do
    for mode in "0 0" "1 0" "1 1"; do
      set -- $mode
      tag="pdl$1-early$2-r$round"
      [ "$round" = 1 ] && ANYR_PDL=$1 ANYR_PDL_EARLY=$2 timeout -k 10 120 "$A" explain 2>&1 | grep -i 'programmatic launch' | head -2
      ANYR_PDL=$1 ANYR_PDL_EARLY=$2 timeout -k 10 200 "$A" bench --algos oneshot-push,twoshot-push,auto,nccl \
        -b 1K -e 16M -f 4 --samples 11 2>&1 | tee "$OUT/$tag-bench.txt"
      check "${PIPESTATUS[0]}" "$tag bench"
      ANYR_PDL=$1 ANYR_PDL_EARLY=$2 timeout -k 10 200 "$A" bench --op add-rmsnorm --hidden 6144,7168 \
        --tokens 1,2,8,16,20,24,32,64,128,256,512,1024 --samples 11 2>&1 | tee "$OUT/$tag-fused.txt"
      check "${PIPESTATUS[0]}" "$tag fused bench"
    done
  done
fi

if want fusedpaths; then
  step "fused kernels forced (ANYR_ALGO): one-shot push and two-shot push against own + kernel"
  for algo in oneshot-push twoshot-push; do
    ANYR_ALGO=$algo timeout -k 10 200 "$A" bench --op add-rmsnorm --hidden 6144,7168 \
      --tokens 1,8,32,64,128,256,512,2048 --samples 11 2>&1 | tee "$OUT/fusedpaths-$algo.txt"
    check "${PIPESTATUS[0]}" "fused bench forced $algo"
  done
fi

if want pairs; then
  step "clusters of two at two blocks per SM: the test, then the fused bench with and without"
  timeout -k 10 300 ctest --test-dir "$BUILD" -L gpu --no-tests=error -R 'ClustersOfTwoBeyondOneBlockPerSm' \
    --output-on-failure --timeout 280 2>&1 | tee "$OUT/pairs-tests.log" | grep -E "Passed|Failed|tests passed"
  check "${PIPESTATUS[0]}" "pairs test"
  # One block per SM of the smallest GPU (explain's blocks.fusedAndHost): as a grid cap it
  # leaves every other launch as it is and turns the pairs off.
  SMS=$(timeout -k 10 120 "$A" explain 2>/dev/null | grep -oE '"fusedAndHost": *[0-9]+' | head -1 |
    grep -oE '[0-9]+$')
  echo "blocks.fusedAndHost: ${SMS:-unknown (132 used)}"
  for round in 1 2; do
    for mode in pairs nopairs; do
      E=(); [ "$mode" = nopairs ] && E=(ANYR_MAX_BLOCKS="${SMS:-132}")
      for q in none fp8 nvfp4; do
        env "${E[@]}" timeout -k 10 120 "$A" bench --op add-rmsnorm --quant "$q" --hidden 6144,7168 \
          --tokens 64,72,80,96,112,128 --samples 9 2>&1 | tee "$OUT/pairs-$mode-$q-r$round.txt" |
          grep -E "^ +(6144|7168) " | sed "s/^/$mode $q r$round: /"
        check "${PIPESTATUS[0]}" "fused bench $mode --quant $q round $round"
      done
    done
  done
fi

if want clusters; then
  step "fused one-shot in thread-block clusters (ANYR_FUSED_CLUSTER): correctness, then 1/0/2/4/8"
  timeout -k 10 400 ctest --test-dir "$BUILD" -L gpu --no-tests=error -R 'Cluster' --output-on-failure \
    --timeout 380 2>&1 | tee "$OUT/clusters-tests.log" | grep -E "INFO fused clusters|Passed|Failed|tests passed" | sort -u | head -20
  check "${PIPESTATUS[0]}" "cluster tests"
  ANYR_FUSED_CLUSTER=0 timeout -k 10 120 "$A" explain 2>&1 | grep -A12 '"fusedClusters"' | head -13
  for c in 1 0 2 4 8; do
    ANYR_FUSED_CLUSTER=$c ANYR_ALGO=oneshot-push timeout -k 10 200 "$A" bench --op add-rmsnorm \
      --hidden 6144,7168 --tokens 1,2,8,16,32 --samples 11 2>&1 | tee "$OUT/clusters-$c-oneshot.txt"
    check "${PIPESTATUS[0]}" "fused bench one-shot ANYR_FUSED_CLUSTER=$c"
  done
  # The dispatched path (one-shot, then the two-shot's register form) with clusters off and on.
  for c in 1 0; do
    ANYR_FUSED_CLUSTER=$c timeout -k 10 200 "$A" bench --op add-rmsnorm --hidden 6144,7168 \
      --tokens 1,8,32,64,128,256,512 --samples 11 2>&1 | tee "$OUT/clusters-$c-auto.txt"
    check "${PIPESTATUS[0]}" "fused bench ANYR_FUSED_CLUSTER=$c"
  done
  for q in fp8 nvfp4; do
    timeout -k 10 200 "$A" bench --op add-rmsnorm --quant "$q" --hidden 6144,7168 \
      --tokens 1,8,32,64,128 --samples 11 2>&1 | tee "$OUT/clusters-auto-$q.txt"
    check "${PIPESTATUS[0]}" "fused bench --quant $q"
  done
  # bench --fused-cluster / --max-blocks reach the communicator's config: given, they win over
  # the (invalid) variables, which are then not read, so the run passes only if they got there;
  # without them the same variables must fail init, naming ANYR_FUSED_CLUSTER.
  ANYR_FUSED_CLUSTER=3 ANYR_MAX_BLOCKS=999 timeout -k 10 200 "$A" bench --op add-rmsnorm \
    --fused-cluster 2 --max-blocks 64 --hidden 6144 --tokens 1,8,32 --samples 5 2>&1 | tee "$OUT/clusters-flags.txt"
  check "${PIPESTATUS[0]}" "fused bench --fused-cluster 2 --max-blocks 64 over bad variables"
  ANYR_FUSED_CLUSTER=3 timeout -k 10 120 "$A" bench --op add-rmsnorm --hidden 6144 --tokens 1 \
    --samples 1 >"$OUT/clusters-flags-control.txt" 2>&1
  if [ $? -eq 0 ] || ! grep -q "ANYR_FUSED_CLUSTER" "$OUT/clusters-flags-control.txt"; then
    echo "FAILED: ANYR_FUSED_CLUSTER=3 without --fused-cluster did not fail init naming it"; RC=1
  fi
fi

if want clustertune; then
  CTL="$OUT/clustertune.txt"
  if [ "${CT_TUNE:-1}" != 0 ]; then
    step "clustertune: tuning GPU tests" | tee -a "$CTL"
    timeout -k 10 500 ctest --test-dir "$BUILD" -L gpu --no-tests=error -R 'DispatchGpu' --output-on-failure \
      --timeout 480 2>&1 | tee "$OUT/clustertune-tests.log" | grep -E "CLUSTER|Passed|Failed|tests passed" | sort -u | tee -a "$CTL"
    check "${PIPESTATUS[0]}" "tuning GPU tests"
    for H in ${TUNE_HIDDENS:-7168 6144}; do
      step "clustertune: anyreduce tune --hidden $H --max-tokens 128 -b 1K -e 4M" | tee -a "$CTL"
      timeout -k 10 300 "$A" tune --hidden "$H" --max-tokens 128 -b 1K -e 4M -o "$OUT/tune-$H.json" 2>&1 | tail -3 | tee -a "$CTL"
      check "${PIPESTATUS[0]}" "tune --hidden $H"
      ANYR_TUNING_FILE="$OUT/tune-$H.json" timeout -k 10 120 "$A" explain 2>&1 | grep -E "clusters|^  *[0-9.]+[KM]? +fused:|add-rmsnorm" | tee -a "$CTL"
    done
  fi
  for r in $(seq 1 "${CT_ROUNDS:-2}"); do
    for H in ${TUNE_HIDDENS:-7168 6144}; do
      for table in none "$OUT/tune-$H.json"; do
        step "clustertune round $r: hidden $H, table $table" | tee -a "$CTL"
        if [ "$table" = none ]; then
          env -u ANYR_TUNING_FILE timeout -k 10 200 "$A" bench --op add-rmsnorm --hidden "$H" \
            --tokens 1,8,16,24,32,64,96,128 --samples 11 2>&1 | tee -a "$CTL" | tail -14
        else
          ANYR_TUNING_FILE="$table" timeout -k 10 200 "$A" bench --op add-rmsnorm --hidden "$H" \
            --tokens 1,8,16,24,32,64,96,128 --samples 11 2>&1 | tee -a "$CTL" | tail -14
        fi
        check "${PIPESTATUS[0]}" "fused bench hidden $H table $table"
      done
    done
  done
fi

if want worlds; then
  # World sizes other than the machine's (3, 4, 5, 8 by default: WORLDS), each on the first W
  # GPUs (CUDA_VISIBLE_DEVICES): the GPU tests (minus the slow ones and those that set their own
  # world sizes, WORLD_TEST_EXCLUDE; `tests` runs them at the machine's width), the
  # all-reduce bench 1 KB..256 MB and the fused bench, NCCL in the same runs; the doctor's GLM
  # preset at 8. Sizes above the GPU count are skipped and said so. `dispatch` (tune, check)
  # runs at the full width on its own.
  NGPU=$(nvidia-smi -L | wc -l)
  for w in ${WORLDS:-3 4 5 8}; do
    if [ "$w" -gt "$NGPU" ] || [ "$w" -lt 2 ]; then
      echo "world size $w: this machine has $NGPU GPUs; skipped"
      continue
    fi
    DEVS=$(seq -s, 0 $((w - 1)))
    step "world size $w (CUDA_VISIBLE_DEVICES=$DEVS)"
    CUDA_VISIBLE_DEVICES=$DEVS timeout -k 10 "${WORLD_TEST_S:-400}" ctest --test-dir "$BUILD" -L gpu --no-tests=error \
      -E "${WORLD_TEST_EXCLUDE:-FusedKernelMatrix|CreateDestroy200|WiderWorldSizes|doctor}" --output-on-failure \
      --timeout 300 2>&1 | tee "$OUT/world$w-tests.log" | grep -E "tests passed|Failed|\*\*\*"
    check "${PIPESTATUS[0]}" "GPU tests at world size $w"
    CUDA_VISIBLE_DEVICES=$DEVS timeout -k 10 400 "$A" bench -b 1K -e 256M -f 4 --samples 7 \
      --json "$OUT/world$w-bench.json" 2>&1 | tee "$OUT/world$w-bench.txt" | grep -E "auto|#"
    check "${PIPESTATUS[0]}" "bench at world size $w"
    CUDA_VISIBLE_DEVICES=$DEVS timeout -k 10 300 "$A" bench --op add-rmsnorm --hidden 6144,7168 \
      --tokens 1,2,8,32,64,128,512,2048 --samples 7 2>&1 | tee "$OUT/world$w-fused.txt"
    check "${PIPESTATUS[0]}" "fused bench at world size $w"
    if [ "$w" -eq 8 ]; then
      CUDA_VISIBLE_DEVICES=$DEVS timeout -k 10 400 "$A" doctor --preset glm --batch 1,8,32 \
        --json "$OUT/doctor-glm-tp8.json" --html "$OUT/doctor-glm-tp8.html" 2>&1 |
        tee "$OUT/doctor-glm-tp8.txt"
      check "${PIPESTATUS[0]}" "doctor glm at TP 8"
    fi
  done
fi

if want shared; then
  step "ranks sharing one GPU: every algorithm forced, exact, timed beside the others"
  for w in ${SHARED_WORLDS:-2 3 4 5 6 7 8}; do
    # shellcheck disable=SC2206 # SHARED_SIZES: bench's -b/-e/-f, word-split
    SZ=(${SHARED_SIZES:--b 4K -e 1M -f 16})
    AL=(); [ -n "${SHARED_ALGOS:-}" ] && AL=(--algos "$SHARED_ALGOS")
    timeout -k 10 "${SHARED_S:-120}" "$A" bench --ranks "$w" "${SZ[@]}" "${AL[@]}" \
      -n 5 -G 3 --samples 3 -w 1 -c 2 --timeout-ms 20000 --json "$OUT/shared$w-bench.json" 2>&1 |
      tee "$OUT/shared$w-bench.txt" | grep -vE "^#? *$" | tail -40
    check "${PIPESTATUS[0]}" "bench at $w ranks sharing one GPU"
  done
fi

if want oldtargets; then
  step "older targets' code paths: PTX only, JIT-compiled on this GPU"
  export CUDA_CACHE_MAXSIZE=4294967296
  for t in ${OLD_TARGETS:-75 80}; do
    OB="$BUILD-ptx$t"
    cmake -S . -B "$OB" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$t-virtual" \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >"$OUT/configure-ptx$t.log" 2>&1 &&
      cmake --build "$OB" -j"$JOBS" --target anyr_gpu_tests >"$OUT/build-ptx$t.log" 2>&1
    check "$?" "build for compute_$t PTX"
    CUDA_VISIBLE_DEVICES=0 timeout -k 10 400 "$OB/tests/anyr_gpu_tests" \
      --gtest_filter='FusedKernel.*:Fused/FusedKernelMatrix.*:AllReduceGpu.OddWorld*:FusedAllReduceGpu.OddWorld*' \
      2>&1 | tee "$OUT/tests-ptx$t.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |compared|NVFP4 enc"
    check "${PIPESTATUS[0]}" "GPU tests from compute_$t PTX"
    ran_tests "$OUT/tests-ptx$t.log" "GPU tests from compute_$t PTX"
  done
fi

if want ncu; then
  step "ncu: one-token kernels at world size 1 (stall reasons per SASS instruction)"
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ]; then
    for k in ${NCU_KERNELS:-addRmsNorm fusedOneShotPushKernel fusedOneShotPushClusterKernel oneShotPushKernel}; do
      CL=(); [ "$k" = fusedOneShotPushClusterKernel ] && CL=(--cluster 8)
      Q=(); [ -n "${NCU_QUANT:-}" ] && Q=(--quant "$NCU_QUANT")
      # shellcheck disable=SC2206 # NCU_ARGS: more anyr_fused_floor arguments, word-split
      Q+=(${NCU_ARGS:-})
      timeout -k 10 200 "$NCU" --clock-control none --cache-control none -k "regex:$k" \
        --launch-skip 20 --launch-count 1 --warp-sampling-interval 0 --section SpeedOfLight --section LaunchStats \
        --section WarpStateStats --section SourceCounters --metrics gpu__time_duration.sum \
        -f -o "$OUT/ncu-$k" "$BUILD/tests/diag/anyr_fused_floor" --ranks 1 --hidden "${NCU_HIDDEN:-6144}" "${CL[@]}" "${Q[@]}" \
        >"$OUT/ncu-$k.log" 2>&1
      check "$?" "ncu $k"
      "$NCU" --import "$OUT/ncu-$k.ncu-rep" --print-summary none >"$OUT/ncu-$k-details.txt" 2>&1
      grep -E "Duration|Stall|Warp Cycles|Registers|Block Size|Grid Size" "$OUT/ncu-$k-details.txt" | head -20
      "$NCU" --import "$OUT/ncu-$k.ncu-rep" --page source --csv --print-source sass \
        >"$OUT/ncu-$k-sass.csv" 2>&1
      head -c 300 "$OUT/ncu-$k-sass.csv"; echo
    done
  else
    echo "ncu is not installed on this machine: skipped"
  fi
fi

if want ncutorch; then
  step "ncutorch: Nsight Compute on the standalone epilogue and torch.compile's kernel"
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ]; then
    NS=(--clock-control none --launch-skip 30 --launch-count 1 --section SpeedOfLight --section LaunchStats
      --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section InstructionStats
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes.sum,lts__t_bytes.sum)
    for shape in ${NCUT_SHAPES:-6144x128 4096x512}; do
      h=${shape%x*}; t=${shape#*x}
      for cc in all none; do
        r="$OUT/ncut-any-$shape-$cc"
        timeout -k 5 150 "$NCU" "${NS[@]}" --cache-control "$cc" -k "regex:addRmsNorm" -f -o "$r" \
          "$BUILD/tests/diag/anyr_epilogue_bench" --variants "${NCUT_VARIANT:-auto}" \
          --dtypes "${NCUT_DTYPE:-bf16}" --hidden "$h" --tokens "$t" --quant none >"$r.log" 2>&1
        check "$?" "ncu anyreduce $shape $cc"
        r="$OUT/ncut-tri-$shape-$cc"
        timeout -k 5 240 env ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" PYTHONPATH="$PWD/python" \
          "$NCU" "${NS[@]}" --cache-control "$cc" --target-processes all -k "regex:triton" -f -o "$r" \
          python3 tools/peers/torch_epilogue_bench.py --dtypes "${NCUT_DTYPE:-bf16}" --hidden "$h" \
          --tokens "$t" --calls 20 --samples 3 >"$r.log" 2>&1
        check "$?" "ncu torch.compile $shape $cc"
        for k in any tri; do
          r="$OUT/ncut-$k-$shape-$cc"
          [ -f "$r.ncu-rep" ] || continue
          "$NCU" --import "$r.ncu-rep" --print-summary none >"$r-details.txt" 2>&1
          "$NCU" --import "$r.ncu-rep" --page source --csv --print-source sass >"$r-sass.csv" 2>&1
          rm -f "$r.ncu-rep"
          echo "$k $shape cache $cc:"
          grep -E "Duration|Executed Instructions  |Registers Per|L2 Hit Rate|Block Size|Grid Size" "$r-details.txt" | head -8
        done
      done
    done
  else
    echo "ncu is not installed on this machine: skipped"
  fi
fi

if want epilogue; then
  step "epilogue: the standalone add + RMSNorm against an empty kernel and a copy of the same bytes"
  EPI_VARIANTS=${EPI_VARIANTS:-regs,rows,rows-v2,cluster,cluster-e0,auto,auto+pdl,api}
  EPI_ARGS=(--variants "$EPI_VARIANTS")
  [ -n "${EPI_DTYPES:-}" ] && EPI_ARGS+=(--dtypes "$EPI_DTYPES")
  [ -n "${EPI_HIDDEN:-}" ] && EPI_ARGS+=(--hidden "$EPI_HIDDEN")
  [ -n "${EPI_TOKENS:-}" ] && EPI_ARGS+=(--tokens "$EPI_TOKENS")
  [ -n "${EPI_QUANT:-}" ] && EPI_ARGS+=(--quant "$EPI_QUANT")
  echo "variants: $EPI_VARIANTS"
  if [ "${EPI_BENCH:-1}" != 0 ]; then
    EB="$BUILD/tests/diag/anyr_epilogue_bench"
    # Each variant first alone beside the first one (the reference of the bitwise check) on a
    # few shapes (one row, a few, more rows than blocks; VPT 1..3; both dtypes; every output):
    # a variant that crashes its process (a fault) is left out of the full run and reported, so
    # it cannot take the others' figures with it. A wrong result is not a crash: the full run
    # reports it.
    FIRST=${EPI_VARIANTS%%,*}
    KEEP="$FIRST"
    for v in ${EPI_VARIANTS//,/ }; do
      [ "$v" = "$FIRST" ] && continue
      CUDA_VISIBLE_DEVICES=${EPI_GPU:-0} timeout -k 5 60 "$EB" --variants "$FIRST,$v" --hidden 2880,6144,8192 \
        --tokens 1,5,600 --calls 2 --samples 1 >"$OUT/epilogue-smoke-$v.txt" 2>&1
      rc=$?
      if [ $rc = 0 ] || [ $rc = 4 ]; then
        KEEP="$KEEP,$v"
      else
        echo "FAILED (variant $v crashed its smoke run, exit $rc; left out of the full run):"
        tail -5 "$OUT/epilogue-smoke-$v.txt"
        RC=1
      fi
    done
    EPI_ARGS[1]="$KEEP"
    CUDA_VISIBLE_DEVICES=${EPI_GPU:-0} timeout -k 10 "${EPI_TIMEOUT_S:-300}" "$EB" \
      "${EPI_ARGS[@]}" --json "$OUT/epilogue.json" 2>&1 | tee "$OUT/epilogue.txt"
    check "${PIPESTATUS[0]}" "anyr_epilogue_bench"
  fi
  if [ "${EPI_TORCH:-1}" != 0 ]; then
    step "epilogue: eager PyTorch and torch.compile beside anyreduce.torch.add_rms_norm"
    T_ARGS=(--compile-shapes "${EPI_COMPILE:-static}")
    [ -n "${EPI_DTYPES:-}" ] && T_ARGS+=(--dtypes "$EPI_DTYPES")
    [ -n "${EPI_HIDDEN:-}" ] && T_ARGS+=(--hidden "$EPI_HIDDEN")
    [ -n "${EPI_TOKENS:-}" ] && T_ARGS+=(--tokens "$EPI_TOKENS")
    CUDA_VISIBLE_DEVICES=${EPI_GPU:-0} timeout -k 10 "${EPI_TORCH_TIMEOUT_S:-300}" env \
      ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" PYTHONPATH="$PWD/python" \
      python3 tools/peers/torch_epilogue_bench.py "${T_ARGS[@]}" --json "$OUT/epilogue-torch.json" 2>&1 |
      grep -v Warning | tee "$OUT/epilogue-torch.txt"
    check "${PIPESTATUS[0]}" "torch_epilogue_bench"
  fi
  step "epilogue: issue 46's targets, per variant (tools/targets/check_targets.py)"
  for v in ${EPI_VARIANTS//,/ }; do
    python3 tools/targets/check_targets.py --dir "$OUT" --epilogue-case "$v" \
      --json "$OUT/epilogue-targets-$v.json" | grep -E "^ +46 " | sed "s/^/$v: /"
    check "${PIPESTATUS[0]}" "check_targets --epilogue-case $v"
  done
fi

if want namespaces; then
  step "peer memory across Linux namespaces: rank 1 under unshare (containers that share no PID or IPC namespace)"
  NS_PY=(env ANYREDUCE_LIBRARY="$PWD/$BUILD/src/libanyreduce.so" PYTHONPATH="$PWD/python" python3 tools/peers/namespace_check.py)
  # How rank 1 is isolated: "shared" (not at all), a new PID namespace, a new IPC namespace, both.
  declare -A ISO=([shared]="" [pid]="--pid --fork --mount-proc" [ipc]="--ipc" [pid+ipc]="--pid --fork --mount-proc --ipc")
  for where in shared pid ipc pid+ipc; do
    W=()
    if [ "$where" != shared ]; then
      # shellcheck disable=SC2206 # the unshare flags, word-split
      W=(unshare ${ISO[$where]})
      if ! "${W[@]}" true 2>/dev/null; then
        # shellcheck disable=SC2206
        W=(unshare --user --map-root-user ${ISO[$where]})
        "${W[@]}" true 2>/dev/null || { echo "SKIPPED $where: unshare ${ISO[$where]} is not permitted here"; continue; }
      fi
    fi
    for kind in auto cuda-ipc vmm; do
      F="$OUT/ns-$kind-$where"
      rm -f "$F.id"
      ANYR_PEER_MEMORY=$kind timeout -k 5 90 "${NS_PY[@]}" --rank 0 --id-file "$F.id" >"$F-0.json" 2>"$F-0.err" &
      P0=$!
      ANYR_PEER_MEMORY=$kind timeout -k 5 90 "${W[@]}" "${NS_PY[@]}" --rank 1 --id-file "$F.id" >"$F-1.json" 2>"$F-1.err"
      RC1=$?
      wait $P0
      RC0=$?
      echo "--- ANYR_PEER_MEMORY=$kind, rank 1: $where${W[*]:+ (${W[*]})}: exit $RC0 / $RC1"
      cat "$F-0.json" "$F-1.json"
      [ -s "$F-1.json" ] || tail -3 "$F-1.err"
      check "$RC0" "namespaces $kind $where rank 0"
      check "$RC1" "namespaces $kind $where rank 1"
    done
  done
  # Rank 1 with a host name of its own (a UTS namespace, as a container): without ANYR_HOST_ID
  # the ranks look like two hosts (no peer or host-memory transport: reported, not a failure of
  # this script); with the same ANYR_HOST_ID on both they are one host again.
  if unshare --uts true 2>/dev/null; then
    for hostid in "" same-host; do
      F="$OUT/ns-uts-${hostid:-none}"
      rm -f "$F.id"
      ANYR_HOST_ID=$hostid timeout -k 5 90 "${NS_PY[@]}" --rank 0 --id-file "$F.id" >"$F-0.json" 2>"$F-0.err" &
      P0=$!
      ANYR_HOST_ID=$hostid timeout -k 5 90 unshare --uts sh -c 'hostname anyr-other-host && exec "$@"' sh \
        "${NS_PY[@]}" --rank 1 --id-file "$F.id" >"$F-1.json" 2>"$F-1.err"
      RC1=$?
      wait $P0
      RC0=$?
      echo "--- rank 1 under unshare --uts with its own host name, ANYR_HOST_ID='$hostid': exit $RC0 / $RC1"
      cat "$F-0.json" "$F-1.json"
      for r in 0 1; do [ -s "$F-$r.json" ] || grep -m2 -E 'Error|error|rror:' "$F-$r.err" | cut -c1-300; done
      [ -n "$hostid" ] && { check "$RC0" "namespaces uts rank 0"; check "$RC1" "namespaces uts rank 1"; }
    done
  else
    echo "SKIPPED uts: unshare --uts is not permitted here"
  fi
fi

if want targets; then
  step "targets: the open issues' performance targets (tools/targets/check_targets.py)"
  TD="$OUT/targets"
  rm -rf "$TD"
  mkdir -p "$TD"
  NGPU=$(nvidia-smi -L | wc -l)
  if [ "$NGPU" -lt 2 ]; then
    echo "one GPU: every target compares two or more GPUs against NCCL; nothing measured"
  else
    for q in none fp8 nvfp4; do
      CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 300 "$A" bench --op add-rmsnorm --quant "$q" \
        --hidden 6144,7168 --tokens 1,2,4,8,16,20,24,32,48,64,80,96,128,256,512,1024,2048 \
        --samples 11 --json "$TD/fused-$q.json" 2>&1 | tee "$OUT/targets-fused-$q.txt" | tail -3
      check "${PIPESTATUS[0]}" "targets: fused bench --quant $q"
    done
    # The host transport as a machine without peer access gets it: no peer memory, and NCCL
    # (the baseline, and anyreduce's own fallback) through host memory.
    CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 300 env ANYR_PEER_MEMORY=none NCCL_P2P_DISABLE=1 "$A" bench \
      --algos auto -b 1K -e 16M -f 2 --samples 11 --json "$TD/host.json" 2>&1 | tee "$OUT/targets-host.txt" | tail -3
    check "${PIPESTATUS[0]}" "targets: host bench"
    for w in native fp8; do
      CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 200 env ANYR_PEER_MEMORY=none NCCL_P2P_DISABLE=1 "$A" bench \
        --algos auto -b 16M -e 16M --wire "$w" --samples 11 --json "$TD/host-wire-$w.json" 2>&1 | tail -2
      check "${PIPESTATUS[0]}" "targets: host bench --wire $w"
    done
  fi
  if [ "$NGPU" -ge 8 ]; then
    CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 timeout -k 10 400 "$A" bench --algos auto -b 1K -e 256M -f 2 \
      --samples 11 --json "$TD/ar-8.json" 2>&1 | tee "$OUT/targets-ar-8.txt" | tail -3
    check "${PIPESTATUS[0]}" "targets: all-reduce bench at 8 ranks"
    CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 timeout -k 10 300 "$A" bench --op add-rmsnorm --hidden 6144,7168 \
      --tokens 1,2,4,8,16,32,64,128,512,2048 --samples 11 --json "$TD/fused-8.json" 2>&1 |
      tee "$OUT/targets-fused-8.txt" | tail -3
    check "${PIPESTATUS[0]}" "targets: fused bench at 8 ranks"
  else
    echo "$NGPU GPUs: the 8-rank targets are not measured"
  fi
  # Missed targets are reported, not a failed step; unreadable records or wrong results are.
  python3 tools/targets/check_targets.py --dir "$TD" --json "$OUT/targets.json" | tee "$OUT/targets.txt"
  check "${PIPESTATUS[0]}" "targets: check_targets.py"
fi

step "done: $([ $RC = 0 ] && echo "every step passed" || echo "SOME STEPS FAILED (see FAILED lines)")"
exit $RC
