#!/usr/bin/env bash
# Everything checked on an H200 in one batch (device time is scarce):
#   NVML query costs; traintop's collector vs nvidia-smi; a real training job that plays
#   healthy / starved / underused / leak / idle phases, recorded by `traintop record` at 10 Hz
#   attached to its PID, with nvidia-smi --query-gpu (-lms 100) and dmon logging beside it;
#   and the live dashboard's screenshots taken during the starved phase.
# Usage: OUT=dir bash scripts/h200_session.sh   (expects traintop importable, e.g. PYTHONPATH)
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-out}"
mkdir -p "$OUT"
cd "$OUT"  # not the repo root: its source traintop/ must not shadow the installed package
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*"; }

log "environment"
{ nvidia-smi; nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE | head -80
  python3 -c "import torch, pynvml, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nproc; free -g; } > "$OUT/env.txt" 2>&1
log "nvml costs"
python3 "$REPO/bench/nvml_calls.py" --json "$OUT/nvml_calls.json" > "$OUT/nvml_calls.txt" 2>&1
cat "$OUT/nvml_calls.txt"

Q=timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem,clocks.max.sm,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv -lms 100 > "$OUT/smi-query.csv" 2> "$OUT/smi-query.err" &
SMI=$!
nvidia-smi dmon -o DT > "$OUT/dmon.txt" 2>&1 &
DMON=$!

log "training job"
python3 "$REPO/bench/workloads/train_phases.py" --phases "$OUT/phases.jsonl" > "$OUT/train.log" 2>&1 &
TP=$!
sleep 2
python3 -m traintop record "$OUT/h200-session.ttrec" --interval 0.1 --pid $TP > "$OUT/record.log" 2>&1 &
RP=$!
sleep 28
log "collector vs nvidia-smi (healthy phase)"
python3 "$REPO/scripts/check_against_nvidia_smi.py" --rounds 4 > "$OUT/compare.txt" 2>&1
cat "$OUT/compare.txt" | head -40
sleep 45
log "live screenshots (starved phase)"
python3 "$REPO/scripts/screenshots.py" --live 35 --pid $TP --out "$OUT" > "$OUT/screenshots.log" 2>&1
tail -3 "$OUT/screenshots.log"
wait $TP
log "training done rc=$?"
kill -TERM $RP; wait $RP
kill $SMI $DMON 2>/dev/null
cat "$OUT/record.log"
tail -12 "$OUT/train.log"
python3 - "$OUT/h200-session.ttrec" <<'PY'
import sys
from traintop.record.recording import RecordingReader
r = RecordingReader(sys.argv[1])
fs = list(r.frames())
print("frames", len(fs), "span", round(fs[-1].t - fs[0].t, 1), "s", "gpus", [g.name for g in r.info.gpus])
for a in r.alerts():
    print(f"{a.rule:14s} {a.severity.label:8s} +{a.start - fs[0].t:6.1f}s..{(a.end or 0) - fs[0].t:6.1f}s  {a.evidence}")
PY
ls -la "$OUT"
