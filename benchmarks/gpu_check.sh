#!/usr/bin/env bash
# The GPU check (see benchmarks/gpu_check.py): run from anywhere, on a bare GPU machine.
#   benchmarks/gpu_check.sh [--cpu] [--dry-run] [--workers N] [--budget S] [--out DIR]
# FNNC_WHEELS=<folder of wheels> installs missing packages (grain, array-record,
# portpicker) with pip --target; PYTHON picks the interpreter (default python3).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
exec "${PYTHON:-python3}" benchmarks/gpu_check.py "$@"
