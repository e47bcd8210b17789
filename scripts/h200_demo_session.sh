#!/usr/bin/env bash
# Record the embedded demo on an H200: the phased training job launched by `traintop run`
# (probe injected) and recorded at 10 Hz, with nvidia-smi --query-gpu (-lms 100) and dmon
# logging beside it, and the live dashboard screenshotted during the starved phase.
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-demo}"
mkdir -p "$OUT"; cd "$OUT"
export PYTHONUNBUFFERED=1
Q=timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem,clocks.max.sm,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv -lms 100 > smi-query-100ms.csv 2>&1 &
SMI=$!
nvidia-smi dmon -o DT > dmon.txt 2>&1 &
DMON=$!
python3 -m traintop run --no-ui --interval 0.1 --record h200-session.ttrec --log train.log -- \
    python3 "$REPO/bench/workloads/train_phases.py" --phases phases.jsonl &
RUN=$!
sleep 85
JOB=$(pgrep -f "train_phases.py --phases" | head -1)
python3 "$REPO/scripts/screenshots.py" --live 30 --pid "$JOB" --out "$OUT" > screenshots.log 2>&1
wait $RUN
kill $SMI $DMON 2>/dev/null
tar czf results.tgz h200-session.ttrec smi-query-100ms.csv dmon.txt phases.jsonl train.log screenshots.log
ls -la
