"""Benchmark SwiGLU fused with FP8 rowwise quantization (forward and backward), one launch each.

``swiglu_quantize_fp8`` on h13 (M, 2H) bf16 and ``swiglu_backward_quantize_fp8`` on grad_h (M, H)
and h13, M = 16384, H in (2048, 8192) (``--quick``: H = 8192 only); power-of-2 scales. Bytes moved =
bytes read + written: forward h13 read (4 M H), h written (2 M H), q (M H) and scales (4 M);
backward grad_h and h13 read (6 M H), grad_h13 written (4 M H), q (2 M H), scales (4 M). Ratio to
copy = copy us / our us for the same bytes, the copy timed in the same run. The anchor is the same
computation as eager PyTorch: ``F.silu(g) * u`` then ``quantize_fp8_2d(h, axis="row")`` (this
toolkit's row kernel); backward ``aten.silu_backward(grad * u, g)`` and ``grad * F.silu(g)``, a
``torch.cat``, then ``quantize_fp8_2d``. ``speedup`` = anchor us / our us. The kernels' bytes are
checked against ``torch_bindings.reference`` once per shape (``--no-check`` skips it).

Run (GPU machine, project root on PYTHONPATH; exits 2 without a GPU)::

    python -m bench.bench_swiglu [--quick] [--out DIR]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from bench.common.baselines import copy_baseline_best
from bench.common.cli import add_bench_args, make_parser, output_paths, progress, timing_kwargs
from bench.common.device import cuda_or_none
from bench.common.report import report
from bench.common.rows import gbps
from bench.common.timing import make_rotating_inputs, time_cuda

ROWS = 16384
HIDDEN = (2048, 8192)
COLUMNS = [
    ("direction", "dir"),
    ("shape", "M x H"),
    ("MB", "MB moved"),
    ("us", "us"),
    ("GB/s", "GB/s"),
    ("ratio", "x copy"),
    ("anchor_us", "eager us"),
    ("speedup", "x eager"),
    ("same_bytes", "bytes = ref"),
]


def moved_bytes(direction: str, rows: int, half: int) -> int:
    """Bytes read + written by one call (each input and output byte once)."""
    if direction == "fwd":
        return rows * half * (4 + 2 + 1) + 4 * rows
    return rows * half * (6 + 4 + 2) + 4 * rows


def _anchor_fwd(h13: torch.Tensor):
    import torch_bindings

    half = h13.shape[1] // 2
    h = torch.nn.functional.silu(h13[:, :half]) * h13[:, half:]
    return (h, *torch_bindings.quantize_fp8_2d(h, axis="row"))


def _anchor_bwd(grad_h: torch.Tensor, h13: torch.Tensor):
    import torch_bindings

    half = h13.shape[1] // 2
    gate, up = h13[:, :half], h13[:, half:]
    d_gate = torch.ops.aten.silu_backward(grad_h * up, gate)
    grad_h13 = torch.cat([d_gate, grad_h * torch.nn.functional.silu(gate)], 1)
    return (grad_h13, *torch_bindings.quantize_fp8_2d(grad_h13, axis="row"))


def _same_bytes(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> bool:
    return all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want, strict=True))


def bench_shape(direction: str, half: int, timing: dict, check: bool, copy_tries: int) -> dict:
    import torch_bindings
    from torch_bindings import reference

    device = torch.device("cuda")
    moved = moved_bytes(direction, ROWS, half)

    def make():
        h13 = torch.randn(ROWS, 2 * half, device=device, dtype=torch.bfloat16) * 3
        if direction == "fwd":
            return (h13,)
        return (torch.randn(ROWS, half, device=device, dtype=torch.bfloat16) * 1e-3, h13)

    sets = make_rotating_inputs(make, bytes_per_set=moved)
    if direction == "fwd":
        ours, anchor, ref = torch_bindings.swiglu_quantize_fp8, _anchor_fwd, reference.swiglu_quantize_fp8
    else:
        ours, anchor = torch_bindings.swiglu_backward_quantize_fp8, _anchor_bwd
        ref = reference.swiglu_backward_quantize_fp8
    same = "-"
    if check:
        same = "yes" if _same_bytes(ours(*sets[0]), ref(*sets[0])) else "NO"
    us = time_cuda(ours, sets, **timing)
    anchor_us = time_cuda(anchor, sets, **timing)
    copy_us = copy_baseline_best(moved, device, tries=copy_tries, **timing)[0].us
    del sets
    torch.cuda.empty_cache()
    return {
        "direction": direction,
        "shape": f"{ROWS}x{half}",
        "MB": moved / 1e6,
        "us": us,
        "GB/s": gbps(moved, us),
        "ratio": copy_us / us,
        "copy_us": copy_us,
        "anchor_us": anchor_us,
        "speedup": anchor_us / us,
        "same_bytes": same,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 1 if a kernel's bytes differ from the reference, 2 without
    a GPU, else 0."""
    parser = make_parser(__doc__.splitlines()[0])  # --quick: H = 8192 only
    add_bench_args(parser, op="the SwiGLU ops", torchao=False, backend=None)
    args = parser.parse_args(argv)
    if cuda_or_none("bench_swiglu") is None:
        return 2
    timing = timing_kwargs(args)
    rows = []
    for direction in ("fwd", "bwd"):
        for half in (8192,) if args.quick else HIDDEN:
            progress(
                f"{direction} {ROWS} x {half}: {moved_bytes(direction, ROWS, half) / 1e6:.0f} MB moved ..."
            )
            rows.append(bench_shape(direction, half, timing, not args.no_check, args.copy_tries))
    print(f"device: {torch.cuda.get_device_name()}")
    json_path, _ = output_paths(args.out, "swiglu")
    report(
        rows,
        COLUMNS,
        "SwiGLU + FP8 rowwise (bf16, power-of-2 scales)",
        json_path=json_path,
        panel_key=None,
        meta={"benchmark": "swiglu", "quick": args.quick},
    )
    return 1 if any(r["same_bytes"] == "NO" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
