"""FP8 grouped GEMM on Hopper: the sm_90a cute kernel vs torch._scaled_grouped_mm and bf16 torch._grouped_mm.

TFLOP/s (2 M N K / time) at the bench_moe shapes with skewed groups (``bench.common.groups``), for
the three GEMMs of an expert layer: forward (y = x w^T, 2d3d), dgrad (grad_x = grad_y w, 2d3d with
w quantized along N) and wgrad (grad_w = grad_y^T x per group, 2d2d). The FP8 operands are
quantized once, outside the timing (SPEC section 7 layouts). torch's wgrad (FP8 and bf16) needs
groups of 16 rows but the last: its wgrad runs on groups rounded down to 16 (the same M), ours
takes the skewed groups as they are. ``wgrad_padded``: ours on the column operands ``gemm="cute"``
gives it, written into 128-row padded groups (``pad_and_quantize_fp8_2d_cols``: no group bound in
a reduction box), against the same torch rows (FLOPs at the real M). Needs an sm_90 GPU (the
cute kernel is sm_90a only); without a CUDA GPU it exits 2.

    python -m bench.bench_grouped_gemm [--quick] [--out DIR]
    python -m bench.bench_grouped_gemm --once wgrad   # two launches of ours per shape, for ncu
    python -m bench.bench_grouped_gemm --probe        # where our wgrad's time goes (below)
    python -m bench.bench_grouped_gemm --shapes E8xM4096xK1024xN1024,E64xM8192xK2048xN1024
    python -m bench.bench_grouped_gemm --power [--seconds 3]   # clock and power under load (below)

``--probe``: our wgrad with the skewed groups, with their ends rounded down to 16 rows (no head to
mask when boxes start at 16-row multiples) and to 128 rows (no partial box: nothing masked), each
with boxes starting at the group's first row rounded down to 16 and to 128 (``reduction_align``:
16-byte or 128-byte aligned TMA boxes), and a forward (2d3d) problem of the same tiles and reduction
length (E N rows, K columns, reduction M / E: the same output tiles and k-tiles per tile).

``--power``: forward, dgrad and the padded wgrad of ours, torch FP8 and torch bf16, each in a
sustained loop of eager calls (``bench.common.power``; ``--seconds`` each, default 3) with the
median SM clock and board power over its steady part, and the TFLOP/s as a fraction of the dense
peak at that clock (the device's SM count x 8192 FP8 or 4096 bf16 FLOPs per SM per clock on sm_90).
"""

from __future__ import annotations

import re
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


def parse_shapes(text: str) -> tuple[Shape, ...]:
    """``--shapes``: comma-separated ``E<experts>xM<tokens>xK<dim>xN<hidden>`` (e.g.
    ``E8xM16384xK7168xN2048``); ``ValueError`` naming the item otherwise."""
    shapes = []
    for item in text.split(","):
        match = re.fullmatch(r"E(\d+)xM(\d+)xK(\d+)xN(\d+)", item.strip())
        if match is None:
            raise ValueError(f"--shapes: {item!r} is not E<experts>xM<tokens>xK<dim>xN<hidden>")
        shapes.append(Shape(*map(int, match.groups())))
    return tuple(shapes)


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
    pc_gy, psc_gy, _, padded_end = ref.pad_and_quantize_fp8_2d_cols(grad_y, offsets, alignment=128)
    pc_x, psc_x, _, _ = ref.pad_and_quantize_fp8_2d_cols(x, offsets, alignment=128)
    return dict(x=x, w=w, grad_y=grad_y, offsets=offsets, torch_offsets=torch_offsets,
                fwd=(q_x, q_w, s_x, s_w), dgrad=(q_gy, q_wn, s_gy, s_wn), wgrad=(qc_gy, qc_x, sc_gy, sc_x),
                torch_wgrad=(tc_gy, tc_x, tsc_gy, tsc_x), padded_wgrad=(pc_gy, pc_x, psc_gy, psc_x),
                padded_end=padded_end)  # fmt: skip


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
    torch_wgrad = {
        "torch_fp8": fp8(tc_gy.t(), tc_x, tsc_gy, tsc_x, ops["torch_offsets"]),
        "torch_bf16": lambda: torch._grouped_mm(gy.t(), x, ops["torch_offsets"]),
    }
    pc_gy, pc_x, psc_gy, psc_x = ops["padded_wgrad"]
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
        "wgrad": {"cute": lambda: ours("2d2d", qc_gy.t(), qc_x.t(), sc_gy, sc_x, off), **torch_wgrad},
        "wgrad_padded": {
            "cute": lambda: ours("2d2d", pc_gy.t(), pc_x.t(), psc_gy, psc_x, ops["padded_end"]),
            **torch_wgrad,
        },
    }


def _bench_calls(s: Shape, device: torch.device) -> dict:
    """:func:`_calls` on the bench's skewed groups (torch's wgrad on their ends rounded down to 16)."""
    ends = skewed_group_ends(s.tokens, s.experts, seed=1)
    aligned = [e // 16 * 16 for e in ends[:-1]] + [ends[-1]]
    return _calls(_operands(s, device, ends, aligned))


def rows_for(s: Shape, device: torch.device) -> list[dict]:
    flops = 2 * s.tokens * s.dim * s.hidden
    rows = []
    for gemm, impls in _bench_calls(s, device).items():
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


def power_rows(s: Shape, device: torch.device, seconds: float) -> list[dict]:
    """``--power`` (module docstring): one row per GEMM and implementation."""
    from bench.common.power import SM90_DENSE_FLOPS_PER_CLOCK, sustained
    from torch_bindings.backend import num_sms

    calls = _bench_calls(s, device)
    flops, sms, rows = 2 * s.tokens * s.dim * s.hidden, num_sms(device.index or 0), []
    for gemm in ("forward", "dgrad", "wgrad_padded"):
        for impl, call in calls[gemm].items():
            call()  # compiles ours before the loop
            run = sustained(call, device.index or 0, seconds)
            tflops = flops / run.us / 1e6
            per_clock = SM90_DENSE_FLOPS_PER_CLOCK["bf16" if impl == "torch_bf16" else "fp8"]
            peak = sms * per_clock * run.sm_mhz * 1e6 / 1e12
            row = {"shape": s.name, "gemm": gemm, "impl": impl, "us": round(run.us, 1),
                   "TFLOPs": round(tflops, 1), "sm_MHz": round(run.sm_mhz), "watts": round(run.watts),
                   "of_peak_at_clock": round(tflops / peak, 3)}  # fmt: skip
            progress("  " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "shape"))
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


def _probe_kernel(form: str, reduction_align: int):
    """Our kernel of ``form`` compiled with the default config but ``reduction_align``, called
    directly: the probe's sizes are ones the launcher accepts, whose checks it skips."""
    from dataclasses import replace

    from cute_kernels import registry
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmSm90Kernel, GroupedGemmVariant

    variant = GroupedGemmVariant(form)
    config = replace(GroupedGemmSm90Kernel.default_config(variant, "sm_90a"), reduction_align=reduction_align)
    return registry.entry("grouped_gemm_sm90").compile(variant, "sm_90a", config=config)


def probe_rows(s: Shape, device: torch.device) -> list[dict]:
    """``--probe`` (module docstring): TFLOP/s of our kernel on problems of equal FLOPs."""
    from torch_bindings import backend
    from torch_bindings import reference as ref

    sms = backend.num_sms(device.index or 0)
    ends = skewed_group_ends(s.tokens, s.experts, seed=1)
    by_16 = [e // 16 * 16 for e in ends[:-1]] + [ends[-1]]
    by_128 = [e // 128 * 128 for e in ends[:-1]] + [ends[-1]]
    x = torch.randn(s.tokens, s.dim, device=device, dtype=torch.bfloat16)
    grad_y = torch.randn(s.tokens, s.hidden, device=device, dtype=torch.bfloat16)
    flops = 2 * s.tokens * s.dim * s.hidden
    kernels = {align: _probe_kernel("2d2d", align) for align in (16, 128)}
    calls = {}
    for groups, group_ends, aligns in (("skewed", ends, (16, 128)), ("16-row multiples", by_16, (16, 128)),
                                       ("128-row multiples", by_128, (16,))):  # fmt: skip
        offsets = torch.tensor(group_ends, dtype=torch.int32, device=device)
        q_gy, s_gy = ref.quantize_fp8_2d(grad_y, axis="col", group_end_offsets=offsets)
        q_x, s_x = ref.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets)
        out = torch.empty(s.experts, s.hidden, s.dim, device=device, dtype=torch.bfloat16)
        operands = (q_gy.t().contiguous(), q_x.t().contiguous(), s_gy, s_x, offsets, out, sms)
        for align in aligns:
            kernel = kernels[align]
            calls[f"wgrad, {groups} groups, boxes from {align}-row multiples"] = (
                lambda k, ops: lambda: k(*ops)
            )(kernel, operands)
    reduction = s.tokens // s.experts
    a = torch.randn(s.experts * s.hidden, reduction, device=device, dtype=torch.bfloat16)
    b = torch.randn(s.experts, s.dim, reduction, device=device, dtype=torch.bfloat16)
    q_a, s_a = ref.quantize_fp8_2d(a, axis="row")
    q_b, s_b = ref.quantize_fp8_3d(b, axis="K")
    offsets = torch.arange(1, s.experts + 1, device=device, dtype=torch.int32) * s.hidden
    out = torch.empty(s.experts * s.hidden, s.dim, device=device, dtype=torch.bfloat16)
    forward_operands = (q_a, q_b, s_a, s_b, offsets, out, sms)
    forward = _probe_kernel("2d3d", 128)  # the default config (2d3d does not read reduction_align)
    calls["forward of the same tiles (reduction M / E)"] = lambda: forward(*forward_operands)
    rows = []
    for name, call in calls.items():
        us = time_cuda(call)
        tflops = round(flops / us / 1e6, 1)
        rows.append({"shape": s.name, "problem": name, "us": round(us, 1), "TFLOPs": tflops})
        progress(f"  {name}: {tflops} TFLOP/s")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    gemms = ("forward", "dgrad", "wgrad", "wgrad_padded")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", choices=gemms, help="two launches of ours per shape, untimed (ncu)")
    mode.add_argument("--probe", action="store_true", help="where our wgrad's time goes")
    mode.add_argument("--power", action="store_true", help="SM clock and board power under load")
    parser.add_argument("--seconds", type=float, default=3.0, help="--power: seconds per loop (default 3)")
    parser.add_argument(
        "--shapes", type=parse_shapes, help="E8xM16384xK7168xN2048,... (default: bench_moe's)"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or (args.seconds != 3.0 and not args.power):
        parser.error("--seconds takes a positive number, with --power")
    shapes = args.shapes or (SHAPES[:1] if args.quick else SHAPES)
    device = cuda_or_none("bench_grouped_gemm")
    if device is None:
        return 2
    if torch.cuda.get_device_capability(device)[0] != 9:
        print(
            "error: bench_grouped_gemm needs an sm_90 GPU (the cute kernel is sm_90a only)", file=sys.stderr
        )
        return 2
    if args.once:
        for s in shapes:
            progress(f"grouped GEMM once: {s.name} {args.once}")
            run_once(s, device, args.once)
        return 0
    mode = "probe" if args.probe else "power" if args.power else ""
    collect = {"probe": probe_rows, "power": lambda s, d: power_rows(s, d, args.seconds), "": rows_for}[mode]
    rows = []
    for s in shapes:
        progress(f"grouped GEMM{' ' + mode if mode else ''}: {s.name}")
        rows += collect(s, device)
    title = {
        "probe": "our wgrad against problems of the same tiles",
        "power": "FP8 grouped GEMM under sustained load: SM clock and board power",
        "": "FP8 grouped GEMM, sm_90a",
    }[mode]
    json_path = output_paths(args.out, f"grouped_gemm_{mode}" if mode else "grouped_gemm")[0]
    report(rows, list(rows[0]), title, json_path=json_path, panel_key=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
