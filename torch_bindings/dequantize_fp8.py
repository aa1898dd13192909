"""FP8 rowwise dequantization bounded by row groups: ``dequantize_fp8_rows`` (one launch of
``cute_kernels.dequant_fp8.DequantFp8RowsKernel``), what ``QuantizedTokens.dequantized`` runs for
an FP8 rowwise dispatch's tokens (notes/bounded-row-passes.md)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import checks, contract, reference, targets
from .op import KernelOp

_OP = _KERNEL = "dequantize_fp8_rows"  # the public name and the cute_kernels.registry name
_CONTRACT = contract.DEQUANTIZE_FP8_ROWS
(_E4M3,), (_F32,) = _CONTRACT.dtypes("q"), _CONTRACT.dtypes("scales")  # one each: identities
_BF16 = torch.bfloat16
_Tensor = torch.Tensor
_ANY_GROUPS = 1 << 62  # the kernel reads only the last end: any number of groups
#: An empty bf16 tensor per device target: ``new_empty(rows, cols)`` on it allocates x without a
#: dtype argument to parse (notes/host-overhead.md; DeviceTarget keeps only the quantizers' dtypes).
_EMPTY_BF16: dict[targets.DeviceTarget, _Tensor] = {}


class DequantKey(NamedTuple):
    """The dequantization kernel's key in a device's table: ``vector`` (16-byte steps)."""

    kernel: str
    vector: bool

    def variant(self, target: targets.DeviceTarget):
        """The kernel's variant (imports the kernel module)."""
        from cute_kernels.dequant_fp8 import DequantFp8RowsVariant

        return DequantFp8RowsVariant(self.vector)


def _run(target: targets.DeviceTarget, q: _Tensor, scales: _Tensor, ends: _Tensor) -> _Tensor:
    """x (M, K) bf16 from q (M, K) e4m3 and scales (M,) (checked) for the rows below the last of
    ``ends`` (G,) int32 (checked, or left to the wrapper of the kernel that surely launches); the
    other rows are left unwritten. One launch; none when q has no elements."""
    empty = _EMPTY_BF16.get(target)
    if empty is None:
        empty = _EMPTY_BF16[target] = torch.empty(0, dtype=_BF16, device=target.device)
    rows, cols = q.shape
    x = empty.new_empty(rows, cols)
    if rows and cols:
        vector = not (cols & 15 or q.data_ptr() & 15)  # x: fresh, 512-byte aligned
        key = (_KERNEL, vector)  # a DequantKey's fields
        kernel = target.kernels.get(key) or target.kernel(DequantKey._make(key), DequantKey.variant)
        kernel(q, scales, ends, x)
    return x


def _fast(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks from metadata reads. When the
    kernel surely launches (M, K > 0) its wrapper checks what is left: the offsets' rank, stride and
    device, scales' device and stride (tests/torch_bindings/test_wrapper_checks_gpu.py)."""
    q, scales, ends = args
    if q.dtype is not _E4M3 or type(scales) is not _Tensor or scales.dtype is not _F32:
        return None
    shape = q.shape
    if len(shape) != 2 or scales.shape != shape[:1] or not q.is_contiguous():
        return None
    if shape[0] and shape[1]:
        if checks.fast_launch_groups(ends, _ANY_GROUPS):
            return _run(target, q, scales, ends)
    elif (
        scales.device == target.device
        and scales.is_contiguous()
        and checks.fast_group_count(ends, target.device, _ANY_GROUPS)
    ):
        return _run(target, q, scales, ends)
    return None


@torch.library.custom_op("cute_kernels::dequantize_fp8_rows", mutates_args=())
def _dequantize_op(q: _Tensor, scales: _Tensor, group_end_offsets: _Tensor) -> _Tensor:
    return _run(targets.select(_OP, "cute", q), q, scales, group_end_offsets)


@_dequantize_op.register_fake
def _dequantize_fake(q: _Tensor, scales: _Tensor, group_end_offsets: _Tensor) -> _Tensor:
    return _CONTRACT.fake(q, scales, group_end_offsets)[0]


_DEQUANTIZE = KernelOp(_OP, _CONTRACT.check, _run, reference.dequantize_fp8_rows, _dequantize_op, fast=_fast)


def dequantize_fp8_rows(
    q: _Tensor, scales: _Tensor, group_end_offsets: _Tensor, *, backend: str = "auto"
) -> _Tensor:
    """FP8 rowwise dequantization of the rows below the last group end.

    q (M, K) ``float8_e4m3fn`` contiguous, scales (M,) fp32 (the dequantization multipliers of SPEC
    section 7: one per row), int32 row-group end offsets (G,), G >= 1 -> x (M, K) bf16 row-major
    with ``x[r] = bf16(fp32(q[r]) * scales[r])`` (one fp32 product, rounded to nearest even; NaN ->
    0x7FFF; exact for power-of-2 scales) for the rows r below the last end, read on the device and
    clamped to [0, M]. The rows past it are left unwritten (unspecified, as the grouped GEMMs leave
    theirs): an expert-parallel dispatch's static worst-case row count costs only the rows it
    filled. One launch, no host sync, no recompile when M, K or the offsets change (two variants:
    K % 16 == 0 with a 16-byte aligned q, or any K).
    """
    return _DEQUANTIZE.dispatch(backend, q, scales, group_end_offsets)


__all__ = ["dequantize_fp8_rows"]
