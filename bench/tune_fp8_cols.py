"""Tune the FP8 column kernels' configs (``cute_kernels.quantize_fp8_col``) on the GPU at hand.

Times each pass on its own (the amax pass: x read once; the cast pass: x read, q written) on bf16
x (M, K) with G = 8 skewed row groups, inputs rotated past L2, for every config of the sweep;
prints us and the ratio to a copy of the same bytes, and checks each config's output bytes against
the first one's (``--dual``: the passes' dual variants, which also fold row maxima and write q
row-major). Pick by hand into ``cute_kernels/configs/sm90.py`` (notes/fp8-col-kernels.md).

    python -m bench.tune_fp8_cols [--quick] [--dual]   # --quick: one shape; --dual: the dual variants
"""

from __future__ import annotations

import itertools

import torch

from bench.common.baselines import copy_baseline_best
from bench.common.cli import make_parser
from bench.common.groups import skewed_group_ends
from bench.common.timing import make_rotating_inputs, time_cuda
from cute_kernels import registry
from cute_kernels.quantize_fp8_col import Fp8ColAmaxConfig, Fp8ColCastConfig, Fp8ColVariant
from cute_utils.constants import FP8_POW2_MASK

SHAPES = [(16384, 7168), (131072, 2048), (65536, 5120)]
AMAX = [Fp8ColAmaxConfig(t, c) for t, c in itertools.product((4096, 8192, 16384), (3, 4))]
CAST = [Fp8ColCastConfig(32768, c, b) for c, b in itertools.product((1, 2, 3, 4), (1, 2, 4))]


def _sweep(name: str, variant: Fp8ColVariant, configs: list, sets: list, run, moved: int) -> None:
    """Time ``run(kernel, *set)`` for each config's kernel (it returns the output tensors it wrote,
    compared across configs outside the timing); print the best first."""
    arch = {9: "sm_90a", 10: "sm_100a"}[torch.cuda.get_device_capability()[0]]
    entry = registry.entry(name)
    copy_us = copy_baseline_best(moved)[0].us
    first, results = None, []
    for config in configs:
        kernel = entry.compile(variant, arch, config=config)
        out = [t.clone() for t in run(kernel, *sets[0])]
        first = first if first is not None else out
        us = time_cuda(lambda *a, k=kernel: run(k, *a), sets)
        results.append((copy_us / us, us, config, all(map(torch.equal, out, first))))
    for ratio, us, config, same in sorted(results, key=lambda r: -r[0]):
        print(f"  {name} {config} {us:8.1f} us ratio {ratio:.3f} same={same}")


def main(argv: list[str] | None = None) -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--dual", action="store_true", help="tune the dual variants (row outputs too)")
    args = parser.parse_args(argv)
    variant = Fp8ColVariant("bfloat16", "groups", dual=args.dual)
    print(f"device: {torch.cuda.get_device_name()} variant: {variant}")
    for rows, cols in SHAPES[:1] if args.quick else SHAPES:
        ends = torch.tensor(skewed_group_ends(rows, 8), dtype=torch.int32, device="cuda")

        def make(rows=rows, cols=cols):
            x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
            q = torch.empty_strided((rows, cols), (1, rows), device="cuda", dtype=torch.float8_e4m3fn)
            amax = torch.zeros(8 * cols + rows, device="cuda", dtype=torch.int32)
            q_rows = torch.empty((rows, cols), device="cuda", dtype=torch.float8_e4m3fn)
            row_scales = torch.empty(rows, device="cuda", dtype=torch.float32)
            return x, q, amax, torch.empty(8 * cols, device="cuda", dtype=torch.float32), q_rows, row_scales

        sets = make_rotating_inputs(make)
        print(f"{rows}x{cols} G=8")

        def amax_pass(kernel, x, q, amax, scales, q_rows, row_scales, ends=ends):
            kernel(x, amax, ends, 4)
            return (amax,)

        def cast_pass(kernel, x, q, amax, scales, q_rows, row_scales, ends=ends):
            rows_out = (q_rows, row_scales) if args.dual else (None, None)
            kernel(x, q, amax, scales, ends, FP8_POW2_MASK, 4, *rows_out)
            return (q.view(torch.uint8), q_rows.view(torch.uint8)) if args.dual else (q.view(torch.uint8),)

        written = rows * cols * (2 if args.dual else 1)
        _sweep("quantize_fp8_col_amax", variant, AMAX, sets, amax_pass, rows * cols * 2)
        _sweep(
            "quantize_fp8_col_cast", variant, CAST, sets, cast_pass, rows * cols * 2 + written + 8 * cols * 4
        )
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
