#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds a consumer with find_package(anyreduce)
# and with pkg-config, and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$BUILD" --prefix "$tmp/prefix" >/dev/null
cmake -S tests/install -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib:${LD_LIBRARY_PATH:-}" "$tmp/consumer/consumer"
LD_LIBRARY_PATH="$tmp/prefix/lib:${LD_LIBRARY_PATH:-}" "$tmp/consumer/consumer_cpp"
flags=$(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs anyreduce)
cc tests/install/main.c $flags -L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcudart -o "$tmp/consumer-pc"
LD_LIBRARY_PATH="$tmp/prefix/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}" "$tmp/consumer-pc"
echo "install: ok (find_package, the C++ layer, and pkg-config)"
