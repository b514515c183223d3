#!/usr/bin/env bash
# The layers of docs/DESIGN.md, bottom up: a file may include its own layer and those below it,
# never one above. Checked with the project's layer checker (../shared/tools/layers.py, or
# ANYR_LAYERS_PY): the library's layers are the public header and the floor, the mechanisms,
# the algorithms, selection, the communicator, the C API.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS_PY=${ANYR_LAYERS_PY:-../shared/tools/layers.py}
if [ ! -f "$LAYERS_PY" ]; then
  echo "check-layers: the layer checker is not at $LAYERS_PY (set ANYR_LAYERS_PY)" >&2
  exit 1
fi
python3 "$LAYERS_PY" --strict include,src/base,src/device \
  src/bootstrap,src/topology,src/transport src/algo,src/fused src/select src/core src/api
# The tools use the public header only: src/ is in no layer, so with --strict any include of it
# fails. Their own layers, bottom up: the shared tool library, the doctor, the command (which
# calls the doctor; the doctor never includes the command).
python3 "$LAYERS_PY" --strict -I include -I tools -I src include tools/common tools/doctor \
  tools/anyreduce
# The NCCL-compatible library (nccl/, its tests included) uses the public header only, as the
# tools do: src/ is in no layer.
python3 "$LAYERS_PY" --strict -I include -I nccl -I src include nccl
