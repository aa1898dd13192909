"""Shared by the grouped-GEMM tests: fp32 math to compare against, SQNR, and group layouts."""

from __future__ import annotations

import torch

from tests.conftest import random_group_ends


def sqnr_db(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``actual`` against ``expected`` in dB."""
    expected = expected.detach().float().cpu()
    noise = (actual.detach().float().cpu() - expected).norm()
    return float("inf") if noise == 0 else float(20 * torch.log10(expected.norm() / noise))


def fp32_grouped_mm(x, w, ends: list[int], grad_y):
    """``(y, grad_x, grad_w)`` of the grouped GEMM in fp32 on the CPU, one matmul per group; rows
    past the last end: y = grad_x = 0."""
    xs = x.detach().float().cpu().requires_grad_()
    ws = w.detach().float().cpu().requires_grad_()
    parts, start = [], 0
    for g, end in enumerate(ends):
        parts.append(xs[start:end] @ ws[g].T)
        start = end
    parts.append(xs.new_zeros(x.shape[0] - start, w.shape[1]))
    y = torch.cat(parts)
    y.backward(grad_y.float().cpu())
    return y.detach(), xs.grad, ws.grad


def fp32_swiglu_experts(x, w13, w2, ends: list[int], grad_out):
    """``(out, grad_x, grad_w13, grad_w2)`` of the SwiGLU experts in fp32 on the CPU (w13 (E, 2H, D):
    gate rows then up rows)."""
    leaves = [t.detach().float().cpu().requires_grad_() for t in (x, w13, w2)]
    xs, a, c = leaves
    hidden = w2.shape[2]
    parts, start = [], 0
    for g, end in enumerate(ends):
        rows = xs[start:end]
        h13 = rows @ a[g].T
        h = torch.nn.functional.silu(h13[:, :hidden]) * h13[:, hidden:]
        parts.append(h @ c[g].T)
        start = end
    parts.append(xs.new_zeros(x.shape[0] - start, w2.shape[1]))
    out = torch.cat(parts)
    out.backward(grad_out.float().cpu())
    return (out.detach(), *(t.grad for t in leaves))


# (name, rows M, groups E, sizes given explicitly or None for seeded random sizes with edges)
LAYOUTS = [
    ("edges", 300, 6, [0, 1, 0, 44, 17, 200]),  # empty first, one-row, empty run, unaligned sizes
    ("one_group_all_rows", 160, 4, [0, 0, 160, 0]),
    ("tail_rows_unowned", 128, 3, [31, 33, 40]),  # last end 104 < M
    ("random", 700, 8, None),
]


def layout_ends(rows: int, groups: int, sizes, seed: int = 0) -> list[int]:
    if sizes is None:
        return random_group_ends(rows, groups, torch.Generator().manual_seed(seed))
    ends, total = [], 0
    for size in sizes:
        total += size
        ends.append(total)
    return ends


def count_fp8_column_operands(monkeypatch) -> dict:
    """Count every FP8 rowwise column (wgrad) operand the training layer makes: the quantizers that
    make one, patched in ``torch_bindings.moe.grouped_mm`` (the padded column op, both duals,
    ``quantize_fp8_2d(axis="col")``), each call one operand. Returns the live counter
    ``{"cols": n}``."""
    from torch_bindings.moe import grouped_mm

    calls = {"cols": 0}

    def counting(original, makes_cols):
        def counted(*args, **kwargs):
            calls["cols"] += bool(makes_cols(*args, **kwargs))
            return original(*args, **kwargs)

        return counted

    for name in ("pad_and_quantize_fp8_2d_cols", "pad_and_quantize_fp8_2d_dual", "quantize_fp8_2d_dual"):
        monkeypatch.setattr(grouped_mm, name, counting(getattr(grouped_mm, name), lambda *a, **k: True))
    is_cols = lambda t, axis="row", **k: axis == "col"  # noqa: E731
    monkeypatch.setattr(grouped_mm, "quantize_fp8_2d", counting(grouped_mm.quantize_fp8_2d, is_cols))
    return calls
