#!/usr/bin/env bash
# The wheels the lent GPU machine lacks, for its Python 3.12 on x86-64, into bench/wheels/
# (ignored by git; a few MB, far under the 64 MiB a device run may carry). The machine has
# torch, numpy, pandas, pyyaml, matplotlib, click and rich; not simpy, orjson or librt, and
# its typer may be newer than the project allows (<0.29), so that travels too.
#
#   bash bench/fetch_wheels.sh          # here, where PyPI is reached; then see bench/README.md
#
# On the device: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#   --upgrade --target /tmp/site bench/wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=bench/wheels
PY="${PYTHON:-python3}"
# the versions the project is tested with (pyproject.toml's ranges; librt must match exactly)
PINS=(simpy==4.1.2 orjson==3.13.0 librt==0.17.0 mypy_extensions==1.2.0 typer==0.28.0)
mkdir -p "$DEST"
for pin in "${PINS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$DEST" "$pin"
done
ls -l "$DEST"
du -sh "$DEST"
