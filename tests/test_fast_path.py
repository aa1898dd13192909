"""The eager fast paths (``KernelOp.fast``) against the full checks, on a CPU target with no-op kernels.

``fast`` skips the full checks, so it must be exactly as strict: for every combination of the good
and bad arguments below, a ``fast`` that returns outputs must have arguments the op's ``check`` and
its kernel path (``run``) accept, and outputs like ``run``'s (shapes, dtypes, strides). Every
combination it declines must be one the full path rejects, except the few listed valid cases
(rare shapes the fast path leaves to ``run``), so valid calls do not silently take the slow path.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from bench.bench_overhead import _NoopKernels
from torch_bindings import (
    pad,
    pad_quantize,
    quantize,
    quantize_3d,
    quantize_dual,
    quantize_fp8,
    swizzle,
    targets,
)

I32, BF16, F32 = torch.int32, torch.bfloat16, torch.float32
E8M0 = torch.float8_e8m0fnu


@pytest.fixture
def target():
    """A CPU kernel target whose kernels do nothing (``bench_overhead --cpu-mock``'s)."""
    cpu = targets.DeviceTarget("sm_90a", 132, device=torch.device("cpu"))
    cpu.kernels = _NoopKernels()
    saved = targets._targets.get(-1)
    targets._targets[-1] = cpu
    yield cpu
    if saved is None:
        targets._targets.pop(-1, None)
    else:
        targets._targets[-1] = saved


def misaligned(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    """A contiguous tensor whose data pointer is 2 elements past a 16-byte boundary."""
    n = 1
    for s in shape:
        n *= s
    return torch.zeros(n + 8, dtype=dtype)[2 : 2 + n].view(*shape)


def offsets() -> list[Any]:
    return [
        None,
        torch.tensor([10, 64], dtype=I32),
        torch.tensor([64], dtype=I32),
        torch.tensor([10, 64], dtype=torch.int64),
        torch.tensor([[10, 64]], dtype=I32),
        torch.zeros(0, dtype=I32),
        torch.tensor([10, 64], dtype=I32, device="meta"),
        torch.arange(8, dtype=I32)[::2],
        torch.zeros(3000, dtype=I32),
        [10, 64],
    ]


def quant_x() -> list[Any]:
    return [
        torch.zeros(64, 64, dtype=BF16),
        torch.zeros(32, 96, dtype=F32),
        torch.zeros(0, 64, dtype=BF16),
        torch.zeros(64, 64, dtype=torch.float16),
        torch.zeros(64, 64, dtype=I32),
        torch.zeros(64, 40, dtype=BF16),
        torch.zeros(40, 64, dtype=BF16),
        torch.zeros(2, 32, 64, dtype=BF16),
        torch.zeros(64, 64, dtype=BF16).t(),
        misaligned(64, 64),
        [[1.0]],
    ]


def weights() -> list[Any]:
    return [
        torch.zeros(2, 32, 64, dtype=BF16),
        torch.zeros(3, 64, 32, dtype=F32),
        torch.zeros(2, 1, 64, dtype=BF16),
        torch.zeros(2, 48, 64, dtype=BF16),
        torch.zeros(2, 32, 40, dtype=BF16),
        torch.zeros(0, 32, 64, dtype=BF16),
        torch.zeros(64, 64, dtype=BF16),
        torch.zeros(2, 64, 32, dtype=BF16).transpose(1, 2),
        torch.zeros(2, 32, 64, dtype=torch.float16),
        misaligned(2, 32, 64),
    ]


MODES = ["rceil", "floor", "RCEIL", None]
FLAGS = [True, False, 1, None]
BLOCKS = ["1x32", "32x1", "2x2", None]


def scales() -> list[Any]:
    return [
        torch.zeros(64, 8, dtype=E8M0),
        torch.zeros(64, 8, dtype=torch.uint8),
        torch.zeros(2, 128, 7, dtype=E8M0),
        torch.zeros(64, 7, dtype=E8M0),
        torch.zeros(0, 8, dtype=E8M0),
        torch.zeros(8, dtype=E8M0),
        torch.zeros(64, 8, dtype=torch.int8),
        torch.zeros(8, 64, dtype=E8M0).t(),
    ]


def byte_rows() -> list[Any]:
    return [
        torch.zeros(64, 64, dtype=BF16),
        torch.zeros(64, 32, dtype=torch.float8_e4m3fn),
        torch.zeros(64, 3, dtype=torch.int64),
        torch.zeros(64, 5, dtype=torch.bool),
        torch.zeros(0, 64, dtype=F32),
        torch.zeros(64, 4, dtype=torch.complex128),
        torch.zeros(64, 64, dtype=BF16).t(),
        torch.zeros(2, 8, 8, dtype=BF16),
    ]


ALIGNMENTS = [16, 32, 128, 48, "32", True]
STARTS = [
    torch.tensor([0, 32], dtype=I32),
    torch.tensor([0], dtype=I32),
    torch.tensor([0, 32], dtype=torch.int64),
    torch.tensor([0, 32], dtype=I32, device="meta"),
]

# op -> (KernelOp, candidates of each positional argument, valid argument tuples fast may decline)
OPS: dict[str, tuple[Any, Callable[[], list[list[Any]]], Callable[[tuple], bool]]] = {
    "swizzle_scales": (swizzle._SWIZZLE_OP, lambda: [scales(), offsets(), ["M", "K", "N", None]], None),
    "quantize_mxfp8_2d": (quantize._QUANTIZE_2D, lambda: [quant_x(), BLOCKS, offsets(), MODES, FLAGS], None),
    "quantize_mxfp8_2d_dual": (quantize_dual._DUAL_OP, lambda: [quant_x(), offsets(), MODES, FLAGS], None),
    "quantize_mxfp8_3d": (quantize_3d._QUANTIZE_3D, lambda: [weights(), BLOCKS, MODES, FLAGS], None),
    "pad_token_groups": (pad._PAD_OP, lambda: [byte_rows(), offsets(), ALIGNMENTS], None),
    "unpad_token_groups": (
        pad._UNPAD_OP,
        lambda: [byte_rows(), offsets(), STARTS, [64, 0, -1, None, 64.0, True]],
        # num_tokens=None reads the row count from the device: the full path's syncing form
        lambda args: args[3] is None,
    ),
    "pad_and_quantize_mxfp8_2d": (
        pad_quantize._PAD_QUANTIZE,
        lambda: [quant_x(), offsets(), ALIGNMENTS, MODES],
        None,
    ),
    "quantize_fp8_2d": (
        quantize_fp8._QUANTIZE_2D,
        lambda: [quant_x(), ["row", "col", "K", None], offsets(), FLAGS],
        None,
    ),
    "quantize_fp8_2d_dual": (quantize_fp8._QUANTIZE_DUAL, lambda: [quant_x(), offsets(), FLAGS], None),
    "quantize_fp8_3d": (
        quantize_fp8._QUANTIZE_3D,
        lambda: [weights(), ["K", "N", "row", None], FLAGS],
        # (E, 1, K) rows: run gives the size-1 dim a row stride first
        lambda args: isinstance(args[0], torch.Tensor) and args[0].dim() == 3 and args[0].shape[1] == 1,
    ),
}


def _raises(fn: Callable[[], Any]) -> bool:
    try:
        fn()
    except (TypeError, ValueError):
        return True
    return False


def _meta(result: Any) -> list[tuple]:
    outs = result if isinstance(result, tuple) else (result,)
    return [(t.shape, t.dtype, t.stride()) for t in outs]


@pytest.mark.parametrize("name", sorted(OPS))
def test_fast_path_is_as_strict_as_the_full_checks(name: str, target) -> None:
    op, candidates, slow_ok = OPS[name]
    taken = declined_valid = 0
    for args in itertools.product(*candidates()):
        # KernelOp.dispatch calls fast only with a tensor first
        out = op.fast(target, *args) if isinstance(args[0], torch.Tensor) else None
        if out is not None:
            taken += 1
            op.check(*args)  # raises if the fast path let a bad argument through
            assert _meta(out) == _meta(op.run(target, *args)), args
        elif not _raises(lambda args=args: (op.check(*args), op.run(target, *args))):
            declined_valid += 1
            assert slow_ok is not None and slow_ok(args), f"{name}: valid {args!r} declined by the fast path"
    assert taken > 0
