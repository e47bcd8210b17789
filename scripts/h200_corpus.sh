#!/usr/bin/env bash
# Record the diagnosis corpus on an H200: each scenario of bench/workloads/corpus.py runs once
# and is seen four ways at the same time, so every source scores the same seconds:
#   NAME-probe.ttrec    `traintop run --record` at 10 Hz, with the probe in every rank
#   NAME-noprobe.ttrec  a second traintop attached to the job's PID, kept 8 s past the job's
#                       end; it finds the job's probes too (through the job's environment), so
#                       bench/diagnosis_score.py removes their ranks and stacks before scoring
#                       it as the source without the probe (NVML and the process tree alone)
#   NAME-smi.csv.gz     nvidia-smi --query-gpu -lms 100
#   NAME-dmon.txt.gz    nvidia-smi dmon (1 s)
#   NAME.labels.jsonl   what the job said it was doing, second by second (the ground truth)
# Usage: OUT=dir SCENARIOS="a b c" bash scripts/h200_corpus.sh   (traintop importable)
# Everything ends up in $OUT/corpus-$BATCH.tgz and $OUT/corpus-$BATCH.txt.
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-corpus}"
BATCH="${BATCH:-1}"
WORK="${WORK:-/tmp/h200-corpus-work}"
mkdir -p "$OUT" "$WORK"
cd "$WORK"  # not the repo root: its source traintop/ must not shadow the installed package
export PYTHONUNBUFFERED=1 CORPUS_SCRATCH="$WORK"
WL="${WL:-$REPO/bench/workloads/corpus.py}"
TORCHRUN="python3 -m torch.distributed.run --nproc_per_node=2"
SCALE="${SCALE:-1}"
NOPROBE="$WORK/noprobe"  # a probe directory with no probes in it: the second recorder sees none
mkdir -p -m 700 "$NOPROBE"
log() { echo "[$(date +%T)] $*"; }
Q=timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem,clocks.max.sm,clocks_event_reasons.active,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max

[ -f env.txt ] || { nvidia-smi; python3 -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__)"; } > env.txt 2>&1

multi() { case "$1" in torchrun_*|gloo_*|straggler_*) return 0;; esac; return 1; }

run_one() {
  local name=$1 launcher="python3"
  multi "$name" && launcher="$TORCHRUN"
  log "$name"
  rm -f "$name.pid" "$name.labels.jsonl"
  nvidia-smi --query-gpu=$Q --format=csv -lms 100 > "$name-smi.csv" 2>/dev/null & local SMI=$!
  nvidia-smi dmon -s puct -o DT > "$name-dmon.txt" 2>&1 & local DMON=$!
  python3 -m traintop run --no-ui --record "$name-probe.ttrec" --interval 0.1 --log "$name-job.log" -- \
    bash -c 'echo $$ > '"$name.pid"'; exec "$@"' _ $launcher "$WL" "$name" --scale "$SCALE" \
    --labels "$WORK/$name.labels.jsonl" ${WL_ARGS:-} > "$name-run.log" 2>&1 & local RUN=$!
  for _ in $(seq 50); do [ -s "$name.pid" ] && break; sleep 0.1; done
  TRAINTOP_PROBE_DIR="$NOPROBE" python3 -m traintop record "$name-noprobe.ttrec" --interval 0.1 \
    --pid "$(cat "$name.pid")" > "$name-noprobe.log" 2>&1 & local REC=$!
  local WATCHERS=""
  if [[ " ${WATCH:-} " == *" $name "* ]]; then
    # what a user sees beside it: the dashboard attached to the job (two sizes) and the agent's series
    python3 "$REPO/scripts/screen_tap.py" --size 160x48 --at "${WATCH_AT:-45,75}" --seconds 400 --out "$name-screen-160x48" \
      -- python3 -m traintop --pid "$(cat "$name.pid")" > /dev/null 2>&1 & WATCHERS="$WATCHERS $!"
    python3 "$REPO/scripts/screen_tap.py" --size 80x24 --at "${WATCH_AT:-45,75}" --seconds 400 --out "$name-screen-80x24" \
      -- python3 -m traintop --pid "$(cat "$name.pid")" > /dev/null 2>&1 & WATCHERS="$WATCHERS $!"
    python3 -m traintop agent --listen 127.0.0.1:19555 > "$name-agent.log" 2>&1 & local AGENT=$!
    (sleep "${WATCH_SCRAPE:-40}"; python3 -c "import urllib.request; print(urllib.request.urlopen(
      'http://127.0.0.1:19555/metrics').read().decode())" > "$name-metrics-running.txt" 2>&1) & WATCHERS="$WATCHERS $!"
  fi
  wait $RUN; echo "  job: $(tail -1 "$name-run.log")"
  if [ -n "$WATCHERS" ]; then
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:19555/metrics').read().decode())" \
      > "$name-metrics.txt" 2>&1
    kill -TERM $AGENT; for w in $WATCHERS; do kill -TERM $w 2>/dev/null; done; wait $AGENT $WATCHERS 2>/dev/null
  fi
  sleep 8  # the job has ended: the findings must end too
  kill -TERM $REC; wait $REC
  kill $SMI $DMON 2>/dev/null; wait $SMI $DMON 2>/dev/null
  gzip -f "$name-smi.csv" "$name-dmon.txt"
  python3 -m traintop analyze "$name-probe.ttrec" 2>&1 | grep -E "^(warning|critical|info)|WARNING|CRITICAL|INFO" | head -8
}

for s in ${SCENARIOS:?name the scenarios}; do run_one "$s"; done
tar czf "$OUT/corpus-$BATCH.tgz" *.ttrec *.labels.jsonl *-smi.csv.gz *-dmon.txt.gz *-run.log *-job.log env.txt \
  $(ls *-screen-*.txt *-metrics*.txt *-agent.log 2>/dev/null) \
  $(ls -d ./*.captures 2>/dev/null)
ls -la "$OUT"
