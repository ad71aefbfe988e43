#!/usr/bin/env bash
# Fetch, on a machine with network, the wheels a fresh NVIDIA box with a CUDA JAX lacks:
# Keras and KerasTuner and the three of their needs such images seldom hold (namex,
# optree, kt-legacy), pinned as in requirements.txt, for CPython 3.12 on x86-64.
# Usage: scripts/gpu_wheels.sh DIR [PYTHON_VERSION]      then carry DIR to the GPU box.
set -euo pipefail
usage="usage: scripts/gpu_wheels.sh DIR [PYTHON_VERSION]"
(($# == 1 || $# == 2)) || { echo "gpu_wheels.sh: $usage" >&2; exit 2; }
dir=$1 python_version=${2:-3.12}
[[ ! -e $dir || -d $dir ]] || { echo "gpu_wheels.sh: $dir is a file; give a folder" >&2; exit 2; }
pin() { grep -i "^$1==" "$(dirname "$0")/../requirements.txt"; }
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$tag")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_version" \
    --implementation cp "${platforms[@]}" -d "$dir" \
    "$(pin keras)" "$(pin keras-tuner)" "$(pin namex)" "$(pin optree)" "$(pin kt-legacy)"
ls "$dir"
