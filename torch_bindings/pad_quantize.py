"""``pad_and_quantize_mxfp8_2d``: token-group padding fused into the 1x32 quantization.

One launch of the ``padded`` variant of ``cute_kernels.quantize``: x is read once, and the kernel
writes the padded E4M3 rows (padding rows zero), the M-groups blocked scales of the padded groups
and the padded group offsets. No host sync; the output row count is the static bound of SPEC
section 4.
"""

from __future__ import annotations

import torch

from cute_kernels.op_specs import GROUP_CAPACITY, padded_rows

from . import checks, contract, reference, targets
from .op import KernelOp
from .quantize import KERNEL, Quantize1x32Key

_OP = "pad_and_quantize_mxfp8_2d"
_CONTRACT = contract.PAD_AND_QUANTIZE_MXFP8_2D


def _launch(
    target: targets.DeviceTarget,
    x: torch.Tensor,
    shape: torch.Size,
    group_end_offsets: torch.Tensor,
    num_groups: int,
    alignment: int,
    mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Allocate the outputs for x of ``shape`` (M, K) with ``num_groups`` (1 .. ``MAX_GROUPS``)
    groups and launch (all checks done): the contract's output shapes from integers (hot path;
    the tests compare both with the reference)."""
    rows, cols = shape
    prows = padded_rows(rows, num_groups, alignment)
    q = target.e4m3.new_empty(prows, cols)
    scales = target.e8m0.new_empty(prows + 128 * num_groups, ((cols >> 5) + 3) & -4)
    if not cols:  # K == 0: no data to quantize, only the padded offsets
        padded_start, padded_end = reference.padded_group_offsets(group_end_offsets, alignment)
        return q, scales, padded_start, padded_end
    padded_start = group_end_offsets.new_empty(num_groups)
    padded_end = group_end_offsets.new_empty(num_groups)
    key = (KERNEL, x.dtype, mode, "padded", GROUP_CAPACITY[num_groups], 2)  # a Quantize1x32Key's fields
    kernel = target.kernels.get(key) or target.kernel(Quantize1x32Key._make(key), Quantize1x32Key.variant)
    kernel(x, q, scales, group_end_offsets, padded_start, padded_end, alignment)
    return q, scales, padded_start, padded_end


def _run_kernel(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int, mode: str, target: targets.DeviceTarget
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    num_groups = checks.check_kernel_inputs(_OP, group_end_offsets, x)
    return _launch(target, x, x.shape, group_end_offsets, num_groups, alignment, mode)


@torch.library.custom_op("cute_kernels::pad_and_quantize_mxfp8_2d", mutates_args=())
def _pad_quantize_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int, scaling_mode: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _PAD_QUANTIZE.run_on_device(x, group_end_offsets, alignment, scaling_mode)


@_pad_quantize_op.register_fake
def _pad_quantize_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int, scaling_mode: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _CONTRACT.fake(x, group_end_offsets, alignment, scaling_mode)


# The op's parts for ``KernelOp``, all on ``(x, group_end_offsets, alignment, scaling_mode)``.


def _fast(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks and the kernel-path checks from
    metadata reads; the offsets' rank, device and stride are left to the kernel's wrapper (launched
    unless K == 0, which this path declines)."""
    x, group_end_offsets, alignment, scaling_mode = args
    shape = checks.fast_quant_shape(x, scaling_mode, True)
    if shape is None or len(shape) != 2 or not shape[1] or not checks.fast_alignment_ok(alignment):
        return None  # (K == 0 launches nothing)
    num_groups = checks.fast_launch_groups(group_end_offsets)  # the kernel's wrapper checks the rest
    if not num_groups:
        return None
    return _launch(target, x, shape, group_end_offsets, num_groups, alignment, scaling_mode)


def _run(target: targets.DeviceTarget, x, group_end_offsets, alignment, scaling_mode):
    return _run_kernel(x, group_end_offsets, alignment, scaling_mode, target)


def _reference(x, group_end_offsets, alignment, scaling_mode):
    return reference.pad_and_quantize_mxfp8_2d(
        x, group_end_offsets, alignment=alignment, scaling_mode=scaling_mode
    )


_PAD_QUANTIZE = KernelOp(_OP, _CONTRACT.check, _run, _reference, _pad_quantize_op, fast=_fast)


def pad_and_quantize_mxfp8_2d(
    x: torch.Tensor,
    group_end_offsets: torch.Tensor,
    *,
    alignment: int = 32,
    scaling_mode: str = "rceil",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad each token group of x (M, K) to a multiple of ``alignment`` rows and MXFP8-quantize it
    along K in one pass (SPEC sections 4 and 5): exactly
    ``quantize_mxfp8_2d(pad_token_groups(x, offs, alignment=A)[0], group_end_offsets=padded_end)``.

    x: bf16/fp32 contiguous, K % 32 == 0; ``group_end_offsets`` int32 (G,) on x's device;
    ``alignment`` in {16, 32, 64, 128}. Returns ``(q, scales, padded_start, padded_end)``: q
    (``A ceil((M + G A) / A)``, K) ``float8_e4m3fn`` with every row outside a group zero; scales
    ``float8_e8m0fnu`` in the M-groups blocked layout of the padded groups, (rows + 128 G, Cp);
    the padded offsets int32 (G,). One launch, no host sync; offsets are clamped, never trusted.
    """
    return _PAD_QUANTIZE.dispatch(backend, x, group_end_offsets, alignment, scaling_mode)
