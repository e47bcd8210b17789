#!/usr/bin/env bash
# The power-cap rule on a real GPU: 45 s of bf16 matmuls (full load, at the power limit),
# then 30 s of a kernel that spins (utilization 100 %, SMs idle, as a hung collective
# shows), then 15 s idle, recorded by `traintop record`; `traintop analyze` then says when
# "Power-capped at full load" started and ended (it must end within seconds of the spin,
# not be raised during it). Needs torch. Never changes clocks or power limits.
# Usage: OUT=dir bash scripts/h200_power_cap.sh
set -u
OUT="${OUT:-/tmp/h200-power-cap}"
mkdir -p "$OUT"
cd "$OUT"  # not from the repository, whose traintop/ lacks the mapped subpackages of an install
REC="$OUT/power_cap.ttrec"
rm -f "$REC"
python3 -m traintop record --quiet --interval 0.5 --duration 95 "$REC" &
RECORDER=$!
sleep 3
python3 - <<'EOF'
import time
import torch

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = time.time()
print(f"load from {time.strftime('%H:%M:%S')}", flush=True)
while time.time() - t < 45:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
print(f"spin from {time.strftime('%H:%M:%S')}", flush=True)
t = time.time()
while time.time() - t < 30:
    torch.cuda._sleep(int(1e9))  # one block spinning: "utilization" without work
    torch.cuda.synchronize()
print(f"idle from {time.strftime('%H:%M:%S')}", flush=True)
EOF
wait "$RECORDER"
python3 -m traintop analyze "$REC"
echo "-- the rules run again over the samples (--rerun):"
python3 -m traintop analyze --rerun "$REC"
