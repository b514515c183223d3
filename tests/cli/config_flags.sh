#!/bin/sh
# The command line's --max-blocks, --fused-cluster and --peer-memory (bench, tune, doctor), --timeout-ms
# (bench, tune), bench's --quant-only, and the lists, hidden sizes and output files of bench,
# tune, explain and doctor: a bad value fails parsing (exit 2, before any GPU work) with the
# flag, the rule and the value; every valid value gets past parsing. CPU only: the valid runs
# hide every GPU, so they stop at "no usable GPU" (exit 3), which only a run that parsed its
# flags reaches.
# Usage: config_flags.sh path/to/anyreduce
set -u
A="$1"
failures=0

# expect_rejected RULE_TEXT ARGS...: exits 2 (the command line was refused), and the output has
# RULE_TEXT (a fixed string).
expect_rejected() {
  want="$1"
  shift
  out=$("$A" "$@" 2>&1 </dev/null)
  rc=$?
  if [ "$rc" -ne 2 ]; then
    echo "FAIL: anyreduce $*: exit $rc, expected 2 (a parse error)"
    failures=$((failures + 1))
  elif ! printf '%s\n' "$out" | grep -qF -- "$want"; then
    echo "FAIL: anyreduce $*: exit $rc without '$want'; it said:"
    printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: anyreduce $* -> $want"
  fi
}

# expect_parsed ARGS...: gets past parsing (to the GPU check: exit 3, "no usable GPU").
expect_parsed() {
  out=$(CUDA_VISIBLE_DEVICES= "$A" "$@" 2>&1 </dev/null)
  rc=$?
  if [ "$rc" -ne 3 ] || ! printf '%s\n' "$out" | grep -qF "no usable GPU"; then
    echo "FAIL: anyreduce $*: expected to parse and stop at the GPU check (exit 3), got exit $rc:"
    printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: anyreduce $* parsed"
  fi
}

MB="must be in 0..256 (0 = automatic)"
FC="must be 0 (automatic), 1 (off), 2, 4 or 8"
for cmd in bench tune doctor; do
  for v in 3 5 6 7 9 16 -1 -2147483648 4294967298 two 2x 2.0; do
    expect_rejected "--fused-cluster: $FC (got '$v')" $cmd --fused-cluster "$v"
  done
  expect_rejected "--fused-cluster: $FC (got '')" $cmd --fused-cluster ""
  for v in 257 -1 1000 4294967297 all 8.5; do
    expect_rejected "--max-blocks: $MB (got '$v')" $cmd --max-blocks "$v"
  done
  expect_rejected "--max-blocks" $cmd --max-blocks
  # a bad value among good ones still fails
  expect_rejected "--fused-cluster: $FC (got '3')" $cmd --max-blocks 8 --fused-cluster 3
done
# The help names both flags and their rules.
for cmd in bench tune doctor; do
  out=$("$A" $cmd --help 2>&1)
  for want in "--max-blocks" "--fused-cluster" "$MB" "$FC"; do
    if ! printf '%s\n' "$out" | grep -qF -- "$want"; then
      echo "FAIL: anyreduce $cmd --help lacks '$want'"
      failures=$((failures + 1))
    fi
  done
done
for cmd in bench tune; do
  for v in 0 1 2 4 8; do expect_parsed $cmd --fused-cluster "$v"; done
  for v in 0 1 64 256; do expect_parsed $cmd --max-blocks "$v"; done
  expect_parsed $cmd --max-blocks 16 --fused-cluster 2
done
expect_parsed doctor --preset tiny --max-blocks 32 --fused-cluster 4
# --peer-memory (bench, tune, doctor): the names ANYR_PEER_MEMORY takes (not its 0 / 1).
PM="must be none, auto, cuda-ipc or vmm"
for cmd in bench tune doctor; do
  for v in 0 1 2 ipc VMM posix ""; do
    expect_rejected "--peer-memory: $PM (got '$v')" $cmd --peer-memory "$v"
  done
  out=$("$A" $cmd --help 2>&1)
  if ! printf '%s\n' "$out" | grep -qF -- "--peer-memory"; then
    echo "FAIL: anyreduce $cmd --help lacks '--peer-memory'"
    failures=$((failures + 1))
  fi
done
for v in none auto cuda-ipc vmm; do
  expect_parsed bench --peer-memory "$v"
  expect_parsed tune --peer-memory "$v"
done
expect_parsed doctor --preset tiny --peer-memory vmm
# --timeout-ms (bench, tune, doctor): a bound in milliseconds, at least 1.
for cmd in bench tune; do
  expect_rejected "--timeout-ms" $cmd --timeout-ms 0
  expect_rejected "--timeout-ms" $cmd --timeout-ms soon
  expect_parsed $cmd --timeout-ms 2500
done

# --quant-only (bench --op add-rmsnorm): normOut NULL needs a quantized output.
QO="--quant-only: needs --quant fp8 or nvfp4"
expect_rejected "$QO" bench --op add-rmsnorm --quant-only
expect_rejected "$QO" bench --op add-rmsnorm --quant none --quant-only
expect_parsed bench --op add-rmsnorm --quant nvfp4 --quant-only
expect_parsed bench --op add-rmsnorm --quant fp8 --quant-only

# Lists and sizes checked before any buffer is made for them, output files before the run.
expect_rejected "--algos: names no algorithm" bench --algos ""
expect_rejected "--datatype: names no dtype" bench -d ""
expect_rejected "--hidden: 20000 is not a multiple of 8 in 128..16384" bench --op add-rmsnorm --hidden 20000
expect_rejected "--hidden: 100 is not a multiple of 8" bench --op add-rmsnorm --hidden 100
expect_rejected "--hidden: 4104 is not a multiple of 16" bench --op add-rmsnorm --quant nvfp4 --hidden 4104
expect_parsed bench --op add-rmsnorm --hidden 4104
expect_rejected "--hidden: 130 is not a multiple of 8" tune --hidden 130
expect_rejected "--json: cannot write '/nonexistent-dir/x.json'" bench --json /nonexistent-dir/x.json
expect_rejected "--output: cannot write '/nonexistent-dir/x.json'" tune -o /nonexistent-dir/x.json
expect_rejected "--ranks" explain --ranks -3
expect_rejected "--algo: only with --topology" explain --algo nccl
expect_rejected "--no-nccl: only with --topology" explain --no-nccl
expect_rejected "--hidden" doctor --hidden 0

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
