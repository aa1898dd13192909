"""Tune the dual quantization kernel's config (``cute_kernels.quantize_dual.DualConfig``).

The chosen configs go to ``cute_kernels/configs/sm90.py`` (``quantize_dual``).

Compiles each candidate config, times it on bf16 (``--dtype float32``: fp32) shapes (blocked rceil
scales; ``--groups G``: the grouped layout) next to a copy of the same bytes and the two single
calls (``quantize_mxfp8_2d`` 1x32 then 32x1), checks every output against the single calls' bytes,
and prints one line per (config, shape).

    python -m bench.tune_quantize_dual [--quick] [--groups G] [--dtype float32]
"""

from __future__ import annotations

import argparse
import sys

import torch

import torch_bindings
from bench.common import block_group_ends, copy_baseline_best, make_rotating_inputs, progress, time_cuda
from bench.common.device import cuda_or_none
from cute_kernels import registry
from cute_kernels.quantize_dual import DualConfig, DualVariant, ScaleLayout

CANDIDATES = {
    "s1_n1": DualConfig(stages=1, tiles_per_cta=1),
    "s1_n2": DualConfig(stages=1, tiles_per_cta=2),
    "s1_n4": DualConfig(stages=1, tiles_per_cta=4),
    "s2_n2": DualConfig(stages=2, tiles_per_cta=2),
    "s2_n4": DualConfig(stages=2, tiles_per_cta=4),
    "s2_n8": DualConfig(stages=2, tiles_per_cta=8),
    "s1_n1_inorder": DualConfig(stages=1, tiles_per_cta=1, spread_rows=False),
}
SHAPES = (
    (8192, 2048),
    (8192, 5120),
    (32768, 2048),
    (32768, 5120),
    (32768, 7168),
    (131072, 5120),
    (131072, 7168),
)


def _single_calls(x: torch.Tensor, ends: torch.Tensor | None = None):
    q_r, s_r = torch_bindings.quantize_mxfp8_2d(x, block="1x32", group_end_offsets=ends)
    q_c, s_c = torch_bindings.quantize_mxfp8_2d(x, block="32x1", group_end_offsets=ends)
    return q_r, s_r, q_c, s_c


def _bytes(tensors) -> list[torch.Tensor]:
    return [t.contiguous().view(torch.uint8) for t in tensors]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first two candidates only")
    parser.add_argument("--groups", type=int, default=0, help="G row groups (the grouped layout)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--rows", type=int, nargs="+", help="only shapes with these row counts")
    parser.add_argument("--candidates", nargs="+", choices=sorted(CANDIDATES), help="only these configs")
    args = parser.parse_args(argv)
    if cuda_or_none("tune_quantize_dual") is None:
        return 2
    names = args.candidates or list(CANDIDATES)[: 2 if args.quick else None]
    candidates = {name: CANDIDATES[name] for name in names}
    layout = ScaleLayout.GROUPS if args.groups else ScaleLayout.BLOCKED
    arch = {9: "sm_90a", 10: "sm_100a"}[torch.cuda.get_device_capability()[0]]
    print(f"device: {torch.cuda.get_device_name()}")
    entry = registry.entry("quantize_dual")
    variant = DualVariant(args.dtype, "rceil", layout)
    kernels = {}
    for name, config in candidates.items():
        progress(f"compiling {name}")
        kernels[name] = entry.compile(variant, arch, config=config)
    for rows, cols in SHAPES:
        if args.rows and rows not in args.rows:
            continue
        ends = block_group_ends(rows, args.groups) if args.groups else None

        def make(rows=rows, cols=cols, ends=ends):
            x = torch.randn(rows, cols, device="cuda", dtype=getattr(torch, args.dtype))
            return (x, *_single_calls(x, ends))

        sets = make_rotating_inputs(make)
        x, q_r, s_r, qt, s_c = sets[0]
        want = _bytes((q_r, s_r, qt, s_c))
        moved = x.numel() * x.element_size() + sum(t.numel() for t in want)
        copy_us = copy_baseline_best(moved)[0].us
        pair_us = time_cuda(lambda x, e=ends: _single_calls(x, e), [s[:1] for s in sets])
        print(f"{rows}x{cols} two single calls {pair_us:9.1f} us  copy {copy_us:8.1f} us")
        for name, kernel in kernels.items():
            outs = [torch.empty_like(t) for t in (q_r, s_r, qt, s_c)]
            for t in outs:
                t.view(torch.uint8).fill_(0xA5)
            kernel(x, *outs, ends)
            same = all(torch.equal(a, b) for a, b in zip(_bytes(outs), want, strict=True))
            us = time_cuda(lambda x, *o, k=kernel, e=ends: k(x, *o, e), sets)
            print(
                f"{rows}x{cols} {name:10s} {us:9.1f} us  ratio {copy_us / us:.3f}  "
                f"vs two calls {pair_us / us:.2f}x  same={same}"
            )
        del sets
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
