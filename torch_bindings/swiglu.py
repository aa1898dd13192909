"""SwiGLU fused with FP8 rowwise quantization: ``swiglu_quantize_fp8`` (forward) and
``swiglu_backward_quantize_fp8`` (backward), one launch each (``cute_kernels.swiglu``).

The numerics are ``torch_bindings.reference.swiglu`` / ``swiglu_backward`` (exact fp32 operations,
docs/contract.md) followed by ``quantize_fp8_2d(axis="row")`` of the bf16 result; the kernels match
them bit for bit.
"""

from __future__ import annotations

import torch

from . import checks, reference, targets
from .op import KernelOp

_OP_FWD, _OP_BWD = "swiglu_quantize_fp8", "swiglu_backward_quantize_fp8"
_KERNEL = "swiglu_fp8"  # cute_kernels.registry name
_BF16 = torch.bfloat16
_Tensor = torch.Tensor


def _variant(key: tuple, target: targets.DeviceTarget):
    """``key = ("swiglu_fp8", direction, round_pow2, vector)`` -> the kernel's variant."""
    from cute_kernels.swiglu import SwigluVariant

    _, direction, round_pow2, vector = key
    return SwigluVariant(direction, round_pow2, vector)


def _launch(target: targets.DeviceTarget, h13, grad_h, round_pow2: bool, rows: int, half: int, out_cols: int):
    """Allocate the outputs (bf16 (M, out_cols), e4m3 (M, out_cols), fp32 (M,)) and launch once on
    h13 (M, 2 half) (``grad_h`` None: the forward); rows of no columns get the scale 1.0 and no
    launch, as do no rows."""
    out = h13.new_empty((rows, out_cols))
    q = target.e4m3.new_empty(rows, out_cols)
    scales = target.f32.new_empty(rows)
    if not half:
        return out, q, scales.fill_(1.0)
    if rows:
        unaligned = h13.data_ptr() & 15 or (grad_h is not None and grad_h.data_ptr() & 15)
        key = (_KERNEL, "fwd" if grad_h is None else "bwd", round_pow2, not (half & 7 or unaligned))
        kernel = target.kernels.get(key) or target.kernel(key, _variant)
        kernel(h13, out, q, scales, grad_h)  # outputs: fresh, 512-byte aligned
    return out, q, scales


def _run_fwd(target: targets.DeviceTarget, h13: torch.Tensor, round_pow2: bool):
    rows, cols = h13.shape
    return _launch(target, h13, None, round_pow2, rows, cols >> 1, cols >> 1)


def _run_bwd(target: targets.DeviceTarget, grad_h: torch.Tensor, h13: torch.Tensor, round_pow2: bool):
    rows, cols = h13.shape
    return _launch(target, h13, grad_h, round_pow2, rows, cols >> 1, cols)


def _fast_fwd(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: :func:`checks.check_swiglu_quantize_fp8` from metadata reads (a contiguous
    2-D bf16 h13 with an even last dim, a bool rounding flag)."""
    h13, round_pow2 = args
    if h13.dtype is _BF16 and (round_pow2 is True or round_pow2 is False) and h13.is_contiguous():
        shape = h13.shape
        if len(shape) == 2 and not shape[1] & 1:
            half = shape[1] >> 1
            return _launch(target, h13, None, round_pow2, shape[0], half, half)
    return None


def _fast_bwd(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: :func:`checks.check_swiglu_backward_quantize_fp8` from metadata reads
    (h13's device compared here: a call with no rows or columns launches no kernel whose wrapper
    would)."""
    grad_h, h13, round_pow2 = args
    if (
        grad_h.dtype is _BF16
        and isinstance(h13, _Tensor)
        and h13.dtype is _BF16
        and (round_pow2 is True or round_pow2 is False)
        and grad_h.is_contiguous()
        and h13.is_contiguous()
    ):
        shape, grad_shape = h13.shape, grad_h.shape
        if len(shape) == 2 and len(grad_shape) == 2 and grad_shape[0] == shape[0]:
            half = grad_shape[1]
            if 2 * half == shape[1] and h13.device == target.device:
                return _launch(target, h13, grad_h, round_pow2, shape[0], half, shape[1])
    return None


# ----------------------------------------------------------------------------------------------
# Custom ops (torch.compile) and the ops
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::swiglu_quantize_fp8", mutates_args=())
def _fwd_op(h13: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_fwd(targets.select(_OP_FWD, "cute", h13), h13, round_pow2)


@_fwd_op.register_fake
def _fwd_fake(h13: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = h13.shape
    shape = (rows, cols // 2)
    q = h13.new_empty(shape, dtype=torch.float8_e4m3fn)
    return h13.new_empty(shape), q, h13.new_empty(rows, dtype=torch.float32)


@torch.library.custom_op("cute_kernels::swiglu_backward_quantize_fp8", mutates_args=())
def _bwd_op(
    grad_h: torch.Tensor, h13: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_bwd(targets.select(_OP_BWD, "cute", h13), grad_h, h13, round_pow2)


@_bwd_op.register_fake
def _bwd_fake(
    grad_h: torch.Tensor, h13: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = h13.shape[0]
    q = h13.new_empty(h13.shape, dtype=torch.float8_e4m3fn)
    return h13.new_empty(h13.shape), q, h13.new_empty(rows, dtype=torch.float32)


def _reference_fwd(h13, round_pow2):
    return reference.swiglu_quantize_fp8(h13, round_scales_to_power_of_2=round_pow2)


def _reference_bwd(grad_h, h13, round_pow2):
    return reference.swiglu_backward_quantize_fp8(grad_h, h13, round_scales_to_power_of_2=round_pow2)


_SWIGLU_FWD = KernelOp(
    _OP_FWD, checks.check_swiglu_quantize_fp8, _run_fwd, _reference_fwd, _fwd_op, fast=_fast_fwd
)
_SWIGLU_BWD = KernelOp(
    _OP_BWD, checks.check_swiglu_backward_quantize_fp8, _run_bwd, _reference_bwd, _bwd_op, fast=_fast_bwd
)


def swiglu_quantize_fp8(
    h13: torch.Tensor, *, round_scales_to_power_of_2: bool = True, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SwiGLU and its FP8 rowwise operand in one pass: h13 (M, 2H) bf16 contiguous, gate columns
    [0, H), up [H, 2H) (the ``gate_up_proj`` layout) -> ``(h, q, scales)``.

    h (M, H) bf16 is ``bf16(silu(g) * u)`` with silu in exact fp32 operations (docs/contract.md;
    ``reference.swiglu``); q (M, H) ``float8_e4m3fn`` row-major and scales (M,) fp32 are exactly
    ``quantize_fp8_2d(h, axis="row", round_scales_to_power_of_2=...)``. One launch, no host sync,
    no recompile when M or H change (H % 8 == 0 with 16-byte aligned h13 takes 8-column steps,
    any other H one column at a time).
    """
    return _SWIGLU_FWD.dispatch(backend, h13, round_scales_to_power_of_2)


def swiglu_backward_quantize_fp8(
    grad_h: torch.Tensor,
    h13: torch.Tensor,
    *,
    round_scales_to_power_of_2: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SwiGLU's backward and its FP8 rowwise operand in one pass: grad_h (M, H) and h13 (M, 2H),
    bf16 contiguous on one device -> ``(grad_h13, q, scales)``.

    grad_h13 (M, 2H) bf16: columns [0, H) ``bf16((grad * u) * silu'(g))``, [H, 2H) ``bf16(grad *
    silu(g))`` (exact fp32 operations, ``reference.swiglu_backward``); q (M, 2H) e4m3 and scales
    (M,) are exactly ``quantize_fp8_2d(grad_h13, axis="row", ...)`` (one scale over all 2H columns
    of a row). One launch, no host sync, no recompile when M or H change.
    """
    return _SWIGLU_BWD.dispatch(backend, grad_h, h13, round_scales_to_power_of_2)
