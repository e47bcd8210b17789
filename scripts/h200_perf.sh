#!/usr/bin/env bash
# Issue 13's measurements on an H200 machine, in one go (idle GPUs): every monitor started
# together (bench/cpu_compare.py --preset h200), where each one's memory lies
# (bench/rss_map.py), the recorder's cost by part against dmon (bench/recorder_cost.py
# --nvml), seeks in a long recording (bench/day_file.py, DAY=file), the monkey on the live
# view of the real GPUs (tests/test_monkey.py with TRAINTOP_MONKEY_GPU=1), then the side by
# side run again. Needs traintop installed (a wheel: the repository's layout maps app/,
# widgets/ and collectors/ into the package), and nvitop, gpustat and pyte importable.
# Usage: OUT=dir [DAY=file.ttrec] [DURATION=60] [WARMUP=10] bash scripts/h200_perf.sh
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-perf}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/summary.txt"
say() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
cd "$OUT"
say environment
{ nvidia-smi; nvidia-smi topo -m; python3 --version; nproc; python3 -m pip list 2>/dev/null |
  grep -i -E '^(textual|rich|nvitop|gpustat|nvidia-ml-py|psutil) '; } >> "$LOG" 2>&1
say "side by side, run 1"
python3 "$REPO/bench/cpu_compare.py" --preset h200 --seconds "${DURATION:-60}" --warmup "${WARMUP:-10}" \
  --json cpu_compare_1.json >> "$LOG" 2>&1
say "memory by mapping"
python3 "$REPO/bench/rss_map.py" --seconds 20 --json rss_map.json \
  "traintop_tui=python3 -m traintop --interval 1" "nvitop=python3 -m nvitop --interval 1" \
  "traintop_record=python3 -m traintop record --interval 1 $OUT/map.ttrec" "dmon=nvidia-smi dmon -d 1" \
  >> "$LOG" 2>&1
rm -f "$OUT"/map.ttrec*
say "recorder cost"
python3 "$REPO/bench/recorder_cost.py" --nvml --json recorder_cost.json >> "$LOG" 2>&1
if [ -n "${DAY:-}" ]; then
  say "seek in $(basename "$DAY")"
  python3 "$REPO/bench/day_file.py" "$DAY" --seeks 40 --json day_file.json >> "$LOG" 2>&1
fi
say "monkey on the live view"
TRAINTOP_MONKEY_GPU=1 python3 -m pytest -q -p no:cacheprovider --rootdir "$REPO" "$REPO/tests/test_monkey.py" \
  -k gpu > monkey.txt 2>&1
tail -3 monkey.txt >> "$LOG"
say "side by side, run 2"
python3 "$REPO/bench/cpu_compare.py" --preset h200 --seconds "${DURATION:-60}" --warmup "${WARMUP:-10}" \
  --json cpu_compare_2.json >> "$LOG" 2>&1
say done
