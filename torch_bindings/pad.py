"""``pad_token_groups`` / ``unpad_token_groups``: PyTorch entry points of ``cute_kernels.pad``.

One launch per call, no host-device sync (except ``unpad_token_groups(..., num_tokens=None)``, which
must read the output row count from the device: training loops pass ``num_tokens``). Each call picks
the widest vector (16 bytes, 4 bytes or one element) that divides the row size in bytes and both
data pointers; kernels are compiled once per (op, dtype, vector width, arch) with symbolic sizes.
Padding copies bytes: the common dtypes (``cute_utils.constants.PAD_KERNEL_DTYPES``) have kernels
of their own, passed without a view, and any other dtype of 1, 2, 4 or 8 bytes runs as the integer
type of its size; both compile to the same instructions.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from cute_kernels.op_specs import padded_rows
from cute_utils.constants import PAD_KERNEL_DTYPES

from . import checks, contract, reference, targets
from .op import KernelOp

_PAD = "pad_token_groups"
_UNPAD = "unpad_token_groups"
#: dtypes with kernels of their own (cute_utils.constants.PAD_KERNEL_DTYPES); others run as their
#: integer carrier.
_KERNEL_DTYPES = frozenset(getattr(torch, name) for name in PAD_KERNEL_DTYPES)
_Tensor, _I32 = torch.Tensor, checks.OFFSETS_DTYPE


class RowGatherKey(NamedTuple):
    """A pad or unpad kernel's key in a device's table: its registry name (``kernel``), the torch
    ``dtype`` it copies (its own, or the integer carrier of its size) and ``vector_bytes``."""

    kernel: str
    dtype: torch.dtype
    vector_bytes: int

    def variant(self, target: targets.DeviceTarget):
        """The kernel's variant (imports the kernel module)."""
        from cute_kernels.pad import RowGatherVariant

        return RowGatherVariant(contract.dtype_name(self.dtype), self.vector_bytes)


class _Operand(NamedTuple):
    """How a dtype the padding ops copy goes to the kernel: its element ``size`` in bytes and the
    ``kernel_dtype`` compiled for it (itself, or the integer carrier of its size: a byte copy), with
    ``view`` True for a carrier."""

    size: int
    kernel_dtype: torch.dtype
    view: bool


#: dtype -> its :class:`_Operand`: the dtypes with kernels from the start, any other the first
#: time :func:`operand_of` sees it (the fast paths read this dict instead of ``element_size``, and
#: leave a dtype not in it to the full path once; ``is_quantized`` belongs to the tensor, not the
#: dtype, and stays a test of its own).
_OPERANDS: dict[torch.dtype, _Operand] = {d: _Operand(d.itemsize, d, False) for d in _KERNEL_DTYPES}


def operand_of(t: torch.Tensor) -> _Operand | None:
    """t's dtype as the padding kernels copy it, or None for a dtype
    :func:`checks.check_byte_copy_tensor` refuses (quantized, or not of 1, 2, 4 or 8 bytes)."""
    if not checks.byte_copyable(t):
        return None
    size, dtype = t.element_size(), t.dtype
    kernel_dtype = dtype if dtype in _KERNEL_DTYPES else reference.BITS_DTYPES[size]
    operand = _OPERANDS[dtype] = _Operand(size, kernel_dtype, kernel_dtype is not dtype)
    return operand


def _vector_bytes(size: int, bits: int) -> int:
    """The widest access (16 bytes, 4 bytes or one element of ``size`` bytes) that divides a row's
    bytes, the data pointer and the row stride in bytes, from ``bits``: the low 4 bits of the three
    or-ed together."""
    if size < 16 and not bits & 15:
        return 16
    if size < 4 and not bits & 3:
        return 4
    return size


#: ``_VECTORS[size << 4 | bits]``: :func:`_vector_bytes` as a flat table (element sizes 1 to 8,
#: ``bits`` the low 4 bits of row bytes | data pointer | row stride bytes), one index per launch.
_VECTORS = tuple(_vector_bytes(i >> 4, i & 15) for i in range(9 << 4))


def _gather(
    name: str, t: torch.Tensor, rows: int, cols: int, operand: _Operand
) -> tuple[torch.Tensor, tuple]:
    """``(data, key)``: the 2-D contiguous ``t`` (rows, cols) as kernel ``name`` takes it (itself or
    its carrier view) and that kernel's table key (a :class:`RowGatherKey`'s fields). The vector
    is the widest access (16, 4 or the element size) that divides the row size in bytes, t's data
    pointer and its row stride in bytes (TVM-FFI checks the stride divisibility a kernel declares);
    a contiguous t with elements has row stride ``cols`` (one row's stride is neither read nor
    checked), an empty one its own (PyTorch gives (M, 0) the row stride 1)."""
    size, kernel_dtype, view = operand
    row_bytes = cols * size
    stride_bytes = row_bytes if rows and cols else t.stride(0) * size
    vector = _VECTORS[size << 4 | (row_bytes | t.data_ptr() | stride_bytes) & 15]
    return (t.view(kernel_dtype) if view else t), (name, kernel_dtype, vector)


# ----------------------------------------------------------------------------------------------
# pad
# ----------------------------------------------------------------------------------------------


def _launch_pad(
    target: targets.DeviceTarget,
    x: torch.Tensor,
    shape: torch.Size,
    operand: _Operand,
    group_end_offsets: torch.Tensor,
    num_groups: int,
    alignment: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Allocate pad's outputs for x of ``shape`` and ``operand`` (checked; ``num_groups`` <=
    ``MAX_KERNEL_GROUPS``) and launch."""
    rows, cols = shape
    data, key = _gather("pad", x, rows, cols, operand)
    out = data.new_empty(padded_rows(rows, num_groups, alignment), cols)
    padded_start = group_end_offsets.new_empty(num_groups)
    padded_end = group_end_offsets.new_empty(num_groups)
    # out: fresh from the caching allocator, 512-byte aligned
    kernel = target.kernels.get(key) or target.kernel(RowGatherKey._make(key), RowGatherKey.variant)
    # Always launched: CTA 0 writes padded_start / padded_end even when there is no data.
    kernel(data, out, group_end_offsets, padded_start, padded_end, alignment)
    return (out.view(x.dtype) if operand.view else out), padded_start, padded_end


def _run_pad(
    target: targets.DeviceTarget, x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_groups = checks.check_kernel_group_count(_PAD, group_end_offsets)
    return _launch_pad(target, x, x.shape, operand_of(x), group_end_offsets, num_groups, alignment)


def _fast_pad(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks and the group limit from metadata reads; the
    offsets' rank, device and stride are left to the kernel's wrapper (pad always launches)."""
    x, group_end_offsets, alignment = args
    operand, shape = _OPERANDS.get(x.dtype), x.shape  # a dtype copied before, in _OPERANDS
    if (
        operand is None
        or len(shape) != 2
        or not x.is_contiguous()
        or x.is_quantized
        or not checks.fast_alignment_ok(alignment)
    ):
        return None
    num_groups = checks.fast_launch_groups(group_end_offsets)  # always launched: the wrapper checks
    if not num_groups:
        return None
    return _launch_pad(target, x, shape, operand, group_end_offsets, num_groups, alignment)


@torch.library.custom_op("cute_kernels::pad_token_groups", mutates_args=())
def _pad_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _PAD_OP.run_on_device(x, group_end_offsets, alignment)


@_pad_op.register_fake
def _pad_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return contract.PAD_TOKEN_GROUPS.fake(x, group_end_offsets, alignment)


def _pad_reference(x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int):
    return reference.pad_token_groups(x, group_end_offsets, alignment=alignment)


_PAD_OP = KernelOp(_PAD, contract.PAD_TOKEN_GROUPS.check, _run_pad, _pad_reference, _pad_op, fast=_fast_pad)


def pad_token_groups(
    x: torch.Tensor, group_end_offsets: torch.Tensor, *, alignment: int = 32, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad each token group of x (M, D) to a multiple of ``alignment`` rows (SPEC section 4).

    ``group_end_offsets``: int32 (G,) end rows on x's device. Returns ``(padded, padded_start,
    padded_end)``: padded is (``A * ceil((M + G A) / A)``, D) in x's dtype, group g's rows at
    ``[padded_start[g], padded_start[g] + n_g)`` and every other row zero; the offsets are int32 (G,)
    on x's device. Bit-exact copy (NaN payloads, -0). One kernel launch, no host sync; offset values
    are clamped to ``[0, M]``, never trusted (garbage offsets give garbage rows, never a fault).
    """
    return _PAD_OP.dispatch(backend, x, group_end_offsets, alignment)


# ----------------------------------------------------------------------------------------------
# unpad
# ----------------------------------------------------------------------------------------------


def _run_unpad(
    target: targets.DeviceTarget,
    padded: torch.Tensor,
    group_end_offsets: torch.Tensor,
    padded_start: torch.Tensor,
    num_tokens: int | None,
) -> torch.Tensor:
    """The kernel path after the contract's checks: the group limit, the row count, then the
    launch through :func:`_fast_unpad` (the one launcher), with every argument in the form it accepts;
    outputs with no rows or no columns launch nothing."""
    checks.check_kernel_group_count(_UNPAD, group_end_offsets)
    if num_tokens is None:  # the one syncing path: the row count lives on the device
        num_tokens = checks.unpad_row_count(int(group_end_offsets[-1]), padded.shape[0])
    num_tokens, cols = int(num_tokens), padded.shape[1]
    checks.check_num_tokens(num_tokens)  # a SymInt's sign, now that it is an int
    if not (num_tokens and cols):
        return padded.new_empty(num_tokens, cols)
    operand_of(padded)  # puts padded's dtype in _OPERANDS
    args = (padded, checks.plain_tensor(group_end_offsets), checks.plain_tensor(padded_start), num_tokens)
    out = _fast_unpad(target, args)
    if out is None:
        raise RuntimeError(f"{_UNPAD}: internal error: checked arguments did not reach the kernel")
    return out


def _fast_unpad(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``, and the launcher of the full path: the contract's checks with an int
    ``num_tokens`` (the no-sync form) and the group limit, from metadata reads, for calls that launch
    (rows and columns to copy); then the (num_tokens, D) output and the launch. The kernel's wrapper
    checks both offsets' device, rank and stride, and that padded_start has the offsets' length (one
    symbolic G). Written as one function (``_gather``'s three lines and the launch inlined, the vector
    rule read from ``_VECTORS``; the CPU tests hold its kernel choice to ``_gather``'s): unpad has the
    smallest floor of the ops, and each Python frame is a visible part of its overhead
    (notes/host-overhead.md)."""
    padded, group_end_offsets, padded_start, num_tokens = args
    if type(num_tokens) is not int or num_tokens <= 0:
        return None
    operand, shape = _OPERANDS.get(padded.dtype), padded.shape  # a dtype copied before
    if (
        operand is None
        or len(shape) != 2
        or not shape[1]
        or not padded.is_contiguous()
        or padded.is_quantized
        or not checks.fast_launch_groups(group_end_offsets)
        or type(padded_start) is not _Tensor
        or padded_start.dtype is not _I32
    ):
        return None
    rows, cols = shape
    size, kernel_dtype, view = operand
    row_bytes = cols * size
    stride_bytes = row_bytes if rows else padded.stride(0) * size  # as _gather (cols > 0 here)
    vector = _VECTORS[size << 4 | (row_bytes | padded.data_ptr() | stride_bytes) & 15]
    data = padded.view(kernel_dtype) if view else padded
    out = data.new_empty(num_tokens, cols)
    key = ("unpad", kernel_dtype, vector)  # a RowGatherKey's fields
    kernel = target.kernels.get(key) or target.kernel(RowGatherKey._make(key), RowGatherKey.variant)
    kernel(data, out, group_end_offsets, padded_start)  # out: fresh, 512-byte aligned
    return out.view(padded.dtype) if view else out


@torch.library.custom_op("cute_kernels::unpad_token_groups", mutates_args=())
def _unpad_op(
    padded: torch.Tensor, group_end_offsets: torch.Tensor, padded_start: torch.Tensor, num_tokens: int | None
) -> torch.Tensor:
    return _UNPAD_OP.run_on_device(padded, group_end_offsets, padded_start, num_tokens)


@_unpad_op.register_fake
def _unpad_fake(
    padded: torch.Tensor, group_end_offsets: torch.Tensor, padded_start: torch.Tensor, num_tokens: int | None
) -> torch.Tensor:
    return contract.UNPAD_TOKEN_GROUPS.fake(padded, group_end_offsets, padded_start, num_tokens)[0]


def _unpad_reference(padded, group_end_offsets, padded_start, num_tokens):
    return reference.unpad_token_groups(padded, group_end_offsets, padded_start, num_tokens=num_tokens)


_UNPAD_OP = KernelOp(
    _UNPAD, contract.UNPAD_TOKEN_GROUPS.check, _run_unpad, _unpad_reference, _unpad_op, fast=_fast_unpad
)


def unpad_token_groups(
    padded: torch.Tensor,
    group_end_offsets: torch.Tensor,
    padded_start: torch.Tensor,
    *,
    num_tokens: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Exact inverse of :func:`pad_token_groups`: (P, D) -> (num_tokens, D) (SPEC section 4).

    Output row r of group g (rows ``[end[g-1], end[g])``) is ``padded[padded_start[g] + r - end[g-1]]``.
    ``num_tokens``: the output row count (the M given to ``pad_token_groups``); rows past the last
    group's end are zero. Pass it: with ``num_tokens=None`` the count is read from
    ``group_end_offsets[-1]`` on the device, **a host-device sync** (and a data-dependent shape under
    ``torch.compile``); a value outside ``[0, padded.shape[0]]`` raises ``ValueError``. Otherwise no
    sync. Offsets are clamped to ``[0, num_tokens]`` and
    ``padded_start`` values are never trusted: a row whose source lies outside ``padded`` is zero.
    """
    return _UNPAD_OP.dispatch(backend, padded, group_end_offsets, padded_start, num_tokens)
