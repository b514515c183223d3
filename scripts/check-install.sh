#!/usr/bin/env bash
# Installs the build into two temporary prefixes, one per library layout: flat `lib` and
# multiarch `lib/x86_64-linux-gnu` (what GNUInstallDirs picks on Debian for the prefix /usr).
# In each it builds a consumer with find_package(anyreduce) (C and the C++ layer) and the same
# two with pkg-config alone (its flags, nothing added by hand: no -I, -L or -lcudart), runs
# them, checks where pkg-config says the files are, and checks the CMake package's version
# policy (tests/install/version_policy.cmake).
#
# $BUILD is installed as it is for the layout it was configured with; the other layout comes
# from a side tree configured from the same sources with that CMAKE_INSTALL_LIBDIR (tests off,
# nothing compiled), into which the library and the command built in $BUILD are copied: the
# install files (.pc, CMake package) are then that layout's own, the binaries the same.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -1; }
built_libdir=$(cache CMAKE_INSTALL_LIBDIR)
[ -n "$built_libdir" ] || { echo "check-install: $BUILD is not a configured build" >&2; exit 1; }

# tree_for LIBDIR: a build tree whose install puts the library under LIBDIR.
tree_for() {
  local libdir=$1
  if [ "$libdir" = "$built_libdir" ]; then
    echo "$BUILD"
    return
  fi
  local tree
  tree="$tmp/tree-$(echo "$libdir" | tr / _)"
  # Without the NCCL-compatible library: its copy would carry the other tree's build RPATH,
  # which this tree's install cannot rewrite (the first layout installs and checks it).
  cmake -S . -B "$tree" -G "$(cache CMAKE_GENERATOR)" -DANYR_BUILD_TESTS=OFF \
    -DANYR_BUILD_NCCL_LIBRARY=OFF \
    -DCMAKE_INSTALL_LIBDIR="$libdir" -DCMAKE_BUILD_TYPE="$(cache CMAKE_BUILD_TYPE)" \
    -DCMAKE_CUDA_COMPILER="$(cache CMAKE_CUDA_COMPILER)" \
    -DCMAKE_CUDA_ARCHITECTURES="$(cache CMAKE_CUDA_ARCHITECTURES)" \
    -DANYR_CUDA_FAMILY_TARGETS="$(cache ANYR_CUDA_FAMILY_TARGETS)" >"$tree.log" 2>&1 ||
    { cat "$tree.log" >&2; exit 1; }
  mkdir -p "$tree/src" "$tree/tools"
  cp -P "$BUILD"/src/libanyreduce.so* "$tree/src/"
  cp "$BUILD/tools/anyreduce" "$tree/tools/"
  echo "$tree"
}

check_layout() {
  local libdir=$1 name=$2
  local prefix="$tmp/$name" tree out
  tree=$(tree_for "$libdir")
  cmake --install "$tree" --prefix "$prefix" >/dev/null
  local lib="$prefix/$libdir"
  local files=("$lib/libanyreduce.so.0")
  [ "$tree" = "$BUILD" ] && files+=("$lib/libanyreduce_nccl.so")
  for f in "${files[@]}" "$lib/pkgconfig/anyreduce.pc" \
    "$lib/cmake/anyreduce/anyreduceConfig.cmake" "$prefix/include/anyreduce/anyreduce.h" \
    "$prefix/bin/anyreduce"; do
    [ -e "$f" ] || { echo "check-install ($name): $f was not installed" >&2; exit 1; }
  done
  # Each layout runs against its own library only.
  local run="$lib:${LD_LIBRARY_PATH:-}"

  # find_package(anyreduce): C and the C++ layer.
  cmake -S tests/install -B "$tmp/consumer-$name" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$tmp/consumer-$name" >/dev/null
  LD_LIBRARY_PATH="$run" "$tmp/consumer-$name/consumer" >/dev/null
  LD_LIBRARY_PATH="$run" "$tmp/consumer-$name/consumer_cpp" >/dev/null
  out=$(cmake -DDIR="$lib/cmake/anyreduce" -P tests/install/version_policy.cmake 2>&1) ||
    { echo "check-install ($name): $out" >&2; exit 1; }

  # pkg-config alone.
  local pc=(env PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config)
  local want got
  for v in prefix:"$prefix" libdir:"$lib" includedir:"$prefix/include"; do
    want=$(realpath -m "${v#*:}")
    got=$(realpath -m "$("${pc[@]}" --variable="${v%%:*}" anyreduce)")
    if [ "$got" != "$want" ]; then
      echo "check-install ($name): pkg-config's ${v%%:*} is $got, not $want" >&2
      exit 1
    fi
  done
  if grep '^Cflags:' "$lib/pkgconfig/anyreduce.pc" | grep -q '/'; then
    echo "check-install ($name): a folder is written into Cflags:" >&2
    grep '^Cflags:' "$lib/pkgconfig/anyreduce.pc" >&2
    exit 1
  fi
  "${pc[@]}" --static --libs anyreduce | grep -qE -- '-lcudart' ||
    { echo "check-install ($name): no -lcudart for a static link" >&2; exit 1; }
  local flags
  flags=$("${pc[@]}" --cflags --libs anyreduce)
  cc tests/install/main.c $flags -o "$tmp/consumer-pc-$name"
  c++ -std=c++17 tests/install/main.cpp $flags -o "$tmp/consumer-pc-cpp-$name"
  # Run time: the CUDA runtime from the folder pkg-config names, where it names one.
  local cudalib
  cudalib=$("${pc[@]}" --variable=cudalibdir anyreduce)
  LD_LIBRARY_PATH="$lib${cudalib:+:$cudalib}:${LD_LIBRARY_PATH:-}" "$tmp/consumer-pc-$name" >/dev/null
  LD_LIBRARY_PATH="$lib${cudalib:+:$cudalib}:${LD_LIBRARY_PATH:-}" "$tmp/consumer-pc-cpp-$name" \
    >/dev/null
  echo "install ($libdir): ok (find_package, the C++ layer, pkg-config: prefix $("${pc[@]}" --variable=prefix anyreduce | sed "s|$tmp|<tmp>|"))"
}

check_layout lib flat
check_layout lib/x86_64-linux-gnu multiarch
echo "install: ok (flat and multiarch layouts; find_package, the C++ layer and pkg-config; version policy)"
