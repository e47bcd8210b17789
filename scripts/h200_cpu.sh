#!/usr/bin/env bash
# CPU per wall second on an H200 (idle GPU): traintop's TUI beside nvitop and gpustat, then
# the headless recorder beside nvidia-smi dmon and -l 1 (two batches, so fewer processes
# share the host at once), and NVML query costs. Usage: OUT=dir bash scripts/h200_cpu.sh
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-cpu}"
mkdir -p "$OUT"; cd "$OUT"
python3 "$REPO/bench/nvml_calls.py" --json nvml_calls.json > nvml_calls.txt 2>&1; cat nvml_calls.txt
python3 "$REPO/bench/cpu_compare.py" --preset h200 --seconds 30 --warmup 8 --only "TUI|nvitop|gpustat" \
  --json cpu_tui.json > cpu_tui.txt 2>&1; cat cpu_tui.txt
python3 "$REPO/bench/cpu_compare.py" --preset h200 --seconds 30 --warmup 8 --only "record|nvidia-smi" \
  --json cpu_headless.json > cpu_headless.txt 2>&1; cat cpu_headless.txt
