#!/usr/bin/env bash
# Goodput on an H200: the corpus scenarios that exercise the time ledger, the precision check,
# the pause finding and MFU, each recorded four ways (scripts/h200_corpus.sh), then the probe's
# overhead with the ledger, precision reading and FLOP counting on (paired runs).
# Usage: OUT=dir PART=1|2 bash scripts/h200_goodput.sh   (traintop importable, torch with CUDA)
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/h200-goodput}"
mkdir -p "$OUT"
case "${PART:-1}" in
  1) SCENARIOS="fp32_no_tf32 healthy_bf16 checkpoints compile_warmup" BATCH=goodput1 OUT="$OUT" \
       bash "$REPO/scripts/h200_corpus.sh" ;;
  2) SCENARIOS="eval_phases starved_then_fed" BATCH=goodput2 OUT="$OUT" bash "$REPO/scripts/h200_corpus.sh"
     (cd /tmp && python3 "$REPO/bench/probe_overhead.py" --pairs 12 --steps 100 --json "$OUT/probe-overhead.json") ;;
esac
