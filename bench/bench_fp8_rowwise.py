"""Benchmark the FP8 rowwise kernels (SPEC section 7) built so far: one scale per row.

``quantize_fp8_2d(axis="row")`` on bf16 x (M, K), M in (16384, 65536, 131072), K in (2048, 5120,
7168), and ``quantize_fp8_3d(axis="K")`` on w (E, N, K), E in (8, 16), N in (2048, 8192), K in (5120,
7168); power-of-2 scales. Bytes moved = x read + q written + scales written. Ratio to copy = copy us /
our us for the same bytes, copy timed in the same run; torchao's Triton kernel for the same output
(``triton_fp8_rowwise_2d_scale_and_cast``, its scales are q_scale: the reciprocal of ours) in the
same run, its q bytes checked against ours (NaN-free data). Goal (issue 20): >= 0.85 of copy for a
single-pass kernel (this one reads the row twice, the second time from L2), >= 3x torchao.

Run (GPU machine, project root on PYTHONPATH)::

    python -m bench.bench_fp8_rowwise [--quick] [--out DIR]
"""

from __future__ import annotations

import sys

import torch

import torch_bindings
from bench.common.baselines import copy_baseline_best
from bench.common.cli import make_parser, output_paths
from bench.common.device import cuda_or_none
from bench.common.report import report
from bench.common.rows import gbps
from bench.common.timing import make_rotating_inputs, time_cuda

ROWS, COLS = (16384, 65536, 131072), (2048, 5120, 7168)
EXPERTS = [(8, 2048, 5120), (8, 2048, 7168), (16, 8192, 5120), (16, 8192, 7168)]


def _torchao_rowwise():
    """torchao's Triton kernel, or None when torchao (or triton) is missing."""
    try:
        from torchao.prototype.moe_training.kernels.float8_rowwise import triton_fp8_rowwise_2d_scale_and_cast
    except Exception:  # noqa: BLE001 - no torchao: no anchor column
        return None
    return triton_fp8_rowwise_2d_scale_and_cast


def bench_shape(shape: tuple[int, ...], torchao_fn) -> dict:
    device = torch.device("cuda")
    sets = make_rotating_inputs(
        lambda: (torch.randn(shape, device=device, dtype=torch.bfloat16),),
        bytes_per_set=3 * torch.Size(shape).numel(),
    )
    run = torch_bindings.quantize_fp8_3d if len(shape) == 3 else torch_bindings.quantize_fp8_2d
    x0 = sets[0][0]
    q, s = run(x0)
    moved = x0.numel() * 2 + q.numel() + s.numel() * 4
    us = time_cuda(run, sets)
    copy_us = copy_baseline_best(moved, device)[0].us
    row = {"shape": "x".join(map(str, shape)), "us": us, "GB/s": gbps(moved, us), "ratio": copy_us / us}
    if torchao_fn is not None and len(shape) == 2:
        ao_q, ao_scale = torchao_fn(x0, round_scales_to_power_of_2=True)
        same = torch.equal(ao_q.view(torch.uint8), q.view(torch.uint8))
        same = same and torch.equal((1.0 / ao_scale.view(-1)).view(torch.int32), s.view(torch.int32))
        ao_us = time_cuda(lambda x: torchao_fn(x, round_scales_to_power_of_2=True), sets)
        row.update({"torchao_us": ao_us, "speedup": ao_us / us, "same_bytes": "yes" if same else "NO"})
    del sets
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    args = make_parser(__doc__.splitlines()[0]).parse_args(argv)  # --quick: K = 7168 only
    if cuda_or_none("bench_fp8_rowwise") is None:
        return 2
    torchao_fn = _torchao_rowwise()
    shapes = [(m, k) for m in ROWS for k in ((7168,) if args.quick else COLS)] + EXPERTS
    rows = [bench_shape(shape, torchao_fn) for shape in shapes]
    print(f"device: {torch.cuda.get_device_name()}")
    keys = list(dict.fromkeys(k for r in rows for k in r))
    json_path, _ = output_paths(args.out, "fp8_rowwise")
    report(
        rows,
        keys,
        "FP8 rowwise, one scale per row (bf16, power-of-2 scales)",
        json_path=json_path,
        panel_key=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
