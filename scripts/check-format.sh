#!/usr/bin/env bash
# Fails when a C++/CUDA source is not formatted with the repository's .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.hpp' '*.cc' '*.cpp' '*.cu' '*.cuh' 2>/dev/null || find include src tools tests -name '*.[hc]*')
clang-format --dry-run --Werror $files
echo "format: ok ($(echo "$files" | wc -w) files)"
