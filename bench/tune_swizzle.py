"""Sweep ``SwizzleConfig`` choices (row blocks per CTA, register cap, threads) on representative
shapes of each layout; prints time and ratio to a copy of the same bytes. Used to pick ``CONFIGS``.
"""

from __future__ import annotations

import itertools
import sys

import torch

from bench.common import (
    copy_baseline_us,
    make_parser,
    output_paths,
    progress,
    report,
    require_cuda,
    time_cuda,
)
from cute_kernels.swizzle import SwizzleConfig, SwizzleLayout, compile_swizzle
from torch_bindings.backend import kernel_arch
from torch_bindings.swizzle import blocked_output_shape

SHAPES = {
    "plain": [(16384, 224), (131072, 224), (131072, 64)],
    "m_groups": [(16384, 224), (131072, 224), (131072, 64)],
    "k_groups": [(7168, 512), (7168, 4096)],
}


def main(argv: list[str] | None = None) -> int:
    args = make_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = require_cuda("tune_swizzle")
    arch, _ = kernel_arch(device)
    configs = [
        SwizzleConfig(threads=threads, blocks_per_cta=blocks, min_ctas_per_sm=cap)
        for threads, blocks, cap in itertools.product((256, 128), (1, 2), (0, 4))
        if not (threads == 128 and cap == 4)
    ]
    rows = []
    for layout_name, shapes in SHAPES.items():
        layout = SwizzleLayout(layout_name)
        for config in configs:
            word_loads = layout is not SwizzleLayout.K_GROUPS
            kernel = compile_swizzle(layout, arch, 2, word_loads, config)
            for shape in shapes:
                scales = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
                scales = scales.view(torch.float8_e8m0fnu)
                ends = None
                groups = "K" if layout is SwizzleLayout.K_GROUPS else "M"
                if layout is not SwizzleLayout.PLAIN:
                    total = shape[1] if groups == "K" else shape[0]
                    ends = (torch.arange(1, 9, device=device) * total // 8 - 3).clamp(min=0).to(torch.int32)
                out = torch.empty(
                    blocked_output_shape(shape, None if ends is None else 8, groups),
                    dtype=torch.float8_e8m0fnu,
                    device=device,
                )
                us = time_cuda(lambda k=kernel, s=scales, o=out, e=ends: k(s, o, e))
                nbytes = scales.numel() + out.numel()
                copy = copy_baseline_us(nbytes, device)
                rows.append(
                    {
                        "layout": layout_name,
                        "shape": shape,
                        "threads": config.threads,
                        "blocks/cta": config.blocks_per_cta,
                        "min ctas": config.min_ctas_per_sm,
                        "us": us,
                        "ratio": copy / us,
                    }
                )
                progress(f"{rows[-1]}")
    json_path, _ = output_paths(args, "tune_swizzle")
    report(
        rows,
        ["layout", "shape", "threads", "blocks/cta", "min ctas", "us", "ratio"],
        "swizzle config sweep",
        json_path=json_path,
        panel_key=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
