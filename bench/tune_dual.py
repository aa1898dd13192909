"""Sweep ``QuantizeConfig`` choices for the dual (1x32 + 32x1 from one read) variant of the 1x32
kernel: prints time and ratio to a copy of the same bytes (inputs rotated past L2)."""

from __future__ import annotations

import sys

import torch

from bench.common import (
    copy_baseline_us,
    make_parser,
    make_rotating_inputs,
    output_paths,
    progress,
    report,
    require_cuda,
    time_cuda,
)
from cute_kernels.quantize import QuantizeConfig, ScaleLayout, compile_quantize
from torch_bindings.backend import kernel_arch
from torch_bindings.quantize import scales_shape_1x32
from torch_bindings.swizzle import blocked_output_shape

SHAPES = [(8192, 7168), (32768, 2048), (32768, 7168), (131072, 7168)]


def _inputs(shape, dtype, device):
    rows, cols = shape

    def make():
        x = torch.randn(shape, dtype=dtype, device=device)
        q = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
        s = torch.empty(scales_shape_1x32(shape, None, True), dtype=torch.float8_e8m0fnu, device=device)
        qt = torch.empty((cols, rows), dtype=torch.float8_e4m3fn, device=device)
        st = torch.empty(
            blocked_output_shape((cols, rows // 32), None, "M"), dtype=torch.float8_e8m0fnu, device=device
        )
        return x, q, s, qt, st

    sets = make_rotating_inputs(make)
    return sets, sum(t.nbytes for t in sets[0])


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    device = require_cuda("tune_dual")
    arch, _ = kernel_arch(device)
    configs = [
        QuantizeConfig(batch_vectors=b, stages=st, target_ctas=t, warp_tiles=w, min_ctas_per_sm=m)
        for b, st, t, w, m in [
            (2, 3, 32768, 4, 0),
            (2, 5, 32768, 4, 0),
            (2, 9, 32768, 4, 0),
            (2, 9, 8192, 4, 0),
            (2, 5, 32768, 1, 0),
            (2, 9, 32768, 4, 3),
        ]
    ]
    rows = []
    for config in configs:
        kernel = compile_quantize("bfloat16", "rceil", ScaleLayout.BLOCKED, arch, config, dual=True)
        for shape in SHAPES:
            sets, nbytes = _inputs(shape, torch.bfloat16, device)
            us = time_cuda(lambda x, q, s, qt, st, k=kernel: k(x, q, s, None, None, None, qt, st, 0), sets)
            copy = copy_baseline_us(nbytes, device)
            rows.append(
                {
                    "shape": shape,
                    "stages": config.stages,
                    "target ctas": config.target_ctas,
                    "warp tiles": config.warp_tiles,
                    "min ctas": config.min_ctas_per_sm,
                    "us": us,
                    "ratio": copy / us,
                }
            )
            progress(f"{rows[-1]}")
            del sets
    json_path, _ = output_paths(args, "tune_dual")
    report(
        rows,
        ["shape", "stages", "target ctas", "warp tiles", "min ctas", "us", "ratio"],
        "dual quantize config sweep (bf16)",
        json_path=json_path,
        panel_key=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
