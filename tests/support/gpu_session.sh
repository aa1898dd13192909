#!/usr/bin/env bash
# The GPU checks of a change in as few device calls as possible: each STAGE runs, its full output
# goes to $OUT/<stage>.log, and a summary table (stage, exit code, seconds, last line) ends the
# output. Stages run in the order given; a failing stage does not stop the others.
#
#   source .gpu/env.sh && bash tests/support/gpu_session.sh gemm suite fuzz sanitize
#   source .gpu/env.sh && bash tests/support/gpu_session.sh bench
#   (2+ GPUs) bash tests/support/gpu_session.sh multigpu
#
# On a machine of several GPUs, single-GPU stages can run side by side, one GPU and one OUT each
# (separate the setup with ';': `source ... && A & B &` would put the source in the first job only):
#   source .gpu/env.sh; S=/tmp/s; bash tests/support/gpu_session.sh multigpu;
#   (CUDA_VISIBLE_DEVICES=0 OUT=$S/g bash tests/support/gpu_session.sh gemm > $S/g.out 2>&1) &
#   (CUDA_VISIBLE_DEVICES=1 OUT=$S bash tests/support/gpu_session.sh suite > $S/u.out 2>&1) & wait
# Benchmarks run that way share the host with the other jobs: host-bound rows (bench_overhead, the
# op rows of bench_moe) are not comparable with a run alone.
#
# Stages:
#   gemm      the grouped GEMM's GPU tests and its gemm="cute" wiring,
#             then its bench
#   suite     every GPU test (pytest -m gpu, XDIST workers, default 6)
#   col_ncu   an ncu profile (speed of light, warp stalls, occupancy) of the FP8 column amax passes,
#             the 3-D dual's and the experts layout's single one, on a 16 x 8192 x 5120 weight
#             (its log: $OUT/col_ncu.log)
#   fuzz      the fuzz harness on dirty memory with garbage offsets (FUZZ_EXAMPLES per op)
#   gemm_tune the grouped GEMM's config sweep (bench.tune grouped_gemm), its wgrad probe
#             (bench_grouped_gemm --probe), then an ncu profile of the wgrad launches at the bench
#             shapes (speed of light, warp stalls; $OUT/gemm_ncu.log)
#   sanitize  compute-sanitizer memcheck + racecheck over the small fuzz, caching allocator off
#   bench     bench_moe --quick, bench_overhead --runs 3, bench_model --quick
#   overhead_ab  bench_overhead of the base tree BASE_TREE (a folder of the packages, e.g. made with
#             `git archive REV cute_kernels cute_utils torch_bindings bench | tar x -C DIR` and
#             carried) and of this tree, in alternating pairs (PAIRS, default 4), with the verdict;
#             run it alone on the machine (host-bound), with a STAGE_TIMEOUT that covers 2 x PAIRS
#             bench_overhead runs
#   multigpu  the EP tests under torchrun on every GPU, then bench_ep (NVLink multicast off)
# Environment: OUT (default /tmp/gpu-session), PYTHON (default python3), XDIST, FUZZ_EXAMPLES, SEED,
# BASE_TREE, PAIRS,
# STAGE_TIMEOUT (seconds per stage, default 300: a hung kernel ends its stage, not the device call).
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
summary=()

run_stage() {  # name, then the command
    local name=$1 start rc last
    shift
    echo "== $name: $*"
    start=$(date +%s)
    timeout -k 10 "${STAGE_TIMEOUT:-300}" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    last=$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-100)
    summary+=("$(printf '%-10s rc=%-3s %5ss  %s' "$name" "$rc" "$(($(date +%s) - start))" "$last")")
    echo "   rc=$rc  $last"
}

gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
echo "GPUs: $gpus ($("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))' 2>/dev/null))"
for stage in "$@"; do
    case "$stage" in
    gemm)
        run_stage gemm_tests "$PYTHON" -m pytest -v -m gpu tests/torch_bindings/test_grouped_gemm_sm90_gpu.py \
            tests/moe/test_grouped_mm_cute.py
        run_stage gemm_bench "$PYTHON" -m bench.bench_grouped_gemm --out "$OUT"
        ;;
    gemm_tune)
        run_stage gemm_tune "$PYTHON" -m bench.tune grouped_gemm --out "$OUT"
        run_stage gemm_probe "$PYTHON" -m bench.bench_grouped_gemm --probe --out "$OUT"
        run_stage gemm_ncu ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
            --section LaunchStats --section Occupancy -k regex:GroupedGemm -c 4 \
            "$PYTHON" -m bench.bench_grouped_gemm --once wgrad
        ;;
    col_ncu)
        run_stage col_ncu ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
            --section Occupancy -k regex:Fp8ColAmax -c 2 "$PYTHON" -m bench.bench_fp8_cols --once
        ;;
    suite) run_stage suite "$PYTHON" -m pytest -q -m gpu -n "${XDIST:-6}" tests ;;
    fuzz)
        run_stage fuzz "$PYTHON" tests/support/fuzz.py --garbage --examples "${FUZZ_EXAMPLES:-20}" \
            --seed "${SEED:-11}"
        ;;
    sanitize) run_stage sanitize env PYTHON="$PYTHON" SEED="${SEED:-7}" EXAMPLES=3 bash tests/support/sanitize.sh ;;
    bench)
        run_stage bench_moe "$PYTHON" -m bench.bench_moe --quick --out "$OUT"
        run_stage overhead "$PYTHON" -m bench.bench_overhead --runs 3
        run_stage bench_model "$PYTHON" -m bench.bench_model --quick --out "$OUT"
        ;;
    overhead_ab)
        run_stage overhead_ab "$PYTHON" -m bench.overhead_ab --base-tree "${BASE_TREE:?set BASE_TREE}" \
            --pairs "${PAIRS:-4}"
        ;;
    multigpu)
        run_stage ep_multigpu "$PYTHON" -m torch.distributed.run --nproc-per-node "$gpus" \
            tests/support/ep_multigpu.py
        run_stage bench_ep "$PYTHON" -m torch.distributed.run --nproc-per-node "$gpus" -m bench.bench_ep \
            --host-profile 20
        ;;
    *) echo "unknown stage: $stage" >&2 ;;
    esac
done
echo "== summary ($OUT)"
printf '%s\n' "${summary[@]}"
