"""PyTorch runners of the 32x1 quantization kernel (``cute_kernels.quantize_32x1``), 2D and 3D.

``launch_32x1_2d`` serves ``quantize_mxfp8_2d(block="32x1")`` (``run_32x1_2d``: the kernel-path
checks, alignment and group count, first; the eager fast path makes them itself) and
``launch_32x1_3d`` serves ``quantize_mxfp8_3d(block="32x1")``. They allocate the outputs with the
SPEC's shapes and strides (q^T storage) and launch on the current stream with no host sync.
``cute_kernels::quantize_mxfp8_2d_32x1`` is the 2D custom op (fake implementation for
``torch.compile``); the 3D path runs inside ``cute_kernels::quantize_mxfp8_3d``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cute_utils.constants import BLOCK_SIZE

from . import checks, contract, targets

_OP_2D = "quantize_mxfp8_2d"
_OP_3D = "quantize_mxfp8_3d"
_KERNEL = "quantize_32x1"  # cute_kernels.registry name
_BLOCK = BLOCK_SIZE
_E8M0 = torch.float8_e8m0fnu


class Quantize32x1Key(NamedTuple):
    """The 32x1 kernel's key in a device's table: x's torch ``dtype``, the scaling ``mode``, the
    scale ``layout`` (a ``ScaleLayout`` value) and ``rank`` (2: one matrix's operands as they are;
    3: expert weights)."""

    kernel: str
    dtype: torch.dtype
    mode: str
    layout: str
    rank: int

    def variant(self, target: targets.DeviceTarget):
        """The kernel's variant (imports the kernel module)."""
        from cute_kernels.quantize_32x1 import Quantize32x1Variant, ScaleLayout

        dtype = contract.dtype_name(self.dtype)
        return Quantize32x1Variant(dtype, self.mode, ScaleLayout(self.layout), self.rank)


def launch_32x1_2d(
    target: targets.DeviceTarget,
    x: torch.Tensor,
    shape: torch.Size,
    group_end_offsets: torch.Tensor | None,
    num_groups: int,
    mode: str,
    blocked: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """32x1 quantization of x of ``shape`` (M, K), M and K multiples of 32 (all checks done;
    ``num_groups`` 0 without offsets): q (M, K) with strides (1, M), scales E8M0 plain (K, M/32),
    blocked (Rp, Cp) or, with row end offsets, K-groups."""
    rows, cols = shape
    # S = (K, M/32): plain, blocked (Rp, Cp) or K-groups (Rp, M/32 + 4 G) (scales_shape_32x1 inlined)
    if num_groups:
        layout, scale_shape = "k_groups", ((cols + 127) & -128, (rows >> 5) + 4 * num_groups)
    elif blocked:
        layout, scale_shape = "blocked", ((cols + 127) & -128, ((rows >> 5) + 3) & -4)
    else:
        layout, scale_shape = "plain", (cols, rows >> 5)
    q = target.e4m3.new_empty_strided((rows, cols), (1, rows))
    if rows == 0 or cols == 0:  # nothing to quantize: only padding bytes (zeros)
        return q, x.new_zeros(scale_shape, dtype=_E8M0)
    scales = target.e8m0.new_empty(*scale_shape)
    # the rank-2 entry on the public tensors: (M, K) x and q (strides (1, M)), 2-D scales
    key = (_KERNEL, x.dtype, mode, layout, 2)  # a Quantize32x1Key's fields
    kernel = target.kernels.get(key) or target.kernel(Quantize32x1Key._make(key), Quantize32x1Key.variant)
    kernel(x, q, scales, group_end_offsets)
    return q, scales


def run_32x1_2d(
    x: torch.Tensor,
    group_end_offsets: torch.Tensor | None,
    mode: str,
    blocked: bool,
    target: targets.DeviceTarget,
) -> tuple[torch.Tensor, torch.Tensor]:
    """32x1 path of ``quantize_mxfp8_2d`` after the contract checks: the kernel-path checks
    (alignment, group count, K % 32), then :func:`launch_32x1_2d`."""
    num_groups = checks.check_kernel_inputs(_OP_2D, group_end_offsets, x)
    if x.shape[1] % _BLOCK:
        checks.check_divisible("x.shape[1] (K)", x.shape[1], _BLOCK, why="for the 32x1 kernel", op=_OP_2D)
    return launch_32x1_2d(target, x, x.shape, group_end_offsets, num_groups, mode, blocked)


def launch_32x1_3d(
    target: targets.DeviceTarget, w: torch.Tensor, shape: torch.Size, mode: str, blocked: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """32x1 quantization of expert weights w of ``shape`` (E, N, K) along N (contract checks and
    alignment done): q (E, N, K) with strides (N*K, 1, N), scales E8M0 per expert of S = (K, N/32):
    plain (E, K, N/32) or blocked (E, Rp, Cp) with every padding byte 0."""
    experts, rows, cols = shape
    q = target.e4m3.new_empty_strided((experts, rows, cols), (rows * cols, 1, rows))
    if blocked:  # per expert S = (K, N/32): plain, or blocked (Rp, Cp)
        scale_shape = (experts, (cols + 127) & -128, ((rows >> 5) + 3) & -4)
    else:
        scale_shape = (experts, cols, rows >> 5)
    if experts == 0 or rows == 0 or cols == 0:
        return q, w.new_zeros(scale_shape, dtype=_E8M0)
    checks.check_kernel_experts(_OP_3D, experts)
    scales = target.e8m0.new_empty(*scale_shape)
    # the rank-3 entry on the public tensors: (E, N, K) w and q (strides (N K, 1, N)), (E, R, C) scales
    key = (_KERNEL, w.dtype, mode, "blocked" if blocked else "plain", 3)  # a Quantize32x1Key's fields
    kernel = target.kernels.get(key) or target.kernel(Quantize32x1Key._make(key), Quantize32x1Key.variant)
    kernel(w, q, scales, None)
    return q, scales


@torch.library.custom_op("cute_kernels::quantize_mxfp8_2d_32x1", mutates_args=())
def quantize_2d_32x1_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Custom op of ``quantize_mxfp8_2d(block="32x1")`` on the kernel path (torch.compile)."""
    target = targets.select(_OP_2D, "cute", x)
    return run_32x1_2d(x, group_end_offsets, scaling_mode, blocked_scales, target)


@quantize_2d_32x1_op.register_fake
def quantize_2d_32x1_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return contract.QUANTIZE_MXFP8_2D.fake(x, "32x1", group_end_offsets, scaling_mode, blocked_scales)
