"""SwiGLU fused with FP8 rowwise quantization: ``swiglu_quantize_fp8`` (forward) and
``swiglu_backward_quantize_fp8`` (backward), one launch each (``cute_kernels.swiglu``).

The numerics are ``torch_bindings.reference.swiglu`` / ``swiglu_backward`` (exact fp32 operations,
docs/contract.md) followed by ``quantize_fp8_2d(axis="row")`` of the bf16 result; the kernels match
them bit for bit. With ``group_end_offsets`` the kernels' bounded variants compute only the rows
below the last group end (read on the device) and leave the rows past it unwritten.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch

from . import checks, contract, reference, targets
from .device_constants import ConstantCache
from .op import KernelOp
from .quantize_fp8 import k_class
from .warn import user_stacklevel

_OP_FWD, _OP_BWD = "swiglu_quantize_fp8", "swiglu_backward_quantize_fp8"
_KERNEL = "swiglu_fp8"  # cute_kernels.registry name
_FWD, _BWD = contract.SWIGLU_QUANTIZE_FP8, contract.SWIGLU_BACKWARD_QUANTIZE_FP8
(_BF16,) = _FWD.dtypes("h13")  # one dtype: the fast paths compare identities
_Tensor = torch.Tensor
_ANY_GROUPS = 1 << 62  # the bounded kernels read only the last end: any number of groups
_captured_tables: list[torch.Tensor] = []  # tables built inside a CUDA graph capture (below)
_tables = ConstantCache()  # the silu table by device


def silu_table(device: torch.device) -> torch.Tensor:
    """The kernels' silu table on ``device`` (``reference.silu_table``), built there once on the
    current stream (a few dozen elementwise launches, no sync), with the stream and capture rules of
    ``torch_bindings.device_constants``. A table first needed inside a CUDA graph capture is built into
    the graph, so that every replay rebuilds it before the kernel reads it, and kept alive without
    being cached; a warning says so once, since those launches repeat on every replay: call the op
    once before capturing."""
    return _tables.get(device, device, lambda: reference.silu_table(device), _keep_captured_table)


def _keep_captured_table(table: torch.Tensor) -> None:
    if not _captured_tables:
        warnings.warn(
            "swiglu_quantize_fp8 / swiglu_backward_quantize_fp8: the silu table was first needed inside a "
            "CUDA graph capture, so the graph rebuilds it (a few dozen elementwise launches) on every "
            "replay; call the op once before capturing to build it outside the graph",
            stacklevel=user_stacklevel(),
        )
    _captured_tables.append(table)


class SwigluKey(NamedTuple):
    """The SwiGLU + FP8 kernel's key in a device's table: ``direction`` ("fwd" / "bwd"),
    ``round_pow2``, ``vector`` (16-byte steps), ``bounded`` (only the rows below the last group
    end) and ``half`` (H raw, one lookup per call: the kernels of one H class are one compile)."""

    kernel: str
    direction: str
    round_pow2: bool
    vector: bool
    bounded: bool
    half: int

    def variant(self, target: targets.DeviceTarget):
        """The kernel's variant (imports the kernel module)."""
        from cute_kernels.swiglu import SwigluVariant

        return SwigluVariant(self.direction, self.round_pow2, self.vector, self.bounded)

    def config(self, variant, target: targets.DeviceTarget):
        """The config for the key's H class (``cute_kernels.configs.pick_for_shape``)."""
        from cute_kernels import configs

        shape_class = swiglu_shape_class(variant.direction, self.half)
        return configs.pick_for_shape(_KERNEL, variant, target.arch, target.name, shape_class)


def swiglu_shape_class(direction: str, half: int) -> str:
    """The tuned table's key of a launch: ``"<direction>/h<H class>"``, the H class being the row
    kernel's class rule (``quantize_fp8.k_class``: the next power of 2, at least 256)."""
    return f"{direction}/h{k_class(half)}"


def _launch(
    target: targets.DeviceTarget,
    h13,
    grad_h,
    round_pow2: bool,
    rows: int,
    half: int,
    out_cols: int,
    ends=None,
):
    """Allocate the outputs (bf16 (M, out_cols), e4m3 (M, out_cols), fp32 (M,)) and launch once on
    h13 (M, 2 half) (``grad_h`` None: the forward), the bounded variant with the group end offsets
    ``ends`` (G,) int32 (checked, or left to the kernel's wrapper when it surely launches): the rows
    past the last end are left unwritten. Rows of no columns get the scale 1.0 (every row, bounded
    or not) and no launch, as do no rows."""
    out = h13.new_empty((rows, out_cols))
    q = target.e4m3.new_empty(rows, out_cols)
    scales = target.f32.new_empty(rows)
    if not half:
        return out, q, scales.fill_(1.0)
    if rows:
        unaligned = h13.data_ptr() & 15 or (grad_h is not None and grad_h.data_ptr() & 15)
        direction, vector = "fwd" if grad_h is None else "bwd", not (half & 7 or unaligned)
        bounded = ends is not None
        key = (_KERNEL, direction, round_pow2, vector, bounded, half)  # a SwigluKey's fields
        kernel = target.kernels.get(key) or target.kernel(
            SwigluKey._make(key), SwigluKey.variant, SwigluKey.config
        )
        table = silu_table(target.device)
        if bounded:
            kernel(h13, out, q, scales, grad_h, ends, table, target.num_sms)
        else:
            kernel(h13, out, q, scales, grad_h, table, target.num_sms)  # outputs: fresh, 512-byte aligned
    return out, q, scales


def _run_fwd(target: targets.DeviceTarget, h13: torch.Tensor, ends: torch.Tensor | None, round_pow2: bool):
    rows, cols = h13.shape
    return _launch(target, h13, None, round_pow2, rows, cols >> 1, cols >> 1, ends)


def _run_bwd(
    target: targets.DeviceTarget,
    grad_h: torch.Tensor,
    h13: torch.Tensor,
    ends: torch.Tensor | None,
    round_pow2: bool,
):
    rows, cols = h13.shape
    return _launch(target, h13, grad_h, round_pow2, rows, cols >> 1, cols, ends)


def _fast_ends(ends: object, target: targets.DeviceTarget, launches: int) -> bool:
    """Group end offsets a fast path may pass on: ``checks.check_offsets`` from metadata reads where
    no kernel launches (no rows or no columns), else the part the bounded kernel's TVM-FFI wrapper
    does not check (an int32 tensor of G >= 1 elements: ``checks.fast_launch_groups``)."""
    if launches:
        return checks.fast_launch_groups(ends, _ANY_GROUPS) > 0
    return checks.fast_group_count(ends, target.device, _ANY_GROUPS) > 0


def _fast_fwd(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks from metadata reads (a contiguous
    2-D bf16 h13 with an even last dim, a bool rounding flag; offsets as :func:`_fast_ends`)."""
    h13, ends, round_pow2 = args
    if h13.dtype is _BF16 and (round_pow2 is True or round_pow2 is False) and h13.is_contiguous():
        shape = h13.shape
        if len(shape) == 2 and not shape[1] & 1:
            half = shape[1] >> 1
            if ends is None:
                return _launch(target, h13, None, round_pow2, shape[0], half, half)
            if _fast_ends(ends, target, shape[0] and half):
                return _launch(target, h13, None, round_pow2, shape[0], half, half, ends)
    return None


def _fast_bwd(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks from metadata reads
    (h13's device compared here: a call with no rows or columns launches no kernel whose wrapper
    would; offsets as :func:`_fast_ends`)."""
    grad_h, h13, ends, round_pow2 = args
    if (
        grad_h.dtype is _BF16
        and isinstance(h13, _Tensor)
        and h13.dtype is _BF16
        and (round_pow2 is True or round_pow2 is False)
        and grad_h.is_contiguous()
        and h13.is_contiguous()
    ):
        shape, grad_shape = h13.shape, grad_h.shape
        if len(shape) == 2 and len(grad_shape) == 2 and grad_shape[0] == shape[0]:
            half = grad_shape[1]
            if 2 * half == shape[1] and h13.device == target.device:
                if ends is None:
                    return _launch(target, h13, grad_h, round_pow2, shape[0], half, shape[1])
                if _fast_ends(ends, target, shape[0] and half):
                    return _launch(target, h13, grad_h, round_pow2, shape[0], half, shape[1], ends)
    return None


# ----------------------------------------------------------------------------------------------
# Custom ops (torch.compile) and the ops
# ----------------------------------------------------------------------------------------------


@torch.library.custom_op("cute_kernels::swiglu_quantize_fp8", mutates_args=())
def _fwd_op(h13: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_fwd(targets.select(_OP_FWD, "cute", h13), h13, None, round_pow2)


@_fwd_op.register_fake
def _fwd_fake(h13: torch.Tensor, round_pow2: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _FWD.fake(h13, None, round_pow2)


@torch.library.custom_op("cute_kernels::swiglu_quantize_fp8_bounded", mutates_args=())
def _fwd_bounded_op(
    h13: torch.Tensor, group_end_offsets: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_fwd(targets.select(_OP_FWD, "cute", h13), h13, group_end_offsets, round_pow2)


@_fwd_bounded_op.register_fake
def _fwd_bounded_fake(
    h13: torch.Tensor, group_end_offsets: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _FWD.fake(h13, group_end_offsets, round_pow2)


@torch.library.custom_op("cute_kernels::swiglu_backward_quantize_fp8", mutates_args=())
def _bwd_op(
    grad_h: torch.Tensor, h13: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_bwd(targets.select(_OP_BWD, "cute", h13), grad_h, h13, None, round_pow2)


@_bwd_op.register_fake
def _bwd_fake(
    grad_h: torch.Tensor, h13: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _BWD.fake(grad_h, h13, None, round_pow2)


@torch.library.custom_op("cute_kernels::swiglu_backward_quantize_fp8_bounded", mutates_args=())
def _bwd_bounded_op(
    grad_h: torch.Tensor, h13: torch.Tensor, group_end_offsets: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_bwd(targets.select(_OP_BWD, "cute", h13), grad_h, h13, group_end_offsets, round_pow2)


@_bwd_bounded_op.register_fake
def _bwd_bounded_fake(
    grad_h: torch.Tensor, h13: torch.Tensor, group_end_offsets: torch.Tensor, round_pow2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _BWD.fake(grad_h, h13, group_end_offsets, round_pow2)


def _custom_fwd(h13, ends, round_pow2):
    return _fwd_op(h13, round_pow2) if ends is None else _fwd_bounded_op(h13, ends, round_pow2)


def _custom_bwd(grad_h, h13, ends, round_pow2):
    if ends is None:
        return _bwd_op(grad_h, h13, round_pow2)
    return _bwd_bounded_op(grad_h, h13, ends, round_pow2)


def _reference_fwd(h13, ends, round_pow2):
    return reference.swiglu_quantize_fp8(h13, group_end_offsets=ends, round_scales_to_power_of_2=round_pow2)


def _reference_bwd(grad_h, h13, ends, round_pow2):
    return reference.swiglu_backward_quantize_fp8(
        grad_h, h13, group_end_offsets=ends, round_scales_to_power_of_2=round_pow2
    )


_SWIGLU_FWD = KernelOp(_OP_FWD, _FWD.check, _run_fwd, _reference_fwd, _custom_fwd, fast=_fast_fwd)
_SWIGLU_BWD = KernelOp(_OP_BWD, _BWD.check, _run_bwd, _reference_bwd, _custom_bwd, fast=_fast_bwd)


def swiglu_quantize_fp8(
    h13: torch.Tensor,
    *,
    group_end_offsets: torch.Tensor | None = None,
    round_scales_to_power_of_2: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SwiGLU and its FP8 rowwise operand in one pass: h13 (M, 2H) bf16 contiguous, gate columns
    [0, H), up [H, 2H) (the ``gate_up_proj`` layout) -> ``(h, q, scales)``.

    h (M, H) bf16 is ``bf16(silu(g) * u)`` with silu in exact fp32 operations (docs/contract.md;
    ``reference.swiglu``); q (M, H) ``float8_e4m3fn`` row-major and scales (M,) fp32 are exactly
    ``quantize_fp8_2d(h, axis="row", round_scales_to_power_of_2=...)``. One launch, no host sync,
    no recompile when M or H change (H % 8 == 0 with 16-byte aligned h13 takes 8-column steps,
    any other H one column at a time).

    ``group_end_offsets`` (int32 (G,), G >= 1, on h13's device): only the rows below the last end
    (read on the device, clamped to [0, M]; no sync) are computed, byte for byte as without; the
    rows past it of h, q and scales are unspecified (left unwritten): an expert-parallel dispatch's
    static worst-case row count costs only the rows it filled.
    """
    return _SWIGLU_FWD.dispatch(backend, h13, group_end_offsets, round_scales_to_power_of_2)


def swiglu_backward_quantize_fp8(
    grad_h: torch.Tensor,
    h13: torch.Tensor,
    *,
    group_end_offsets: torch.Tensor | None = None,
    round_scales_to_power_of_2: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SwiGLU's backward and its FP8 rowwise operand in one pass: grad_h (M, H) and h13 (M, 2H),
    bf16 contiguous on one device -> ``(grad_h13, q, scales)``.

    grad_h13 (M, 2H) bf16: columns [0, H) ``bf16((grad * u) * silu'(g))``, [H, 2H) ``bf16(grad *
    silu(g))`` (exact fp32 operations, ``reference.swiglu_backward``); q (M, 2H) e4m3 and scales
    (M,) are exactly ``quantize_fp8_2d(grad_h13, axis="row", ...)`` (one scale over all 2H columns
    of a row). One launch, no host sync, no recompile when M or H change.

    ``group_end_offsets`` (int32 (G,), G >= 1, on h13's device): only the rows below the last end
    are computed, as in :func:`swiglu_quantize_fp8`; the rows past it of grad_h13, q and scales are
    unspecified.
    """
    return _SWIGLU_BWD.dispatch(backend, grad_h, h13, group_end_offsets, round_scales_to_power_of_2)
