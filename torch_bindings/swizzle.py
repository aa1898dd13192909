"""``swizzle_scales``: PyTorch entry point of the blocked-scale kernel (``cute_kernels.swizzle``).

The eager hot path imports no kernel module: it picks the variant's :class:`SwizzleKey` (layout,
rank, word loads, wide window, ragged end; one of the prebuilt keys, so a call allocates none;
:meth:`SwizzleKey.variant` builds the variant on a device's first use of it) from host-side copies
of the kernel's limits (``SwizzleKernel.can_implement``, ``wide_window``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cute_kernels.op_specs import blocked_output_shape
from cute_utils.constants import SWIZZLE_WIDE_MAX_BYTES

from . import checks, contract, reference, targets
from .op import KernelOp

_OP = "swizzle_scales"
_CONTRACT = contract.SWIZZLE_SCALES


_E8M0, _U8 = torch.float8_e8m0fnu, torch.uint8
_SCALE_DTYPES, _GROUPS = _CONTRACT.dtypes("scales"), _CONTRACT.choices("groups")


class SwizzleKey(NamedTuple):
    """A swizzle variant's key in a device's kernel table: ``layout`` (a ``SwizzleLayout`` value),
    ``rank`` (3: plain (E, R, C)), ``word_loads`` (rows of whole, aligned 4-byte words),
    ``wide`` (the 128-column-window config, :func:`wide_window`), ``ragged_end`` (raw-word loads
    of a source that may end inside an aligned word)."""

    kernel: str
    layout: str
    rank: int
    word_loads: bool
    wide: bool
    ragged_end: bool

    def variant(self, target: targets.DeviceTarget):
        """The ``SwizzleVariant`` of this key (imports the kernel module)."""
        from cute_kernels.swizzle import SwizzleLayout, SwizzleVariant

        return SwizzleVariant(
            SwizzleLayout(self.layout), self.rank, self.word_loads, self.wide, ragged_end=self.ragged_end
        )


class _Loads(NamedTuple):
    """The two keys of one layout, rank and window: ``aligned`` (plain and M-groups: word loads;
    K-groups, whose rows are never loaded as words: raw words of a source ending on a word) and
    ``ragged`` (raw words of a source that may end inside an aligned word)."""

    aligned: SwizzleKey
    ragged: SwizzleKey


def _loads(layout: str, rank: int = 2, wide: bool = False) -> _Loads:
    words = layout != "k_groups"
    return _Loads(
        SwizzleKey("swizzle", layout, rank, words, wide, False),
        SwizzleKey("swizzle", layout, rank, False, wide, True),
    )


#: Every key, prebuilt (a call picks one and allocates none); the grouped layouts' by ``wide``.
_PLAIN, _PLAIN_3D = _loads("plain"), _loads("plain", 3)
_M_GROUPS = (_loads("m_groups"), _loads("m_groups", wide=True))
_K_GROUPS = (_loads("k_groups"), _loads("k_groups", wide=True))


def wide_window(rows: int, cols: int) -> bool:
    """Whether grouped (rows, cols) scales take the wide-window kernel: the host-side copy of
    ``cute_kernels.swizzle.wide_window`` (the hot path does not import the kernel modules)."""
    return cols > 64 and rows * cols <= SWIZZLE_WIDE_MAX_BYTES


def _run_kernel(
    target: targets.DeviceTarget, scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str
) -> torch.Tensor:
    """The kernel path after the contract's checks: the group limit, then the launch through
    :func:`_fast` (the one launcher) with the offsets as a plain tensor; grouped outputs with no
    columns (M groups) or no rows (K groups) launch nothing."""
    num_groups = checks.check_kernel_group_count(_OP, group_end_offsets)
    if num_groups and not scales.shape[1 if groups == "M" else 0]:
        return scales.new_empty(blocked_output_shape(scales.shape, num_groups, groups), dtype=_E8M0)
    offsets = None if group_end_offsets is None else checks.plain_tensor(group_end_offsets)
    out = _fast(target, (scales, offsets, groups))
    if out is None:
        raise RuntimeError(f"{_OP}: internal error: checked arguments did not reach the kernel")
    return out


def _fast(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``, and the launcher of the full path: the contract's checks and the group
    limit from metadata reads, then the blocked E8M0 output (``op_specs.blocked_output_shape``)
    and the launch of the variant for it. With offsets it takes only calls that launch (M groups with
    columns, K groups with rows): the kernel's wrapper checks the offsets' rank, device and stride.
    Written as one function (no launcher frame: each frame is a visible part of the overhead,
    notes/host-overhead.md); the CPU tests hold its variant to ``SwizzleKernel.can_implement``."""
    scales, group_end_offsets, groups = args
    dtype = scales.dtype
    if not (dtype in _SCALE_DTYPES and type(groups) is str and groups in _GROUPS and scales.is_contiguous()):
        return None
    shape = scales.shape
    if dtype is _U8:
        scales = scales.view(_E8M0)
    if group_end_offsets is None:
        if len(shape) == 2:
            loads, (rows, cols) = _PLAIN, shape
        elif len(shape) == 3:
            loads, (experts, rows, cols) = _PLAIN_3D, shape
        else:
            return None
        out_rows, out_cols = (rows + 127) & -128, (cols + 3) & -4
        if loads is _PLAIN_3D:  # (E, Rp, Cp)
            out = scales.new_empty(experts, out_rows, out_cols)
            out_rows *= experts
        else:
            out = scales.new_empty(out_rows, out_cols)
        if not (out_rows and out_cols):  # out.numel(), without a call
            return out
        static = cols
    else:
        num_groups = checks.fast_launch_groups(group_end_offsets)
        if not num_groups or len(shape) != 2:
            return None
        rows, cols = shape
        # wide_window(rows, cols) inlined (test_bindings_cpu checks the variant this picks against it)
        wide = cols > 64 and rows * cols <= SWIZZLE_WIDE_MAX_BYTES
        if groups == "M":
            if not cols:
                return None
            loads, static = _M_GROUPS[wide], cols
            out = scales.new_empty(rows + 128 * num_groups, (cols + 3) & -4)
        else:
            if not rows:
                return None
            loads, static = _K_GROUPS[wide], rows
            out = scales.new_empty((rows + 127) & -128, cols + 4 * num_groups)
    # Rows of whole, aligned 4-byte words stage with fewer instructions; else raw words, ragged where
    # the source may end inside a word, decided from the static dim (C for plain and M-groups, R = K
    # for K-groups) and the base, so M never switches kernels.
    key = loads.ragged if static & 3 or scales.data_ptr() & 3 else loads.aligned
    kernel = target.kernels.get(key) or target.kernel(key, SwizzleKey.variant)
    kernel(scales, out, group_end_offsets, target.num_sms)
    return out


@torch.library.custom_op("cute_kernels::swizzle_scales", mutates_args=())
def _swizzle_op(scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str) -> torch.Tensor:
    return _SWIZZLE_OP.run_on_device(scales, group_end_offsets, groups)


@_swizzle_op.register_fake
def _swizzle_fake(scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str) -> torch.Tensor:
    return _CONTRACT.fake(scales, group_end_offsets, groups)[0]


def _reference(scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str) -> torch.Tensor:
    return reference.swizzle_scales(scales, group_end_offsets=group_end_offsets, groups=groups)


_SWIZZLE_OP = KernelOp(_OP, _CONTRACT.check, _run_kernel, _reference, _swizzle_op, fast=_fast)


def swizzle_scales(
    scales: torch.Tensor,
    *,
    group_end_offsets: torch.Tensor | None = None,
    groups: str = "M",
    backend: str = "auto",
) -> torch.Tensor:
    """E8M0 scales to the blocked layout of tcgen05 / cuBLAS block-scaled GEMMs (SPEC section 3).

    ``scales``: (R, C) or (E, R, C) ``torch.float8_e8m0fnu`` (or uint8), contiguous.
    Without offsets: (Rp, Cp), or (E, Rp, Cp) with each expert blocked independently.
    ``groups="M"`` with int32 end offsets over the R rows: (R + 128 G, Cp), each group blocked from
    its own 128-row-aligned start. ``groups="K"`` with end offsets over the C scale columns:
    (Rp, C + 4 G), each group's tiles stored contiguously. Every byte not covered is 0.
    Never synchronizes with the host; the offsets' values are clamped, never trusted.
    """
    return _SWIZZLE_OP.dispatch(backend, scales, group_end_offsets, groups)
