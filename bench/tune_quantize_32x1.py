"""Tune the 32x1 quantization kernel's config (``cute_kernels.quantize_32x1.Quantize32x1Config``).

Compiles each candidate config, times it on bf16 shapes (blocked rceil scales; ``--groups G``: G
uneven row groups, K-groups scales) next to a copy of the same bytes, checks the bytes against the
first candidate's, and prints one line per (config, shape).

    python -m bench.tune_quantize_32x1 [--groups G]
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.common import block_group_ends, copy_baseline_best, make_rotating_inputs, time_cuda
from bench.common.device import cuda_or_none
from cute_kernels import registry
from cute_kernels.quantize_32x1 import Quantize32x1Config, Quantize32x1Variant, ScaleLayout
from torch_bindings.quantize_32x1 import scales_shape_32x1

CANDIDATES = {
    "pairs_mc4": Quantize32x1Config(),
    "pairs_mc0": Quantize32x1Config(min_ctas_per_sm=0),
    "lane_mc4": Quantize32x1Config(pair_stores=False),
    "pairs_t4k": Quantize32x1Config(target_ctas=4096),
    "pairs_t32k": Quantize32x1Config(target_ctas=32768),
    "pairs_t64k": Quantize32x1Config(target_ctas=65536),
}
GROUP_CANDIDATES = {
    "pairs_t32k": Quantize32x1Config(target_ctas=32768),
    "pairs_t16k": Quantize32x1Config(target_ctas=16384),
    "pairs_t8k": Quantize32x1Config(target_ctas=8192),
    "pairs_t4k": Quantize32x1Config(target_ctas=4096),
    "pairs_t2k": Quantize32x1Config(target_ctas=2048),
}
SHAPES = ((32768, 2048), (32768, 7168), (131072, 2048), (131072, 5120), (131072, 7168))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=0, help="G row groups (the K-groups layout)")
    args = parser.parse_args(argv)
    if cuda_or_none("tune_quantize_32x1") is None:
        return 2
    candidates = GROUP_CANDIDATES if args.groups else CANDIDATES
    layout = ScaleLayout.K_GROUPS if args.groups else ScaleLayout.BLOCKED
    variant = Quantize32x1Variant("bfloat16", "rceil", layout, rank=2)  # the 2-D op's entry
    arch = {9: "sm_90a", 10: "sm_100a"}[torch.cuda.get_device_capability()[0]]
    entry = registry.entry("quantize_32x1")
    print(f"device: {torch.cuda.get_device_name()}")
    for rows, cols in SHAPES:
        ends = block_group_ends(rows, args.groups) if args.groups else None
        shape = scales_shape_32x1(rows, cols, args.groups or None, True)

        def make(rows=rows, cols=cols, shape=shape):
            x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
            q = torch.empty_strided((rows, cols), (1, rows), device="cuda", dtype=torch.float8_e4m3fn)
            return (x, q, torch.empty(shape, device="cuda", dtype=torch.float8_e8m0fnu))

        sets = make_rotating_inputs(make)
        moved = rows * cols * 3 + shape[0] * shape[1]
        copy_us = copy_baseline_best(moved)[0].us
        reference = None
        for name, config in candidates.items():
            kernel = entry.compile(variant, arch, config=config)
            x, q, s = sets[0]
            kernel(x, q, s, ends)
            out = (q.view(torch.uint8).clone(), s.view(torch.uint8).clone())
            reference = reference or out
            same = all(torch.equal(a, b) for a, b in zip(out, reference, strict=True))
            us = time_cuda(lambda x, q, s, k=kernel, e=ends: k(x, q, s, e), sets)
            print(f"{rows}x{cols} {name:12s} {us:9.1f} us  ratio {copy_us / us:.3f}  same={same}")
        del sets
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
