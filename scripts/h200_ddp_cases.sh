#!/usr/bin/env bash
# Multi-GPU and stall cases on two H200s, in one batch (about 7 minutes). Each is recorded by
# traintop at 10 Hz with the probe (`traintop run`), and for the DDP cases also by a second
# traintop attached by PID that sees no probe (NVML and the process tree alone), with
# nvidia-smi --query-gpu -lms 100 and dmon -s puct (1 s) logging beside it:
#   straggler   DDP, rank 1 spends 0.25 s of CPU on its main thread before each step
#   balanced    DDP, both ranks equal (must stay quiet)
#   stall       DDP, rank 1 blocks before an all-reduce; rank 0 waits in NCCL until its
#               40-s watchdog ends the job; the probes' messages (with their stack dumps) saved
#   loaderhang  one GPU, a DataLoader worker hangs; the job waits 40 s, then its loader times out
#   pageable    one GPU, 256 MiB copied from pageable host memory each step
#   starved     DDP, only rank 1's loader is slow (2 workers, 0.4 s of CPU per batch)
# Usage: OUT=dir bash scripts/h200_ddp_cases.sh   (expects traintop importable; 2 GPUs)
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-ddp}"  # gets one archive per case and summary.txt
WORK="${WORK:-/tmp/h200-ddp-work}"
mkdir -p "$OUT" "$WORK"
cd "$WORK"  # not the repo root: its source traintop/ must not shadow the installed package
export PYTHONUNBUFFERED=1
DDP="$REPO/bench/workloads/ddp_cases.py"
WL="$REPO/bench/workloads/pathologies.py"
TAP="$REPO/scripts/probe_tap.py"
TORCHRUN="python3 -m torch.distributed.run --nproc_per_node=2"
SECS="${SECS:-50}"
STAGES="${STAGES:-straggler balanced stall loaderhang pageable starved}"
NOPROBE="$WORK/noprobe"  # a probe directory with no probes in it: the second recorder sees none
mkdir -p -m 700 "$NOPROBE"
log() { echo "[$(date +%T)] $*"; }
want() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }

{ nvidia-smi; nvidia-smi topo -m; python3 -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'gpus', torch.cuda.device_count())"
  env | grep -E '^(NCCL|TORCH|NVSHMEM)_' ; } > env.txt 2>&1
head -30 env.txt

Q=timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem,clocks.max.sm,clocks_event_reasons.active,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max
start_logs() {
  nvidia-smi --query-gpu=$Q --format=csv -lms 100 > "$1-smi-100ms.csv" 2>/dev/null & SMI=$!
  nvidia-smi dmon -s puct -o DT > "$1-dmon.txt" 2>&1 & DMON=$!
}
stop_logs() { kill $SMI $DMON 2>/dev/null; wait $SMI $DMON 2>/dev/null; }
pack() { gzip -f "$1-smi-100ms.csv" "$1-probe.jsonl" 2>/dev/null; tar czf "$OUT/$1.tgz" "$1"*; }

# name, then the job's command: traintop run records it with the probe; a second traintop
# attached to the job's PID, blind to the probes, records it too.
run_case() {
  local name=$1; shift
  log "$name"; start_logs "$name"
  rm -f "$name.pid"
  python3 -m traintop run --no-ui --record "$name.ttrec" --interval 0.1 --log "$name-job.log" -- \
    bash -c 'echo $$ > '"$name.pid"'; exec "$@"' _ "$@" > "$name-run.log" 2>&1 & RUN=$!
  for _ in $(seq 50); do [ -s "$name.pid" ] && break; sleep 0.1; done
  TRAINTOP_PROBE_DIR="$NOPROBE" python3 -m traintop record "$name-noprobe.ttrec" --interval 0.1 \
    --pid "$(cat "$name.pid")" > "$name-noprobe.log" 2>&1 & REC=$!
  wait $RUN; echo "  job: $(tail -1 "$name-run.log")"
  kill -TERM $REC; wait $REC
  [ -n "${TAPP:-}" ] && { kill $TAPP 2>/dev/null; wait $TAPP 2>/dev/null; TAPP=; }
  stop_logs; pack "$name"
}

want straggler && run_case straggler $TORCHRUN "$DDP" straggler --seconds "$SECS" --cpu-s 0.25 \
  --events "$WORK/straggler.jsonl"
want balanced && run_case balanced $TORCHRUN "$DDP" balanced --seconds $((SECS - 5)) \
  --events "$WORK/balanced.jsonl"
if want stall; then
  # ~12 s to start, 20 s of steps, then the stall; the stacks asked for 15 s into it (the probes
  # also send them on their own after 30 s without a step)
  python3 "$TAP" stall-probe.jsonl --seconds 95 --ask 47 > stall-tap.log 2>&1 & TAPP=$!
  run_case stall timeout -k 5 100 $TORCHRUN "$DDP" stall --seconds 20 --stall-s 80 \
    --nccl-timeout 40 --events "$WORK/stall.jsonl"
fi
if want loaderhang; then
  python3 "$TAP" loaderhang-probe.jsonl --seconds 80 --ask 40 > loaderhang-tap.log 2>&1 & TAPP=$!
  CUDA_VISIBLE_DEVICES=0 run_case loaderhang python3 "$WL" loader_hang --seconds 20 --hang-s 40 \
    --log "$WORK/loaderhang.jsonl"
fi
want pageable && CUDA_VISIBLE_DEVICES=0 run_case pageable python3 "$WL" pageable --seconds $((SECS - 5)) \
  --log "$WORK/pageable.jsonl"
want starved && run_case starved $TORCHRUN "$DDP" starved --seconds "$SECS" --cpu-s 0.4 \
  --events "$WORK/starved.jsonl"

log "what traintop saw"
python3 - $STAGES > "$OUT/summary.txt" 2>&1 <<'PY'
import os, statistics, sys
from traintop.record.recording import RecordingReader
for name in sys.argv[1:]:
    for suffix in ("", "-noprobe"):
        path = f"{name}{suffix}.ttrec"
        if not os.path.exists(path):
            continue
        r = RecordingReader(path)
        fs = list(r.frames())
        print(f"== {path}: {len(fs)} frames over {fs[-1].t - fs[0].t:.0f} s" if fs else f"== {path}: empty")
        for i in sorted({g.index for f in fs for g in f.gpus}):
            def col(n):
                return [getattr(g, n) for f in fs for g in f.gpus if g.index == i and getattr(g, n) is not None]
            parts = []
            for n in ("util", "sm_active", "power_w", "pcie_rx", "mem_used"):
                v = col(n)
                parts.append(f"{n} {statistics.median(v):.4g}/{max(v):.4g}" if v else f"{n} -")
            print(f"   GPU {i}: " + "  ".join(parts) + "  (median/max)")
        ranks = {}
        for f in fs:
            for k in f.ranks:
                ranks.setdefault(k.pid, []).append(k)
        for pid, ks in ranks.items():
            st = [k.step_time for k in ks if k.step_time]
            iw = [k.input_wait for k in ks if k.input_wait is not None]
            print(f"   rank {ks[-1].rank} pid {pid} dev {ks[-1].device} steps {ks[-1].steps} "
                  f"step {statistics.median(st) if st else None} wait {statistics.median(iw) if iw else None}")
        for a in r.alerts():
            print(f"   alert {a.rule} {a.subject} {a.severity.label} @{a.start - fs[0].t:.0f}s: {a.evidence[:200]}")
PY
cat "$OUT/summary.txt"
for n in $STAGES; do
  for f in "$n-smi-100ms.csv.gz" "$n-dmon.txt"; do
    [ -f "$f" ] || continue
    echo "== $f"; python3 -m traintop analyze "$f" 2>&1 | grep -iE "warning|critical|info" | head -5
  done
done | tee -a "$OUT/summary.txt"
cat env.txt >> "$OUT/summary.txt"
ls -la "$OUT"
