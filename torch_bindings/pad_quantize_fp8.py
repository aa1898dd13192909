"""``pad_and_quantize_fp8_2d_cols``: token-group padding fused into the grouped FP8 column
quantization (the wgrad operand of the FP8 rowwise recipe).

The column passes of ``quantize_fp8_2d(axis="col")`` (a zero fill, the ``groups`` amax pass on x,
then ``cute_kernels.quantize_fp8_col.Fp8ColPadCastKernel``) write q straight into the padded
groups: x is never padded, and the padded offsets come from the cast's own group scan. No host
sync; the output row count is the static bound of SPEC section 4.
"""

from __future__ import annotations

import torch

from cute_kernels.op_specs import padded_rows
from cute_utils.constants import FP8_POW2_MASK

from . import checks, contract, reference, targets
from .op import KernelOp
from .quantize_fp8 import PADDED, _col_passes, _fast_shape

_OP = "pad_and_quantize_fp8_2d_cols"
_CONTRACT = contract.PAD_AND_QUANTIZE_FP8_2D_COLS


def _launch(
    target: targets.DeviceTarget,
    x: torch.Tensor,
    shape: torch.Size,
    group_end_offsets: torch.Tensor,
    num_groups: int,
    alignment: int,
    round_pow2: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Allocate the outputs for x of ``shape`` (M, K) with ``num_groups`` (1 .. ``MAX_GROUPS``)
    groups and launch the passes (all checks done). With no rows or no columns nothing is read:
    the outputs come from their definitions (q zeros, scales 1.0, the padded offsets by PyTorch
    ops, no sync)."""
    rows, cols = shape
    prows = padded_rows(rows, num_groups, alignment)
    q = target.e4m3.new_empty_strided((prows, cols), (1, prows))
    scales = target.f32.new_empty(num_groups * cols)
    if not (rows and cols):
        padded_start, padded_end = reference.padded_group_offsets(group_end_offsets, alignment)
        return q.zero_(), scales.fill_(1.0), padded_start, padded_end
    padded_start = group_end_offsets.new_empty(num_groups)
    padded_end = group_end_offsets.new_empty(num_groups)
    vector_loads = not (cols & 1 or x.data_ptr() % (2 * x.element_size()))
    amax = torch.zeros(num_groups * cols, dtype=torch.int32, device=x.device)
    steps = num_groups.bit_length()
    key = (x.dtype, PADDED, vector_loads, True, False, cols, num_groups)  # a ColPassesKey's fields
    amax_pass, cast_pass = _col_passes(target, key)
    amax_pass(x, amax, group_end_offsets, steps)
    mask = FP8_POW2_MASK if round_pow2 else -1
    cast_pass(x, q, amax, scales, group_end_offsets, padded_start, padded_end, mask, steps, alignment)
    return q, scales, padded_start, padded_end


@torch.library.custom_op("cute_kernels::pad_and_quantize_fp8_2d_cols", mutates_args=())
def _pad_cols_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _PAD_COLS.run_on_device(x, group_end_offsets, alignment, round_pow2)


@_pad_cols_op.register_fake
def _pad_cols_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _CONTRACT.fake(x, group_end_offsets, alignment, round_pow2)


# The op's parts for ``KernelOp``, all on ``(x, group_end_offsets, alignment, round_pow2)``.


def _fast(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks and the kernel-path checks from metadata reads (the
    column passes' keys name no kernel whose wrapper the offsets' rank could be left to)."""
    x, group_end_offsets, alignment, round_pow2 = args
    shape = _fast_shape(x, round_pow2)
    if shape is None or len(shape) != 2 or not (shape[0] and shape[1]):
        return None
    if not checks.fast_alignment_ok(alignment):
        return None
    num_groups = checks.fast_group_count(group_end_offsets, target.device)
    if not num_groups:
        return None
    return _launch(target, x, shape, group_end_offsets, num_groups, alignment, round_pow2)


def _run(target: targets.DeviceTarget, x, group_end_offsets, alignment, round_pow2):
    num_groups = checks.check_kernel_group_count(_OP, group_end_offsets)  # any x alignment: element loads
    return _launch(target, x, x.shape, group_end_offsets, num_groups, alignment, round_pow2)


def _reference(x, group_end_offsets, alignment, round_pow2):
    return reference.pad_and_quantize_fp8_2d_cols(
        x, group_end_offsets, alignment=alignment, round_scales_to_power_of_2=round_pow2
    )


_PAD_COLS = KernelOp(_OP, _CONTRACT.check, _run, _reference, _pad_cols_op, fast=_fast)


def pad_and_quantize_fp8_2d_cols(
    x: torch.Tensor,
    group_end_offsets: torch.Tensor,
    *,
    alignment: int = 16,
    round_scales_to_power_of_2: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The grouped FP8 column (wgrad) operand of x (M, K) written into token groups padded to
    ``alignment`` rows, in the passes of the unpadded one (SPEC sections 4 and 7): exactly
    ``quantize_fp8_2d(pad_token_groups(x, offs, alignment=A)[0], axis="col",
    group_end_offsets=padded_end)``, without the pad pass.

    x: bf16/fp32 contiguous; ``group_end_offsets`` int32 (G,) on x's device; ``alignment`` in {16,
    32, 64, 128}. Returns ``(q, scales, padded_start, padded_end)``: q ``float8_e4m3fn`` (P, K) with
    strides (1, P), P = ``A ceil((M + G A) / A)``, group g's rows at ``[padded_start[g],
    padded_start[g] + n_g)``, its padding rows the quantized zeros (0, 0x7F in a column whose group
    amax is NaN), rows past the last padded group 0; scales fp32 (G*K,) group-major (an empty
    group's 1.0); the padded offsets int32 (G,), what the grouped GEMM's 2d x 2d (wgrad) form takes
    with this q. No host sync; offsets are clamped, never trusted.
    """
    return _PAD_COLS.dispatch(backend, x, group_end_offsets, alignment, round_scales_to_power_of_2)
