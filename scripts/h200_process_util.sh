#!/usr/bin/env bash
# On a GPU machine: two real jobs share GPU 0 (one busy, one light); traintop's per-process
# utilization beside `nvidia-smi pmon` in one run, the snapshot, doctor's NVML lines, and the
# CPU that `traintop record --jsonl` and `nvidia-smi --query-gpu -l 1` each cost over the same
# seconds. Writes its files to $OUT (default ./out). Needs torch on the machine's python3.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PY:-python3}
SECS=${SECS:-30}

job() {  # $1: matrix size, $2: seconds to sleep between bursts
    "$PY" - "$1" "$2" <<'EOF' &
import sys, time, torch
n, pause = int(sys.argv[1]), float(sys.argv[2])
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
end = time.time() + 600
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    if pause:
        time.sleep(pause)
EOF
}
# sizes and pauses of the two jobs (a job that never pauses can leave the other no sample)
job "${BUSY_N:-8192}" "${BUSY_PAUSE:-0}" ; BUSY=$!
job "${LIGHT_N:-2048}" "${LIGHT_PAUSE:-0.05}" ; LIGHT=$!
trap 'kill $BUSY $LIGHT 2>/dev/null' EXIT
sleep 8  # both jobs up and stepping
echo "busy job PID $BUSY, light job PID $LIGHT" > "$OUT/jobs.txt"

cpu_s() {  # utime+stime of a process, in seconds
    awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0
}

# side by side, started together: pmon, traintop's stream, nvidia-smi's query loop
nvidia-smi pmon -s um -o DT -d 1 -c "$SECS" > "$OUT/pmon.txt" 2>&1 &
PMON=$!
"$PY" -m traintop record --interval 1 --duration "$SECS" --jsonl "$OUT/samples.jsonl" 2> "$OUT/record.err" &
TT=$!
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw,temperature.gpu,clocks.sm \
    --format=csv -l 1 > /dev/null 2>&1 &
SMI=$!
sleep $((SECS - 1))
echo "traintop record --jsonl (interval 1 s): $(cpu_s $TT) CPU s over $((SECS - 1)) s" > "$OUT/cpu.txt"
echo "nvidia-smi --query-gpu -l 1:          $(cpu_s $SMI) CPU s over $((SECS - 1)) s" >> "$OUT/cpu.txt"
wait $TT $PMON
kill $SMI 2>/dev/null

"$PY" -m traintop snapshot > "$OUT/snapshot.json" 2> "$OUT/snapshot.err"
"$PY" - > "$OUT/calls.txt" 2>&1 <<'EOF'
import pynvml, time
from traintop.collectors.process_util import NEW_CALL, LEGACY_CALL
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
for name in (NEW_CALL, LEGACY_CALL):
    try:
        got = getattr(pynvml, name)(h, int((time.time() - 2) * 1e6))
        print(name, "answers:", len(got), "samples;", sorted({(s.pid, s.smUtil) for s in got})[:6])
    except Exception as e:
        print(name, "fails:", type(e).__name__, e)
EOF
timeout 60 "$PY" -m traintop doctor --json > "$OUT/doctor.json" 2>&1
"$PY" -m traintop export "$OUT/pmon.txt" > "$OUT/pmon-as-samples.jsonl" 2> "$OUT/pmon-import.err"
kill $BUSY $LIGHT 2>/dev/null
wait 2>/dev/null
ls -la "$OUT"
