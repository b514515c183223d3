#!/bin/sh
# The command's exit-status convention (tools/common/exit_codes.h, README "The tool"), the same
# for every subcommand: with every GPU hidden (CUDA_VISIBLE_DEVICES=, so this holds on any
# machine) probe, explain, bench, tune and doctor exit 3 and say in words that there is no
# usable GPU (no NVIDIA driver, or no GPU visible), never CUDA's "driver version is
# insufficient"; an unknown flag exits 2; --help exits 0 and states the convention.
# Usage: exit_codes.sh path/to/anyreduce
set -u
A="$1"
failures=0
fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}

for cmd in probe explain bench tune doctor; do
  out=$(CUDA_VISIBLE_DEVICES= "$A" $cmd 2>&1 </dev/null)
  rc=$?
  if [ "$rc" -ne 3 ]; then
    fail "anyreduce $cmd without a GPU: exit $rc, expected 3: $out"
  elif ! printf '%s\n' "$out" | grep -qF "anyreduce $cmd"; then
    fail "anyreduce $cmd without a GPU does not name the command: $out"
  elif ! printf '%s\n' "$out" | grep -qF "no usable GPU"; then
    fail "anyreduce $cmd without a GPU does not say so: $out"
  elif ! printf '%s\n' "$out" | grep -qE "no NVIDIA driver was found|found no GPU"; then
    fail "anyreduce $cmd without a GPU does not say why in words: $out"
  elif printf '%s\n' "$out" | grep -qi "insufficient"; then
    fail "anyreduce $cmd without a GPU repeats CUDA's error: $out"
  else
    echo "ok: anyreduce $cmd without a GPU -> 3"
  fi

  "$A" $cmd --no-such-flag >/dev/null 2>&1 </dev/null
  rc=$?
  [ "$rc" -eq 2 ] || fail "anyreduce $cmd --no-such-flag: exit $rc, expected 2"

  out=$("$A" $cmd --help 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ] || ! printf '%s\n' "$out" | grep -qF "Exit status: 0 done; 1 the run failed; 2"; then
    fail "anyreduce $cmd --help: exit $rc, or no exit-status line"
  fi
done

# The offline forms need no GPU.
out=$(CUDA_VISIBLE_DEVICES= "$A" env 2>&1 </dev/null) || fail "anyreduce env without a GPU: exit $?"
out=$(CUDA_VISIBLE_DEVICES= "$A" version 2>&1 </dev/null) || fail "anyreduce version without a GPU: exit $?"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
