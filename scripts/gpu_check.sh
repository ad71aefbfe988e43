#!/usr/bin/env bash
# Issue 14's GPU check in one call of a time-limited GPU slot, on a box set up as gpu_run.sh wants:
# the engine benchmark at size reference on CIFAR-10 in bfloat16 (one run, then 2, 4 and 8 at once; 3 rounds
# after a warm-up, so each median is a middle value, not the mean of two),
# then reference benchmark runs until the slot ends. Each part has a hard time limit, so what finished
# is packed before the slot's end: OUT_DIR gets engine.log, benchmark.log and results.tar.gz (the
# engine JSON and every finished run folder, no checkpoints; `tar -xzf` it in the repository root).
# Usage: scripts/gpu_check.sh WHEELS_DIR OUT_DIR SECONDS [benchmark options, e.g. --workers 4]
# WORKER_COUNTS="4" times fewer concurrent settings than the default "2 4 8"; PERFORMER_MPS=1 (gpu_run.sh)
# runs both parts under NVIDIA MPS, where the engine times each count without and with it.
set -uo pipefail
usage="usage: scripts/gpu_check.sh WHEELS_DIR OUT_DIR SECONDS [benchmark options]"
(($# >= 3)) || { echo "gpu_check.sh: $usage" >&2; exit 2; }
wheels=$1 out=$2 seconds=$3
shift 3
[[ $seconds =~ ^[0-9]+$ ]] && ((seconds >= 120)) || { echo "gpu_check.sh: SECONDS must be an integer >= 120" >&2; exit 2; }
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1
end=$((SECONDS + seconds))
nvidia-smi -L
# The engine first (the check's targets), with 60% of the time; the queue gets the rest.
timeout $((seconds * 3 / 5)) bash scripts/gpu_run.sh "$wheels" profiles.engine --backends jax --dataset cifar10 \
    --size reference --limit all --precision mixed_bfloat16 --rounds 3 --worker-counts ${WORKER_COUNTS:-2 4 8} 2>&1 \
    | tee "$out/engine.log"
left=$((end - SECONDS - 20))  # 20 s for the archive
if ((left > 60)); then
    # --max-minutes stops new runs in time; timeout ends a first run that could not be judged in advance.
    timeout "$left" bash scripts/gpu_run.sh "$wheels" --profile reference --max-minutes "$(((left - 15) / 60)).$(((left - 15) % 60 * 10 / 60))" \
        "$@" 2>&1 | tee "$out/benchmark.log"
fi
tar -czf "$out/results.tar.gz" --exclude=best.keras --exclude=backup $(ls -d profiles/results/gpu-* results/reference 2>/dev/null)
ls -l "$out"
