"""Benchmark the row passes bounded by the last group end (notes/bounded-row-passes.md).

An expert-parallel dispatch returns ``rows = R*T*k + E_local*alignment`` rows (SPEC section 9) of
which a rank fills about ``rows / R`` on average. For x (rows, D) bf16 with the last group end at
``rows / R`` (``--fill``) this times, in one run:

- ``quantize_fp8_2d(x, axis="row")`` over every row (what the expert block runs today), the bounded
  call ``quantize_fp8_2d(x, axis="row", group_end_offsets=ends)``, the bounded call with the bound
  at 0 (the cost of the CTAs that only read the bound and exit), and the unbounded call on exactly
  the filled rows ``x[:bound]`` (the floor the bounded call should reach);
- the same four for the dequantization: PyTorch's ``(q.float() * s[:, None]).bfloat16()`` over
  every row (``QuantizedTokens.dequantized`` before), ``dequantize_fp8_rows`` bounded, at bound 0,
  and bounded at ``rows`` on ``q[:bound]`` (the floor);
- a device copy of the filled rows' bytes (read + write) for each pass.

Defaults: R = 4, T = 8192, k = 8, E_local = 8, alignment 16, D = 7168 (about 3.8 GB of bf16 x).

    python -m bench.bench_bounded_rows [--quick] [--ranks 4] [--tokens 8192] [--dim 7168]
"""

from __future__ import annotations

import sys

import torch

import torch_bindings as tb
from bench.common.baselines import copy_baseline_best
from bench.common.cli import make_parser, output_paths, timing_kwargs
from bench.common.device import cuda_or_none
from bench.common.report import report
from bench.common.timing import time_cuda


def _rows(ranks: int, tokens: int, topk: int, local_experts: int, alignment: int) -> int:
    return tb.reference.ep_rows(ranks, tokens, topk, local_experts, alignment)


def _quantize_rows(x: torch.Tensor, ends: torch.Tensor, timing: dict) -> list[dict]:
    bound = int(ends[-1])
    zero = torch.zeros_like(ends)
    calls = {
        "quantize: every row": lambda: tb.quantize_fp8_2d(x),
        "quantize: bounded": lambda: tb.quantize_fp8_2d(x, group_end_offsets=ends),
        "quantize: bound 0": lambda: tb.quantize_fp8_2d(x, group_end_offsets=zero),
        "quantize: x[:bound] (floor)": lambda: tb.quantize_fp8_2d(x[:bound]),
    }
    copy_us = copy_baseline_best(bound * x.shape[1] * 3)[0].us  # read bf16, write e4m3
    return [{"pass": name, "us": time_cuda(fn, **timing), "copy_us": copy_us} for name, fn in calls.items()]


def _dequantize_rows(q: torch.Tensor, s: torch.Tensor, ends: torch.Tensor, timing: dict) -> list[dict]:
    bound = int(ends[-1])
    zero, full = torch.zeros_like(ends), torch.full_like(ends, bound)
    calls = {
        "dequantize: PyTorch, every row": lambda: (q.float() * s[:, None]).to(torch.bfloat16),
        "dequantize: bounded": lambda: tb.dequantize_fp8_rows(q, s, ends),
        "dequantize: bound 0": lambda: tb.dequantize_fp8_rows(q, s, zero),
        "dequantize: q[:bound] (floor)": lambda: tb.dequantize_fp8_rows(q[:bound], s[:bound], full),
    }
    copy_us = copy_baseline_best(bound * q.shape[1] * 3)[0].us  # read e4m3, write bf16
    return [{"pass": name, "us": time_cuda(fn, **timing), "copy_us": copy_us} for name, fn in calls.items()]


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--local-experts", type=int, default=8)
    parser.add_argument("--dim", type=int, default=7168)
    parser.add_argument("--fill", type=float, default=None, help="filled fraction (default 1 / ranks)")
    args = parser.parse_args(argv)
    if cuda_or_none("bench_bounded_rows") is None:
        return 2
    tokens = args.tokens // 4 if args.quick else args.tokens
    rows = _rows(args.ranks, tokens, args.topk, args.local_experts, 16)
    bound = int(rows * (args.fill if args.fill is not None else 1.0 / args.ranks)) // 16 * 16
    x = torch.randn(rows, args.dim, device="cuda", dtype=torch.bfloat16)
    ends = torch.linspace(0, bound, args.local_experts + 1, device="cuda")[1:].int()
    q, s = tb.quantize_fp8_2d(x)
    timing = timing_kwargs(args)
    results = _quantize_rows(x, ends, timing) + _dequantize_rows(q, s, ends, timing)
    for row in results:
        row.update({"rows": rows, "bound": bound, "D": args.dim, "ratio to copy": row["copy_us"] / row["us"]})
    print(f"device: {torch.cuda.get_device_name()}")
    json_path, _ = output_paths(args.out, "bounded_rows")
    columns = ["pass", "rows", "bound", "D", "us", "copy_us", "ratio to copy"]
    report(results, columns, "Row passes bounded by the last group end", json_path=json_path, panel_key=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
