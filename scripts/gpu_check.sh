#!/usr/bin/env bash
# The GPU check of issue 36, on the device machine: install what its image lacks (open_clip and its two small
# needs, carried as wheels in .whl/), run the cuda tests, then benchmarks/gpu.py; the logs and the JSON line go
# to $OUT (cuda_tests.log, gpu_benchmark.log, gpu.json, nvidia_smi.txt).
#
#   scripts/gpu_check.sh --fetch-wheels      # here, once: the x86-64 / Python 3.12 wheels into .whl/
#   OUT=/tmp/gpu scripts/gpu_check.sh        # there (the device tool: carry .whl); about 10 minutes at most
#   OUT=/tmp/x PYTHON=<venv>/bin/python DEVICE=cpu BENCH_ARGS=--small scripts/gpu_check.sh   # a dry run on a CPU
set -uo pipefail

WHEELS=${WHEELS:-.whl}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
BENCH_ARGS=${BENCH_ARGS:-}
# what the device image lacks of lace's needs (it has torch, timm, transformers, numpy, scipy, numba, pytest, ...)
CARRIED="open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth==0.9.4"

if [[ ${1:-} == --fetch-wheels ]]; then
    mkdir -p "$WHEELS"
    # shellcheck disable=SC2086
    exec "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$WHEELS" $CARRIED
fi

: "${OUT:?set OUT to the folder the logs and the JSON go to}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 1
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=src:.:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi >"$OUT/nvidia_smi.txt" 2>&1 || echo "no nvidia-smi" >"$OUT/nvidia_smi.txt"

# the cuda tests (on a CPU they are collected and skip); at most 5 minutes
timeout 300 "$PYTHON" -m pytest tests/cuda -m cuda -q -p no:cacheprovider --durations=15 -rs 2>&1 \
    | tee "$OUT/cuda_tests.log"
tests=${PIPESTATUS[0]}

# the benchmark; at most 7 minutes (it is sized for about 3 on an H200)
# shellcheck disable=SC2086
timeout 420 "$PYTHON" benchmarks/gpu.py --device "$DEVICE" $BENCH_ARGS 2>&1 | tee "$OUT/gpu_benchmark.log"
bench=${PIPESTATUS[0]}
grep "^{\"benchmark\"" "$OUT/gpu_benchmark.log" | tail -n 1 >"$OUT/gpu.json"

echo "cuda tests: exit $tests; benchmark: exit $bench" | tee -a "$OUT/cuda_tests.log"
[[ $tests -eq 0 && $bench -eq 0 ]]
