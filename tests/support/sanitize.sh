#!/usr/bin/env bash
# compute-sanitizer over the fuzz harness (tests/support/fuzz.py) on small shapes, with PyTorch's caching
# allocator off so a write past a tensor's end leaves its allocation (inside a cached segment memcheck
# cannot see it):
#   memcheck:  every fuzzed op, plus the garbage-offset patterns (negative, decreasing, past the end,
#              INT_MAX, INT_MIN); on an sm_90 GPU also the grouped GEMM's fuzz and garbage tests;
#   racecheck: every fuzzed op (each stages through shared memory: scans, cp.async rings, tiles).
# Needs a GPU. Environment: PYTHON (default python3), SEED (default 0), EXAMPLES (memcheck cases per
# op, default 8), RACE_EXAMPLES (default 2). Exits non-zero on the first tool error.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
SEED=${SEED:-0}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONUNBUFFERED=1
# Compile (or load from the disk cache) outside the tools first: the same cases, no sanitizer.
"$PYTHON" tests/support/fuzz.py --small --examples "${RACE_EXAMPLES:-2}" --seed "$SEED" >/dev/null
echo "== memcheck (seed $SEED)"
"$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 1 --print-limit 50 \
  "$PYTHON" tests/support/fuzz.py --small --garbage --examples "${EXAMPLES:-8}" --seed "$SEED"
if "$PYTHON" -c 'import sys, torch; sys.exit(torch.cuda.get_device_capability()[0] != 9)'; then
  echo "== memcheck: the sm_90a grouped GEMM (fuzzed groups, garbage offsets)"
  "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 1 --print-limit 50 \
    "$PYTHON" -m pytest -q -x -p no:cacheprovider tests/torch_bindings/test_grouped_gemm_sm90_gpu.py \
    -k "fuzz or garbage"
fi
echo "== racecheck (seed $SEED)"
"$sanitizer" --tool racecheck --report-api-errors no --error-exitcode 1 --print-limit 50 \
  "$PYTHON" tests/support/fuzz.py --small --examples "${RACE_EXAMPLES:-2}" --seed "$SEED"
