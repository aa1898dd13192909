"""Tune the TMA 1x32 quantization kernel against the cp.async one (bf16, blocked scales).

Times ``cute_kernels.experimental.quantize_tma`` for a few ``TmaQuantizeConfig`` choices next to the
cp.async kernel (``cute_kernels.quantize`` with its tuned config) on (8192 | 32768 | 131072) x
(2048 | 7168); prints time, ratio to a copy of the same bytes (inputs rotated past L2) and speedup
over cp.async, and checks once per shape that every TMA config writes the same bytes as the cp.async
kernel. Both compile through ``cute_kernels.registry``."""

from __future__ import annotations

import itertools
import sys

import torch

from bench.common import (
    copy_baseline_us,
    cuda_or_none,
    make_parser,
    output_paths,
    progress,
    report,
    time_cuda,
    timing_kwargs,
)
from bench.tune_quantize import compile_1x32, quantize_inputs
from cute_kernels import registry
from cute_kernels.experimental.quantize_tma import TmaQuantizeConfig, TmaVariant
from cute_kernels.quantize import ScaleLayout
from torch_bindings.backend import kernel_arch
from torch_bindings.quantize import scales_shape_1x32

SHAPES = list(itertools.product((8192, 32768, 131072), (2048, 7168)))
QUICK_SHAPES = [(8192, 7168), (32768, 2048), (131072, 7168)]
CONFIGS = [
    TmaQuantizeConfig(box_rows=b, stages=st, warp_tiles=w, target_ctas=t, store_stages=qs)
    for b, st, w, t, qs in [
        (8, 3, 4, 32768, 2),  # the default
        (8, 3, 4, 32768, 0),  # TMA loads only, 8-byte STG of q
        (8, 4, 4, 32768, 2),
        (4, 4, 4, 32768, 2),
        (4, 6, 4, 32768, 3),
        (16, 3, 4, 32768, 2),
        (16, 2, 4, 32768, 2),
        (16, 3, 4, 32768, 0),
        (32, 2, 4, 16384, 2),
        (8, 3, 1, 32768, 2),
        (8, 3, 4, 8192, 2),
    ]
]
QUICK_CONFIGS = CONFIGS[:2] + CONFIGS[3:4] + CONFIGS[5:6]


def _same_bytes(reference_kernel, kernel, x) -> bool:
    """Whether ``kernel`` (TMA) writes the bytes ``reference_kernel`` (cp.async) writes for ``x``."""
    outs = []
    for tma in (False, True):
        q = torch.full(x.shape, 0x55, dtype=torch.uint8, device=x.device).view(torch.float8_e4m3fn)
        s = torch.full(
            scales_shape_1x32(tuple(x.shape), None, True), 0x55, dtype=torch.uint8, device=x.device
        )
        s = s.view(torch.float8_e8m0fnu)
        if tma:
            kernel(x, q, s)
        else:
            reference_kernel(x, q, s, None, None, None, 0)
        outs.append((q.view(torch.uint8), s.view(torch.uint8)))
    return all(torch.equal(a, b) for a, b in zip(outs[0], outs[1], strict=True))


def _row(
    shape, label: str, config: TmaQuantizeConfig | None, us: float, copy_us: float, base_us: float, same
):
    return {
        "shape": shape,
        "kernel": label,
        "box rows": config.box_rows if config else "-",
        "stages": config.stages if config else "-",
        "warp tiles": config.warp_tiles if config else "-",
        "target ctas": config.target_ctas if config else "-",
        "q stores": (f"tma x{config.store_stages}" if config.store_stages else "stg") if config else "stg",
        "us": us,
        "ratio": copy_us / us,
        "vs cp.async": base_us / us,
        "same bytes": same,
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--mode", default="rceil", choices=["floor", "rceil"])
    args = parser.parse_args(argv)
    device = cuda_or_none("tune_quantize_tma")
    if device is None:
        return 2
    arch, _ = kernel_arch(device)
    timing = timing_kwargs(args)
    configs = QUICK_CONFIGS if args.quick else CONFIGS
    baseline = compile_1x32("bfloat16", args.mode, ScaleLayout.BLOCKED, arch)
    variant, tma_entry = (
        TmaVariant("bfloat16", args.mode, ScaleLayout.BLOCKED),
        registry.entry("quantize_tma"),
    )
    kernels = [(c, tma_entry.compile(variant, arch, config=c)) for c in configs]
    rows = []
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        sets, nbytes = quantize_inputs(shape, torch.bfloat16, False, device)  # (x, q, scales, None) sets
        copy_us = copy_baseline_us(nbytes, device)
        base_us = time_cuda(lambda x, q, s, e, k=baseline: k(x, q, s, e, None, None, 0), sets, **timing)
        rows.append(_row(shape, "cp.async", None, base_us, copy_us, base_us, "-"))
        progress(f"{rows[-1]}")
        for config, kernel in kernels:
            same = _same_bytes(baseline, kernel, sets[0][0])
            us = time_cuda(lambda x, q, s, _, k=kernel: k(x, q, s), sets, **timing)
            rows.append(_row(shape, "tma", config, us, copy_us, base_us, same))
            progress(f"{rows[-1]}")
        del sets
        torch.cuda.empty_cache()
    json_path, _ = output_paths(args, "tune_quantize_tma")
    report(
        rows,
        [
            "shape",
            "kernel",
            "box rows",
            "stages",
            "warp tiles",
            "target ctas",
            "q stores",
            "us",
            "ratio",
            "vs cp.async",
            "same bytes",
        ],
        f"quantize 1x32 TMA vs cp.async loads (bf16, {args.mode}, blocked)",
        json_path=json_path,
        panel_key=None,
    )
    bad = [r for r in rows if r["same bytes"] is False]
    for r in bad:
        print(f"FAIL {r['shape']} {r['kernel']} box {r['box rows']} stages {r['stages']}: bytes differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
