"""FP8 rowwise quantization (SPEC section 7): ``quantize_fp8_2d``, ``quantize_fp8_2d_dual``,
``quantize_fp8_3d``, ``quantize_fp8_3d_dual``.

Kernels: one scale per row (``cute_kernels.quantize_fp8.Fp8RowKernel``, one launch) for
``quantize_fp8_2d(axis="row")`` (its bounded variants when row groups are given: only the rows
below the last end) and ``quantize_fp8_3d(axis="K")``; column scales
(``cute_kernels.quantize_fp8_col``: a zero fill, the amax pass, the cast pass) for
``quantize_fp8_2d(axis="col")`` with and without row groups and ``quantize_fp8_3d(axis="N")``; the
duals run the column passes' dual variants (layouts plain / groups for 2-D, experts for 3-D), which
also produce the row outputs (x or w read twice).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cute_utils.constants import FP8_POW2_MASK

from . import checks, contract, reference, targets
from .op import KernelOp
from .quantize_3d import expert_rows

_OP_2D, _OP_DUAL, _OP_3D = "quantize_fp8_2d", "quantize_fp8_2d_dual", "quantize_fp8_3d"
_OP_DUAL_3D = "quantize_fp8_3d_dual"
_KERNEL = "quantize_fp8_row"  # cute_kernels.registry names
_COL_AMAX, _COL_CAST = "quantize_fp8_col_amax", "quantize_fp8_col_cast"
_COL_PAD_CAST = "quantize_fp8_col_pad_cast"  # the cast into padded groups (its amax: "groups")
PADDED = "padded"  # cute_kernels.quantize_fp8_col.PADDED, without importing the DSL
_E4M3 = torch.float8_e4m3fn
_QUANT_DTYPES = contract.QUANTIZE_FP8_2D.dtypes("x")  # every FP8 quantization op's (test_contract)
_ANY_GROUPS = 1 << 62  # the column kernels take any number of row groups


class Fp8RowKey(NamedTuple):
    """The row kernel's key in a device's table: x's torch ``dtype``, ``round_pow2``, ``vector``
    (16-byte steps), ``rank``, ``cols`` (K raw, one lookup per call: the kernels of one K class are
    one compile) and ``bounded`` (only the rows below the last group end)."""

    kernel: str
    dtype: torch.dtype
    round_pow2: bool
    vector: bool
    rank: int
    cols: int
    bounded: bool

    def variant(self, target: targets.DeviceTarget):
        """The kernel's variant (imports the kernel module)."""
        from cute_kernels.quantize_fp8 import Fp8RowVariant

        dtype = contract.dtype_name(self.dtype)
        return Fp8RowVariant(dtype, self.round_pow2, self.vector, self.rank, self.bounded)

    def config(self, variant, target: targets.DeviceTarget):
        """The config for the K class of the key's K (``cute_kernels.configs.pick_for_shape``); a
        bounded variant takes its unbounded twin's."""
        from cute_kernels import configs

        shape_class = f"{variant.dtype}/k{k_class(self.cols)}"
        return configs.pick_for_shape(_KERNEL, variant, target.arch, target.name, shape_class)


def k_class(cols: int) -> int:
    """K's class: the next power of 2 of K, at least 256 (the row kernel compiles once per class; the
    tuned tables of both kernels are keyed by it)."""
    return 1 << max(cols - 1, 255).bit_length()


class ColKey(NamedTuple):
    """A column pass's key in a device's table: its registry name (``kernel``), x's torch ``dtype``,
    the scale ``layout``, ``vector_loads``, ``vector_stores``, ``dual``, and the shape class's K
    class and group bucket (which stand for any K and G of their class)."""

    kernel: str
    dtype: torch.dtype
    layout: str
    vector_loads: bool
    vector_stores: bool
    dual: bool
    k_class: int
    group_bucket: int

    def variant(self, target: targets.DeviceTarget):
        """The column kernels' variant (imports the kernel module)."""
        from cute_kernels.quantize_fp8_col import Fp8ColVariant

        dtype = contract.dtype_name(self.dtype)
        return Fp8ColVariant(dtype, self.layout, self.vector_loads, self.vector_stores, self.dual)

    def config(self, variant, target: targets.DeviceTarget):
        """The pass's config for the key's shape class (``cute_kernels.configs.pick_for_shape``)."""
        from cute_kernels import configs

        # the cast into padded groups does the grouped cast's work per element: its tuned entries
        kernel, layout = (_COL_CAST, "groups") if variant.layout == PADDED else (self.kernel, variant.layout)
        shape_class = col_shape_class(variant.dtype, layout, self.k_class, self.group_bucket, variant.dual)
        return configs.pick_for_shape(kernel, variant, target.arch, target.name, shape_class)


class ColPassesKey(NamedTuple):
    """The key under which a device's table keeps both column passes of a call (no registry name:
    K and G raw, a few entries per (K, G) met): x's torch ``dtype``, the scale ``layout``,
    ``vector_loads``, ``vector_stores``, ``dual``, ``cols`` (K) and ``groups`` (G)."""

    dtype: torch.dtype
    layout: str
    vector_loads: bool
    vector_stores: bool
    dual: bool
    cols: int
    groups: int


def group_bucket(groups: int) -> int:
    """The column passes' group-count bucket: 1, then the next power of 8 (8, 64, 512, ...)."""
    bucket = 1
    while bucket < groups:
        bucket *= 8
    return bucket


def col_shape_class(dtype: str, layout: str, cols: int, groups: int, dual: bool = False) -> str:
    """The column passes' tuned-table key for x (M, cols) or w (E, N, cols) with ``groups`` scale
    rows (G, E or 1): ``"<dtype>/<layout>/k<K class>/g<group bucket>"``, the layout ``"<layout>+dual"``
    for the dual variants."""
    return f"{dtype}/{layout}{'+dual' if dual else ''}/k{k_class(cols)}/g{group_bucket(groups)}"


def _col_outputs(
    x: torch.Tensor, offsets: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, str, int]:
    """``(q, scales, layout, n)`` of the column quantization of x (M, K) or w (E, N, K): q with x's
    shape and the transposed strides ((1, M) / (N K, 1, N)), scales (n K,) or (E, K), n the number
    of scale rows (G, E or 1)."""
    *lead, rows, cols = x.shape
    if x.dim() == 3:
        q = x.new_empty_strided(x.shape, (rows * cols, 1, rows), dtype=_E4M3)
        return q, x.new_empty((lead[0], cols), dtype=torch.float32), "experts", lead[0]
    q = x.new_empty_strided(x.shape, (1, max(rows, 1)), dtype=_E4M3)
    groups = 1 if offsets is None else offsets.shape[0]
    layout = "plain" if offsets is None else "groups"
    return q, x.new_empty(groups * cols, dtype=torch.float32), layout, groups


def _col_passes(target: targets.DeviceTarget, key: tuple) -> tuple:
    """``(amax kernel, cast kernel)`` for ``key`` (a :class:`ColPassesKey`'s fields), found with one
    lookup; a miss classes K and G and takes each pass from ``target.kernel`` (one compile per
    distinct config). Layout :data:`PADDED`: the ``groups`` amax pass and the cast into padded
    groups."""
    passes = target.kernels.get(key)
    if passes is None:
        k = ColPassesKey._make(key)
        k_cls, bucket = k_class(k.cols), group_bucket(k.groups)
        padded = k.layout == PADDED
        amax_layout, cast_name = ("groups", _COL_PAD_CAST) if padded else (k.layout, _COL_CAST)
        amax = ColKey(_COL_AMAX, k.dtype, amax_layout, k.vector_loads, True, k.dual, k_cls, bucket)
        cast = ColKey(cast_name, k.dtype, k.layout, k.vector_loads, k.vector_stores, k.dual, k_cls, bucket)
        passes = target.kernels[k] = tuple(
            target.kernel(p, ColKey.variant, ColKey.config) for p in (amax, cast)
        )
    return passes


def _launch_cols(target: targets.DeviceTarget, x, offsets, round_pow2: bool, cols_out: tuple, rows_out=None):
    """The amax pass then the cast pass on x with at least one row and column: ``cols_out`` the
    ``(q, scales, layout, n)`` of :func:`_col_outputs`; ``rows_out`` (dual) ``(q_row, s_row)`` ((M, K)
    and (M,), or (E, N, K) and (E, N)), whose row amax words (M, or E N) follow the n K column words."""
    q, scales, layout, groups = cols_out
    rows, cols = x.shape[-2:]
    vector_loads = not (cols & 1 or x.data_ptr() % (2 * x.element_size()))
    vector_stores = not rows & 15  # q: fresh, 256-byte aligned
    dual = rows_out is not None
    row_words = x.numel() // cols if dual else 0  # M, or E N
    amax = torch.zeros(groups * cols + row_words, dtype=torch.int32, device=x.device)
    steps = groups.bit_length()
    key = (x.dtype, layout, vector_loads, vector_stores, dual, cols, groups)  # a ColPassesKey's fields
    amax_pass, cast_pass = _col_passes(target, key)
    amax_pass(x, amax, offsets, steps)
    mask = FP8_POW2_MASK if round_pow2 else -1
    cast_pass(x, q, amax, scales, offsets, mask, steps, *(rows_out or (None, None)))


def _run_cols(
    target: targets.DeviceTarget, x: torch.Tensor, offsets: torch.Tensor | None, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per column (per row group with ``offsets``) of x (M, K), or per column of each
    expert of w (E, N, K): q (:func:`_col_outputs`), scales (K,), (G K,) or (E, K). Two passes
    (amax, cast) after zeroing the amax words."""
    cols_out = _col_outputs(x, offsets)
    q, scales = cols_out[:2]
    if not scales.numel():
        return q, scales
    if not x.numel():  # no rows: every group is empty
        return q, scales.fill_(1.0)
    if x.dim() == 3:
        checks.check_kernel_experts(_OP_3D, x.shape[0])
    _launch_cols(target, x, offsets, round_pow2, cols_out)
    return q, scales


def _launch_rows(
    target: targets.DeviceTarget, x: torch.Tensor, shape: torch.Size, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row of x of ``shape`` (M, K) or (E, N, K) (checked; an (E, 1, K) x with its row
    stride fixed by :func:`_run_rows`): q in x's shape, row-major; scales ``shape[:-1]``."""
    q = target.e4m3.new_empty(*shape)
    scales = target.f32.new_empty(*shape[:-1])
    cols = shape[-1]
    if not cols:  # rows of no elements: scale 1.0 (and PyTorch's strides of (M, 0) are 1)
        return q, scales.fill_(1.0)
    if scales.numel():
        vector = not (cols & 7 or x.data_ptr() & 15)  # q: fresh, 512-byte aligned
        key = (_KERNEL, x.dtype, round_pow2, vector, len(shape), cols, False)  # an Fp8RowKey's fields
        kernel = target.kernels.get(key) or target.kernel(
            Fp8RowKey._make(key), Fp8RowKey.variant, Fp8RowKey.config
        )
        kernel(x, q, scales)
    return q, scales


def _launch_bounded_rows(
    target: targets.DeviceTarget, x: torch.Tensor, shape: torch.Size, round_pow2: bool, ends: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_launch_rows` of x (M, K) (checked) on the rows below the last of the group end
    offsets ``ends`` (G,) int32 (checked, or left to the kernel's wrapper when it surely launches):
    the rows past it are left unwritten (K = 0: every scale 1.0, no launch)."""
    q = target.e4m3.new_empty(*shape)
    scales = target.f32.new_empty(shape[0])
    cols = shape[1]
    if not cols:
        return q, scales.fill_(1.0)
    if shape[0]:
        vector = not (cols & 7 or x.data_ptr() & 15)  # q: fresh, 512-byte aligned
        key = (_KERNEL, x.dtype, round_pow2, vector, 2, cols, True)  # an Fp8RowKey's fields
        kernel = target.kernels.get(key) or target.kernel(
            Fp8RowKey._make(key), Fp8RowKey.variant, Fp8RowKey.config
        )
        kernel(x, q, scales, ends)
    return q, scales


def _run_rows(
    target: targets.DeviceTarget, x: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row of x (M, K) or w (E, N, K): q in x's shape, row-major; scales x.shape[:-1]."""
    if x.dim() == 3 and x.shape[1] == 1:  # the one shape whose row stride PyTorch leaves free
        x = expert_rows(x)
    return _launch_rows(target, x, x.shape, round_pow2)


def _fast_shape(x: torch.Tensor, round_pow2) -> torch.Size | None:
    """x's shape when x is a contiguous bf16/fp32 tensor and ``round_pow2`` a bool (the tests of
    the FP8 contracts' checks other than rank and axis); else None."""
    dtype = x.dtype
    if dtype in _QUANT_DTYPES and (round_pow2 is True or round_pow2 is False):
        if x.is_contiguous():
            return x.shape
    return None


# ----------------------------------------------------------------------------------------------
# quantize_fp8_2d
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::quantize_fp8_2d_row", mutates_args=())
def _rows_2d_op(x: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_rows(targets.select(_OP_2D, "cute", x), x, round_pow2)


@_rows_2d_op.register_fake
def _rows_2d_fake(x: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return contract.QUANTIZE_FP8_2D.fake(x, "row", None, round_pow2)


@torch.library.custom_op("cute_kernels::quantize_fp8_2d_row_bounded", mutates_args=())
def _rows_bounded_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    target = targets.select(_OP_2D, "cute", x)
    return _launch_bounded_rows(target, x, x.shape, round_pow2, group_end_offsets)


@_rows_bounded_op.register_fake
def _rows_bounded_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return contract.QUANTIZE_FP8_2D.fake(x, "row", group_end_offsets, round_pow2)


@torch.library.custom_op("cute_kernels::quantize_fp8_2d_col", mutates_args=())
def _cols_2d_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_cols(targets.select(_OP_2D, "cute", x), x, group_end_offsets, round_pow2)


@_cols_2d_op.register_fake
def _cols_2d_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return contract.QUANTIZE_FP8_2D.fake(x, "col", group_end_offsets, round_pow2)


def _fast_2d(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks from metadata reads."""
    x, axis, group_end_offsets, round_pow2 = args
    shape = _fast_shape(x, round_pow2)
    if shape is None or len(shape) != 2 or type(axis) is not str:
        return None
    if axis == "row":
        if group_end_offsets is None:
            return _launch_rows(target, x, shape, round_pow2)
        if (  # the bounded kernel's wrapper checks the offsets' rank, stride and device when it launches
            checks.fast_launch_groups(group_end_offsets, _ANY_GROUPS)
            if shape[0] and shape[1]
            else checks.fast_group_count(group_end_offsets, target.device, _ANY_GROUPS)
        ):
            return _launch_bounded_rows(target, x, shape, round_pow2, group_end_offsets)
        return None
    if axis == "col" and (
        group_end_offsets is None or checks.fast_group_count(group_end_offsets, target.device, _ANY_GROUPS)
    ):
        return _run_cols(target, x, group_end_offsets, round_pow2)
    return None


def _run_2d(target: targets.DeviceTarget, x, axis, group_end_offsets, round_pow2):
    if axis == "col":
        return _run_cols(target, x, group_end_offsets, round_pow2)
    if group_end_offsets is not None:
        return _launch_bounded_rows(target, x, x.shape, round_pow2, group_end_offsets)
    return _run_rows(target, x, round_pow2)


def _reference_2d(x, axis, group_end_offsets, round_pow2):
    return reference.quantize_fp8_2d(
        x, axis=axis, group_end_offsets=group_end_offsets, round_scales_to_power_of_2=round_pow2
    )


def _custom_2d(x, axis, group_end_offsets, round_pow2):
    if axis == "col":
        return _cols_2d_op(x, group_end_offsets, round_pow2)
    if group_end_offsets is not None:
        return _rows_bounded_op(x, group_end_offsets, round_pow2)
    return _rows_2d_op(x, round_pow2)


_QUANTIZE_2D = KernelOp(
    _OP_2D, contract.QUANTIZE_FP8_2D.check, _run_2d, _reference_2d, _custom_2d, fast=_fast_2d
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

    ``axis="row"``: one scale per row: q (M, K) ``float8_e4m3fn`` row-major, scales fp32 (M,); with
    int32 row-group end offsets (G,) only the rows below the last end (read on the device, clamped
    to [0, M]) are quantized and the rows past it are left unwritten (their q and scales
    unspecified, as the grouped GEMMs leave theirs; K = 0: every scale 1.0): an expert-parallel
    dispatch's static worst-case row count costs only the rows it filled.
    ``axis="col"``: one scale per column: q (M, K) with strides (1, M), scales (K,), or with int32
    row-group end offsets (G,) one per (group, column): scales (G*K,) group-major, an empty group's
    1.0 and rows past the last group's end quantize to 0. Scales are the dequantization multipliers
    ``1 / q_scale`` (``q * scale ~ x``), what ``torch._scaled_grouped_mm`` takes. Rows: one launch;
    columns: a zero fill and two passes over x (amax, cast). No host sync; no recompile when M or
    the offsets change, nor K within its compile class (the next power of 2 of K; columns also: K
    even or odd, M % 16, and the group-count bucket 1, <= 8, <= 64, ...).
    """
    return _QUANTIZE_2D.dispatch(backend, x, axis, group_end_offsets, round_scales_to_power_of_2)


# ----------------------------------------------------------------------------------------------
# quantize_fp8_2d_dual
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::quantize_fp8_2d_dual", mutates_args=())
def _dual_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_dual(targets.select(_OP_DUAL, "cute", x), x, group_end_offsets, round_pow2)


@_dual_op.register_fake
def _dual_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return contract.QUANTIZE_FP8_2D_DUAL.fake(x, group_end_offsets, round_pow2)


def _fast_dual(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks from metadata reads."""
    x, group_end_offsets, round_pow2 = args
    shape = _fast_shape(x, round_pow2)
    if shape is None or len(shape) != 2:
        return None
    if group_end_offsets is None or checks.fast_group_count(group_end_offsets, target.device, _ANY_GROUPS):
        return _run_dual(target, x, group_end_offsets, round_pow2)
    return None


def _run_dual(target: targets.DeviceTarget, x, group_end_offsets, round_pow2):
    """Both quantizations from two reads of x: the column passes' dual variants (the amax pass also
    folds each row's max into a row word, the cast pass also writes q_row and s_row)."""
    rows, cols = x.shape
    q_row, s_row = x.new_empty(x.shape, dtype=_E4M3), x.new_empty(rows, dtype=torch.float32)
    cols_out = _col_outputs(x, group_end_offsets)
    q_col, s_col = cols_out[:2]
    if not x.numel():  # rows of no elements: scale 1.0; no rows: every group is empty
        return q_row, s_row.fill_(1.0), q_col, s_col.fill_(1.0)
    _launch_cols(target, x, group_end_offsets, round_pow2, cols_out, (q_row, s_row))
    return q_row, s_row, q_col, s_col


def _reference_dual(x, group_end_offsets, round_pow2):
    return reference.quantize_fp8_2d_dual(
        x, group_end_offsets=group_end_offsets, round_scales_to_power_of_2=round_pow2
    )


_QUANTIZE_DUAL = KernelOp(
    _OP_DUAL, contract.QUANTIZE_FP8_2D_DUAL.check, _run_dual, _reference_dual, _dual_op, fast=_fast_dual
)


def quantize_fp8_2d_dual(
    x: torch.Tensor,
    *,
    group_end_offsets: torch.Tensor | None = None,
    round_scales_to_power_of_2: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_row, s_row, q_col, s_col)``: :func:`quantize_fp8_2d` with ``axis="row"`` and with
    ``axis="col"``, each with the row groups if given, bit for bit (SPEC section 7), from two reads
    of x: a zero fill, an amax pass (column or (group, column) maxima and row maxima) and a cast
    pass writing both q. With groups, q_row and s_row are the bounded row op's: the rows past the
    clamped last end are unspecified and left unwritten (docs/contract.md). No host sync; no
    recompile when M or the offsets change, nor K within its class (the next power of 2; K even or
    odd, M % 16) or G within its bucket (1, <= 8, <= 64, ...)."""
    return _QUANTIZE_DUAL.dispatch(backend, x, group_end_offsets, round_scales_to_power_of_2)


# ----------------------------------------------------------------------------------------------
# quantize_fp8_3d
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::quantize_fp8_3d_k", mutates_args=())
def _rows_3d_op(w: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_rows(targets.select(_OP_3D, "cute", w), w, round_pow2)


@_rows_3d_op.register_fake
def _rows_3d_fake(w: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return contract.QUANTIZE_FP8_3D.fake(w, "K", round_pow2)


@torch.library.custom_op("cute_kernels::quantize_fp8_3d_n", mutates_args=())
def _cols_3d_op(w: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _run_cols(targets.select(_OP_3D, "cute", w), w, None, round_pow2)


@_cols_3d_op.register_fake
def _cols_3d_fake(w: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return contract.QUANTIZE_FP8_3D.fake(w, "N", round_pow2)


def _fast_3d(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks from metadata reads."""
    w, axis, round_pow2 = args
    shape = _fast_shape(w, round_pow2)
    if shape is None or len(shape) != 3 or type(axis) is not str:
        return None
    if axis == "K" and shape[1] != 1:  # (E, 1, K): _run_rows fixes the row stride
        return _launch_rows(target, w, shape, round_pow2)
    if axis == "N":
        return _run_cols(target, w, None, round_pow2)
    return None


def _run_3d(target: targets.DeviceTarget, w, axis, round_pow2):
    if axis == "N":
        return _run_cols(target, w, None, round_pow2)
    return _run_rows(target, w, round_pow2)


def _reference_3d(w, axis, round_pow2):
    return reference.quantize_fp8_3d(w, axis=axis, round_scales_to_power_of_2=round_pow2)


def _custom_3d(w, axis, round_pow2):
    if axis == "N":
        return _cols_3d_op(w, round_pow2)
    return _rows_3d_op(w, round_pow2)


_QUANTIZE_3D = KernelOp(
    _OP_3D, contract.QUANTIZE_FP8_3D.check, _run_3d, _reference_3d, _custom_3d, fast=_fast_3d
)


def quantize_fp8_3d(
    w: torch.Tensor, *, axis: str = "K", round_scales_to_power_of_2: bool = True, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 rowwise quantization of expert weights w (E, N, K), bf16 or fp32, contiguous (SPEC 7).

    ``axis="K"``: amax over K: q (E, N, K) row-major, scales fp32 (E, N) (the forward's right
    operand is ``q.transpose(-2, -1)``). ``axis="N"``: amax over N: q (E, N, K) with strides
    (N*K, 1, N), scales (E, K) (two passes over w: amax, cast; at most 65535 experts on the kernel
    path). Scales are ``1 / q_scale``. No host sync; no recompile when N changes, nor K within its
    class (the next power of 2) or, with ``axis="N"``, E within its bucket (<= 8, <= 64, ...).
    """
    return _QUANTIZE_3D.dispatch(backend, w, axis, round_scales_to_power_of_2)


# ----------------------------------------------------------------------------------------------
# quantize_fp8_3d_dual
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::quantize_fp8_3d_dual", mutates_args=())
def _dual_3d_op(
    w: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_dual_3d(targets.select(_OP_DUAL_3D, "cute", w), w, round_pow2)


@_dual_3d_op.register_fake
def _dual_3d_fake(
    w: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return contract.QUANTIZE_FP8_3D_DUAL.fake(w, round_pow2)


def _fast_dual_3d(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks from metadata reads."""
    w, round_pow2 = args
    shape = _fast_shape(w, round_pow2)
    if shape is None or len(shape) != 3:
        return None
    return _run_dual_3d(target, w, round_pow2)


def _run_dual_3d(target: targets.DeviceTarget, w, round_pow2):
    """Both quantizations of w (E, N, K) from two reads of w: the column passes' experts dual
    variants (the amax pass also folds each row (e, n)'s max into a row word, the cast pass also
    writes q_k (E, N, K) row-major and s_k (E, N))."""
    experts, n, k = w.shape
    q_k, s_k = target.e4m3.new_empty(experts, n, k), target.f32.new_empty(experts, n)
    cols_out = _col_outputs(w, None)
    q_n, s_n = cols_out[:2]
    if not w.numel():  # rows of no elements: scale 1.0; no rows: every expert's columns are empty
        return q_k, s_k.fill_(1.0), q_n, s_n.fill_(1.0)
    checks.check_kernel_experts(_OP_DUAL_3D, experts)
    _launch_cols(target, w, None, round_pow2, cols_out, (q_k, s_k))
    return q_k, s_k, q_n, s_n


def _reference_dual_3d(w, round_pow2):
    return reference.quantize_fp8_3d_dual(w, round_scales_to_power_of_2=round_pow2)


_QUANTIZE_DUAL_3D = KernelOp(
    _OP_DUAL_3D,
    contract.QUANTIZE_FP8_3D_DUAL.check,
    _run_dual_3d,
    _reference_dual_3d,
    _dual_3d_op,
    fast=_fast_dual_3d,
)


def quantize_fp8_3d_dual(
    w: torch.Tensor, *, round_scales_to_power_of_2: bool = True, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_k, s_k, q_n, s_n)``: :func:`quantize_fp8_3d` of expert weights w (E, N, K), bf16 or fp32,
    contiguous, with ``axis="K"`` (q_k ``float8_e4m3fn`` (E, N, K) row-major, s_k fp32 (E, N)) and
    with ``axis="N"`` (q_n (E, N, K) with strides (N*K, 1, N), s_n fp32 (E, K)), bit for bit (SPEC
    section 7), from two reads of w instead of three: a zero fill, an amax pass (column and row
    maxima) and a cast pass writing both q (the column passes' experts dual variants; at most 65535
    experts on the kernel path). Scales are ``1 / q_scale``. No host sync; no recompile when N
    changes (within N % 16), nor K within its class (the next power of 2; K even or odd) or E within
    its bucket (<= 8, <= 64, ...)."""
    return _QUANTIZE_DUAL_3D.dispatch(backend, w, round_scales_to_power_of_2)
