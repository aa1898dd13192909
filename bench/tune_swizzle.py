"""Sweep ``SwizzleConfig`` choices (threads, window, resident CTAs per SM) on representative shapes of
each layout and load mode; prints time and ratio to a copy of the same bytes. Used to pick the
configs of ``cute_kernels/configs/sm90.py`` (``swizzle``).

Inputs are rotated past the L2 like in ``bench_swizzle``; the ``IN_L2`` shapes are also timed on a
single, L2-resident input set (``--quick``: the default config and one alternative only).
"""

from __future__ import annotations

import itertools
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
from cute_kernels.swizzle import SwizzleConfig, SwizzleLayout, SwizzleVariant
from torch_bindings.backend import kernel_arch, num_sms
from torch_bindings.swizzle import blocked_output_shape

# (shape, groups): 16-120 MB of scales, aligned (word loads) and unaligned (funnel-shifted) rows.
SHAPES = {
    "plain": [((65536, 160), 0), ((131072, 224), 0), ((524288, 224), 0), ((131001, 226), 0)],
    "m_groups": [
        ((65536, 160), 8),
        ((131072, 64), 8),
        ((131072, 160), 8),
        ((131072, 224), 64),
        ((131072, 226), 8),
        ((524288, 224), 8),
    ],
    "k_groups": [((5120, 4096), 8), ((7168, 4096), 8), ((2048, 16384), 8), ((7168, 16384), 8)],
}
#: Also timed on one input set (all of it L2-resident): shows fixed costs that DRAM latency hides.
IN_L2 = {"plain": [(65536, 160)], "m_groups": [(65536, 160)], "k_groups": [(5120, 4096)]}
#: (config, grid scale): the scale multiplies the SM count the persistent grid is sized for, so
#: above 1 the CTAs run in waves and each walks fewer row blocks. Also the grouped layouts'
#: L2 prefetch of the first work item, on and off (notes/swizzle-grouped-window-and-prefetch.md).
CONFIGS = [
    (SwizzleConfig(threads=256, window_cols=64, ctas_per_sm=4), 1),
    (SwizzleConfig(threads=256, window_cols=128, ctas_per_sm=4), 1),
    (SwizzleConfig(threads=256, window_cols=64, ctas_per_sm=4, prefetch=False), 1),
    (SwizzleConfig(threads=256, window_cols=128, ctas_per_sm=4, prefetch=False), 1),
]


def _ends(total: int, groups: int, device: torch.device) -> torch.Tensor:
    """Uneven, unaligned end offsets (a few empty groups) over ``total``."""
    weights = torch.arange(1, groups + 1, dtype=torch.float64) ** 1.5
    weights[1::5] = 0
    ends = (weights.cumsum(0) / weights.sum() * total).floor().to(torch.int32)
    ends[-1] = total - 3
    return ends.to(device)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    args = parser.parse_args(argv)
    device = cuda_or_none("tune_swizzle")
    if device is None:
        return 2
    arch, _ = kernel_arch(device)
    sms = num_sms(device.index)
    configs = CONFIGS[:2] if args.quick else CONFIGS
    rows = []
    kernels = {}
    for layout_name, shapes in SHAPES.items():
        if layout_name not in args.layouts:
            continue
        layout = SwizzleLayout(layout_name)
        for shape, groups in shapes:
            word_loads = layout is not SwizzleLayout.K_GROUPS and shape[1] % 4 == 0
            # as torch_bindings.swizzle picks it: raw plain/M-groups sources, K-groups with K % 4
            ragged = not word_loads and (layout is not SwizzleLayout.K_GROUPS or shape[0] % 4 != 0)
            group_arg = "K" if layout is SwizzleLayout.K_GROUPS else "M"
            ends = None
            if groups:
                ends = _ends(shape[1] if group_arg == "K" else shape[0], groups, device)
            out_shape = blocked_output_shape(shape, groups or None, group_arg)

            def make(shape=shape, out_shape=out_shape):
                scales = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
                out = torch.empty(out_shape, dtype=torch.float8_e8m0fnu, device=device)
                return (scales.view(torch.float8_e8m0fnu), out)

            nbytes = torch.Size(shape).numel() + torch.Size(out_shape).numel()
            rotated = make_rotating_inputs(make, bytes_per_set=nbytes)
            copy = copy_baseline_us(nbytes, device)
            for (config, scale), in_l2 in itertools.product(configs, (False, True)):
                if in_l2 and (shape not in IN_L2[layout_name] or (config, scale) != CONFIGS[0]):
                    continue
                sets = rotated[:1] if in_l2 else rotated
                # The SM count is a launch argument: one compile per config, any grid scale.
                key = (layout, word_loads, ragged, config)
                if key not in kernels:
                    variant = SwizzleVariant(layout, 2, word_loads, ragged_end=ragged)
                    try:
                        kernels[key] = registry.entry("swizzle").compile(variant, arch, config=config)
                    except Exception as exc:  # noqa: BLE001 - a config that does not compile is skipped
                        progress(f"{layout_name} {config}: {type(exc).__name__}: {exc}")
                        kernels[key] = None
                kernel = kernels[key]
                if kernel is None:
                    continue
                grid_sms = sms * scale
                us = time_cuda(lambda s, o, k=kernel, e=ends, n=grid_sms: k(s, o, e, n), sets)
                rows.append(
                    {
                        "layout": layout_name,
                        "shape": shape,
                        "G": groups,
                        "words": word_loads,
                        "threads": config.threads,
                        "window": config.window_cols,
                        "ctas/SM": config.ctas_per_sm,
                        "prefetch": config.prefetch,
                        "grid": scale,
                        "in L2": in_l2,
                        "us": us,
                        "ratio": copy / us,
                    }
                )
                progress(f"{rows[-1]}")
            del sets, rotated
            torch.cuda.empty_cache()
    json_path, _ = output_paths(args.out, "tune_swizzle")
    report(
        rows,
        [
            "layout",
            "shape",
            "G",
            "words",
            "threads",
            "window",
            "ctas/SM",
            "prefetch",
            "grid",
            "in L2",
            "us",
            "ratio",
        ],
        "swizzle config sweep",
        json_path=json_path,
        panel_key=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
