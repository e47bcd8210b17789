#!/usr/bin/env bash
# Issue 35 on an H200 machine, in one go (about 7 minutes; at most 9): traintop against its peers,
# idle and under a real training job, every monitor started together (bench/peer_cost.py --preset
# h200: record vs `nvidia-smi dmon`, agent vs nvitop-exporter scraped every 5 s, the dashboard vs
# nvitop at 1 Hz at 160x48 and 80x24 and at each tool's defaults, `traintop run` beside the
# unattached dashboard), then where the dashboard's and the recorder's CPU goes under the job
# (bench/live_profile.py, bench/recorder_cost.py --nvml) and what each NVML call costs
# (bench/nvml_calls.py).
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl   # once
#   OUT=dir bash scripts/h200_perf.sh    (NO_PROFILE=1: the side-by-side table alone)
#
# traintop runs from this checkout (a linked tree makes app/, widgets/ and collectors/ its
# subpackages, as an install does; bytecode compiled first); nvitop, nvitop-exporter and
# textual from SITE (default /tmp/site). Everything lands in $OUT: peer_cost.txt (the table),
# peer_cost.json (raw), and the rest beside them.
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-perf}"
SITE="${SITE:-/tmp/site}"
SECONDS_STEADY="${STEADY:-45}"
WARMUP="${WARMUP:-35}"  # past the 30 s after which a steadily busy GPU's utilization buffer is no longer read
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/summary.txt"
say() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
START=$(date +%s)

TREE="$(mktemp -d)"  # traintop as installed: traintop/{app,widgets,collectors} linked from the checkout
mkdir -p "$TREE/traintop"
for f in "$REPO"/traintop/*; do ln -s "$f" "$TREE/traintop/"; done
for sub in app widgets collectors; do ln -s "$REPO/$sub" "$TREE/traintop/$sub"; done
export PYTHONPATH="$TREE${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
python3 -m compileall -q "$REPO/traintop" "$REPO/app" "$REPO/widgets" "$REPO/collectors" "$SITE" > /dev/null 2>&1
cd "$OUT"  # not the repository's root: its traintop/ alone (without app/) must not shadow the tree

say environment
{ nvidia-smi; python3 --version; nproc; python3 -c "import traintop, textual, nvitop, pynvml, psutil
print('traintop', traintop.__version__, traintop.__file__); print('textual', textual.__version__)
print('nvitop', nvitop.__version__, 'psutil', psutil.__version__)"; git -C "$REPO" log --oneline -1; } >> "$LOG" 2>&1

say "side by side: idle, under training, attached"
python3 "$REPO/bench/peer_cost.py" --preset h200 --load nanogpt --runs "${RUNS:-1}" --seconds "$SECONDS_STEADY" \
  --warmup "$WARMUP" --json "$OUT/peer_cost.json" --table "$OUT/peer_cost.txt" > "$OUT/peer_cost.log" 2>&1
cat "$OUT/peer_cost.txt" >> "$LOG" 2>/dev/null || tail -20 "$OUT/peer_cost.log" >> "$LOG"

if [ -z "${NO_PROFILE:-}" ]; then  # NO_PROFILE=1: the table alone
say "where the CPU goes under the job: the dashboard (cProfile), the recorder (by part)"
python3 "$REPO/bench/workloads/nanogpt.py" --seconds 150 > "$OUT/job.log" 2>&1 &
JOB=$!
trap 'kill $JOB 2>/dev/null' EXIT
for _ in $(seq 90); do grep -q "^step " "$OUT/job.log" && break; sleep 1; done
python3 "$REPO/bench/live_profile.py" --warmup 35 --seconds 30 --top 25 -- --interval 1 > "$OUT/live_profile.txt" 2>&1
python3 "$REPO/bench/recorder_cost.py" --nvml --hours 0.05 --seconds 0 --json "$OUT/recorder_cost.json" \
  > "$OUT/recorder_cost.txt" 2>&1
python3 "$REPO/bench/nvml_calls.py" --json "$OUT/nvml_calls.json" > "$OUT/nvml_calls.txt" 2>&1
kill $JOB 2>/dev/null
head -24 "$OUT/live_profile.txt" >> "$LOG"
grep -A8 '"per_tick_us"' "$OUT/recorder_cost.txt" >> "$LOG"
fi
say "done in $(( $(date +%s) - START )) s"
rm -rf "$TREE"
