#!/usr/bin/env bash
# Builds the libFuzzer targets under tests/fuzz with clang (-fsanitize=fuzzer,address,undefined)
# and runs each for a bounded time on its seed corpus (tests/fuzz/corpus/<target>). Exits
# non-zero when a target crashes, leaks, trips a sanitizer or breaks a checked property; the
# reproducer is left in $FUZZ_BUILD/artifacts/<target>/ and its path printed.
#
#   scripts/fuzz.sh                    # every target, FUZZ_SECONDS (default 20) each
#   FUZZ_SECONDS=300 scripts/fuzz.sh fuzz_topology_json
#   scripts/fuzz.sh --replay FILE...   # run one target on given inputs (set FUZZ_TARGET)
#
# The targets link only the pure host parsers (no CUDA kernels, no GPU): the main build's
# g++/nvcc objects are not reused; everything is compiled here by clang into $FUZZ_BUILD.
# New findings are not added to the checked-in corpus automatically: copy a minimized input
# there together with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CXX=${FUZZ_CXX:-clang++}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
FUZZ_BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz: $CXX not found (Debian: apt-get install clang libclang-rt-dev or clang-14)" >&2
  exit 1
fi
# libFuzzer ships with Debian's clang; check that it links before building everything.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
  >"$probe/p.cc"
if ! "$CXX" -fsanitize=fuzzer "$probe/p.cc" -o "$probe/p" 2>"$probe/err"; then
  echo "fuzz: $CXX cannot link libFuzzer (install Debian's clang with its runtime):" >&2
  cat "$probe/err" >&2
  exit 1
fi

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# ANYR_HOST_ONLY: the algorithm registry without its kernels (src/algo/registry.cc).
FLAGS="-std=c++17 -O1 -g $SAN -Wall -Wextra -Wshadow -Wno-unused-parameter -Werror
       -DANYR_HOST_ONLY -I$ROOT/include -I$ROOT/src -I$ROOT/tests -isystem $CUDA_HOME/include"
LIBS="-L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcudart -lcrypto -lpthread -ldl"

# The library sources the parsers live in (and what they need: errors, logging, env).
LIB_SOURCES=(src/bootstrap/message.cc src/bootstrap/auth.cc src/bootstrap/unique_id.cc
  src/bootstrap/socket.cc src/base/env.cc src/base/error.cc src/base/log.cc src/base/config.cc
  src/base/validate.cc
  src/topology/topology.cc src/topology/islands.cc src/topology/fabric.cc src/algo/registry.cc
  src/algo/cost.cc
  src/select/admission.cc src/select/dispatch.cc src/select/tuning.cc tests/fuzz/fuzz_stubs.cc)
ALL_TARGETS=(fuzz_bootstrap_message fuzz_topology_json fuzz_config_env fuzz_tuning_json)

mkdir -p "$FUZZ_BUILD/obj"
objs=()
for src in "${LIB_SOURCES[@]}"; do
  obj="$FUZZ_BUILD/obj/$(echo "$src" | tr / _).o"
  if [ ! -e "$obj" ] || [ "$src" -nt "$obj" ] || [ "$0" -nt "$obj" ] ||
    [ -n "$(find src include -name '*.h' -newer "$obj" -print -quit)" ]; then
    echo "fuzz: compiling $src"
    # shellcheck disable=SC2086
    "$CXX" $FLAGS -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  fi
  objs+=("$obj")
done

build_target() {
  local t=$1
  echo "fuzz: building $t"
  # shellcheck disable=SC2086
  "$CXX" $FLAGS -fsanitize=fuzzer "tests/fuzz/$t.cc" "${objs[@]}" $LIBS -o "$FUZZ_BUILD/$t"
}

if [ "${1:-}" = "--replay" ]; then
  shift
  t=${FUZZ_TARGET:?set FUZZ_TARGET to the target to replay with}
  build_target "$t"
  exec "$FUZZ_BUILD/$t" "$@"
fi

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")
failed=()
for t in "${targets[@]}"; do
  build_target "$t"
  seeds="$ROOT/tests/fuzz/corpus/${t#fuzz_}"
  work="$FUZZ_BUILD/corpus/$t"
  art="$FUZZ_BUILD/artifacts/$t"
  rm -rf "$art"
  mkdir -p "$work" "$art"
  [ -d "$seeds" ] || { echo "fuzz: no seed corpus at $seeds" >&2; exit 1; }
  dict=()
  [ -e "tests/fuzz/${t#fuzz_}.dict" ] && dict=(-dict="tests/fuzz/${t#fuzz_}.dict")
  echo "fuzz: running $t for ${FUZZ_SECONDS}s (seeds: $(ls "$seeds" | wc -l) in ${seeds#"$ROOT"/})"
  # New inputs go to the scratch corpus; the checked-in seeds are only read.
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$FUZZ_BUILD/$t" "${dict[@]}" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$art/" "$work" "$seeds" \
    >"$FUZZ_BUILD/$t.log" 2>&1; then
    echo "fuzz: $t FAILED; last lines of $FUZZ_BUILD/$t.log:" >&2
    tail -40 "$FUZZ_BUILD/$t.log" >&2
    echo "fuzz: reproducer(s): $(ls "$art" | sed "s|^|$art/|" | tr '\n' ' ')" >&2
    failed+=("$t")
  else
    grep -E '^stat::number_of_executed_units|^Done' "$FUZZ_BUILD/$t.log" | tr '\n' ' '
    echo
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ok (${targets[*]}, ${FUZZ_SECONDS}s each)"
