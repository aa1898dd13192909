"""FP8 grouped GEMM on Hopper: the sm_90a cute kernel vs torch._scaled_grouped_mm and bf16 torch._grouped_mm.

TFLOP/s (2 M N K / time) at the bench_moe shapes with skewed groups (``bench.common.groups``), for
the three GEMMs of an expert layer: forward (y = x w^T, 2d3d), dgrad (grad_x = grad_y w, 2d3d with
w quantized along N) and wgrad (grad_w = grad_y^T x per group, 2d2d). The FP8 operands are
quantized once, outside the timing (SPEC section 7 layouts). torch's wgrad (FP8 and bf16) needs
groups of 16 rows but the last: its wgrad runs on groups rounded down to 16 (the same M), ours
takes the skewed groups as they are. Needs an sm_90 GPU (the cute kernel is sm_90a only); without a
CUDA GPU it exits 2.

    python -m bench.bench_grouped_gemm [--quick] [--out DIR]
    python -m bench.bench_grouped_gemm --once wgrad   # two launches of ours per shape, for ncu
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from bench.common.cli import make_parser, output_paths, progress
from bench.common.device import cuda_or_none
from bench.common.groups import skewed_group_ends
from bench.common.report import report
from bench.common.timing import time_cuda


@dataclass(frozen=True)
class Shape:
    experts: int
    tokens: int
    dim: int  # K of the forward
    hidden: int  # N of the forward

    @property
    def name(self) -> str:
        return f"E{self.experts} M{self.tokens} K{self.dim} N{self.hidden}"


SHAPES = (Shape(8, 16384, 7168, 2048), Shape(16, 16384, 5120, 8192))


def _operands(s: Shape, device: torch.device, ends: list[int], torch_ends: list[int]):
    """Quantized operands of the three GEMMs (reference quantizers, on the GPU); torch's FP8 wgrad
    gets its own, with column scales over its groups of ``torch_ends``."""
    from torch_bindings import reference as ref

    x = torch.randn(s.tokens, s.dim, device=device, dtype=torch.bfloat16)
    w = (torch.randn(s.experts, s.hidden, s.dim, device=device) * 0.02).to(torch.bfloat16)
    grad_y = torch.randn(s.tokens, s.hidden, device=device, dtype=torch.bfloat16)
    offsets = torch.tensor(ends, dtype=torch.int32, device=device)
    torch_offsets = torch.tensor(torch_ends, dtype=torch.int32, device=device)
    q_x, s_x = ref.quantize_fp8_2d(x, axis="row")
    q_w, s_w = ref.quantize_fp8_3d(w, axis="K")
    q_gy, s_gy = ref.quantize_fp8_2d(grad_y, axis="row")
    q_wn, s_wn = ref.quantize_fp8_3d(w, axis="N")
    qc_gy, sc_gy = ref.quantize_fp8_2d(grad_y, axis="col", group_end_offsets=offsets)
    qc_x, sc_x = ref.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets)
    tc_gy, tsc_gy = ref.quantize_fp8_2d(grad_y, axis="col", group_end_offsets=torch_offsets)
    tc_x, tsc_x = ref.quantize_fp8_2d(x, axis="col", group_end_offsets=torch_offsets)
    return dict(x=x, w=w, grad_y=grad_y, offsets=offsets, torch_offsets=torch_offsets,
                fwd=(q_x, q_w, s_x, s_w), dgrad=(q_gy, q_wn, s_gy, s_wn), wgrad=(qc_gy, qc_x, sc_gy, sc_x),
                torch_wgrad=(tc_gy, tc_x, tsc_gy, tsc_x))  # fmt: skip


def _calls(ops: dict) -> dict:
    """{gemm: {impl: zero-argument call}} for ours, torch FP8 rowwise and torch bf16."""
    from torch_bindings.grouped_gemm_sm90 import grouped_gemm_fp8_rowwise_sm90 as ours

    off = ops["offsets"]
    x, w, gy = ops["x"], ops["w"], ops["grad_y"]

    def fp8(a, b, sa, sb, offs):
        return lambda: torch._scaled_grouped_mm(
            a, b, sa, sb, offs, out_dtype=torch.bfloat16, use_fast_accum=True
        )

    q_x, q_w, s_x, s_w = ops["fwd"]
    q_gy, q_wn, s_gy, s_wn = ops["dgrad"]
    qc_gy, qc_x, sc_gy, sc_x = ops["wgrad"]
    tc_gy, tc_x, tsc_gy, tsc_x = ops["torch_wgrad"]
    return {
        "forward": {
            "cute": lambda: ours("2d3d", q_x, q_w, s_x, s_w, off),
            "torch_fp8": fp8(q_x, q_w.transpose(-2, -1), s_x, s_w, off),
            "torch_bf16": lambda: torch._grouped_mm(x, w.transpose(-2, -1), off),
        },
        "dgrad": {
            "cute": lambda: ours("2d3d", q_gy, q_wn.transpose(-2, -1), s_gy, s_wn, off),
            "torch_fp8": fp8(q_gy, q_wn, s_gy, s_wn, off),
            "torch_bf16": lambda: torch._grouped_mm(gy, w, off),
        },
        "wgrad": {
            "cute": lambda: ours("2d2d", qc_gy.t(), qc_x.t(), sc_gy, sc_x, off),
            "torch_fp8": fp8(tc_gy.t(), tc_x, tsc_gy, tsc_x, ops["torch_offsets"]),
            "torch_bf16": lambda: torch._grouped_mm(gy.t(), x, ops["torch_offsets"]),
        },
    }


def rows_for(s: Shape, device: torch.device) -> list[dict]:
    ends = skewed_group_ends(s.tokens, s.experts, seed=1)
    aligned = [e // 16 * 16 for e in ends[:-1]] + [ends[-1]]
    ops = _operands(s, device, ends, aligned)
    flops = 2 * s.tokens * s.dim * s.hidden
    rows = []
    for gemm, impls in _calls(ops).items():
        row = {"shape": s.name, "gemm": gemm}
        for impl, call in impls.items():
            try:
                us = time_cuda(call)
                row[f"{impl}_TFLOPs"] = round(flops / us / 1e6, 1)
            except torch.AcceleratorError as exc:  # sticky: every later CUDA call would fail too
                raise SystemExit(f"error: {s.name} {gemm} {impl}: {exc}") from exc
            except Exception as exc:  # report the others; a failing baseline is a table entry
                row[f"{impl}_TFLOPs"] = f"error: {type(exc).__name__}"
        progress(f"  {gemm}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k.endswith("TFLOPs")))
        cute, fp8 = row["cute_TFLOPs"], row["torch_fp8_TFLOPs"]
        row["cute_vs_fp8"] = (
            round(cute / fp8, 3) if isinstance(cute, float) and isinstance(fp8, float) else ""
        )
        rows.append(row)
    return rows


def run_once(s: Shape, device: torch.device, gemm: str) -> None:
    """Two launches of our kernel for ``gemm`` at shape ``s`` (the first also compiles), nothing
    timed: what a profiler reads (``ncu -k regex:GroupedGemm``, tests/support/gpu_session.sh)."""
    ends = skewed_group_ends(s.tokens, s.experts, seed=1)
    call = _calls(_operands(s, device, ends, ends))[gemm]["cute"]
    call()
    torch.cuda.synchronize()
    call()
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--once", choices=("forward", "dgrad", "wgrad"), help="two launches of ours per shape, untimed (ncu)"
    )
    args = parser.parse_args(argv)
    device = cuda_or_none("bench_grouped_gemm")
    if device is None:
        return 2
    if torch.cuda.get_device_capability(device)[0] != 9:
        print(
            "error: bench_grouped_gemm needs an sm_90 GPU (the cute kernel is sm_90a only)", file=sys.stderr
        )
        return 2
    if args.once:
        for s in SHAPES[:1] if args.quick else SHAPES:
            progress(f"grouped GEMM once: {s.name} {args.once}")
            run_once(s, device, args.once)
        return 0
    rows = []
    for s in SHAPES[:1] if args.quick else SHAPES:
        progress(f"grouped GEMM: {s.name}")
        rows += rows_for(s, device)
    json_path = output_paths(args.out, "grouped_gemm")[0]
    report(rows, list(rows[0]), "FP8 grouped GEMM, sm_90a", json_path=json_path, panel_key=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
