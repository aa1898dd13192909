"""FP8 rowwise quantization (SPEC section 7): ``quantize_fp8_2d``, ``quantize_fp8_2d_dual``,
``quantize_fp8_3d``.

Kernels so far: one scale per row (``cute_kernels.quantize_fp8.Fp8RowKernel``) for
``quantize_fp8_2d(axis="row")`` and ``quantize_fp8_3d(axis="K")``. The column scales (with and without
token groups), the dual and ``quantize_fp8_3d(axis="N")`` have their reference only: on a GPU they
raise ``NotImplementedError`` unless ``backend="reference"`` is asked for (no silent slow path).
"""

from __future__ import annotations

import torch

from . import checks, reference, targets
from .op import KernelOp
from .quantize_3d import expert_rows

_OP_2D, _OP_DUAL, _OP_3D = "quantize_fp8_2d", "quantize_fp8_2d_dual", "quantize_fp8_3d"
_KERNEL = "quantize_fp8_row"  # cute_kernels.registry name
_E4M3 = torch.float8_e4m3fn
_QUANT_DTYPES = frozenset(checks.QUANT_DTYPES)


def _variant(key: tuple, target: targets.DeviceTarget):
    """``key = ("quantize_fp8_row", torch dtype, round_pow2, vector, rank)`` -> the kernel's variant."""
    from cute_kernels.quantize_fp8 import Fp8RowVariant

    _, dtype, round_pow2, vector, rank = key
    return Fp8RowVariant(str(dtype).removeprefix("torch."), round_pow2, vector, rank)


def _not_written(op: str, what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{op}: the kernel for {what} is not written yet (issue 20); pass backend='reference' to run "
        "the PyTorch reference"
    )


def _run_rows(
    target: targets.DeviceTarget, x: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row of x (M, K) or w (E, N, K): q in x's shape, row-major; scales x.shape[:-1]."""
    if x.dim() == 3 and x.shape[1] == 1:  # the one shape whose row stride PyTorch leaves free
        x = expert_rows(x)
    q = x.new_empty(x.shape, dtype=_E4M3)
    scales = x.new_empty(x.shape[:-1], dtype=torch.float32)
    if scales.numel():
        vector = not (x.shape[-1] & 7 or x.data_ptr() & 15)  # q: fresh, 512-byte aligned
        key = (_KERNEL, x.dtype, round_pow2, vector, x.dim())
        target.kernel(key, _variant)(x, q, scales)
    return q, scales


# ----------------------------------------------------------------------------------------------
# quantize_fp8_2d
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::quantize_fp8_2d_row", mutates_args=())
def _rows_2d_op(x: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_rows(targets.select(_OP_2D, "cute", x), x, round_pow2)


@_rows_2d_op.register_fake
def _rows_2d_fake(x: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape, dtype=_E4M3), x.new_empty(x.shape[:-1], dtype=torch.float32)


def _fast_2d_ok(x, axis, group_end_offsets, round_pow2) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and x.dtype in _QUANT_DTYPES
        and x.dim() == 2
        and type(axis) is str
        and axis == "row"
        and group_end_offsets is None
        and (round_pow2 is True or round_pow2 is False)
        and x.is_contiguous()
    )


def _run_2d(target: targets.DeviceTarget, x, axis, group_end_offsets, round_pow2):
    if axis != "row":
        raise _not_written(_OP_2D, "column scales (axis='col')")
    return _run_rows(target, x, round_pow2)


def _reference_2d(x, axis, group_end_offsets, round_pow2):
    return reference.quantize_fp8_2d(
        x, axis=axis, group_end_offsets=group_end_offsets, round_scales_to_power_of_2=round_pow2
    )


def _custom_2d(x, axis, group_end_offsets, round_pow2):
    if axis != "row":
        raise _not_written(_OP_2D, "column scales (axis='col')")
    return _rows_2d_op(x, round_pow2)


_QUANTIZE_2D = KernelOp(
    _OP_2D, checks.check_quantize_fp8_2d, _run_2d, _reference_2d, _custom_2d, fast_ok=_fast_2d_ok
)


def quantize_fp8_2d(
    x: torch.Tensor,
    *,
    axis: str = "row",
    group_end_offsets: torch.Tensor | None = None,
    round_scales_to_power_of_2: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 rowwise quantization of x (M, K), bf16 or fp32, contiguous (SPEC section 7).

    ``axis="row"``: one scale per row: q (M, K) ``float8_e4m3fn`` row-major, scales fp32 (M,).
    ``axis="col"``: one scale per column: q (M, K) with strides (1, M), scales (K,), or with int32
    row-group end offsets (G,) one per (group, column): scales (G*K,) group-major, an empty group's
    1.0 (reference only so far). Scales are the dequantization multipliers ``1 / q_scale``
    (``q * scale ~ x``), what ``torch._scaled_grouped_mm`` takes. The row kernel: one launch, no
    host sync, no recompile when M or K change.
    """
    return _QUANTIZE_2D.dispatch(backend, x, axis, group_end_offsets, round_scales_to_power_of_2)


# ----------------------------------------------------------------------------------------------
# quantize_fp8_2d_dual (reference only so far)
# ----------------------------------------------------------------------------------------------


def _run_dual(target: targets.DeviceTarget, x, group_end_offsets, round_pow2):
    raise _not_written(_OP_DUAL, "the dual (row and column scales)")


def _reference_dual(x, group_end_offsets, round_pow2):
    return reference.quantize_fp8_2d_dual(
        x, group_end_offsets=group_end_offsets, round_scales_to_power_of_2=round_pow2
    )


def _custom_dual(x, group_end_offsets, round_pow2):
    raise _not_written(_OP_DUAL, "the dual (row and column scales)")


_QUANTIZE_DUAL = KernelOp(
    _OP_DUAL, checks.check_quantize_fp8_2d_dual, _run_dual, _reference_dual, _custom_dual
)


def quantize_fp8_2d_dual(
    x: torch.Tensor,
    *,
    group_end_offsets: torch.Tensor | None = None,
    round_scales_to_power_of_2: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_row, s_row, q_col, s_col)``: :func:`quantize_fp8_2d` with ``axis="row"`` and with
    ``axis="col"`` (and the row groups, if given), bit for bit (SPEC section 7). Reference only so
    far: on a GPU pass ``backend="reference"``."""
    return _QUANTIZE_DUAL.dispatch(backend, x, group_end_offsets, round_scales_to_power_of_2)


# ----------------------------------------------------------------------------------------------
# quantize_fp8_3d
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::quantize_fp8_3d_k", mutates_args=())
def _rows_3d_op(w: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_rows(targets.select(_OP_3D, "cute", w), w, round_pow2)


@_rows_3d_op.register_fake
def _rows_3d_fake(w: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return w.new_empty(w.shape, dtype=_E4M3), w.new_empty(w.shape[:-1], dtype=torch.float32)


def _fast_3d_ok(w, axis, round_pow2) -> bool:
    return (
        isinstance(w, torch.Tensor)
        and w.dtype in _QUANT_DTYPES
        and w.dim() == 3
        and type(axis) is str
        and axis == "K"
        and (round_pow2 is True or round_pow2 is False)
        and w.is_contiguous()
    )


def _run_3d(target: targets.DeviceTarget, w, axis, round_pow2):
    if axis != "K":
        raise _not_written(_OP_3D, "scales along N (axis='N')")
    return _run_rows(target, w, round_pow2)


def _reference_3d(w, axis, round_pow2):
    return reference.quantize_fp8_3d(w, axis=axis, round_scales_to_power_of_2=round_pow2)


def _custom_3d(w, axis, round_pow2):
    if axis != "K":
        raise _not_written(_OP_3D, "scales along N (axis='N')")
    return _rows_3d_op(w, round_pow2)


_QUANTIZE_3D = KernelOp(
    _OP_3D, checks.check_quantize_fp8_3d, _run_3d, _reference_3d, _custom_3d, fast_ok=_fast_3d_ok
)


def quantize_fp8_3d(
    w: torch.Tensor, *, axis: str = "K", round_scales_to_power_of_2: bool = True, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 rowwise quantization of expert weights w (E, N, K), bf16 or fp32, contiguous (SPEC 7).

    ``axis="K"``: amax over K: q (E, N, K) row-major, scales fp32 (E, N) (the forward's right
    operand is ``q.transpose(-2, -1)``). ``axis="N"``: amax over N: q (E, N, K) with strides
    (N*K, 1, N), scales (E, K) (reference only so far). Scales are ``1 / q_scale``.
    """
    return _QUANTIZE_3D.dispatch(backend, w, axis, round_scales_to_power_of_2)
