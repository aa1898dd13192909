"""The grouped-GEMM training op (SPEC section 8; docs/contract.md, "Grouped GEMM training op").

``scaled_grouped_mm(x, w, group_end_offsets, recipe=...)``: ``y[rows of g] = x[rows of g] @ w[g].T``
for x (M, K) bf16 and w (E, N, K) bf16, differentiable in x and w. Per recipe, forward and backward
quantize with this package's kernels and run three grouped GEMMs:

- forward ``y = x @ w.T`` (2d x 3d, token groups along M);
- dgrad ``grad_x = grad_y @ w`` (2d x 3d);
- wgrad ``grad_w[g] = grad_y[g].T @ x[g]`` (2d x 2d, token groups along the contraction).

The FP8 wgrad GEMM needs every token group to start on a 16-row boundary (32 for MXFP8): the op pads
x and grad_y with :func:`pad_token_groups` and quantizes the padded copies for it, so any group sizes
work and nothing syncs. FP8 rowwise quantizes the rows of x and grad_y unpadded (its 2d x 3d GEMM
takes any group sizes); MXFP8 runs every GEMM on the padded copies and unpads the outputs
(notes/grouped-gemm-op.md).

GEMM paths: ``"native"`` runs ``torch._scaled_grouped_mm`` (FP8 rowwise on sm_90 / sm_100, MXFP8 on
sm_100); ``"emulated"`` dequantizes the exact quantized operands to bf16 and runs
``torch._grouped_mm``, for testing the numerics where the native GEMM is missing (CPU; MXFP8 on
Hopper). It is slower than the bf16 recipe. ``gemm="auto"`` takes the native path where it exists
and otherwise the emulation *with a one-time warning*; ``gemm="native"`` raises instead.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from . import checks, reference
from .pad import pad_token_groups, unpad_token_groups
from .quantize_3d import quantize_mxfp8_3d
from .quantize_dual import quantize_mxfp8_2d_dual
from .quantize_fp8 import quantize_fp8_2d, quantize_fp8_3d

RECIPES = checks.GROUPED_MM_RECIPES
# Token-group alignment each recipe's wgrad GEMM needs (its group starts must be 16-byte aligned
# along the token dimension; MXFP8's 32-row scale blocks must not straddle groups).
GROUP_ALIGNMENT = {"fp8_rowwise": 16, "mxfp8": 32, "bf16": 1}
# GPU major versions where torch._scaled_grouped_mm runs the recipe.
_NATIVE_MAJORS = {"fp8_rowwise": (9, 10), "mxfp8": (10,)}
_warned: set[tuple[str, str]] = set()


def native_gemm_reason(recipe: str, device: torch.device) -> str | None:
    """``None`` when ``torch._scaled_grouped_mm`` runs ``recipe`` on ``device``, else why not."""
    if recipe == "bf16":
        return None
    if device.type != "cuda":
        return f"torch._scaled_grouped_mm needs a CUDA device, the tensors are on {device.type}"
    capability = torch.cuda.get_device_capability(device)
    if capability[0] not in _NATIVE_MAJORS[recipe]:
        arches = " or ".join(f"sm_{m}0" for m in _NATIVE_MAJORS[recipe])
        here = f"sm_{capability[0]}{capability[1]}"
        return f"recipe {recipe!r} needs {arches} for torch._scaled_grouped_mm, this GPU is {here}"
    return None


def gemm_path(recipe: str, device: torch.device, gemm: str = "auto") -> str:
    """``"native"`` or ``"emulated"``: the GEMMs a call with these arguments runs. ``gemm="native"``
    raises ``RuntimeError`` where the native GEMM is missing; ``"auto"`` then picks the emulation and
    warns once per (recipe, device type)."""
    reason = native_gemm_reason(recipe, device)
    if gemm == "emulated" and recipe != "bf16":
        return "emulated"
    if reason is None:
        return "native"
    if gemm == "native":
        raise RuntimeError(f"scaled_grouped_mm: gemm='native' cannot run here: {reason}")
    key = (recipe, device.type)
    # Under torch.compile the choice is made while tracing and the warning is not raised (the
    # contract says so: gemm="native" is the strict choice there).
    if key not in _warned and not torch.compiler.is_compiling():
        _warned.add(key)
        warnings.warn(
            f"scaled_grouped_mm: {reason}; running the {recipe} EMULATION (dequantized operands, bf16 "
            "torch._grouped_mm): same quantization numerics, slower than recipe='bf16'. Pass "
            "gemm='native' to make this an error, gemm='emulated' to silence it.",
            stacklevel=3,
        )
    return "emulated"


@dataclass(frozen=True)
class _Step:
    """What one call runs: the recipe, whether its GEMMs are emulated, and whether the caller's
    groups already start on the recipe's alignment (``aligned``: offsets made by
    ``pad_token_groups`` with that alignment; the op then pads nothing)."""

    recipe: str
    emulated: bool
    aligned: bool

    @property
    def alignment(self) -> int:
        return GROUP_ALIGNMENT[self.recipe]


@dataclass(frozen=True)
class _Groups:
    """The token groups of one call: ``ends`` the caller's end offsets (G,) int32, ``rows`` M, and
    the aligned layout the wgrad operands use: ``padded_start``/``padded_end`` (G,) int32 (the
    caller's ends when ``aligned``)."""

    ends: torch.Tensor
    rows: int
    padded_start: torch.Tensor | None
    padded_end: torch.Tensor


def _aligned(t: torch.Tensor, groups: _Groups, step: _Step) -> torch.Tensor:
    """``t`` itself when the caller's groups are aligned, else its padded copy (groups.padded_*)."""
    return t if step.aligned else pad_token_groups(t, groups.ends, alignment=step.alignment)[0]


def _unpad(t_padded: torch.Tensor, groups: _Groups) -> torch.Tensor:
    return unpad_token_groups(t_padded, groups.ends, groups.padded_start, num_tokens=groups.rows)


def wgrad_mm(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """bf16 ``torch._grouped_mm`` 2d x 2d (a (N, Mp), b (Mp, K), groups along Mp) -> (G, N, K). An
    empty group's slice is 0: the CUDA kernel writes it so; the CPU fallback leaves it unwritten, so
    on CPU it is masked here (a pass over the output, CPU only)."""
    out = torch._grouped_mm(a, b, ends)
    if out.device.type == "cpu":
        sizes = ends - torch.cat([ends.new_zeros(1), ends[:-1]])
        out = torch.where((sizes > 0).view(-1, 1, 1), out, out.new_zeros(()))
    return out


# ----------------------------------------------------------------------------------------------
# fp8_rowwise
# ----------------------------------------------------------------------------------------------


def _dequant_rows_fp8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 ``q * scales[..., None, :]`` for a 3d operand (E, Kc, N) with scales (E, N), or
    ``q * scales[:, None]`` for a 2d operand (M, Kc) with scales (M,)."""
    if q.dim() == 3:
        return (q.float() * scales.view(q.shape[0], 1, q.shape[2])).to(torch.bfloat16)
    return (q.float() * scales[:, None]).to(torch.bfloat16)


def _dequant_group_cols_fp8(q: torch.Tensor, scales: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """bf16 ``q[m, c] * scales[g(m) * C + c]`` for q (Mp, C), g(m) the group of row m (rows past the
    last end use the last group's scales; their q is 0)."""
    groups = ends.numel()
    rows = torch.arange(q.shape[0], device=q.device, dtype=ends.dtype)
    g = reference._group_of(rows, ends).clamp_(max=groups - 1)
    return (q.float() * scales.view(groups, -1)[g]).to(torch.bfloat16)


def _fp8_gemm(a, b, scale_a, scale_b, ends, step: _Step) -> torch.Tensor:
    """The FP8 rowwise grouped GEMM (fast accumulation, as torchao's recipe): 2d x 3d (a (M, Kc)
    row-major, scale_a (M,); b (E, Kc, N) column-major, scale_b (E, N)) or 2d x 2d (a (N, Mp)
    row-major, b (Mp, K) column-major, group-major scales (G N,) and (G K,)); groups along M or
    along Mp by ``ends``."""
    if not step.emulated:
        return torch._scaled_grouped_mm(
            a, b, scale_a, scale_b, ends, out_dtype=torch.bfloat16, use_fast_accum=True
        )
    if b.dim() == 3:
        return torch._grouped_mm(_dequant_rows_fp8(a, scale_a), _dequant_rows_fp8(b, scale_b), ends)
    a_dq = _dequant_group_cols_fp8(a.t(), scale_a, ends).t()
    return wgrad_mm(a_dq, _dequant_group_cols_fp8(b, scale_b, ends), ends)


@dataclass(frozen=True)
class _Fp8Operand:
    """One activation-like operand (x or grad_y) quantized for its two GEMMs: rows (``q_row``
    (rows, C) row-major, ``s_row`` (rows,)) for the 2d x 3d GEMM over the caller's groups; columns
    per aligned group (``q_col`` (Mp, C) column-major, ``s_col`` (G C,)) for the wgrad GEMM."""

    q_row: torch.Tensor
    s_row: torch.Tensor
    q_col: torch.Tensor
    s_col: torch.Tensor


def _fp8_operand(t: torch.Tensor, t_aligned: torch.Tensor, groups: _Groups) -> _Fp8Operand:
    """Rows of ``t`` itself (the 2d x 3d GEMM takes any group sizes) and columns of its aligned copy
    ``t_aligned``, in two kernels rather than the dual one: on H200 the row and column kernels run
    nearer copy speed than the dual, more than paying for the extra read (notes/grouped-gemm-op.md)."""
    q, s = quantize_fp8_2d(t, axis="row")
    q_col, s_col = quantize_fp8_2d(t_aligned, axis="col", group_end_offsets=groups.padded_end)
    return _Fp8Operand(q, s, q_col, s_col)


def _fp8_forward(x, w, groups: _Groups, x_aligned, step: _Step):
    """y (M, N) and what backward keeps: x's wgrad operand (q_col, s_col)."""
    q_w, s_w = quantize_fp8_3d(w, axis="K")
    op = _fp8_operand(x, x_aligned, groups)
    y = _fp8_gemm(op.q_row, q_w.transpose(-2, -1), op.s_row, s_w, groups.ends, step)
    return y, (op.q_col, op.s_col)


def _fp8_backward(grad_y, w, groups: _Groups, saved, step: _Step):
    q_col_x, s_col_x = saved
    op = _fp8_operand(grad_y, _aligned(grad_y, groups, step), groups)
    q_w, s_w = quantize_fp8_3d(w, axis="N")  # (E, N, K) column-major: dgrad's right operand
    grad_x = _fp8_gemm(op.q_row, q_w, op.s_row, s_w, groups.ends, step)
    grad_w = _fp8_gemm(op.q_col.t(), q_col_x, op.s_col, s_col_x, groups.padded_end, step)
    return grad_x, grad_w


# ----------------------------------------------------------------------------------------------
# mxfp8
# ----------------------------------------------------------------------------------------------


def _dequant_mx(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 dequantization of q (..., C) whose 32-element blocks run along its last dim, with plain
    E8M0 scales (..., C / 32). Exact unless a value reaches 2^128 (bf16's range)."""
    blocks = q.reshape(*q.shape[:-1], q.shape[-1] // 32, 32)
    return reference.dequantize_blocks(blocks, scales, dim=-1).reshape(q.shape).to(torch.bfloat16)


def _mx_quantize(t: torch.Tensor, ends: torch.Tensor, step: _Step):
    """``(q_1x32, s_1x32, q_32x1, s_32x1)`` of an aligned (Mp, C): blocked M-/K-groups scales for the
    native GEMM, plain scales for the emulation (the groups start on 32-row boundaries, so the
    blocks and their values are the same)."""
    if step.emulated:
        return quantize_mxfp8_2d_dual(t, blocked_scales=False)
    return quantize_mxfp8_2d_dual(t, group_end_offsets=ends)


def _mx_gemm_emulated(kind: str, a, sa, b, sb, ends) -> torch.Tensor:
    """The emulated GEMMs on plain scales: ``"fwd"`` a 1x32 (Mp, K), b 1x32 (E, N, K);
    ``"dgrad"`` a 1x32 (Mp, N), b 32x1 (E, N, K) column-major with scales (E, K, N/32);
    ``"wgrad"`` a = grad_y 32x1 (Mp, N), b = x 32x1 (Mp, K), scales (N, Mp/32) and (K, Mp/32)."""
    if kind == "fwd":
        return torch._grouped_mm(_dequant_mx(a, sa), _dequant_mx(b, sb).transpose(-2, -1), ends)
    if kind == "dgrad":
        return torch._grouped_mm(
            _dequant_mx(a, sa), _dequant_mx(b.transpose(-2, -1), sb).transpose(-2, -1), ends
        )
    return wgrad_mm(_dequant_mx(a.t(), sa), _dequant_mx(b.t(), sb).t(), ends)


def _mx_gemm(kind: str, a, sa, b, sb, ends, step: _Step) -> torch.Tensor:
    if step.emulated:
        return _mx_gemm_emulated(kind, a, sa, b, sb, ends)
    if b.dim() == 3:  # a 3-D operand takes its per-expert blocked scales flattened: (E, Rp Cp)
        sb = sb.reshape(sb.shape[0], -1)
    if kind == "fwd":
        b = b.transpose(-2, -1)
    elif kind == "wgrad":
        a = a.t()
    return torch._scaled_grouped_mm(a, b, sa, sb, offs=ends, out_dtype=torch.bfloat16)


def _mx_forward(x, w, groups: _Groups, x_aligned, step: _Step):
    """MXFP8 operands always come from the aligned copy (the 1x32 GEMM operands too): one dual
    quantization gives the forward's 1x32 operand and the wgrad's 32x1 operand (kept for backward)."""
    q, s, q_col, s_col = _mx_quantize(x_aligned, groups.padded_end, step)
    q_w, s_w = quantize_mxfp8_3d(w, block="1x32", blocked_scales=not step.emulated)
    out = _mx_gemm("fwd", q, s, q_w, s_w, groups.padded_end, step)
    return (out if step.aligned else _unpad(out, groups)), (q_col, s_col)


def _mx_backward(grad_y, w, groups: _Groups, saved, step: _Step):
    q_col_x, s_col_x = saved
    q, s, q_col, s_col = _mx_quantize(_aligned(grad_y, groups, step), groups.padded_end, step)
    q_w, s_w = quantize_mxfp8_3d(w, block="32x1", blocked_scales=not step.emulated)
    grad_x = _mx_gemm("dgrad", q, s, q_w, s_w, groups.padded_end, step)
    grad_w = _mx_gemm("wgrad", q_col, s_col, q_col_x, s_col_x, groups.padded_end, step)
    return (grad_x if step.aligned else _unpad(grad_x, groups)), grad_w


_FORWARD = {"fp8_rowwise": _fp8_forward, "mxfp8": _mx_forward}
_BACKWARD = {"fp8_rowwise": _fp8_backward, "mxfp8": _mx_backward}


# ----------------------------------------------------------------------------------------------
# The autograd function
# ----------------------------------------------------------------------------------------------


def _groups(x: torch.Tensor, ends: torch.Tensor, step: _Step):
    """The call's groups and x's aligned copy (x itself when already aligned; else the pad, which
    also yields the aligned offsets every later GEMM and the backward reuse)."""
    if step.aligned:
        return _Groups(ends, x.shape[0], None, ends), x
    x_padded, start, end = pad_token_groups(x, ends, alignment=step.alignment)
    return _Groups(ends, x.shape[0], start, end), x_padded


class _ScaledGroupedMM(torch.autograd.Function):
    """Forward and backward of one recipe (module docstring). Backward keeps x's quantized wgrad
    operand (1 byte per element: half of x in bf16) rather than x, and w (a parameter, kept
    anyway); w's backward quantization (along N) is recomputed, not stored."""

    @staticmethod
    def forward(ctx, x, w, ends, recipe: str, emulated: bool, aligned: bool):
        step = _Step(recipe, emulated, aligned)
        groups, x_aligned = _groups(x, ends, step)
        y, saved = _FORWARD[recipe](x, w, groups, x_aligned, step)
        ctx.save_for_backward(w, ends, groups.padded_start, groups.padded_end, *saved)
        ctx.step, ctx.rows = step, x.shape[0]
        return y

    @staticmethod
    def backward(ctx, grad_y):
        w, ends, padded_start, padded_end, *saved = ctx.saved_tensors
        groups = _Groups(ends, ctx.rows, padded_start, padded_end)
        grad_x, grad_w = _BACKWARD[ctx.step.recipe](grad_y.contiguous(), w, groups, saved, ctx.step)
        return grad_x, grad_w, None, None, None, None


class _Bf16GroupedMM(torch.autograd.Function):
    """The bf16 baseline: ``torch._grouped_mm`` forward, dgrad and wgrad (any group sizes)."""

    @staticmethod
    def forward(ctx, x, w, ends):
        ctx.save_for_backward(x, w, ends)
        return torch._grouped_mm(x, w.transpose(-2, -1), ends)

    @staticmethod
    def backward(ctx, grad_y):
        x, w, ends = ctx.saved_tensors
        grad_y = grad_y.contiguous()
        return torch._grouped_mm(grad_y, w, ends), wgrad_mm(grad_y.t(), x, ends), None


def grouped_mm_apply(x, w, ends, recipe: str, emulated: bool, aligned: bool) -> torch.Tensor:
    """The op without checks, for callers (the expert module) that padded the groups themselves:
    ``aligned=True`` promises ``ends`` came from ``pad_token_groups`` with the recipe's alignment."""
    if recipe == "bf16":
        return _Bf16GroupedMM.apply(x, w, ends)
    return _ScaledGroupedMM.apply(x, w, ends, recipe, emulated, aligned)


def scaled_grouped_mm(
    x: torch.Tensor,
    w: torch.Tensor,
    group_end_offsets: torch.Tensor,
    *,
    recipe: str = "fp8_rowwise",
    out_dtype: torch.dtype = torch.bfloat16,
    gemm: str = "auto",
) -> torch.Tensor:
    """Grouped GEMM ``y[rows of g] = x[rows of g] @ w[g].T`` with low-precision operands (SPEC
    section 8), differentiable in x and w.

    x (M, K) bf16 contiguous; w (E, N, K) bf16 contiguous (one ``nn.Linear`` weight per expert);
    ``group_end_offsets`` (E,) int32 on x's device, non-decreasing, last <= M, any group sizes
    (empty groups allowed: their slice of grad_w is 0). Rows of x past the last group's end belong to
    no group: their rows of y and grad_x are unspecified (as with ``torch._grouped_mm``). Returns y
    (M, N) bf16.
    Recipes: ``"fp8_rowwise"`` (SPEC section 7 operands; K, N multiples of 16), ``"mxfp8"`` (SPEC
    sections 2-4 operands; K, N multiples of 32), ``"bf16"`` (``torch._grouped_mm``; K, N multiples
    of 8). ``gemm``: ``"auto"`` (native GEMM, or the emulation with a one-time warning),
    ``"native"`` (error where missing) or ``"emulated"`` (see the module docstring and
    :func:`gemm_path`). No host sync in forward or backward; works under ``torch.compile`` and CUDA
    graphs.
    """
    checks.check_scaled_grouped_mm(x, w, group_end_offsets, recipe, out_dtype, gemm)
    emulated = gemm_path(recipe, x.device, gemm) == "emulated"
    return grouped_mm_apply(x, w, group_end_offsets, recipe, emulated, aligned=False)
