"""Sweep ``QuantizeConfig`` choices (vectors per unit, pipeline stages, grid size, warps along K)
for the 1x32 quantization on the issue's shapes (``--padded``: the fused-padding variant;
``--dual``: the dual 1x32 + 32x1 variant); prints time and ratio to a copy of the same bytes
(inputs rotated past L2). Used to pick the ``quantize_1x32`` configs in ``cute_kernels/configs/sm90.py``.
"""

from __future__ import annotations

import sys

import torch

from bench.common import (
    copy_baseline_us,
    cuda_or_none,
    make_parser,
    make_rotating_inputs,
    output_paths,
    progress,
    report,
    time_cuda,
)
from cute_kernels import registry
from cute_kernels.quantize import Quantize1x32Variant, QuantizeConfig, ScaleLayout
from cute_utils.constants import MAX_GROUPS
from torch_bindings.backend import kernel_arch
from torch_bindings.quantize import scales_shape_1x32


def compile_1x32(
    dtype_name: str, mode: str, layout: ScaleLayout, arch: str, config: QuantizeConfig | None = None
):
    """The registry's 1x32 kernel of one variant for ``arch`` with ``config`` (``None``: the arch's
    tuned one); the variant's group capacity is the config's, its SM count the arch's usual one."""
    variant = Quantize1x32Variant(dtype_name, mode, layout, config.max_groups if config else MAX_GROUPS)
    return registry.entry("quantize_1x32").compile(variant, arch, config=config)


SHAPES = [(8192, 2048), (8192, 7168), (32768, 2048), (32768, 7168), (131072, 7168)]
GROUPS = 8


def quantize_inputs(shape, dtype, grouped: bool, device):
    """Rotating (x, q, blocked scales, ends or None) argument sets of the 1x32 kernel for one shape
    (``grouped``: M-groups scales, GROUPS unaligned groups) and the bytes moved per call."""
    rows, cols = shape
    ends = None
    if grouped:
        ends = (torch.arange(1, GROUPS + 1, device=device) * rows // GROUPS - 37).clamp(min=0).to(torch.int32)
        ends[-1] = rows

    def make():
        x = torch.randn(shape, dtype=dtype, device=device)
        q = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
        s = torch.empty(
            scales_shape_1x32(shape, GROUPS if grouped else None, True), dtype=torch.uint8, device=device
        )
        return x, q, s.view(torch.float8_e8m0fnu), ends

    sets = make_rotating_inputs(make)
    x, q, s, _ = sets[0]
    return sets, x.nbytes + q.nbytes + s.nbytes


def _padded_sweep(configs, arch, device) -> list[dict]:
    """Time the ``padded`` (fused token-group padding, A = 32) variant on seed 000's shapes."""
    from torch_bindings.pad_quantize import _outputs

    rows = []
    for config in configs:
        kernel = compile_1x32("bfloat16", "rceil", ScaleLayout.PADDED, arch, config)
        shapes = (((16384, 1536), 16), ((16384, 2048), 8), ((16384, 2048), 16), ((16384, 7168), 16))
        for shape, groups in shapes:
            ends = (torch.arange(1, groups + 1, device=device) * shape[0] // groups - 37).clamp(min=0)
            ends = ends.to(torch.int32)

            def make(shape=shape, ends=ends):
                x = torch.randn(shape, dtype=torch.bfloat16, device=device)
                return (x, *_outputs(x, ends, 32), ends)

            sets = make_rotating_inputs(make)
            nbytes = sum(t.nbytes for t in sets[0][:3])
            us = time_cuda(lambda x, q, s, ps, pe, e, k=kernel: k(x, q, s, e, ps, pe, 32), sets)
            rows.append(_row(shape, groups, config, us, copy_baseline_us(nbytes, device) / us))
            progress(f"{rows[-1]}")
            del sets
    return rows


def _row(shape, grouped, config: QuantizeConfig, us: float, ratio: float) -> dict:
    return {
        "shape": shape,
        "grouped": grouped,
        "batch": config.batch_vectors,
        "stages": config.stages,
        "target ctas": config.target_ctas,
        "max G": config.max_groups,
        "warp tiles": config.warp_tiles,
        "chunk major": config.chunk_major,
        "us": us,
        "ratio": ratio,
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--padded", action="store_true", help="sweep the fused-padding variant instead")
    args = parser.parse_args(argv)
    device = cuda_or_none("tune_quantize")
    if device is None:
        return 2
    arch, _ = kernel_arch(device)
    dtype = getattr(torch, args.dtype)
    configs = [
        QuantizeConfig(batch_vectors=b, stages=st, target_ctas=t, max_groups=g, warp_tiles=w)
        for b, st, t, g, w in [
            (2, 3, 16384, 64, 1),
            (2, 3, 8192, 64, 4),
            (2, 3, 16384, 64, 4),
            (2, 3, 32768, 64, 4),
            (4, 3, 16384, 64, 4),
            (2, 4, 16384, 64, 4),
            (2, 3, 16384, 64, 2),
        ]
    ]
    if args.padded:
        configs = [
            QuantizeConfig(target_ctas=t, max_groups=64, warp_tiles=w, chunk_major=c)
            for t, w, c in [(32768, 4, True), (4096, 4, True), (2048, 4, True), (1024, 4, True)]
        ]
    rows = _padded_sweep(configs, arch, device) if args.padded else []
    for config in [] if args.padded else configs:
        kernels = {
            grouped: compile_1x32(
                args.dtype, "rceil", ScaleLayout.M_GROUPS if grouped else ScaleLayout.BLOCKED, arch, config
            )
            for grouped in (False, True)
        }
        for shape in SHAPES[:2] if args.quick else SHAPES:
            for grouped, kernel in kernels.items():
                sets, nbytes = quantize_inputs(shape, dtype, grouped, device)
                us = time_cuda(lambda x, q, s, e, k=kernel: k(x, q, s, e, None, None, 0), sets)
                rows.append(_row(shape, grouped, config, us, copy_baseline_us(nbytes, device) / us))
                progress(f"{rows[-1]}")
                del sets
    json_path, _ = output_paths(args, "tune_quantize")
    report(
        rows,
        [
            "shape",
            "grouped",
            "batch",
            "stages",
            "target ctas",
            "max G",
            "warp tiles",
            "chunk major",
            "us",
            "ratio",
        ],
        f"quantize 1x32 config sweep ({args.dtype})",
        json_path=json_path,
        panel_key=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
