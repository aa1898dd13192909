"""Benchmark the grouped-GEMM training op and the SwiGLU expert module, forward + backward.

Columns, all in one run on the same inputs: ``bf16`` (``torch._grouped_mm`` forward, dgrad,
wgrad), ``ours`` (``scaled_grouped_mm(recipe="fp8_rowwise", gemm="native")``) and ``torchao``
(``_to_fp8_rowwise_then_scaled_grouped_mm``), plus ``fp8 GEMMs`` (the three
``torch._scaled_grouped_mm`` calls alone on operands quantized beforehand: the cap). Every step
sets ``.grad = None`` first (fresh gradients, no accumulation). Group sizes are skewed and
multiples of 16 (torchao needs that; ours does not know it: its column operands come padded to
16 rows from their quantizer). On an sm_90 GPU a
``cute`` column runs ``gemm="cute"`` (the project's own FP8 grouped GEMM, what ``gemm="auto"``
runs on an H200: no pad pass, the column operands come padded from their quantizer) in the op and module
tables, and a ``cute_2d3d`` column ``gemm="cute_2d3d"`` (the project's GEMM for the forward and
the dgrad, torch's for the wgrad).

Also: the kernel time per step by kernel (``torch.profiler``), split into GEMMs and the rest
(quantization, padding, layout, glue), and the rest against the copy-bandwidth floor of the bytes
our quantization and padding move (each pass's input read once plus its outputs: the column passes'
second read is not counted; copy GB/s measured in this run). Per op of the module's step (ours and
``cute``, 1 micro-batch): GPU us inside the step, bytes (tensor arguments + results) and the ratio
to a device copy of the same bytes (``bench.common.op_trace``).

Run (GPU machine, project root on PYTHONPATH)::

    python -m bench.bench_moe [--quick] [--parts gemm,module,peak] [--out DIR]

``--parts peak`` without ``module`` measures the module columns' peak memory without timing them.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import torch

import torch_bindings as tb
from bench.common.baselines import copy_baseline_best
from bench.common.cli import add_parts_arg, make_parser, output_paths, progress
from bench.common.device import cuda_or_none
from bench.common.groups import skewed_group_sizes
from bench.common.op_trace import op_rows, print_op_table, trace_ops
from bench.common.report import report
from bench.common.timing import time_cuda
from torch_bindings.reference import padded_rows

ALIGN = 16


@dataclass(frozen=True)
class Shape:
    """E experts, M tokens, x (M, K), w (E, N, K)."""

    name: str
    experts: int
    rows: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.k * self.n


GEMM_SHAPES = [
    Shape("E8 M16384 K7168 N2048", 8, 16384, 7168, 2048),
    Shape("E16 M65536 K5120 N8192", 16, 65536, 5120, 8192),
    Shape("Llama4-Scout-like E16 M16384 K5120 N8192", 16, 16384, 5120, 8192),
]
# SwiGLU experts: D = K, hidden H = N.
MODULE_SHAPES = [GEMM_SHAPES[0], GEMM_SHAPES[2]]


def aligned_group_ends(rows: int, groups: int, device) -> torch.Tensor:
    """Skewed group sizes, each a multiple of 16, summing to ``rows`` (a multiple of 16)."""
    sizes = [s // ALIGN * ALIGN for s in skewed_group_sizes(rows, groups, seed=1)]
    sizes[max(range(groups), key=sizes.__getitem__)] += rows - sum(sizes)
    return torch.tensor(sizes, device=device).cumsum(0).to(torch.int32)


def _torchao_mm():
    try:
        from torchao.prototype.moe_training.fp8_grouped_mm import _to_fp8_rowwise_then_scaled_grouped_mm
    except Exception:  # noqa: BLE001 - no torchao: no anchor column
        return None
    # Groups here are 16-aligned, so torchao's own padding is off (0.18 does not support it).
    return lambda x, w, ends: _to_fp8_rowwise_then_scaled_grouped_mm(
        x, w.transpose(-2, -1), ends, out_dtype=torch.bfloat16, pad_token_groups_for_grouped_mm=False
    )


def _ours(recipe: str, gemm: str = "native"):
    return lambda x, w, ends: tb.scaled_grouped_mm(x, w, ends, recipe=recipe, gemm=gemm)


def cute_gemm_runs() -> bool:
    """Whether ``gemm="cute"`` runs on the current GPU (sm_90): the ``cute`` and ``cute_2d3d``
    columns."""
    from torch_bindings.moe.grouped_mm import cute_gemm_reason

    return cute_gemm_reason(torch.device("cuda")) is None


def _gemm_step(mm, x, w, ends, grad_y):
    def step():
        x.grad = w.grad = None
        mm(x, w, ends).backward(grad_y)

    return step


def _time(step) -> float:
    return time_cuda(step, warmup=3, iters=5, reps=5, use_graph=False)


def _time_all(steps: dict) -> dict[str, float]:
    """µs per step of each column; a column that raises is reported and dropped (not fatal)."""
    us = {}
    for name, step in steps.items():
        try:
            us[name] = _time(step)
        except Exception as error:  # noqa: BLE001 - e.g. a torchao version without this path
            print(f"{name}: failed: {type(error).__name__}: {str(error)[:200]}")
    return us


# ----------------------------------------------------------------------------------------------
# Bytes our fp8_rowwise path moves outside the GEMMs (each pass's reads + writes)
# ----------------------------------------------------------------------------------------------


def _operand_bytes(rows: int, padded: int, cols: int, groups: int) -> int:
    """x (cols = K) or grad_y (cols = N), bf16: the row quantization of the operand and its column
    quantization into ``padded`` rows of 16-row padded groups (``pad_and_quantize_fp8_2d_cols``,
    torch_bindings.moe.grouped_mm.fp8_wgrad_cols: x read once counted, q of the padded rows)."""
    row = 3 * rows * cols + 4 * rows
    col = 2 * rows * cols + padded * cols + 4 * groups * cols
    return row + col


def quantization_bytes(s: Shape) -> int:
    padded = padded_rows(s.rows, s.experts, ALIGN)
    weights = 2 * (3 * s.experts * s.n * s.k) + 4 * s.experts * (s.n + s.k)
    x = _operand_bytes(s.rows, padded, s.k, s.experts)
    grad_y = _operand_bytes(s.rows, padded, s.n, s.experts)
    return weights + x + grad_y


# ----------------------------------------------------------------------------------------------
# The FP8 GEMMs alone
# ----------------------------------------------------------------------------------------------


def fp8_gemms_step(x, w, ends, grad_y):
    """The three FP8 rowwise GEMMs on operands quantized once beforehand (groups aligned)."""
    q_x, s_x, qc_x, sc_x = tb.quantize_fp8_2d_dual(x, group_end_offsets=ends)
    q_gy, s_gy, qc_gy, sc_gy = tb.quantize_fp8_2d_dual(grad_y, group_end_offsets=ends)
    q_wk, s_wk = tb.quantize_fp8_3d(w, axis="K")
    q_wn, s_wn = tb.quantize_fp8_3d(w, axis="N")
    kw = dict(out_dtype=torch.bfloat16, use_fast_accum=True)

    def step():
        torch._scaled_grouped_mm(q_x, q_wk.transpose(-2, -1), s_x, s_wk, ends, **kw)
        torch._scaled_grouped_mm(q_gy, q_wn, s_gy, s_wn, ends, **kw)
        torch._scaled_grouped_mm(qc_gy.t(), qc_x, sc_gy, sc_x, ends, **kw)

    return step


def gemm_parts_row(s: Shape, x, w, ends, grad_y) -> dict:
    """Each of the three GEMMs alone, bf16 and FP8 (operands quantized beforehand)."""
    q_x, s_x, qc_x, sc_x = tb.quantize_fp8_2d_dual(x, group_end_offsets=ends)
    q_gy, s_gy, qc_gy, sc_gy = tb.quantize_fp8_2d_dual(grad_y, group_end_offsets=ends)
    q_wk, s_wk = tb.quantize_fp8_3d(w, axis="K")
    q_wn, s_wn = tb.quantize_fp8_3d(w, axis="N")
    kw = dict(out_dtype=torch.bfloat16, use_fast_accum=True)
    calls = {
        "fwd bf16": lambda: torch._grouped_mm(x, w.transpose(-2, -1), ends),
        "fwd fp8": lambda: torch._scaled_grouped_mm(q_x, q_wk.transpose(-2, -1), s_x, s_wk, ends, **kw),
        "dgrad bf16": lambda: torch._grouped_mm(grad_y, w, ends),
        "dgrad fp8": lambda: torch._scaled_grouped_mm(q_gy, q_wn, s_gy, s_wn, ends, **kw),
        "wgrad bf16": lambda: torch._grouped_mm(grad_y.t(), x, ends),
        "wgrad fp8": lambda: torch._scaled_grouped_mm(qc_gy.t(), qc_x, sc_gy, sc_x, ends, **kw),
    }
    row = {"shape": s.name}
    for name, call in calls.items():
        us = _time(call)
        row[f"{name} us"] = us
        row[f"{name} TFLOP/s"] = s.flops / us / 1e6
    return row


def operand_passes_row(s: Shape, x, ends, copy_gbps: float) -> dict:
    """x's two FP8 operands: the dual kernel on x's groups (aligned here) against a row pass over x
    plus the column operand in 16-row padded groups (what the op runs on groups it does not know to
    be aligned), each with its copy floor (x read once counted)."""
    prows = padded_rows(s.rows, s.experts, ALIGN)
    dual_bytes = 2 * x.numel() * 2 + 4 * x.shape[0] + 4 * s.experts * s.k
    separate_bytes = 3 * x.numel() + 4 * x.shape[0] + 2 * x.numel() + prows * s.k + 4 * s.experts * s.k
    dual_us = _time(lambda: tb.quantize_fp8_2d_dual(x, group_end_offsets=ends))
    separate_us = _time(
        lambda: (
            tb.quantize_fp8_2d(x, axis="row"),
            tb.pad_and_quantize_fp8_2d_cols(x, ends, alignment=ALIGN),
        )
    )
    return {
        "x (M, K)": s.name,
        "dual us": dual_us,
        "dual floor us": dual_bytes / copy_gbps / 1e3,
        "row + col us": separate_us,
        "row + col floor us": separate_bytes / copy_gbps / 1e3,
    }


# ----------------------------------------------------------------------------------------------
# Per-kernel breakdown
# ----------------------------------------------------------------------------------------------

_GEMM_NAME = re.compile(r"gemm|xmma|f8f8|cutlass::device_kernel|nvjet|sm90_", re.IGNORECASE)


def kernel_breakdown(step, steps: int = 3) -> list[tuple[str, float]]:
    """(kernel name, µs per step) of the CUDA kernels ``step`` launches, largest first."""
    step()
    torch.cuda.synchronize()
    activity = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / steps
    return sorted(totals.items(), key=lambda item: -item[1])


def split_gemm(kernels: list[tuple[str, float]]) -> tuple[float, float]:
    gemm = sum(us for name, us in kernels if _GEMM_NAME.search(name))
    return gemm, sum(us for _, us in kernels) - gemm


def print_breakdown(title: str, kernels: list[tuple[str, float]], top: int = 14) -> None:
    print(f"\n### kernels per step: {title}\n\n| kernel | µs/step |\n|---|---|")
    for name, us in kernels[:top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        print(f"| `{short}` | {us:.1f} |")
    rest = sum(us for _, us in kernels[top:])
    if rest:
        print(f"| ({len(kernels) - top} more) | {rest:.1f} |")


# ----------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------


def _inputs(s: Shape, device):
    x = torch.randn(s.rows, s.k, device=device, dtype=torch.bfloat16).requires_grad_()
    w = (torch.randn(s.experts, s.n, s.k, device=device) / s.k**0.5).to(torch.bfloat16).requires_grad_()
    grad_y = torch.randn(s.rows, s.n, device=device, dtype=torch.bfloat16)
    return x, w, aligned_group_ends(s.rows, s.experts, device), grad_y


def _speedups(label_key: str, label: str, us: dict[str, float]) -> dict:
    """The label, then bf16, ours and (when they ran) cute, cute_2d3d and torchao µs with their
    speedups over bf16."""
    row = {label_key: label, "bf16 us": us["bf16"]}
    for name in ("ours", "cute", "cute_2d3d", "torchao"):
        if name in us:
            row.update({f"{name} us": us[name], f"{name} vs bf16": us["bf16"] / us[name]})
    return row


def gemm_rows(s: Shape, torchao_mm, copy_gbps: float) -> tuple[dict, dict, dict]:
    """The fwd+bwd row, the per-GEMM row and the operand-passes row of one shape."""
    device = torch.device("cuda")
    x, w, ends, grad_y = _inputs(s, device)
    parts = gemm_parts_row(s, x.detach(), w.detach(), ends, grad_y)
    passes = operand_passes_row(s, x.detach(), ends, copy_gbps)
    steps = {"bf16": _gemm_step(_ours("bf16"), x, w, ends, grad_y)}
    steps["ours"] = _gemm_step(_ours("fp8_rowwise"), x, w, ends, grad_y)
    if cute_gemm_runs():
        steps["cute"] = _gemm_step(_ours("fp8_rowwise", gemm="cute"), x, w, ends, grad_y)
        steps["cute_2d3d"] = _gemm_step(_ours("fp8_rowwise", gemm="cute_2d3d"), x, w, ends, grad_y)
    if torchao_mm is not None:
        steps["torchao"] = _gemm_step(torchao_mm, x, w, ends, grad_y)
    steps["fp8 GEMMs"] = fp8_gemms_step(x.detach(), w.detach(), ends, grad_y)
    us = _time_all(steps)
    kernels = kernel_breakdown(steps["ours"])
    print_breakdown(f"ours fp8_rowwise, {s.name}", kernels)
    gemm_us, rest_us = split_gemm(kernels)
    moved = quantization_bytes(s)
    row = _speedups("shape", s.name, us)
    row.update(
        {
            "fp8 GEMMs us": us["fp8 GEMMs"],
            "GEMM cap vs bf16": us["bf16"] / us["fp8 GEMMs"],
            "ours GEMM kernels us": gemm_us,
            "ours other kernels us": rest_us,
            "other / GEMM": rest_us / gemm_us,
            "quant GB": moved / 1e9,
            "floor us": moved / copy_gbps / 1e3,
            "other / floor": rest_us / (moved / copy_gbps / 1e3),
        }
    )
    del x, w, grad_y, steps
    torch.cuda.empty_cache()
    return row, parts, passes


def _torchao_swiglu(torchao_mm, hidden: int):
    """torchao's FP8 rowwise op on the fused weight: one GEMM for gate and up, as ours."""

    def forward(x, w13, w2, ends):
        h13 = torchao_mm(x, w13, ends)
        return torchao_mm(torch.nn.functional.silu(h13[:, :hidden]) * h13[:, hidden:], w2, ends)

    return forward


def _compiled_bf16_block(hidden: int):
    """The bf16 block with its SwiGLU (forward and backward) under ``torch.compile``: the faster
    bf16 baseline."""
    swiglu = torch.compile(lambda h13: torch.nn.functional.silu(h13[:, :hidden]) * h13[:, hidden:])

    def forward(x, w13, w2, ends):
        h13 = tb.scaled_grouped_mm(x, w13, ends, recipe="bf16")
        return tb.scaled_grouped_mm(swiglu(h13), w2, ends, recipe="bf16")

    return forward


def module_bytes(s: Shape) -> int:
    """Bytes the FP8 rowwise block moves outside its GEMMs per micro-batch (aligned groups, each
    pass's inputs read once and outputs written once; weights counted separately)."""
    m, d, h, e = s.rows, s.k, s.n, s.experts
    x = 2 * (2 * m * d + m * d) + 4 * m + 4 * e * d  # x rows and columns
    swiglu = (2 * m * 2 * h + 2 * m * h + m * h + 4 * m) + (2 * m * h + m * h)  # h13 -> h, q; h cols
    grad_out = 2 * (2 * m * d + m * d)
    d_swiglu = (2 * m * h + 2 * m * 2 * h + 2 * m * 2 * h + m * 2 * h) + (2 * m * 2 * h + m * 2 * h)
    return x + swiglu + grad_out + d_swiglu


def weight_bytes(s: Shape) -> int:
    """Bytes of quantizing both weights in both layouts (read bf16, write e4m3 and scales)."""
    return 2 * 3 * (s.experts * 2 * s.n * s.k + s.experts * s.k * s.n)


def _micro_batches(forward, x, params, ends, grad_out, n: int):
    """One optimizer step of ``n`` micro-batches: the parameters change (their version counters
    move, as an optimizer's in-place update moves them), then ``n`` forward + backward passes."""

    def step():
        for p in params:
            p.grad = None
            torch.autograd.graph.increment_version(p)
        for _ in range(n):
            x.grad = None
            forward(x, ends).backward(grad_out)

    return step


def _peak_mib(step, x, params) -> float:
    """Peak device memory of a step beyond the parameters, inputs and cache held before it, MiB (the
    previous step's gradients are dropped first, as the step itself drops them)."""
    x.grad = None
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - held) / 2**20


def _module_forwards(s: Shape, torchao_mm, device):
    """name -> (forward(x, ends), parameters) of every column."""
    ours = tb.GroupedExperts(s.experts, s.k, s.n, recipe="fp8_rowwise", gemm="native", device=device)
    plain = tb.GroupedExperts.from_weights(ours.w13, ours.w2, gemm="native", weight_cache=False)
    base = tb.GroupedExperts.from_weights(ours.w13, ours.w2, recipe="bf16")
    params = [ours.w13, ours.w2]
    forwards = {
        "bf16": (base, params),
        "bf16 compiled SwiGLU": (lambda a, e: _compiled_bf16_block(s.n)(a, ours.w13, ours.w2, e), params),
        "ours": (lambda a, e: ours(a, e, groups_aligned=True), params),
        "ours cache off": (lambda a, e: plain(a, e, groups_aligned=True), params),
        "ours unaligned path": (ours, params),
    }
    if cute_gemm_runs():
        cute = tb.GroupedExperts.from_weights(ours.w13, ours.w2, gemm="cute")
        forwards["cute"] = (cute, params)
        forwards[CUTE_128] = (lambda a, e: cute(a, e, groups_aligned=True), params)
        hybrid = tb.GroupedExperts.from_weights(ours.w13, ours.w2, gemm="cute_2d3d")
        forwards["cute_2d3d"] = (lambda a, e: hybrid(a, e, groups_aligned=True), params)
    if torchao_mm is not None:
        forwards["torchao"] = (lambda a, e: _torchao_swiglu(torchao_mm, s.n)(a, ours.w13, ours.w2, e), params)
    return forwards, ours


#: The ``gemm="cute"`` block on groups padded to 128 rows, as ``MoELayer(alignment=128)`` hands them
#: over (the dispatch or permute places each group at a multiple of 128 rows, at no extra pass). Its
#: inputs hold the padding rows (zeros), which every pass carries: that much more work than the
#: other columns on the same tokens.
CUTE_128 = "cute 128-row groups"


def _module_inputs(s: Shape, device):
    """name -> (x (M, D) bf16 requiring grad, skewed aligned group ends, grad_out (M, D) bf16): the
    same tokens for every column (key None), and for :data:`CUTE_128` (where that column runs) in
    groups padded to 128 rows."""
    x = torch.randn(s.rows, s.k, device=device, dtype=torch.bfloat16).requires_grad_()
    ends = aligned_group_ends(s.rows, s.experts, device)
    grad_out = torch.randn(s.rows, s.k, device=device, dtype=torch.bfloat16)
    if not cute_gemm_runs():
        return {None: (x, ends, grad_out)}
    padded, _, padded_ends = tb.pad_token_groups(x.detach(), ends, alignment=128)
    rows = int(padded_ends[-1])  # setup, untimed
    progress(f"  {CUTE_128}: {rows} rows for {s.rows} tokens ({rows / s.rows - 1:.1%} padding)")
    padded_grad = tb.pad_token_groups(grad_out, ends, alignment=128)[0][:rows].contiguous()
    x128 = padded[:rows].contiguous().requires_grad_()
    return {None: (x, ends, grad_out), CUTE_128: (x128, padded_ends, padded_grad)}


def module_rows(s: Shape, torchao_mm, copy_gbps: float) -> list[dict]:
    """Per micro-batch fwd+bwd µs and peak memory of every column, with 1 and 4 micro-batches per
    optimizer step; the per-kernel breakdown of ours; the bytes floor of its non-GEMM kernels."""
    device = torch.device("cuda")
    forwards, ours = _module_forwards(s, torchao_mm, device)
    inputs = _module_inputs(s, device)
    x, ends, grad_out = inputs[None]
    rows = []
    for n in (1, 4):
        steps = {name: _column_step(inputs, name, f, p, n) for name, (f, p) in forwards.items()}
        us = {name: t / n for name, t in _time_all(steps).items()}
        peak = {
            name: _peak_mib(step, _inputs_of(inputs, name)[0], forwards[name][1])
            for name, step in steps.items()
            if name in us
        }
        best_bf16 = min(us["bf16"], us.get("bf16 compiled SwiGLU", us["bf16"]))
        row = {"module (D=K, H=N)": s.name, "micro-batches": n, "best bf16 us": best_bf16}
        for name, t in us.items():
            row[f"{name} us"] = t
            row[f"{name} vs best bf16"] = best_bf16 / t
            row[f"{name} peak MiB"] = peak[name]
        row["ours weight cache MiB"] = ours.weight_cache_bytes() / 2**20
        rows.append(row)
    one_step = _micro_batches(forwards["ours"][0], x, forwards["ours"][1], ends, grad_out, 1)
    kernels = kernel_breakdown(one_step)
    print_breakdown(f"ours fp8_rowwise SwiGLU experts (aligned groups), {s.name}", kernels, top=16)
    gemm_us, rest_us = split_gemm(kernels)
    moved = module_bytes(s) + weight_bytes(s)
    print(
        f"\nnon-GEMM kernels {rest_us:.0f} us against a floor of {moved / copy_gbps / 1e3:.0f} us "
        f"({moved / 1e9:.2f} GB at {copy_gbps:.0f} GB/s; weights {weight_bytes(s) / 1e9:.2f} GB); "
        f"GEMM kernels {gemm_us:.0f} us"
    )
    for name in ("ours", "cute"):
        if name in forwards:
            step = _column_step(inputs, name, forwards[name][0], forwards[name][1], 1)
            step()
            totals, step_us = trace_ops(step)
            print_op_table(f"ops per step: {name}, {s.name}, 1 micro-batch", op_rows(totals, step_us))
    del forwards, ours, x, grad_out, inputs
    torch.cuda.empty_cache()
    return rows


def _inputs_of(inputs: dict, name: str) -> tuple:
    """(x, ends, grad_out) of column ``name``: its own, or the shared ones."""
    return inputs.get(name, inputs[None])


def _column_step(inputs: dict, name: str, forward, params, n: int):
    """:func:`_micro_batches` of column ``name`` on its inputs."""
    x, ends, grad_out = _inputs_of(inputs, name)
    return _micro_batches(forward, x, params, ends, grad_out, n)


def peak_rows(s: Shape) -> list[dict]:
    """Peak memory only (no timing): every column's step with 1 and 4 micro-batches after one warm
    step, MiB beyond the parameters, inputs and weight cache held before it (a stale cache entry
    is replaced one for one), and each against bf16's."""
    device = torch.device("cuda")
    forwards, ours = _module_forwards(s, None, device)
    inputs = _module_inputs(s, device)
    rows = []
    for n in (1, 4):
        row = {"module (D=K, H=N)": s.name, "micro-batches": n}
        for name, (forward, params) in forwards.items():
            step = _column_step(inputs, name, forward, params, n)
            step()  # warm: compiled kernels, and a weight cache that holds the previous step's entries
            row[f"{name} peak MiB"] = _peak_mib(step, _inputs_of(inputs, name)[0], params)
        for name in forwards:
            row[f"{name} vs bf16"] = row[f"{name} peak MiB"] / row["bf16 peak MiB"]
        row["ours weight cache MiB"] = ours.weight_cache_bytes() / 2**20
        rows.append(row)
    del forwards, ours, inputs
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])  # --quick: the first shape only
    # gemm: the op (scaled_grouped_mm) tables; peak: the module's peak memory alone (module has it too)
    add_parts_arg(parser, ("gemm", "module", "peak"))
    args = parser.parse_args(argv)
    parts = args.parts
    if cuda_or_none("bench_moe") is None:
        return 2
    torchao_mm = _torchao_mm()
    copy_gbps = (1 << 31) / copy_baseline_best(1 << 31, torch.device("cuda"))[0].us / 1e3
    print(f"device: {torch.cuda.get_device_name()}, copy {copy_gbps:.0f} GB/s (read + write)")
    tables: list[list[dict]] = [[], [], []]
    for s in (GEMM_SHAPES[:1] if args.quick else GEMM_SHAPES) if "gemm" in parts else ():
        progress(f"grouped GEMM fwd+bwd: {s.name}")
        for table, row in zip(tables, gemm_rows(s, torchao_mm, copy_gbps), strict=True):
            table.append(row)
    modules = []
    for s in (MODULE_SHAPES[:1] if args.quick else MODULE_SHAPES) if "module" in parts else ():
        progress(f"SwiGLU experts fwd+bwd: {s.name}")
        modules += module_rows(s, torchao_mm, copy_gbps)
    peaks = []
    peak_alone = "peak" in parts and "module" not in parts  # the module rows carry the peaks too
    for s in (MODULE_SHAPES[:1] if args.quick else MODULE_SHAPES) if peak_alone else ():
        progress(f"SwiGLU experts peak memory: {s.name}")
        peaks += peak_rows(s)
    if peaks:
        peak_json, _ = output_paths(args.out, "moe_peak")
        title = "SwiGLU experts: peak memory of a step"
        report(peaks, list(peaks[0]), title, json_path=peak_json, panel_key=None)
    meta = {"copy_GBps": copy_gbps}
    titles = ["Grouped GEMM fwd+bwd (FP8 rowwise)", "Each GEMM alone", "x's FP8 operands: dual vs row + col"]
    for stem, title, rows in zip(("moe", "moe_gemms", "moe_passes"), titles, tables, strict=True):
        if not rows:
            continue
        report(
            rows, list(rows[0]), title, json_path=output_paths(args.out, stem)[0], panel_key=None, meta=meta
        )
    if not modules:
        return 0
    module_json, _ = output_paths(args.out, "moe_module")
    report(
        modules,
        list(modules[0]),
        "SwiGLU experts fwd+bwd",
        json_path=module_json,
        panel_key=None,
        meta=meta,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
