"""``quantize_mxfp8_2d``: PyTorch entry point of the 1x32 quantization kernel (``cute_kernels.quantize``).

The 32x1 block runs ``cute_kernels.quantize_32x1`` through ``torch_bindings.quantize_32x1``.
The 1x32 kernel's key in a device's table is a :class:`Quantize1x32Key` (dtype, mode, layout, max
groups: ``GROUP_CAPACITY[G]`` for the M-groups layout and ``pad_quantize``'s padded one, else
``MAX_GROUPS``; rank 3 for the entry that takes ``quantize_3d``'s (E, N, K) operands); the variant
(and the kernel module) is built only on a miss.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cute_kernels.op_specs import GROUP_CAPACITY

from . import checks, contract, reference, targets
from .op import KernelOp
from .quantize_32x1 import launch_32x1_2d, quantize_2d_32x1_op, run_32x1_2d

_OP = "quantize_mxfp8_2d"
_CONTRACT = contract.QUANTIZE_MXFP8_2D
_M_MASK = _CONTRACT.divisor("x", "M") - 1  # 32x1 blocks along M
KERNEL = "quantize_1x32"  # cute_kernels.registry name
MAX_GROUPS = checks.MAX_KERNEL_GROUPS
_E4M3 = torch.float8_e4m3fn
_E8M0 = torch.float8_e8m0fnu


class Quantize1x32Key(NamedTuple):
    """The 1x32 kernel's key in a device's table: x's torch ``dtype``, the scaling ``mode``, the
    scale ``layout`` (a ``ScaleLayout`` value), ``max_groups`` (the group capacity) and ``rank``
    (3: the entry taking (E, N, K) operands)."""

    kernel: str
    dtype: torch.dtype
    mode: str
    layout: str
    max_groups: int
    rank: int

    def variant(self, target: targets.DeviceTarget):
        """The kernel's variant on ``target`` (its SM count sizes the grouped layouts' waves)."""
        from cute_kernels.quantize import Quantize1x32Variant, ScaleLayout

        dtype = contract.dtype_name(self.dtype)
        layout = ScaleLayout(self.layout)
        return Quantize1x32Variant(dtype, self.mode, layout, self.max_groups, target.num_sms, self.rank)


def launch_1x32_2d(
    target: targets.DeviceTarget,
    x: torch.Tensor,
    shape: torch.Size,
    group_end_offsets: torch.Tensor | None,
    num_groups: int,
    mode: str,
    blocked: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate (q, scales) for x of ``shape`` (M, K) and launch the 1x32 kernel once (all checks
    done; ``num_groups`` 0 without offsets)."""
    rows, cols = shape
    padded_cols = ((cols >> 5) + 3) & -4  # integer form of scales_shape_1x32 (hot path)
    if num_groups:
        layout, key_groups = "m_groups", GROUP_CAPACITY[num_groups]
        scales = target.e8m0.new_empty(rows + 128 * num_groups, padded_cols)
    elif blocked:
        layout, key_groups = "blocked", MAX_GROUPS
        scales = target.e8m0.new_empty((rows + 127) & -128, padded_cols)
    else:
        layout, key_groups = "plain", MAX_GROUPS
        scales = target.e8m0.new_empty(rows, cols >> 5)
    q = target.e4m3.new_empty(rows, cols)
    if scales.numel():
        key = (KERNEL, x.dtype, mode, layout, key_groups, 2)  # a Quantize1x32Key's fields
        kernel = target.kernels.get(key) or target.kernel(Quantize1x32Key._make(key), Quantize1x32Key.variant)
        kernel(x, q, scales, group_end_offsets, None, None, 0)
    return q, scales


@torch.library.custom_op("cute_kernels::quantize_mxfp8_2d_1x32", mutates_args=())
def _quantize_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _QUANTIZE_2D.run_on_device(x, "1x32", group_end_offsets, scaling_mode, blocked_scales)


@_quantize_op.register_fake
def _quantize_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _CONTRACT.fake(x, "1x32", group_end_offsets, scaling_mode, blocked_scales)


# The op's parts for ``KernelOp``, all on ``(x, block, group_end_offsets, scaling_mode, blocked_scales)``:
# the block picks the 1x32 kernel (above) or the 32x1 one (``torch_bindings.quantize_32x1``).


def _fast(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks and the kernel-path checks from metadata
    reads; the offsets' rank, device and stride are left to the kernel's wrapper
    (:func:`checks.fast_optional_groups`)."""
    x, block, group_end_offsets, scaling_mode, blocked_scales = args
    shape = checks.fast_quant_shape(x, scaling_mode, blocked_scales)
    if shape is None or len(shape) != 2 or type(block) is not str:
        return None
    num_groups = checks.fast_optional_groups(group_end_offsets, blocked_scales, shape)
    if num_groups < 0:
        return None
    if block == "1x32":
        return launch_1x32_2d(target, x, shape, group_end_offsets, num_groups, scaling_mode, blocked_scales)
    if block == "32x1" and not shape[0] & _M_MASK:
        return launch_32x1_2d(target, x, shape, group_end_offsets, num_groups, scaling_mode, blocked_scales)
    return None


def _run(target: targets.DeviceTarget, x, block, group_end_offsets, scaling_mode, blocked_scales):
    """The kernel path after the contract checks: the kernel-path checks (alignment, group count),
    then the block's launcher."""
    if block != "1x32":
        return run_32x1_2d(x, group_end_offsets, scaling_mode, blocked_scales, target)
    num_groups = checks.check_kernel_inputs(_OP, group_end_offsets, x)
    return launch_1x32_2d(target, x, x.shape, group_end_offsets, num_groups, scaling_mode, blocked_scales)


def _reference(x, block, group_end_offsets, scaling_mode, blocked_scales):
    return reference.quantize_mxfp8_2d(
        x,
        block=block,
        group_end_offsets=group_end_offsets,
        scaling_mode=scaling_mode,
        blocked_scales=blocked_scales,
    )


def _custom_op(x, block, group_end_offsets, scaling_mode, blocked_scales):
    op = _quantize_op if block == "1x32" else quantize_2d_32x1_op
    return op(x, group_end_offsets, scaling_mode, blocked_scales)


_QUANTIZE_2D = KernelOp(_OP, _CONTRACT.check, _run, _reference, _custom_op, fast=_fast)


def quantize_mxfp8_2d(
    x: torch.Tensor,
    *,
    block: str = "1x32",
    group_end_offsets: torch.Tensor | None = None,
    scaling_mode: str = "rceil",
    blocked_scales: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize x (M, K), bf16 or fp32, contiguous (SPEC sections 2, 3 and 5).

    ``block="1x32"`` (K % 32 == 0): q (M, K) ``float8_e4m3fn`` row-major; scales
    ``float8_e8m0fnu``: (M, K/32) with ``blocked_scales=False``, else the blocked layout (Rp, Cp),
    or with int32 row end offsets the M-groups layout (M + 128 G, Cp) for any group sizes, written
    by the quantization kernel itself. One launch, no host sync, no recompile when M or the
    offsets change.

    ``block="32x1"`` (M % 32 == 0): q (M, K) with strides (1, M); scales of S = (K, M/32): plain
    (K, M/32), blocked (Rp, Cp), or with row end offsets (multiples of 32) the K-groups layout
    (Rp, M/32 + 4 G), written by the 32x1 kernel (``cute_kernels.quantize_32x1``).
    """
    return _QUANTIZE_2D.dispatch(backend, x, block, group_end_offsets, scaling_mode, blocked_scales)
