#!/usr/bin/env bash
# Issue-4/5 checks on an H200 in one batch: NVML costs incl. GPM; `traintop doctor`;
# CPU per wall second of traintop vs nvitop, gpustat and nvidia-smi (idle GPU, side by side);
# then pathologies recorded at 10 Hz by traintop with nvidia-smi --query-gpu -lms 100 and
# dmon logging beside it: tiny kernels (util 100 %, few SMs), PCIe-bound copies, fragmentation
# (with the probe), another process holding memory beside a job, and a kernel fault (XID).
# Usage: OUT=dir bash scripts/h200_pathologies.sh   (expects traintop importable)
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-out}"
mkdir -p "$OUT"
cd "$OUT"  # not the repo root: its source traintop/ must not shadow the installed package
export PYTHONUNBUFFERED=1
WL="$REPO/bench/workloads/pathologies.py"
SECS="${SECS:-60}"
STAGES="${STAGES:-costs doctor cpu small_kernels pcie fragmentation other fault}"
log() { echo "[$(date +%T)] $*"; }
want() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }

{ nvidia-smi; nvidia-smi -q -d PCIE,ECC,PERFORMANCE | head -120
  python3 -c "import torch, pynvml, platform; print('python', platform.python_version(), 'torch', torch.__version__)"
  lscpu | head -20; } > env.txt 2>&1
want costs && { log "nvml costs"; python3 "$REPO/bench/nvml_calls.py" --json nvml_calls.json > nvml_calls.txt 2>&1; cat nvml_calls.txt; }
want doctor && { log "doctor"; python3 -m traintop doctor > doctor.txt 2>&1; echo "exit $?" >> doctor.txt; cat doctor.txt
python3 -m traintop doctor --json > doctor.json 2>&1; }
if want cpu; then
  log "cpu comparison (idle GPU)"
  python3 "$REPO/bench/cpu_compare.py" --preset h200 --seconds 30 --warmup 8 --json cpu_compare.json > cpu_compare.txt 2>&1
  cat cpu_compare.txt
fi

Q=timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem,clocks.max.sm,clocks_event_reasons.active,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max
start_logs() {
  nvidia-smi --query-gpu=$Q --format=csv -lms 100 > "$1-smi.csv" 2>/dev/null & SMI=$!
  nvidia-smi dmon -s puctv -o DT > "$1-dmon.txt" 2>&1 & DMON=$!
}
stop_logs() { kill $SMI $DMON 2>/dev/null; wait $SMI $DMON 2>/dev/null; }
record_pid() {  # name pid seconds
  python3 -m traintop record "$1.ttrec" --interval 0.1 --pid "$2" > "$1-record.log" 2>&1 & REC=$!
}

for M in small_kernels pcie; do
  want $M || continue
  log "$M"; start_logs "$M"
  python3 "$WL" "$M" --seconds "$SECS" --log "$M.jsonl" > "$M.log" 2>&1 & J=$!
  sleep 1; record_pid "$M" $J
  if want shots; then  # the live dashboard attached to this job, once its alert has had time to rise
    sleep 12; python3 "$REPO/scripts/screenshots.py" --live 35 --pid $J --out "$OUT/shots-$M" > "shots-$M.log" 2>&1
    tail -2 "shots-$M.log"
  fi
  wait $J; sleep 1; kill -TERM $REC; wait $REC; stop_logs
done

want fragmentation && { log "fragmentation (traintop run, probe)"; start_logs fragmentation
python3 -m traintop run --no-ui --record fragmentation.ttrec --interval 0.1 -- \
  python3 "$WL" fragmentation --seconds "$SECS" --log "$OUT/fragmentation.jsonl" > fragmentation-run.log 2>&1
stop_logs; }

want other && { log "another process beside a job"; start_logs other
python3 "$WL" holder --gib 20 --seconds $((SECS + 15)) --log other.jsonl > holder.log 2>&1 & H=$!
sleep 4
python3 "$WL" train --seconds "$SECS" --log other.jsonl > train.log 2>&1 & J=$!
sleep 1; record_pid other $J; wait $J; sleep 1; kill -TERM $REC; wait $REC; kill $H; wait $H; stop_logs; }

want fault && { log "kernel fault (XID)"; start_logs fault
python3 -m traintop record fault.ttrec --interval 0.1 > fault-record.log 2>&1 & REC=$!
sleep 3
python3 "$WL" fault --log fault.jsonl > fault.log 2>&1; echo "fault exit $?" >> fault.log
sleep 5; kill -TERM $REC; wait $REC; stop_logs
tail -3 fault.log; }

log "what traintop found"
for f in small_kernels pcie fragmentation other fault; do
  [ -f "$f.ttrec" ] || continue
  echo "== $f"; python3 -m traintop analyze "$f.ttrec" > "$f-analyze.txt" 2>&1; head -40 "$f-analyze.txt"
  python3 - "$f.ttrec" <<'PY'
import sys
from traintop.record.recording import RecordingReader
fs = list(RecordingReader(sys.argv[1]).frames())
def col(name):
    return [getattr(g, name) for f in fs for g in f.gpus if getattr(g, name) is not None]
for n in ("util", "sm_active", "tensor_active", "dram_active", "pcie_rx", "throttle_power", "ecc_corrected", "xid", "pcie_gen"):
    v = col(n)
    if v:
        print(f"  {n:15s} n={len(v):4d} mean={sum(v)/len(v):12.1f} max={max(v):12.1f}")
    else:
        print(f"  {n:15s} none")
PY
  for L in smi dmon; do
    ext=csv; [ $L = dmon ] && ext=txt
    python3 -m traintop analyze "$f-$L.$ext" > "$f-$L-analyze.txt" 2>&1
    echo "  -- $L: $(grep -c . "$f-$L.$ext") lines"; grep -E "^\s*(▲|!|✖|ℹ|\*|-)|warning|critical|info" "$f-$L-analyze.txt" | head -6
  done
done
tar czf results.tgz --exclude=results.tgz . && ls -la
