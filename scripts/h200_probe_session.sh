#!/usr/bin/env bash
# The attach/probe checks on H200s (two GPUs for the DDP part), in one batch:
#   1. `traintop run` injects the probe into a real training job (healthy, then a leak) whose own
#      memory log is compared with what the probe published;
#   2. a job that does `import traintop.probe`, found by `traintop record --pid`;
#   3. two-rank DDP under torchrun, launched by `traintop run`;
#   4. the probe's overhead on a real training step (paired runs);
#   5. NVML query costs and the fast tick again.
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-probe}"
mkdir -p "$OUT"; cd "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*"; }
nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
Q=timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem,clocks.max.sm,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv -lms 100 > smi-query-100ms.csv 2>&1 &
SMI=$!
nvidia-smi dmon -o DT --format csv > dmon.csv 2>&1 &
DMON=$!

log "1. traintop run (probe injected): healthy 25 s, leak 20 s"
python3 -m traintop run --no-ui --interval 0.25 --record probe-run.ttrec --log job1.log -- \
    python3 "$REPO/bench/workloads/train_phases.py" --only healthy,leak --seconds 25 --log-memory mem1.jsonl
python3 "$REPO/scripts/check_probe_against_job.py" probe-run.ttrec mem1.jsonl | tee probe-vs-job.txt

log "2. attach by PID to a job that imports traintop.probe (starved 40 s)"
python3 "$REPO/bench/workloads/train_phases.py" --only starved --seconds 40 --probe > job2.log 2>&1 &
JP=$!
sleep 4
python3 -m traintop record attach.ttrec --pid $JP --interval 0.25 --duration 34
wait $JP

log "3. DDP, 2 ranks, under traintop run"
python3 -m traintop run --no-ui --interval 0.25 --record ddp.ttrec --log ddp.log -- \
    torchrun --nproc_per_node=2 "$REPO/bench/workloads/ddp_train.py" --seconds 30
tail -3 ddp.log

log "4. probe overhead"
python3 "$REPO/bench/probe_overhead.py" --pairs 12 --steps 100 --width 8192 --batch 4096 --json overhead.json

log "5. NVML costs, fast tick"
python3 "$REPO/bench/nvml_calls.py" --json nvml_calls.json > nvml_calls.txt 2>&1; cat nvml_calls.txt
kill $SMI $DMON 2>/dev/null

python3 - <<'PY'
from traintop.record.recording import RecordingReader
for name in ("probe-run.ttrec", "attach.ttrec", "ddp.ttrec"):
    r = RecordingReader(name)
    fs = list(r.frames())
    ranks = {}
    for f in fs:
        for k in f.ranks:
            ranks[k.pid] = k
    print(f"== {name}: {len(fs)} frames, GPUs {[g.index for g in fs[-1].gpus]}, probed processes {len(ranks)}")
    for k in ranks.values():
        print(f"   pid {k.pid} rank {k.rank}/{k.world_size} cuda {k.cuda} dev {k.device} steps {k.steps} "
              f"alloc {k.allocated} res {k.reserved} step {k.step_time} wait {k.input_wait}")
    for a in r.alerts():
        print(f"   alert {a.rule} {a.subject} {a.severity.label}: {a.evidence}")
PY
tar czf "$OUT/results.tgz" --exclude=results.tgz -C "$OUT" .
ls -la "$OUT"
