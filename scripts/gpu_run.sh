#!/usr/bin/env bash
# On a fresh NVIDIA box with a CUDA JAX and no TensorFlow: install Keras and KerasTuner from a
# folder of wheels (scripts/gpu_wheels.sh) beside that JAX, then run a chunk of the benchmark.
# Usage: scripts/gpu_run.sh WHEELS_DIR [benchmark options]
#        (default options: --profile reference --max-minutes 25)
#        scripts/gpu_run.sh WHEELS_DIR MODULE [options]   any other module of the repository, the same way,
#        e.g. profiles.engine --backends jax --dataset cifar10 --size reference --limit all --worker-counts 2 4 8
# The run folders land in results/<profile>/runs/ as on any machine; `--max-minutes` starts no
# run the time left cannot finish, so a rented hour ends with finished folders only.
set -euo pipefail
wheels=${1:?usage: scripts/gpu_run.sh WHEELS_DIR [benchmark options]}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
site=${PERFORMER_SITE:-/tmp/performer-site}
python3 -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" \
    || { echo "gpu_run.sh: JAX sees no GPU here; install a CUDA JAX first (README: Training on a GPU)" >&2; exit 2; }
python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}" KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false
cd "$repo"
if [ $# -eq 0 ]; then set -- --profile reference --max-minutes 25; fi
if [[ $1 == -* ]]; then set -- experiments.benchmark "$@"; fi
exec python3 -m "$@"
