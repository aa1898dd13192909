"""Sweep ``PadConfig`` choices (threads, vectors per lane, row chunks per warp, register cap) for
``pad`` and ``unpad`` on seed 000's shapes (bf16, A = 32, skewed unaligned groups); prints time, ratio
to a copy of the same bytes (read + written) and whether the output matches the reference. Used to
pick the pad/unpad configs of ``cute_kernels.configs``. ``--full``: the whole threads x vectors x items grid.
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
    skewed_group_ends,
    time_cuda,
)
from cute_kernels import registry
from cute_kernels.pad import PadConfig, RowGatherVariant
from torch_bindings import reference
from torch_bindings.backend import kernel_arch
from torch_bindings.pad import padded_shape

ALIGNMENT = 32
_VARIANT = RowGatherVariant("int16", 16)  # bf16 rows as 16-byte vectors
SHAPES = [(16384, 1536, 8), (16384, 7168, 8), (16384, 2048, 16), (131072, 7168, 8)]
QUICK_SHAPES = SHAPES[:2]
FULL = [
    PadConfig(threads=t, vectors_per_lane=v, ctas_per_sm=2048 // t, items_per_warp=i)
    for t, v, i in itertools.product((128, 256, 512), (2, 4, 8), (1, 2, 4))
]
SWEEP = [
    PadConfig(),
    PadConfig(items_per_warp=1),
    PadConfig(items_per_warp=4),
    PadConfig(vectors_per_lane=8, items_per_warp=1),
    PadConfig(threads=256, ctas_per_sm=4, items_per_warp=1),
    PadConfig(threads=256, ctas_per_sm=4),
]


def _inputs(op: str, tokens: int, dim: int, groups: int, device: torch.device):
    """``(make, nbytes)``: a factory of one argument set of the ``op`` kernel and its bytes moved."""
    ends = torch.tensor(skewed_group_ends(tokens, groups), dtype=torch.int32, device=device)
    padded = padded_shape((tokens, dim), groups, ALIGNMENT)
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    padded_sizes = (sizes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
    padded_end = padded_sizes.cumsum(0).to(torch.int32)
    padded_start = (padded_end - padded_sizes).to(torch.int32)
    x_bytes = tokens * dim * 2
    out_bytes = padded[0] * dim * 2

    def make_pad():
        x = torch.randn(tokens, dim, dtype=torch.bfloat16, device=device).view(torch.int16)
        out = torch.empty(padded, dtype=torch.int16, device=device)
        return (x, out, ends, torch.empty_like(ends), torch.empty_like(ends))

    def make_unpad():
        src = torch.randn(padded, dtype=torch.bfloat16, device=device).view(torch.int16)
        out = torch.empty(tokens, dim, dtype=torch.int16, device=device)
        return (src, out, ends, padded_start)

    return (make_pad, x_bytes + out_bytes) if op == "pad" else (make_unpad, 2 * x_bytes)


def _matches_reference(op: str, args: tuple) -> bool:
    """Whether the kernel's output in ``args`` (after it ran on them) equals the reference, bytewise."""
    if op == "pad":
        x, out, ends, *_ = args
        expected = reference.pad_token_groups(x, ends, alignment=ALIGNMENT)[0]
    else:
        src, out, ends, padded_start = args
        expected = reference.unpad_token_groups(src, ends, padded_start, num_tokens=out.shape[0])
    return torch.equal(out.view(torch.uint8), expected.view(torch.uint8))


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="sweep the threads x vectors x CTAs/SM grid")
    args = parser.parse_args(argv)
    device = cuda_or_none("tune_pad")
    if device is None:
        return 2
    arch, _ = kernel_arch(device)
    rows = []
    kernels = {}
    shapes = QUICK_SHAPES if args.quick else SHAPES
    for op, (tokens, dim, groups) in itertools.product(("pad", "unpad"), shapes):
        make, nbytes = _inputs(op, tokens, dim, groups, device)
        sets = make_rotating_inputs(make, bytes_per_set=nbytes)
        copy = copy_baseline_us(nbytes, device)
        for config in FULL if args.full else SWEEP:
            kernel = kernels.get((op, config))
            if kernel is None:
                kernel = kernels[op, config] = registry.entry(op).compile(_VARIANT, arch, config=config)
            extra = (ALIGNMENT,) if op == "pad" else ()
            us = time_cuda(lambda *a, k=kernel, e=extra: k(*a, *e), sets)
            exact = _matches_reference(op, sets[0])
            rows.append(
                {
                    "op": op,
                    "shape": (tokens, dim),
                    "G": groups,
                    "threads": config.threads,
                    "vectors": config.vectors_per_lane,
                    "ctas/SM": config.ctas_per_sm,
                    "items/warp": config.items_per_warp,
                    "us": us,
                    "ratio": copy / us,
                    "exact": exact,
                }
            )
            progress(f"{rows[-1]}")
        del sets
        torch.cuda.empty_cache()
    json_path, _ = output_paths(args.out, "tune_pad")
    columns = ["op", "shape", "G", "threads", "vectors", "ctas/SM", "items/warp", "us", "ratio", "exact"]
    report(rows, columns, "pad config sweep", json_path=json_path, panel_key=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
