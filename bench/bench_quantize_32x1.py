"""Benchmark the 32x1 MXFP8 quantization (``quantize_mxfp8_2d(block="32x1")``) and the dual op.

bf16 x (M, K), M in (8192, 32768, 131072), K in (2048, 5120, 7168), rceil, blocked scales, no groups
and G = 8 row groups (sizes multiples of 32). Bytes moved = x read + q written + scales written
(dual: both q and both scale tensors). Ratio to copy = copy us / our us for the same bytes, copy
timed in the same run (:func:`bench.common.baselines.copy_baseline_best`). The dual row also shows
the time of the two single calls and the speedup of the dual op over them.

Goals (issue 6): 32x1 ratio to copy >= 0.85 for M*K >= 32768*2048; dual >= 1.4x faster than the
two single calls.

Run (GPU machine, project root on PYTHONPATH)::

    python -m bench.bench_quantize_32x1 [--quick] [--no-dual] [--out DIR]
"""

from __future__ import annotations

import sys

import torch

import torch_bindings
from bench.common.baselines import copy_baseline_best
from bench.common.cli import make_parser, output_paths
from bench.common.device import cuda_or_none
from bench.common.groups import block_group_ends
from bench.common.report import report
from bench.common.rows import gbps
from bench.common.timing import make_rotating_inputs, time_cuda

ROWS = (8192, 32768, 131072)
COLS = (2048, 5120, 7168)


def _nbytes(outputs) -> int:
    return sum(t.numel() * t.element_size() for t in outputs)


def bench_shape(rows: int, cols: int, groups: int | None, dual: bool) -> dict:
    device = torch.device("cuda")
    ends = block_group_ends(rows, groups, device) if groups else None
    sets = make_rotating_inputs(
        lambda: (torch.randn(rows, cols, device=device, dtype=torch.bfloat16),),
        bytes_per_set=rows * cols * 4,
    )

    def single(x):
        return torch_bindings.quantize_mxfp8_2d(x, block="32x1", group_end_offsets=ends)

    def one_x32(x):
        return torch_bindings.quantize_mxfp8_2d(x, block="1x32", group_end_offsets=ends)

    x0 = sets[0][0]
    moved = x0.numel() * 2 + _nbytes(single(x0))
    us = time_cuda(single, sets)
    copy_us = copy_baseline_best(moved, device)[0].us
    row = {
        "shape": f"{rows}x{cols}",
        "G": groups or 0,
        "32x1_us": us,
        "32x1_GBps": gbps(moved, us),
        "32x1_ratio": copy_us / us,
    }
    if dual:
        both = torch_bindings.quantize_mxfp8_2d_dual(x0, group_end_offsets=ends)
        moved_dual = x0.numel() * 2 + _nbytes(both)
        dual_us = time_cuda(lambda x: torch_bindings.quantize_mxfp8_2d_dual(x, group_end_offsets=ends), sets)
        pair_us = time_cuda(lambda x: (one_x32(x), single(x)), sets)
        copy_dual = copy_baseline_best(moved_dual, device)[0].us
        row.update(
            {
                "dual_us": dual_us,
                "dual_ratio": copy_dual / dual_us,
                "two_calls_us": pair_us,
                "dual_speedup": pair_us / dual_us,
            }
        )
    del sets
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])  # --quick: one shape per M
    parser.add_argument("--no-dual", action="store_true")
    args = parser.parse_args(argv)
    if cuda_or_none("bench_quantize_32x1") is None:
        return 2
    cols_list = (7168,) if args.quick else COLS
    rows_out = []
    for rows in ROWS:
        for cols in cols_list:
            for groups in (None, 8):
                rows_out.append(bench_shape(rows, cols, groups, not args.no_dual))
    print(f"device: {torch.cuda.get_device_name()}")
    keys = list(dict.fromkeys(k for r in rows_out for k in r))
    json_path, _ = output_paths(args.out, "quantize_32x1")
    report(
        rows_out, keys, "quantize_mxfp8_2d 32x1 and dual (bf16, rceil)", json_path=json_path, panel_key=None
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
