#!/usr/bin/env bash
# Run where the package index is reachable, before a GPU run: fetches the wheels a bare
# GPU image lacks for the suite (grain and what it needs, fpzip) for Python 3.12 on
# x86-64 Linux into .whl/ (git ignores it), which benchmarks/gpu_check.sh installs from.
# The versions are those of the H200 run of 2026-11-27 (jax 0.11.2 image).
#   benchmarks/gpu_wheels.sh            # then carry .whl/ to the GPU machine
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-python3}"
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014; do
    platforms+=(--platform "${p}_x86_64")
done
for wheel in grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 fpzip==1.2.5; do
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d .whl "$wheel"
done
ls .whl
