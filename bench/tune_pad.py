"""Sweep ``PadConfig`` choices (threads, vectors per lane, resident CTAs per SM) for ``pad`` and ``unpad``
on seed 000's shapes (bf16, A = 32, skewed unaligned groups); prints time and ratio to a copy of the
same bytes (read + written). Used to pick ``cute_kernels.pad.CONFIGS``.
"""

from __future__ import annotations

import itertools
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
    skewed_group_ends,
    time_cuda,
)
from cute_kernels.pad import PadConfig, PadOp, compile_pad
from torch_bindings.backend import kernel_arch, num_sms
from torch_bindings.pad import padded_shape

ALIGNMENT = 32
SHAPES = [(16384, 1536, 8), (16384, 7168, 8), (16384, 2048, 16), (131072, 7168, 8)]
QUICK_SHAPES = SHAPES[:2]
CONFIGS = [
    PadConfig(threads=t, vectors_per_lane=v, ctas_per_sm=c)
    for t, v, c in itertools.product((128, 256, 512), (2, 4, 8), (2, 4, 8))
    if t * c <= 2048
]


def _inputs(op: PadOp, tokens: int, dim: int, groups: int, device: torch.device):
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
        x = torch.randn(tokens, dim, dtype=torch.bfloat16, device=device)
        out = torch.empty(padded, dtype=torch.bfloat16, device=device)
        return (x, out, ends, torch.empty_like(ends), torch.empty_like(ends))

    def make_unpad():
        src = torch.randn(padded, dtype=torch.bfloat16, device=device)
        out = torch.empty(tokens, dim, dtype=torch.bfloat16, device=device)
        return (src, out, ends, padded_start)

    return (make_pad, x_bytes + out_bytes) if op is PadOp.PAD else (make_unpad, 2 * x_bytes)


def main(argv: list[str] | None = None) -> int:
    args = make_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = require_cuda("tune_pad")
    arch, _ = kernel_arch(device)
    sms = num_sms(device.index)
    rows = []
    for op, (tokens, dim, groups) in itertools.product(PadOp, QUICK_SHAPES if args.quick else SHAPES):
        make, nbytes = _inputs(op, tokens, dim, groups, device)
        sets = make_rotating_inputs(make, bytes_per_set=nbytes)
        copy = copy_baseline_us(nbytes, device)
        for config in CONFIGS:
            kernel = compile_pad(op, "bfloat16", 16, arch, config)
            extra = (ALIGNMENT,) if op is PadOp.PAD else ()
            limit = config.max_ctas(sms)
            us = time_cuda(lambda *a, k=kernel, e=extra, n=limit: k(*a, *e, n), sets)
            rows.append(
                {
                    "op": op.value,
                    "shape": (tokens, dim),
                    "G": groups,
                    "threads": config.threads,
                    "vectors": config.vectors_per_lane,
                    "ctas/SM": config.ctas_per_sm,
                    "us": us,
                    "ratio": copy / us,
                }
            )
            progress(f"{rows[-1]}")
        del sets
        torch.cuda.empty_cache()
    json_path, _ = output_paths(args.out, "tune_pad")
    columns = ["op", "shape", "G", "threads", "vectors", "ctas/SM", "us", "ratio"]
    report(rows, columns, "pad config sweep", json_path=json_path, panel_key=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
