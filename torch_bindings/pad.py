"""``pad_token_groups`` / ``unpad_token_groups``: PyTorch entry points of ``cute_kernels.pad``.

One launch per call, no host-device sync (except ``unpad_token_groups(..., num_tokens=None)``, which
must read the output row count from the device: training loops pass ``num_tokens``). Each call picks
the widest vector (16 bytes, 4 bytes or one element) that divides the row size in bytes and both
data pointers; kernels are compiled once per (op, element size, vector width, arch) with symbolic
sizes: padding copies bytes, so every dtype of 1, 2, 4 or 8 bytes runs as the integer type of its size.
"""

from __future__ import annotations

import torch

from . import backend as _backend
from . import checks, reference
from .kernel_cache import get_kernel, on_clear

_PAD = "pad_token_groups"
_UNPAD = "unpad_token_groups"
_VECTOR_BYTES = (16, 4)  # then one element: must match cute_kernels.pad.vector_widths

_kernels: dict[tuple, object] = {}  # hot-path lookup in front of kernel_cache.get_kernel
on_clear(_kernels.clear)


def _kernel(op: str, dtype: torch.dtype, width: int, arch: str):
    """Kernel for ``op`` on ``dtype`` (an integer carrier of ``reference.BITS_DTYPES``)."""
    key = (op, dtype, width, arch)
    kernel = _kernels.get(key)
    if kernel is None:
        name = str(dtype).removeprefix("torch.")

        def build():
            from cute_kernels.pad import PadOp, compile_pad

            return compile_pad(PadOp(op), name, width, arch)

        kernel = _kernels[key] = get_kernel((f"{op}_token_groups", name, width, arch), build)
    return kernel


def vector_bytes(element_size: int, *tensors: torch.Tensor) -> int:
    """Widest access (16, 4 or ``element_size`` bytes) that divides the row size of the 2-D
    ``tensors`` and, for each, its data pointer and row stride in bytes (TVM-FFI checks the stride
    divisibility a kernel declares; a row-major (M, 0) tensor has row stride 1)."""
    row_bytes = tensors[0].shape[1] * element_size
    for width in _VECTOR_BYTES:
        if width > element_size and row_bytes % width == 0:
            if all(t.data_ptr() % width == 0 and t.stride(0) * element_size % width == 0 for t in tensors):
                return width
    return element_size


def padded_shape(x_shape, num_groups, alignment: int) -> tuple:
    """(rows, D) of the padded output; works on SymInts."""
    return (reference.padded_rows(x_shape[0], num_groups, alignment), x_shape[1])


# ----------------------------------------------------------------------------------------------
# pad
# ----------------------------------------------------------------------------------------------


def _run_pad(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int, arch: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    checks.check_kernel_group_count(_PAD, group_end_offsets)
    num_groups = group_end_offsets.shape[0]
    bits = x.view(reference.BITS_DTYPES[x.element_size()])  # a byte copy: any dtype of its size
    out = bits.new_empty(padded_shape(x.shape, num_groups, alignment))
    padded_start = group_end_offsets.new_empty(num_groups)
    padded_end = group_end_offsets.new_empty(num_groups)
    width = vector_bytes(x.element_size(), x)  # out: fresh from the caching allocator, 512-byte aligned
    kernel = _kernel("pad", bits.dtype, width, arch)
    # Always launched: CTA 0 writes padded_start / padded_end even when there is no data.
    kernel(bits, out, group_end_offsets, padded_start, padded_end, alignment)
    return out.view(x.dtype), padded_start, padded_end


@torch.library.custom_op("cute_kernels::pad_token_groups", mutates_args=())
def _pad_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    arch = _backend.select(_PAD, "cute", x.device)
    return _run_pad(x, group_end_offsets, alignment, arch)


@_pad_op.register_fake
def _pad_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out = x.new_empty(padded_shape(x.shape, group_end_offsets.shape[0], alignment))
    return (
        out,
        group_end_offsets.new_empty(group_end_offsets.shape),
        group_end_offsets.new_empty(group_end_offsets.shape),
    )


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
    checks.check_pad(x, group_end_offsets, alignment)
    arch = _backend.select(_PAD, backend, x.device)
    if arch is None:
        return reference.pad_token_groups(x, group_end_offsets, alignment=alignment)
    if torch.compiler.is_compiling():
        return _pad_op(x, group_end_offsets, alignment)
    return _run_pad(x, group_end_offsets, alignment, arch)


# ----------------------------------------------------------------------------------------------
# unpad
# ----------------------------------------------------------------------------------------------


def _run_unpad(
    padded: torch.Tensor,
    group_end_offsets: torch.Tensor,
    padded_start: torch.Tensor,
    num_tokens: int | None,
    arch: str,
) -> torch.Tensor:
    checks.check_kernel_group_count(_UNPAD, group_end_offsets)
    if num_tokens is None:  # the one syncing path: the row count lives on the device
        num_tokens = checks.unpad_row_count(int(group_end_offsets[-1]), padded.shape[0])
    bits = padded.view(reference.BITS_DTYPES[padded.element_size()])  # a byte copy
    out = bits.new_empty((num_tokens, padded.shape[1]))
    if out.numel():
        width = vector_bytes(padded.element_size(), padded)  # out: fresh, 512-byte aligned
        kernel = _kernel("unpad", bits.dtype, width, arch)
        kernel(bits, out, group_end_offsets, padded_start)
    return out.view(padded.dtype)


@torch.library.custom_op("cute_kernels::unpad_token_groups", mutates_args=())
def _unpad_op(
    padded: torch.Tensor, group_end_offsets: torch.Tensor, padded_start: torch.Tensor, num_tokens: int | None
) -> torch.Tensor:
    arch = _backend.select(_UNPAD, "cute", padded.device)
    return _run_unpad(padded, group_end_offsets, padded_start, num_tokens, arch)


@_unpad_op.register_fake
def _unpad_fake(
    padded: torch.Tensor, group_end_offsets: torch.Tensor, padded_start: torch.Tensor, num_tokens: int | None
) -> torch.Tensor:
    if num_tokens is None:
        num_tokens = torch.library.get_ctx().new_dynamic_size()
    return padded.new_empty((num_tokens, padded.shape[1]))


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
    checks.check_unpad(padded, group_end_offsets, padded_start, num_tokens=num_tokens)
    arch = _backend.select(_UNPAD, backend, padded.device)
    if arch is None:
        return reference.unpad_token_groups(padded, group_end_offsets, padded_start, num_tokens=num_tokens)
    if torch.compiler.is_compiling():
        return _unpad_op(padded, group_end_offsets, padded_start, num_tokens)
    return _run_unpad(padded, group_end_offsets, padded_start, num_tokens, arch)
