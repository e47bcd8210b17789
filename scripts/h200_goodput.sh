#!/usr/bin/env bash
# Goodput on an H200: the corpus scenarios that exercise the time ledger, the precision check,
# the pause finding and MFU, each recorded four ways (scripts/h200_corpus.sh), then the probe's
# overhead with the ledger, precision reading and FLOP counting on (paired runs).
# Usage: OUT=dir PART=1|2|3|4 bash scripts/h200_goodput.sh   (traintop importable, torch with CUDA)
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-goodput}"
mkdir -p "$OUT"
case "${PART:-1}" in
  1) SCENARIOS="fp32_no_tf32 healthy_bf16 checkpoints compile_warmup" BATCH=goodput1 OUT="$OUT" \
       bash "$REPO/scripts/h200_corpus.sh" ;;
  2) SCENARIOS="eval_phases starved_then_fed" BATCH=goodput2 OUT="$OUT" bash "$REPO/scripts/h200_corpus.sh"
     (cd /tmp && python3 "$REPO/bench/probe_overhead.py" --pairs 12 --steps 100 --json "$OUT/probe-overhead.json") ;;
  3) # the cost of a sample stream, side by side with nvidia-smi's own loop, over the whole batch
     python3 -m traintop record --jsonl /tmp/stream.jsonl --interval 1 --quiet > /tmp/stream.log 2>&1 & TT=$!
     nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw,temperature.gpu \
       --format=csv -l 1 > /tmp/smi-stream.csv 2>&1 & SMI=$!
     T0=$(date +%s.%N)
     SCENARIOS="fp32_no_tf32 healthy_bf16 checkpoints oom_retries" SCALE=1.5 BATCH=goodput3 OUT="$OUT" \
       WORK=/tmp/h200-goodput3 bash "$REPO/scripts/h200_corpus.sh"
     T1=$(date +%s.%N)
     cpu() { awk '{print ($14 + $15) / 100}' "/proc/$1/stat"; }
     python3 - "$(cpu $TT)" "$(cpu $SMI)" "$T0" "$T1" "$(wc -l < /tmp/stream.jsonl)" "$(wc -l < /tmp/smi-stream.csv)" <<'PY' | tee "$OUT/stream-cost.txt"
import sys
tt, smi, t0, t1, lines, smi_lines = map(float, sys.argv[1:])
wall = t1 - t0
print(f"over {wall:.0f} s: traintop record --jsonl (1 s) {tt:.2f} CPU-s = {tt / wall * 100:.2f} % of a core, "
      f"{lines:.0f} lines; nvidia-smi --query-gpu -l 1 {smi:.2f} CPU-s = {smi / wall * 100:.2f} %, {smi_lines:.0f} lines; "
      f"ratio {tt / smi if smi else float('nan'):.1f}")
PY
     kill $TT $SMI; wait $TT $SMI 2>/dev/null ;;
  4) # the same side by side, as long as one command may run (DURATION s), over plain training jobs
     DURATION="${DURATION:-540}"
     python3 -m traintop record --jsonl /tmp/stream4.jsonl --interval 1 --quiet > /tmp/stream4.log 2>&1 & TT=$!
     nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw,temperature.gpu \
       --format=csv -l 1 > /tmp/smi-stream4.csv 2>&1 & SMI=$!
     T0=$(date +%s.%N); END=$(( $(date +%s) + DURATION ))
     while [ "$(date +%s)" -lt "$END" ]; do
       for s in healthy_bf16 checkpoints fp32_no_tf32 eval_phases; do
         left=$(( END - $(date +%s) )); [ "$left" -le 5 ] && break
         (cd /tmp && timeout "$left" python3 "$REPO/bench/workloads/corpus.py" "$s" > /dev/null 2>&1)
       done
     done
     T1=$(date +%s.%N)
     cpu() { awk '{print ($14 + $15) / 100}' "/proc/$1/stat"; }
     rss() { awk '/VmRSS/ {print $2 / 1024}' "/proc/$1/status"; }
     python3 - "$(cpu $TT)" "$(cpu $SMI)" "$T0" "$T1" "$(wc -l < /tmp/stream4.jsonl)" "$(wc -l < /tmp/smi-stream4.csv)" "$(rss $TT)" <<'PY' | tee "$OUT/stream-cost-long.txt"
import sys
tt, smi, t0, t1, lines, smi_lines, rss = map(float, sys.argv[1:])
wall = t1 - t0
print(f"over {wall:.0f} s: traintop record --jsonl (1 s) {tt:.2f} CPU-s = {tt / wall * 100:.2f} % of a core, "
      f"{lines:.0f} lines, RSS {rss:.0f} MiB at the end; nvidia-smi --query-gpu -l 1 {smi:.2f} CPU-s = "
      f"{smi / wall * 100:.2f} %, {smi_lines:.0f} lines; ratio {tt / smi if smi else float('nan'):.1f}")
PY
     kill $TT $SMI; wait $TT $SMI 2>/dev/null ;;
esac
