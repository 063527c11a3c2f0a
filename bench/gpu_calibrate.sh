#!/usr/bin/env bash
# Prepared GPU check (run on a lent H200 via the device tool, ~5 min): calibrates the torch
# backend on CUDA for a scaled Nemotron-3-Super and the athena-tiny model, verifies resume ==
# scratch on the GPU in fp32 and bf16, and runs athena-tiny on the torch backend. Everything it
# writes goes under ${OUT:-gpu_out}/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
python -m pip install -q torch==2.13.0 >/dev/null 2>&1 || true
python -m pip install -q -e . >/dev/null
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
sim calibrate --model nemotron-3-super-120b --layers 8 --width-div 2 --device cuda --grid full \
  --out "$OUT/h200-nemotron-3-super-120b-l8-w2.yaml" 2>&1 | tee "$OUT/calibrate-super.log"
sim calibrate --scenario scenarios/athena-tiny.yaml --device cuda --grid full \
  --out "$OUT/h200-tiny-hybrid.yaml" 2>&1 | tee "$OUT/calibrate-tiny.log"
sim verify scenarios/athena-tiny.yaml --set backend.device=cuda --out "$OUT/verify-fp32" \
  2>&1 | tee "$OUT/verify-fp32.log"
sim verify scenarios/athena-tiny.yaml --set backend.device=cuda --set backend.dtype=bfloat16 \
  --out "$OUT/verify-bf16" 2>&1 | tee "$OUT/verify-bf16.log"
sim run scenarios/athena-tiny.yaml --set backend.kind=torch --set backend.device=cuda \
  --out "$OUT/run-torch" -q
echo "done: $OUT"
