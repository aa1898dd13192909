"""The eager fast paths (``KernelOp.fast``) against the full checks, on a CPU target whose kernels
launch nothing but refuse what the kernels' TVM-FFI wrappers refuse (the checks some fast paths leave
to them).

``fast`` skips the full checks, so it must be exactly as strict: for every combination of the good
and bad arguments below, a ``fast`` that returns outputs must have arguments the op's ``check`` and
its kernel path (``run``) accept, and outputs like ``run``'s (shapes, dtypes, strides). Every
combination it declines must be one the full path rejects, except the few listed valid cases
(rare shapes the fast path leaves to ``run``), so valid calls do not silently take the slow path.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from bench.bench_overhead import _Noop, _NoopKernels
from torch_bindings import (
    dequantize_fp8,
    pad,
    pad_quantize,
    pad_quantize_fp8,
    quantize,
    quantize_3d,
    quantize_dual,
    quantize_fp8,
    swiglu,
    swizzle,
    targets,
)

I32, BF16, F32 = torch.int32, torch.bfloat16, torch.float32
E8M0 = torch.float8_e8m0fnu


#: Registry names whose kernels declare all their 1-D int32 arguments with one symbolic length G
#: (the pad family's offsets, padded_start and padded_end; cute_kernels.pad, cute_kernels.quantize).
SHARED_GROUPS = frozenset({"pad", "unpad", quantize.KERNEL})
#: Registry name -> the positions of its kernel's (G,) int32 arguments (group offsets, padded starts
#: and ends), as the launchers pass them.
GROUP_ARGS: dict[str, tuple[int, ...]] = {
    "swiglu_fp8": (5,),  # the bounded variants' offsets (the others take seven arguments)
    "swizzle": (2,),
    "pad": (2, 3, 4),
    "unpad": (2, 3),
    quantize.KERNEL: (3, 4, 5),
    "quantize_32x1": (3,),
    "quantize_dual": (5,),
    "quantize_fp8_row": (3,),  # the bounded variants' offsets (the others take three arguments)
    "dequantize_fp8_rows": (2,),
}
#: How the mock kernels below refuse an argument (the real wrappers' words: "Mismatched ...").
MOCK_REFUSAL = "Mismatched"


class _WrapperChecks(_Noop):
    """A no-op kernel that refuses what a compiled kernel's TVM-FFI wrapper refuses before it
    launches and the fast paths leave to it (tests/torch_bindings/test_wrapper_checks_gpu.py checks the real
    wrappers): a tensor argument off the first one's device (``RuntimeError`` on ``meta``, which
    the wrappers cannot take), a 1-D one (declared with stride 1) of length over 1 and a stride
    other than 1, a (G,) argument (``GROUP_ARGS``) of another rank than 1, and under
    ``SHARED_GROUPS`` (G,) arguments of different lengths (one symbolic G). Like the wrappers it
    does not check the outer strides of other tensors (free symbols there): the fast paths test the
    contiguity of their data themselves."""

    def __init__(self, name: object) -> None:
        self.shared_groups = name in SHARED_GROUPS
        self.group_args = GROUP_ARGS.get(name, ()) if isinstance(name, str) else ()

    def __call__(self, *args: Any) -> None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        for t in tensors:
            if t.is_meta:
                raise RuntimeError("Cannot pack tensors on meta")
            if t.device != tensors[0].device or (t.dim() == 1 and t.shape[0] > 1 and t.stride(0) != 1):
                raise ValueError(f"{MOCK_REFUSAL} Tensor device or stride")
        groups = [args[i] for i in self.group_args if i < len(args) and isinstance(args[i], torch.Tensor)]
        if any(t.dim() != 1 for t in groups):
            raise ValueError(f"{MOCK_REFUSAL} Tensor rank")
        if self.shared_groups and len({t.shape[0] for t in groups}) > 1:
            raise ValueError(f"{MOCK_REFUSAL} Tensor shape")


class _WrapperCheckedKernels(_NoopKernels):
    def get(self, key: object, default: object = None) -> Any:
        if key not in self:
            self[key] = _WrapperChecks(key[0] if isinstance(key, tuple) else key)
        return self[key]


@pytest.fixture
def target():
    """A CPU kernel target whose kernels check their arguments as the TVM-FFI wrappers do and
    launch nothing."""
    cpu = targets.DeviceTarget("sm_90a", 132, device=torch.device("cpu"))
    cpu.kernels = _WrapperCheckedKernels()
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
        torch.tensor([[10], [64]], dtype=I32),
        torch.tensor(64, dtype=I32),  # rank 0: one element, like G = 1
        torch.zeros(0, dtype=I32),
        torch.tensor([10, 64], dtype=I32, device="meta"),
        torch.arange(8, dtype=I32)[::2],
        torch.arange(16, dtype=I32)[::8][1:],  # one group, stride 8: contiguous (size 1)
        torch.tensor([10, 64], dtype=torch.uint32),  # the one wrong dtype the wrappers take
        torch.zeros(3000, dtype=I32),
        [10, 64],
    ]


def quant_x() -> list[Any]:
    return [
        torch.zeros(64, 64, dtype=BF16),
        torch.zeros(32, 96, dtype=F32),
        torch.zeros(0, 64, dtype=BF16),
        torch.zeros(64, 0, dtype=BF16),
        torch.zeros(64, 64, dtype=torch.float16),
        torch.zeros(64, 64, dtype=I32),
        torch.zeros(64, 40, dtype=BF16),
        torch.zeros(40, 64, dtype=BF16),
        torch.zeros(2, 32, 64, dtype=BF16),
        torch.zeros(64, 64, dtype=BF16).t(),
        torch.zeros(64, 96, dtype=BF16)[:, :64],  # rows padded: only the outer stride is off
        torch.zeros(1, 64, dtype=BF16).expand(64, 64),  # row stride 0
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
        torch.zeros(4, 32, 64, dtype=BF16)[::2],  # every other expert
        torch.zeros(2, 48, 64, dtype=BF16)[:, :32],  # experts padded
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
        torch.zeros(64, 0, dtype=E8M0),
        torch.zeros(8, dtype=E8M0),
        torch.zeros(64, 8, dtype=torch.int8),
        torch.zeros(8, 64, dtype=E8M0).t(),
        torch.zeros(64, 12, dtype=E8M0)[:, :8],  # rows padded
    ]


def fp8_rows() -> list[Any]:
    e4m3 = torch.float8_e4m3fn
    return [
        torch.zeros(64, 64, dtype=e4m3),
        torch.zeros(64, 40, dtype=e4m3),  # element steps
        torch.zeros(0, 64, dtype=e4m3),
        torch.zeros(64, 0, dtype=e4m3),
        torch.zeros(64, 64, dtype=BF16),
        torch.zeros(2, 32, 64, dtype=e4m3),
        torch.zeros(64, 64, dtype=e4m3).t(),
        torch.zeros(64, 96, dtype=e4m3)[:, :64],  # rows padded
        misaligned(64, 64, dtype=e4m3),
        [[1.0]],
    ]


def row_scales() -> list[Any]:
    return [
        torch.zeros(64, dtype=F32),
        torch.zeros(0, dtype=F32),
        torch.zeros(32, dtype=F32),
        torch.zeros(64, dtype=BF16),
        torch.zeros(64, 1, dtype=F32),
        torch.zeros(128, dtype=F32)[::2],
        torch.zeros(64, dtype=F32, device="meta"),
        None,
    ]


def _quantized() -> torch.Tensor:
    with warnings.catch_warnings():  # quantized tensors are deprecated; still refused, so tested
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(torch.zeros(64, 8), 0.1, 0, torch.quint8)


def byte_rows() -> list[Any]:
    return [
        torch.zeros(64, 64, dtype=BF16),
        torch.zeros(64, 32, dtype=torch.float8_e4m3fn),
        torch.zeros(64, 3, dtype=torch.int64),
        torch.zeros(64, 5, dtype=torch.bool),
        torch.zeros(0, 64, dtype=F32),
        torch.zeros(64, 0, dtype=BF16),
        torch.zeros(64, 4, dtype=torch.complex128),
        torch.zeros(64, 64, dtype=BF16).t(),
        torch.zeros(64, 80, dtype=BF16)[:, :64],  # rows padded
        torch.zeros(2, 8, 8, dtype=BF16),
        _quantized(),
        _quantized().view(torch.uint8),  # uint8, and still a quantized tensor
    ]


def swiglu_h13() -> list[Any]:
    """h13 (M, 2H) candidates: those of :func:`quant_x` and an odd last dim."""
    return [*quant_x(), torch.zeros(64, 7, dtype=BF16), torch.zeros(0, 7, dtype=BF16)]


def swiglu_grads() -> list[Any]:
    """grad_h (M, H) candidates for the h13 of :func:`swiglu_h13`: matching (M, H) of several of
    them, wrong shapes, dtypes, strides, devices and alignment."""
    return [
        torch.zeros(64, 32, dtype=BF16),
        torch.zeros(64, 20, dtype=BF16),
        torch.zeros(0, 32, dtype=BF16),
        torch.zeros(64, 0, dtype=BF16),
        torch.zeros(40, 32, dtype=BF16),
        torch.zeros(64, 64, dtype=BF16),
        torch.zeros(64, 32, dtype=F32),
        torch.zeros(64, 32, dtype=BF16, device="meta"),
        torch.zeros(32, 64, dtype=BF16).t(),
        torch.zeros(64, 48, dtype=BF16)[:, :32],  # rows padded
        torch.zeros(2, 64, 32, dtype=BF16),
        misaligned(64, 32),
    ]


ALIGNMENTS = [16, 32, 128, 48, "32", True]
STARTS = [
    torch.tensor([0, 32], dtype=I32),
    torch.tensor([0], dtype=I32),
    torch.tensor([[0, 32]], dtype=I32),
    torch.tensor(0, dtype=I32),
    torch.tensor([0, 32], dtype=torch.int64),
    torch.tensor([0, 32], dtype=I32, device="meta"),
]


def _empty(data: Any) -> bool:
    """Empty data: with offsets the kernel would not launch, so no wrapper would check the offsets;
    the fast paths leave these to the full path."""
    return isinstance(data, torch.Tensor) and data.numel() == 0


def _swizzle_launches_nothing(args: tuple) -> bool:
    """Grouped swizzle calls with nothing to launch (M groups of 2-D scales with no columns, K groups
    with no rows): no wrapper would check the offsets, so its fast path leaves them to the full
    path; it launches the other empty grouped calls."""
    data, groups = args[0], args[2]
    return (
        isinstance(data, torch.Tensor)
        and data.dim() == 2
        and groups in ("M", "K")
        and data.shape[1 if groups == "M" else 0] == 0
    )


# op -> (KernelOp, candidates of each positional argument, valid argument tuples fast may decline)
OPS: dict[str, tuple[Any, Callable[[], list[list[Any]]], Callable[[tuple], bool]]] = {
    "swizzle_scales": (
        swizzle._SWIZZLE_OP,
        lambda: [scales(), offsets(), ["M", "K", "N", None]],
        lambda args: args[1] is not None and _swizzle_launches_nothing(args),
    ),
    "quantize_mxfp8_2d": (
        quantize._QUANTIZE_2D,
        lambda: [quant_x(), BLOCKS, offsets(), MODES, FLAGS],
        lambda args: args[2] is not None and _empty(args[0]),
    ),
    "quantize_mxfp8_2d_dual": (
        quantize_dual._DUAL_OP,
        lambda: [quant_x(), offsets(), MODES, FLAGS],
        lambda args: args[1] is not None and _empty(args[0]),
    ),
    "quantize_mxfp8_3d": (quantize_3d._QUANTIZE_3D, lambda: [weights(), BLOCKS, MODES, FLAGS], None),
    "pad_token_groups": (pad._PAD_OP, lambda: [byte_rows(), offsets(), ALIGNMENTS], None),
    "unpad_token_groups": (
        pad._UNPAD_OP,
        lambda: [byte_rows(), offsets(), STARTS, [64, 0, -1, None, 64.0, True]],
        # num_tokens=None reads the row count from the device: the full path's syncing form; no
        # rows or no columns to copy launch nothing
        lambda args: args[3] is None or args[3] == 0 or args[0].shape[1] == 0,
    ),
    "pad_and_quantize_mxfp8_2d": (
        pad_quantize._PAD_QUANTIZE,
        lambda: [quant_x(), offsets(), ALIGNMENTS, MODES],
        lambda args: isinstance(args[0], torch.Tensor) and args[0].shape[-1] == 0,  # K = 0: no launch
    ),
    "pad_and_quantize_fp8_2d_cols": (
        pad_quantize_fp8._PAD_COLS,
        lambda: [quant_x(), offsets(), ALIGNMENTS, FLAGS],
        # no rows or no columns: the outputs from PyTorch ops, no launch
        lambda args: isinstance(args[0], torch.Tensor) and _empty(args[0]),
    ),
    "pad_and_quantize_fp8_2d_dual": (
        pad_quantize_fp8._PAD_DUAL,
        lambda: [quant_x(), offsets(), ALIGNMENTS, FLAGS],
        lambda args: isinstance(args[0], torch.Tensor) and _empty(args[0]),
    ),
    "quantize_fp8_2d": (
        quantize_fp8._QUANTIZE_2D,
        lambda: [quant_x(), ["row", "col", "K", None], offsets(), FLAGS],
        None,
    ),
    "dequantize_fp8_rows": (dequantize_fp8._DEQUANTIZE, lambda: [fp8_rows(), row_scales(), offsets()], None),
    "quantize_fp8_2d_dual": (quantize_fp8._QUANTIZE_DUAL, lambda: [quant_x(), offsets(), FLAGS], None),
    "quantize_fp8_3d": (
        quantize_fp8._QUANTIZE_3D,
        lambda: [weights(), ["K", "N", "row", None], FLAGS],
        # (E, 1, K) rows: run gives the size-1 dim a row stride first
        lambda args: isinstance(args[0], torch.Tensor) and args[0].dim() == 3 and args[0].shape[1] == 1,
    ),
    "swiglu_quantize_fp8": (swiglu._SWIGLU_FWD, lambda: [swiglu_h13(), offsets(), FLAGS], None),
    "swiglu_backward_quantize_fp8": (
        swiglu._SWIGLU_BWD,
        lambda: [swiglu_grads(), swiglu_h13(), offsets(), FLAGS],
        None,
    ),
    "quantize_fp8_3d_dual": (quantize_fp8._QUANTIZE_DUAL_3D, lambda: [weights(), FLAGS], None),
}


def _full_path_refuses(op: Any, target: Any, args: tuple) -> bool:
    """Whether the full path (``check``, then ``run``) raises ``TypeError`` / ``ValueError``; a mock
    kernel refusing what ``check`` accepted fails the test (the mock would be stricter than the
    wrappers, and a fast path's decline of a valid call would go unseen)."""
    try:
        op.check(*args)
    except (TypeError, ValueError):
        return True
    try:
        op.run(target, *args)
    except (TypeError, ValueError) as exc:
        assert MOCK_REFUSAL not in str(exc), f"{op.name}: the mock refused checked arguments {args!r}"
        return True
    return False


def _fast(op: Any, target: Any, args: tuple) -> Any:
    """What ``KernelOp.dispatch`` takes from ``op.fast``: called only with a tensor first, and a
    refusal (the kernel wrapper's, or a kernel-path limit) read as a decline."""
    if not isinstance(args[0], torch.Tensor):
        return None
    try:
        return op.fast(target, args)
    except (TypeError, ValueError, RuntimeError):
        return None


def _meta(result: Any) -> list[tuple]:
    outs = result if isinstance(result, tuple) else (result,)
    return [(t.shape, t.dtype, t.stride()) for t in outs]


@pytest.mark.parametrize("name", sorted(OPS))
def test_fast_path_is_as_strict_as_the_full_checks(name: str, target) -> None:
    op, candidates, slow_ok = OPS[name]
    taken = taken_nonempty = declined_valid = 0
    for t in byte_rows():  # the padding ops' fast paths leave a dtype to the full path once
        pad.operand_of(t)
    for args in itertools.product(*candidates()):
        out = _fast(op, target, args)
        if out is not None:
            taken += 1
            taken_nonempty += args[0].numel() > 0
            op.check(*args)  # raises if the fast path let a bad argument through
            assert _meta(out) == _meta(op.run(target, *args)), args
        elif not _full_path_refuses(op, target, args):
            declined_valid += 1
            assert slow_ok is not None and slow_ok(args), f"{name}: valid {args!r} declined by the fast path"
    assert taken_nonempty > 0, f"{name}: the fast path launched nothing"
