"""``pad_and_quantize_fp8_2d_cols``: token-group padding fused into the grouped FP8 column
quantization (the wgrad operand of the FP8 rowwise recipe); ``pad_and_quantize_fp8_2d_dual``: the
same with the row operand from the same two reads of x (the column passes' dual variants).

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
    dual: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Allocate the outputs for x of ``shape`` (M, K) with ``num_groups`` (1 .. ``MAX_GROUPS``)
    groups and launch the passes (all checks done): ``(q, scales, padded_start, padded_end)``,
    after ``(q_row, s_row)`` when ``dual`` (the dual amax pass, whose M row words follow the G K
    column words, and the dual cast). With no rows or no columns nothing is read: the outputs come
    from their definitions (q zeros, scales 1.0, the padded offsets by PyTorch ops, no sync)."""
    rows, cols = shape
    prows = padded_rows(rows, num_groups, alignment)
    q = target.e4m3.new_empty_strided((prows, cols), (1, prows))
    scales = target.f32.new_empty(num_groups * cols)
    rows_out = (target.e4m3.new_empty((rows, cols)), target.f32.new_empty(rows)) if dual else ()
    if not (rows and cols):
        padded_start, padded_end = reference.padded_group_offsets(group_end_offsets, alignment)
        if dual:
            rows_out[1].fill_(1.0)  # a row of no columns
        return (*rows_out, q.zero_(), scales.fill_(1.0), padded_start, padded_end)
    padded_start = group_end_offsets.new_empty(num_groups)
    padded_end = group_end_offsets.new_empty(num_groups)
    vector_loads = not (cols & 1 or x.data_ptr() % (2 * x.element_size()))
    amax = torch.zeros(num_groups * cols + (rows if dual else 0), dtype=torch.int32, device=x.device)
    steps = num_groups.bit_length()
    key = (x.dtype, PADDED, vector_loads, True, dual, cols, num_groups)  # a ColPassesKey's fields
    amax_pass, cast_pass = _col_passes(target, key)
    amax_pass(x, amax, group_end_offsets, steps)
    mask = FP8_POW2_MASK if round_pow2 else -1
    offsets = (group_end_offsets, padded_start, padded_end)
    cast_pass(x, q, amax, scales, *offsets, mask, steps, alignment, *(rows_out or (None, None)))
    return (*rows_out, q, scales, padded_start, padded_end)


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


# The ops' parts for ``KernelOp``, all on ``(x, group_end_offsets, alignment, round_pow2)``.


def _fast_launch(target: targets.DeviceTarget, args: tuple, dual: bool):
    """``KernelOp.fast`` (``dual``: of the dual op): the contract's checks and the kernel-path checks
    from metadata reads (the column passes' keys name no kernel whose wrapper the offsets' rank
    could be left to)."""
    x, group_end_offsets, alignment, round_pow2 = args
    shape = _fast_shape(x, round_pow2)
    if shape is None or len(shape) != 2 or not (shape[0] and shape[1]):
        return None
    if not checks.fast_alignment_ok(alignment):
        return None
    num_groups = checks.fast_group_count(group_end_offsets, target.device)
    if not num_groups:
        return None
    return _launch(target, x, shape, group_end_offsets, num_groups, alignment, round_pow2, dual)


def _kernel_op(op: str, op_contract, custom_op, dual: bool, reference_fn) -> KernelOp:
    """The ``KernelOp`` of ``op`` (the column op, or with ``dual`` the dual): its checks, kernel path,
    reference, custom op and fast path."""

    def run(target: targets.DeviceTarget, x, group_end_offsets, alignment, round_pow2):
        num_groups = checks.check_kernel_group_count(op, group_end_offsets)  # any x alignment: element loads
        return _launch(target, x, x.shape, group_end_offsets, num_groups, alignment, round_pow2, dual)

    def reference_op(x, group_end_offsets, alignment, round_pow2):
        return reference_fn(x, group_end_offsets, alignment=alignment, round_scales_to_power_of_2=round_pow2)

    def fast(target: targets.DeviceTarget, args: tuple):
        return _fast_launch(target, args, dual)

    return KernelOp(op, op_contract.check, run, reference_op, custom_op, fast=fast)


_PAD_COLS = _kernel_op(_OP, _CONTRACT, _pad_cols_op, False, reference.pad_and_quantize_fp8_2d_cols)


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


# ----------------------------------------------------------------------------------------------
# pad_and_quantize_fp8_2d_dual
# ----------------------------------------------------------------------------------------------

_OP_DUAL = "pad_and_quantize_fp8_2d_dual"
_CONTRACT_DUAL = contract.PAD_AND_QUANTIZE_FP8_2D_DUAL


@torch.library.custom_op("cute_kernels::pad_and_quantize_fp8_2d_dual", mutates_args=())
def _pad_dual_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _PAD_DUAL.run_on_device(x, group_end_offsets, alignment, round_pow2)


@_pad_dual_op.register_fake
def _pad_dual_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _CONTRACT_DUAL.fake(x, group_end_offsets, alignment, round_pow2)


_PAD_DUAL = _kernel_op(_OP_DUAL, _CONTRACT_DUAL, _pad_dual_op, True, reference.pad_and_quantize_fp8_2d_dual)


def pad_and_quantize_fp8_2d_dual(
    x: torch.Tensor,
    group_end_offsets: torch.Tensor,
    *,
    alignment: int = 16,
    round_scales_to_power_of_2: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both FP8 rowwise operands of x (M, K) from two reads of x: its rows, as
    ``quantize_fp8_2d(x, axis="row", group_end_offsets=offs)``, and its grouped column (wgrad)
    operand in token groups padded to ``alignment`` rows, as :func:`pad_and_quantize_fp8_2d_cols`,
    bit for bit (SPEC sections 4 and 7). x is read by the dual amax pass (row and column maxima)
    and the dual cast, against three reads for the two ops.

    Same arguments as :func:`pad_and_quantize_fp8_2d_cols`. Returns ``(q_row, s_row, q_col, s_col,
    padded_start, padded_end)``: q_row ``float8_e4m3fn`` (M, K) row-major and s_row fp32 (M,), the
    rows past the last group end unspecified (left unwritten, as the bounded row op's), then
    :func:`pad_and_quantize_fp8_2d_cols`'s four outputs. No host sync; offsets are clamped, never
    trusted.
    """
    rounding = round_scales_to_power_of_2
    return _PAD_DUAL.dispatch(backend, x, group_end_offsets, alignment, rounding)
