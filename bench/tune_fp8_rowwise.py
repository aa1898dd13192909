"""Tune the FP8 row kernel's config (``cute_kernels.quantize_fp8.Fp8RowConfig``) on the GPU at hand.

Sweeps threads per CTA x amax-pass unroll x CTAs per SM on bf16 (16384 | 131072) x (2048 | 7168),
power-of-2 scales, inputs rotated past L2; prints us and the ratio to a copy of the same bytes, and
checks every config's bytes against the first one's. (The per-arch JSON table of issue 20 is not
written yet: pick by hand into ``cute_kernels/configs/sm90.py``.)

    python -m bench.tune_fp8_rowwise [--quick]   # --quick: CTA-per-row configs and the shipped one
"""

from __future__ import annotations

import itertools

import torch

from bench.common.baselines import copy_baseline_best
from bench.common.cli import make_parser
from bench.common.timing import make_rotating_inputs, time_cuda
from cute_kernels import registry
from cute_kernels.quantize_fp8 import Fp8RowConfig, Fp8RowVariant

SHAPES = [(16384, 2048), (16384, 7168), (131072, 2048), (131072, 7168)]
CONFIGS = [  # one row per warp, then a whole CTA per row
    Fp8RowConfig(threads=t, unroll=u, ctas_per_sm=c)
    for t, u, c in itertools.product((128, 256, 512, 1024), (2, 4, 8, 16, 32), (1, 2, 4, 8))
    if t * c <= 2048
] + [
    Fp8RowConfig(threads=t, unroll=u, ctas_per_sm=c, row_per_cta=True)
    for t, u, c in itertools.product((128, 256, 512, 1024), (1, 2, 4, 8), (1, 2, 4, 8))
    if t * c <= 2048
]


def main(argv: list[str] | None = None) -> None:
    args = make_parser(__doc__.splitlines()[0]).parse_args(argv)
    arch = {9: "sm_90a", 10: "sm_100a"}[torch.cuda.get_device_capability()[0]]
    entry, variant = registry.entry("quantize_fp8_row"), Fp8RowVariant("bfloat16")
    configs = CONFIGS
    if args.quick:
        configs = [c for c in CONFIGS if c.row_per_cta or (c.unroll == 16 and c.threads == 512)]
    kernels = {config: entry.compile(variant, arch, config=config) for config in configs}
    print(f"device: {torch.cuda.get_device_name()}, {len(configs)} configs")
    for rows, cols in SHAPES:

        def make(rows=rows, cols=cols):
            x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
            q = torch.empty(rows, cols, device="cuda", dtype=torch.float8_e4m3fn)
            return x, q, torch.empty(rows, device="cuda", dtype=torch.float32)

        sets = make_rotating_inputs(make)
        moved = rows * cols * 3 + rows * 4
        copy_us = copy_baseline_best(moved)[0].us
        first, results = None, []
        for config, kernel in kernels.items():
            kernel(*sets[0])
            out = (sets[0][1].view(torch.uint8).clone(), sets[0][2].clone())
            first = first or out
            same = torch.equal(out[0], first[0]) and torch.equal(out[1], first[1])
            us = time_cuda(lambda x, q, s, k=kernel: k(x, q, s), sets)
            results.append((copy_us / us, us, config, same))
        for ratio, us, config, same in sorted(results, key=lambda r: -r[0])[:6]:
            print(
                f"{rows}x{cols} threads={config.threads:4d} unroll={config.unroll:2d} "
                f"row/CTA={config.row_per_cta:d} ctas/SM={config.ctas_per_sm} {us:8.1f} us "
                f"ratio {ratio:.3f} same={same}"
            )
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
