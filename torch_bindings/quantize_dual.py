"""``quantize_mxfp8_2d_dual``: the 1x32 and 32x1 quantizations of x from one read.

One launch of the dual kernel (``cute_kernels.quantize_dual.QuantizeDualKernel``) writes both
results, with or without row groups (M-groups 1x32 scales, K-groups 32x1 scales). Kernels are
compiled once per (dtype, scaling mode, scale layout, arch) with symbolic sizes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import checks, contract, reference, targets
from .op import KernelOp

_OP = "quantize_mxfp8_2d_dual"
_CONTRACT = contract.QUANTIZE_MXFP8_2D_DUAL
_M_MASK = _CONTRACT.divisor("x", "M") - 1
_E8M0 = torch.float8_e8m0fnu


class DualKey(NamedTuple):
    """The dual kernel's key in a device's table: x's torch ``dtype``, the scaling ``mode`` and the
    scale ``layout`` (a ``ScaleLayout`` value)."""

    kernel: str
    dtype: torch.dtype
    mode: str
    layout: str

    def variant(self, target: targets.DeviceTarget):
        """The kernel's variant (imports the kernel module)."""
        from cute_kernels.quantize_dual import DualVariant, ScaleLayout

        return DualVariant(contract.dtype_name(self.dtype), self.mode, ScaleLayout(self.layout))


def _launch_dual(
    target: targets.DeviceTarget,
    x: torch.Tensor,
    shape: torch.Size,
    group_end_offsets: torch.Tensor | None,
    num_groups: int,
    scaling_mode: str,
    blocked_scales: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_1x32, scales_1x32, q_32x1, scales_32x1)`` of x of ``shape`` (M, K), M and K multiples of
    32 (all checks done; ``num_groups`` 0 without offsets), bit-identical to the two single calls:
    one launch of the dual kernel (layout ``groups`` with offsets, else ``blocked`` or ``plain``)."""
    rows, cols = shape
    q_r = target.e4m3.new_empty(rows, cols)
    q_c = target.e4m3.new_empty_strided((rows, cols), (1, rows))
    # scales_shape_1x32 / scales_shape_32x1 inlined (hot path): S_r = (M, K/32), S_c = (K, M/32)
    if num_groups:
        layout = "groups"
        shape_r = (rows + 128 * num_groups, ((cols >> 5) + 3) & -4)
        shape_c = ((cols + 127) & -128, (rows >> 5) + 4 * num_groups)
    elif blocked_scales:
        layout = "blocked"
        shape_r = ((rows + 127) & -128, ((cols >> 5) + 3) & -4)
        shape_c = ((cols + 127) & -128, ((rows >> 5) + 3) & -4)
    else:
        layout, shape_r, shape_c = "plain", (rows, cols >> 5), (cols, rows >> 5)
    if rows == 0 or cols == 0:  # nothing to quantize: only padding bytes (zeros)
        return q_r, x.new_zeros(shape_r, dtype=_E8M0), q_c, x.new_zeros(shape_c, dtype=_E8M0)
    s_r = target.e8m0.new_empty(*shape_r)
    s_c = target.e8m0.new_empty(*shape_c)
    key = ("quantize_dual", x.dtype, scaling_mode, layout)  # a DualKey's fields
    kernel = target.kernels.get(key) or target.kernel(DualKey._make(key), DualKey.variant)
    kernel(x, q_r, s_r, q_c, s_c, group_end_offsets)
    return q_r, s_r, q_c, s_c


def _run_dual(
    target: targets.DeviceTarget,
    x: torch.Tensor,
    group_end_offsets: torch.Tensor | None,
    scaling_mode: str,
    blocked_scales: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel path after the contract checks: alignment and group count, then the launch."""
    num_groups = checks.check_kernel_inputs(_OP, group_end_offsets, x)
    return _launch_dual(target, x, x.shape, group_end_offsets, num_groups, scaling_mode, blocked_scales)


def _fast_dual(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks and the kernel-path checks from
    metadata reads; the offsets' rank, device and stride are left to the kernel's wrapper
    (:func:`checks.fast_optional_groups`)."""
    x, group_end_offsets, scaling_mode, blocked_scales = args
    shape = checks.fast_quant_shape(x, scaling_mode, blocked_scales)
    if shape is None or len(shape) != 2 or shape[0] & _M_MASK:
        return None
    num_groups = checks.fast_optional_groups(group_end_offsets, blocked_scales, shape)
    if num_groups < 0:
        return None
    return _launch_dual(target, x, shape, group_end_offsets, num_groups, scaling_mode, blocked_scales)


@torch.library.custom_op("cute_kernels::quantize_mxfp8_2d_dual", mutates_args=())
def _dual_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _DUAL_OP.run_on_device(x, group_end_offsets, scaling_mode, blocked_scales)


@_dual_op.register_fake
def _dual_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _CONTRACT.fake(x, group_end_offsets, scaling_mode, blocked_scales)


def _dual_reference(x, group_end_offsets, scaling_mode, blocked_scales):
    return reference.quantize_mxfp8_2d_dual(
        x, group_end_offsets=group_end_offsets, scaling_mode=scaling_mode, blocked_scales=blocked_scales
    )


_DUAL_OP = KernelOp(_OP, _CONTRACT.check, _run_dual, _dual_reference, _dual_op, fast=_fast_dual)


def quantize_mxfp8_2d_dual(
    x: torch.Tensor,
    *,
    group_end_offsets: torch.Tensor | None = None,
    scaling_mode: str = "rceil",
    blocked_scales: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_1x32, scales_1x32, q_32x1, scales_32x1)`` of x (M, K), bf16/fp32, M and K multiples of
    32: bit-identical to ``quantize_mxfp8_2d`` with ``block="1x32"`` and ``block="32x1"`` (same
    offsets: M-groups 1x32 scales, K-groups 32x1 scales with ``kend = end / 32``), x read once by
    one kernel. No host sync."""
    return _DUAL_OP.dispatch(backend, x, group_end_offsets, scaling_mode, blocked_scales)
