#!/usr/bin/env bash
# On a fresh NVIDIA box with a CUDA JAX and no TensorFlow: install Keras and KerasTuner from a
# folder of wheels (scripts/gpu_wheels.sh) beside that JAX, then run a chunk of the benchmark.
# Usage: scripts/gpu_run.sh WHEELS_DIR [benchmark options]
#        (default options: --profile reference --max-minutes 25)
#        scripts/gpu_run.sh WHEELS_DIR MODULE [options]   any other module of the repository, the same way,
#        e.g. profiles.engine --backends jax --dataset cifar10 --size reference --limit all --worker-counts 2 4 8
# The run folders land in results/<profile>/runs/ as on any machine; `--max-minutes` starts no
# run the time left cannot finish, so a rented hour ends with finished folders only (except a dataset's first
# runs, which have no finished run to judge from: the log says so).
# PERFORMER_MPS=1 runs the command under NVIDIA's Multi-Process Service (a daemon started here and
# stopped at the end): without it the processes of `--workers N` take turns on the GPU instead of
# sharing it, which may be why 4 workers gained 1.68x and 8 less (profiles/README.md: The engine benchmark on a GPU).
set -euo pipefail
(($# >= 1)) || { echo "gpu_run.sh: usage: scripts/gpu_run.sh WHEELS_DIR [benchmark options]" >&2; exit 2; }
wheels=$1
shift
compgen -G "$wheels/*.whl" >/dev/null \
    || { echo "gpu_run.sh: $wheels holds no .whl files; scripts/gpu_wheels.sh makes them (README: Training on a GPU)" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
site=${PERFORMER_SITE:-/tmp/performer-site}
mps=${PERFORMER_MPS:-0}
[[ $mps == 0 || $mps == 1 ]] || { echo "gpu_run.sh: PERFORMER_MPS must be 0 or 1, not '$mps'" >&2; exit 2; }
if [[ $mps == 1 ]] && ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "gpu_run.sh: PERFORMER_MPS=1 needs nvidia-cuda-mps-control, which is not on PATH" >&2; exit 2
fi
# Quiet: where JAX is not installed at all its traceback would bury the line below.
python3 -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null \
    || { echo "gpu_run.sh: JAX sees no GPU here; install a CUDA JAX first (README: Training on a GPU)" >&2; exit 2; }
python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}" KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false
cd "$repo"
if [ $# -eq 0 ]; then set -- --profile reference --max-minutes 25; fi
if [[ $1 == -* ]]; then set -- experiments.benchmark "$@"; fi
if [[ $mps == 0 ]]; then exec python3 -m "$@"; fi
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/performer-mps/pipe}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/performer-mps/log}
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "gpu_run.sh: the MPS daemon did not start (see $CUDA_MPS_LOG_DIRECTORY)" >&2; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
echo "gpu_run.sh: MPS daemon started (logs in $CUDA_MPS_LOG_DIRECTORY)" >&2
python3 -m "$@"
