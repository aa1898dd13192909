"""Tune the FP8 row kernel's config (``cute_kernels.quantize_fp8.Fp8RowConfig``) per K class on the
GPU at hand, and write the per-device table the bindings read (``cute_kernels/configs/tuned.json``).

For each K class (the next power of 2 of K: the binding's compile key) sweeps threads per CTA x
unroll x (one row per warp | a whole CTA per row) on bf16 x (16384, K) for the class's K values,
power-of-2 scales, inputs rotated past L2; prints us and the ratio to a copy of the same bytes,
checks every config's bytes against the first one's, and keeps the config with the best worst
ratio over the class's K values. ``--write FILE`` merges the winners into FILE (the table's
format: ``cute_kernels.configs``) under this arch and device name.

    python -m bench.tune_fp8_rowwise [--quick] [--write cute_kernels/configs/tuned.json]
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import torch

from bench.common.baselines import copy_baseline_best
from bench.common.cli import make_parser, progress
from bench.common.device import cuda_or_none
from bench.common.timing import make_rotating_inputs, time_cuda
from bench.common.tuned import merge_tuned
from cute_kernels import registry
from cute_kernels.quantize_fp8 import Fp8RowConfig, Fp8RowVariant

ROWS = 16384
CLASSES = {1024: (1024,), 2048: (2048,), 4096: (4096,), 8192: (5120, 7168)}
CONFIGS = [  # a whole CTA per row (the tuned kind), then one row per warp
    Fp8RowConfig(threads=t, unroll=u, ctas_per_sm=1, row_per_cta=True)
    for t, u in itertools.product((128, 256, 512, 1024), (1, 2, 4, 8))
] + [Fp8RowConfig(threads=t, unroll=u, ctas_per_sm=1) for t, u in itertools.product((256, 512), (8, 16))]


def _ratios(cols: int, kernels: dict) -> dict:
    """``{config: (ratio to copy, us)}`` at (ROWS, cols); raises if a config's bytes differ."""

    def make():
        x = torch.randn(ROWS, cols, device="cuda", dtype=torch.bfloat16)
        q = torch.empty(ROWS, cols, device="cuda", dtype=torch.float8_e4m3fn)
        return x, q, torch.empty(ROWS, device="cuda", dtype=torch.float32)

    sets = make_rotating_inputs(make)
    copy_us = copy_baseline_best(ROWS * cols * 3 + ROWS * 4)[0].us
    first, out = None, {}
    for config, kernel in kernels.items():
        kernel(*sets[0])
        got = (sets[0][1].view(torch.uint8).clone(), sets[0][2].clone())
        first = first or got
        if not (torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])):
            raise AssertionError(f"{config}: bytes differ from {next(iter(kernels))}")
        us = time_cuda(lambda x, q, s, k=kernel: k(x, q, s), sets)
        out[config] = (copy_us / us, us)
    del sets
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, default=None, help="merge the winners into this table")
    args = parser.parse_args(argv)
    if cuda_or_none("tune_fp8_rowwise") is None:
        return 2
    arch = {9: "sm_90a", 10: "sm_100a"}[torch.cuda.get_device_capability()[0]]
    device = torch.cuda.get_device_name()
    configs = [c for c in CONFIGS if c.row_per_cta] if args.quick else CONFIGS
    entry, variant = registry.entry("quantize_fp8_row"), Fp8RowVariant("bfloat16")
    kernels = {config: entry.compile(variant, arch, config=config) for config in configs}
    print(f"device: {device}, {len(configs)} configs")
    winners = {}
    for k_class, cols_list in CLASSES.items():
        progress(f"K class {k_class}: K = {cols_list}")
        per_cols = [_ratios(cols, kernels) for cols in cols_list]
        worst = {c: min(r[c][0] for r in per_cols) for c in configs}
        ranked = sorted(configs, key=lambda c: -worst[c])
        for config in ranked[:4]:
            us = ", ".join(f"{r[config][1]:.1f}" for r in per_cols)
            print(f"k{k_class} {config} worst ratio {worst[config]:.3f} us [{us}]")
        winners[k_class] = ranked[0]
    if args.write is not None:
        entries = {f"bfloat16/k{k_class}": dataclasses.asdict(c) for k_class, c in winners.items()}
        merge_tuned(args.write, "quantize_fp8_row", arch, device, entries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
