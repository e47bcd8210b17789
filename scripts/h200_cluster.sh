#!/usr/bin/env bash
# traintop across "two nodes" on one machine with two H200s, through a real Prometheus:
#   - two agents, one per GPU (--only-gpus 0 / 1), posing as nodes h200-node0 and h200-node1;
#   - a two-rank DDP job under `traintop run` whose rank 1 has a slow DataLoader (a straggler);
#   - a real Prometheus scraping both agents every second;
#   - `traintop analyze --prometheus --json` must name rank 1 on h200-node1 as the straggler,
#     and `traintop cluster` is screenshot (scripts/screenshots.py --cluster).
#
# The machine that runs it needs no network: prepare the kit here first, which copies this
# machine's prometheus binary and downloads the two Python wheels traintop's cluster code adds:
#     bash scripts/h200_cluster.sh --prepare          # writes .cluster-kit/ (ignored by git)
# then run on the GPU machine, carrying the kit:
#     bash scripts/h200_cluster.sh                    # results in $OUT (default /tmp/h200-cluster)
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
KIT="$REPO/.cluster-kit"

if [ "${1:-}" = "--prepare" ]; then
    mkdir -p "$KIT/wheels"
    cp "$(command -v prometheus)" "$KIT/prometheus" || { echo "no prometheus binary here (apt-get install prometheus)"; exit 1; }
    python3 -m pip download -q --only-binary=:all: -d "$KIT/wheels" "prometheus-client>=0.17" "httpx>=0.24" \
        || { echo "pip download failed"; exit 1; }
    grep -qxF "/.cluster-kit/" "$REPO/.gitignore" 2>/dev/null || echo "note: add /.cluster-kit/ to .gitignore"
    du -sh "$KIT"; ls "$KIT/wheels"
    exit 0
fi

OUT="${OUT:-/tmp/h200-cluster}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*"; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

[ -x "$KIT/prometheus" ] || { echo "missing $KIT/prometheus: run 'bash scripts/h200_cluster.sh --prepare' first and carry .cluster-kit"; exit 1; }
python3 -c "import prometheus_client, httpx" 2>/dev/null || \
    python3 -m pip install -q --no-index --find-links "$KIT/wheels" prometheus-client httpx || exit 1
cd "$REPO"
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P0=$(free_port); P1=$(free_port); PP=$(free_port)
export TRAINTOP_PROBE_DIR="$OUT/probes"   # the job's probes and both agents meet here
JOB=h200-ddp

log "agents: GPU 0 as h200-node0 on :$P0, GPU 1 as h200-node1 on :$P1"
python3 -m traintop agent --only-gpus 0 --hostname h200-node0 --job $JOB --listen 127.0.0.1:$P0 --interval 0.5 \
    --record "$OUT/node0.ttrec" 2> "$OUT/agent0.log" & PIDS+=($!)
python3 -m traintop agent --only-gpus 1 --hostname h200-node1 --job $JOB --listen 127.0.0.1:$P1 --interval 0.5 \
    --record "$OUT/node1.ttrec" 2> "$OUT/agent1.log" & PIDS+=($!)

cat > "$OUT/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ['$REPO/deploy/prometheus/traintop-alerts.yml']
scrape_configs:
  - job_name: traintop
    honor_labels: true
    static_configs:
      - targets: ['127.0.0.1:$P0', '127.0.0.1:$P1']
EOF
"$KIT/prometheus" --config.file="$OUT/prometheus.yml" --storage.tsdb.path="$OUT/prom-data" \
    --web.listen-address=127.0.0.1:$PP --log.level=warn 2> "$OUT/prometheus.log" & PIDS+=($!)
PROM=http://127.0.0.1:$PP
for _ in $(seq 50); do curl -sf $PROM/-/ready >/dev/null && break; sleep 0.2; done
T0=$(date +%s)

log "DDP job, 2 ranks, rank 1's loader sleeps 30 ms a batch (90 s)"
SLURM_JOB_ID=$JOB python3 -m traintop run --no-ui --log "$OUT/ddp.log" -- \
    torchrun --nproc_per_node=2 bench/workloads/ddp_straggler.py --seconds 90 --slow-rank 1 --delay 0.03
tail -3 "$OUT/ddp.log"
SPAN=$(( $(date +%s) - T0 + 5 ))

log "scrapes per host"
for p in $P0 $P1; do curl -s 127.0.0.1:$p/metrics > "$OUT/metrics-$p.txt"; wc -c "$OUT/metrics-$p.txt"; done

log "analyze --prometheus --json over the job's ${SPAN} s"
python3 -m traintop analyze --prometheus $PROM --job $JOB --since ${SPAN}s --json > "$OUT/analyze.json"
echo "exit $?"
python3 -m traintop analyze --prometheus $PROM --job $JOB --since ${SPAN}s > "$OUT/analyze.txt"; cat "$OUT/analyze.txt"

log "screenshots of traintop cluster (the last 2 minutes)"
python3 scripts/screenshots.py --cluster $PROM --job $JOB --out "$OUT" --prefix h200-cluster

python3 - "$OUT/analyze.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = [f for f in r["findings"] if f["rule"] in ("straggler", "straggler_node")]
print("stragglers:", [(f["host"], f["subject"]) for f in s])
print("explained by the cross-host view:", [(f["rule"], f["host"], f["subject"]) for f in r.get("explained", [])])
named = any(f["host"] == "h200-node1" and f["subject"].endswith("rank 1") and "input wait" in f["evidence"] for f in s)
# rank 0 waits for rank 1 in its collectives: neither starved nor underused
wrong = [(f["rule"], f["subject"]) for f in r["findings"] if f["host"] == "h200-node0"
         and f["rule"] in ("starvation", "underuse", "idle_gpu", "node_starving", "straggler", "straggler_node")]
warnings = [(f["rule"], f["host"]) for f in r["findings"] if f["severity"] != "info"]
print("warnings or worse:", warnings)
if named and not wrong:
    print("PASS: the straggler is rank 1 on h200-node1 (its input), nothing wrong named on h200-node0")
else:
    print("FAIL:" + ("" if named else " rank 1 on h200-node1 not named as the straggler with its input wait;")
          + (f" h200-node0 wrongly judged: {wrong}" if wrong else ""))
PY
tar czf "$OUT/results.tgz" --exclude=results.tgz --exclude=prom-data --exclude=probes -C "$OUT" .
ls -la "$OUT"
