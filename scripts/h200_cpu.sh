#!/usr/bin/env bash
# CPU per wall second on an H200 machine (idle GPUs): every monitor started together in one
# run (traintop's TUI at --interval 1 at 160x48 and 80x24 and at its defaults, nvitop at
# --interval 1 and its defaults, gpustat, nvidia-smi dmon, traintop's recorder), with the
# ratios to nvitop and dmon; then NVML query costs. nvitop and gpustat may come from wheels
# on PYTHONPATH. Usage: OUT=dir [DURATION=60] [WARMUP=10] bash scripts/h200_cpu.sh
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-cpu}"
mkdir -p "$OUT"; cd "$OUT"
python3 "$REPO/bench/cpu_compare.py" --preset h200 --seconds "${DURATION:-60}" --warmup "${WARMUP:-10}" \
  --json cpu_all.json > cpu_all.txt 2>&1; cat cpu_all.txt
python3 "$REPO/bench/nvml_calls.py" --json nvml_calls.json > nvml_calls.txt 2>&1; cat nvml_calls.txt
