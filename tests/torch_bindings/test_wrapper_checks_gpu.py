"""The eager fast paths leave some checks to the kernels' TVM-FFI wrappers (KernelOp.fast): on the
GPU, each such bad argument must be refused by the real wrapper before a launch, and the public call
must still raise the contract's error, word for word what the full checks raise.

tests/torch_bindings/test_fast_path.py checks the fast paths on a CPU target whose mock kernels
refuse what these wrappers refuse; this file checks that the wrappers do.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import torch_bindings as tb
from torch_bindings import (
    dequantize_fp8,
    pad,
    pad_quantize,
    quantize,
    quantize_3d,
    quantize_dual,
    quantize_fp8,
    swiglu,
    swizzle,
    targets,
)

pytestmark = pytest.mark.gpu

I32, BF16 = torch.int32, torch.bfloat16


def _ends(device: str = "cuda") -> torch.Tensor:
    return torch.tensor([128, 256], dtype=I32, device=device)


#: Makers of int32 offsets the fast paths pass on (they test the dtype and the element count G),
#: refused by the wrappers on device, rank or strides.
BAD_OFFSETS: dict[str, Callable[[], torch.Tensor]] = {
    "of rank 2": lambda: _ends().view(1, 2),
    "of rank 0": lambda: torch.tensor(256, dtype=I32, device="cuda"),
    "on the CPU": lambda: _ends("cpu"),
    "on meta": lambda: _ends("meta"),
    "strided": lambda: torch.tensor([128, 0, 256, 0], dtype=I32, device="cuda")[::2],
}


def _x() -> torch.Tensor:
    return torch.randn(256, 256, dtype=BF16, device="cuda")


def _scales() -> torch.Tensor:
    return torch.zeros(256, 8, dtype=torch.float8_e8m0fnu, device="cuda")


def _fp8_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales): FP8 rowwise rows of ``_x()``."""
    return tb.quantize_fp8_2d(_x())


def _padded() -> tuple[torch.Tensor, torch.Tensor]:
    padded, start, _ = tb.pad_token_groups(_x(), _ends())
    return padded, start


def cases() -> list[tuple[str, Any, Callable[[], tuple]]]:
    """(case id, KernelOp, zero-argument maker of the positional arguments)."""
    out: list[tuple[str, Any, Callable[[], tuple]]] = []
    for what, offs in BAD_OFFSETS.items():
        out += [
            (f"swizzle M, offsets {what}", swizzle._SWIZZLE_OP, lambda o=offs: (_scales(), o(), "M")),
            (f"swizzle K, offsets {what}", swizzle._SWIZZLE_OP, lambda o=offs: (_scales(), o(), "K")),
            (f"pad, offsets {what}", pad._PAD_OP, lambda o=offs: (_x(), o(), 32)),
            (f"unpad, offsets {what}", pad._UNPAD_OP, lambda o=offs: (_padded()[0], o(), _padded()[1], 256)),
            (f"unpad, padded_start {what}", pad._UNPAD_OP, lambda o=offs: (_padded()[0], _ends(), o(), 256)),
            (
                f"1x32 M-groups, offsets {what}",
                quantize._QUANTIZE_2D,
                lambda o=offs: (_x(), "1x32", o(), "rceil", True),
            ),
            (
                f"32x1 K-groups, offsets {what}",
                quantize._QUANTIZE_2D,
                lambda o=offs: (_x(), "32x1", o(), "rceil", True),
            ),
            (f"dual, offsets {what}", quantize_dual._DUAL_OP, lambda o=offs: (_x(), o(), "rceil", True)),
            (
                f"pad+quantize, offsets {what}",
                pad_quantize._PAD_QUANTIZE,
                lambda o=offs: (_x(), o(), 32, "rceil"),
            ),
            (f"SwiGLU bounded, offsets {what}", swiglu._SWIGLU_FWD, lambda o=offs: (_x(), o(), True)),
            (
                f"SwiGLU bwd bounded, offsets {what}",
                swiglu._SWIGLU_BWD,
                lambda o=offs: (_x()[:, :128].contiguous(), _x(), o(), True),
            ),
            (
                f"FP8 row bounded, offsets {what}",
                quantize_fp8._QUANTIZE_2D,
                lambda o=offs: (_x(), "row", o(), True),
            ),
            (f"FP8 dequant, offsets {what}", dequantize_fp8._DEQUANTIZE, lambda o=offs: (*_fp8_rows(), o())),
        ]
    three = [0, 128, 256]
    out += [
        (
            "FP8 dequant, scales on the CPU",
            dequantize_fp8._DEQUANTIZE,
            lambda: (_fp8_rows()[0], torch.ones(256), _ends()),
        ),
        (
            "FP8 dequant, scales strided",
            dequantize_fp8._DEQUANTIZE,
            lambda: (_fp8_rows()[0], torch.ones(512, device="cuda")[::2], _ends()),
        ),
        (
            "unpad, padded_start of 3 groups",
            pad._UNPAD_OP,
            lambda: (_padded()[0], _ends(), torch.tensor(three, dtype=I32, device="cuda"), 256),
        ),
    ]
    return out


CASES = cases()
#: What the wrappers say: "Mismatched ..." (device type or index, rank, strides, shared sizes),
#: "Misaligned ...", or the DLPack conversion's refusal of a meta tensor.
WRAPPER_REFUSAL = "Mismatched|Misaligned|Cannot pack tensors on meta"

#: Data views the wrappers take (a tensor's outer strides are free symbols in the compiled
#: signature; only constant strides, here the innermost 1, are checked) but the contract refuses:
#: the fast paths must test contiguity themselves and decline them.
VIEWS: list[tuple[str, Any, Callable[[], tuple]]] = [
    ("swizzle, rows padded", swizzle._SWIZZLE_OP, lambda: (_rows_padded(_scales()), None, "M")),
    ("swizzle M, rows padded", swizzle._SWIZZLE_OP, lambda: (_rows_padded(_scales()), _ends(), "M")),
    ("pad, rows padded", pad._PAD_OP, lambda: (_rows_padded(_x()), _ends(), 32)),
    ("pad, row stride 0", pad._PAD_OP, lambda: (_x()[:1].expand(256, 256), _ends(), 32)),
    ("unpad, rows padded", pad._UNPAD_OP, lambda: (_rows_padded(_padded()[0]), _ends(), _padded()[1], 256)),
    ("1x32, rows padded", quantize._QUANTIZE_2D, lambda: (_rows_padded(_x()), "1x32", None, "rceil", True)),
    ("32x1, rows padded", quantize._QUANTIZE_2D, lambda: (_rows_padded(_x()), "32x1", None, "rceil", True)),
    ("dual, rows padded", quantize_dual._DUAL_OP, lambda: (_rows_padded(_x()), _ends(), "rceil", True)),
    ("3D 1x32, every other expert", quantize_3d._QUANTIZE_3D, lambda: (_w_sliced(), "1x32", "rceil", True)),
    ("3D 32x1, every other expert", quantize_3d._QUANTIZE_3D, lambda: (_w_sliced(), "32x1", "rceil", True)),
    (
        "pad+quantize, rows padded",
        pad_quantize._PAD_QUANTIZE,
        lambda: (_rows_padded(_x()), _ends(), 32, "rceil"),
    ),
    ("FP8 row, rows padded", quantize_fp8._QUANTIZE_2D, lambda: (_rows_padded(_x()), "row", None, True)),
    ("FP8 col, rows padded", quantize_fp8._QUANTIZE_2D, lambda: (_rows_padded(_x()), "col", None, True)),
    ("FP8 dual, rows padded", quantize_fp8._QUANTIZE_DUAL, lambda: (_rows_padded(_x()), None, True)),
    ("FP8 3D K, every other expert", quantize_fp8._QUANTIZE_3D, lambda: (_w_sliced(), "K", True)),
    ("FP8 3D N, every other expert", quantize_fp8._QUANTIZE_3D, lambda: (_w_sliced(), "N", True)),
    ("SwiGLU, h13 rows padded", swiglu._SWIGLU_FWD, lambda: (_rows_padded(_x()), None, True)),
    ("SwiGLU bounded, h13 rows padded", swiglu._SWIGLU_FWD, lambda: (_rows_padded(_x()), _ends(), True)),
    (
        "SwiGLU bwd, grad_h rows padded",
        swiglu._SWIGLU_BWD,
        lambda: (_rows_padded(_x()[:, :128]), _x(), None, True),
    ),
    (
        "SwiGLU bwd, h13 rows padded",
        swiglu._SWIGLU_BWD,
        lambda: (_x()[:, :128].contiguous(), _rows_padded(_x()), None, True),
    ),
    (
        "SwiGLU bwd bounded, h13 rows padded",
        swiglu._SWIGLU_BWD,
        lambda: (_x()[:, :128].contiguous(), _rows_padded(_x()), _ends(), True),
    ),
    ("FP8 3D dual, every other expert", quantize_fp8._QUANTIZE_DUAL_3D, lambda: (_w_sliced(), True)),
]


def _rows_padded(t: torch.Tensor) -> torch.Tensor:
    """Zeros of t's shape and dtype whose rows lie 16 bytes further apart than their size: not
    contiguous, innermost stride 1, a 16-byte aligned data pointer."""
    cols = t.shape[-1]
    return t.new_zeros(*t.shape[:-1], cols + 16 // t.element_size())[..., :cols]


def _w_sliced() -> torch.Tensor:
    """Every other expert of (4, 128, 256): (2, 128, 256) with an expert stride of 2 N K."""
    return torch.randn(4, 128, 256, dtype=BF16, device="cuda")[::2]


def _expected_error(op: Any, args: tuple) -> Exception:
    try:
        op.check(*args)
    except (TypeError, ValueError) as exc:
        return exc
    raise AssertionError(f"{op.name}: the full checks accept {args!r}")


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_wrapper_refuses_and_the_call_raises_the_contract_error(case: int) -> None:
    name, op, make_args = CASES[case]
    op.dispatch("cute", *_valid_args(op))  # the device's kernel table is filled: the fast path runs
    args = make_args()
    target = targets.known(args[0])
    assert target is not None
    # the wrapper's own refusal (a decline, or a compile error, would be no refusal: a wrong case)
    with pytest.raises((ValueError, RuntimeError), match=WRAPPER_REFUSAL):
        op.fast(target, args)
    expected = _expected_error(op, args)
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        op.dispatch("auto", *args)


@pytest.mark.parametrize("case", range(len(VIEWS)), ids=[c[0] for c in VIEWS])
def test_views_the_wrappers_take_are_declined_and_raise_the_contract_error(case: int) -> None:
    name, op, make_args = VIEWS[case]
    op.dispatch("cute", *_valid_args(op))
    args = make_args()
    assert op.fast(targets.known(args[0]), args) is None
    expected = _expected_error(op, args)
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        op.dispatch("auto", *args)


def test_a_wrapper_takes_a_row_padded_tensor() -> None:
    """Why the fast paths test their data's contiguity: the pad kernel's wrapper launches on a
    row-padded x (outer stride free), where the contract asks for a contiguous one."""
    x, ends = _rows_padded(_x()), _ends()
    tb.pad_token_groups(x.contiguous(), ends)
    target = targets.known(x)
    kernel = target.kernels[("pad", torch.bfloat16, 16)]  # bf16 rows of 16-byte vectors
    out = x.new_empty(512, 256)
    kernel(x, out, ends, ends.new_empty(2), ends.new_empty(2), 32)  # no refusal
    torch.cuda.synchronize()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_offsets_on_another_gpu_are_refused_by_the_wrapper() -> None:
    """The wrappers hold every tensor argument to one device index."""
    x, ends = _x(), _ends("cuda:1")
    tb.pad_token_groups(x, _ends())
    with pytest.raises(ValueError, match=WRAPPER_REFUSAL):
        pad._PAD_OP.fast(targets.known(x), (x, ends, 32))
    expected = _expected_error(pad._PAD_OP, (x, ends, 32))
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        tb.pad_token_groups(x, ends)


def _valid_args(op: Any) -> tuple:
    ends = _ends()
    return {
        swizzle._SWIZZLE_OP.name: (_scales(), ends, "M"),
        pad._PAD_OP.name: (_x(), ends, 32),
        pad._UNPAD_OP.name: (_padded()[0], ends, _padded()[1], 256),
        quantize._QUANTIZE_2D.name: (_x(), "1x32", ends, "rceil", True),
        quantize_dual._DUAL_OP.name: (_x(), ends, "rceil", True),
        pad_quantize._PAD_QUANTIZE.name: (_x(), ends, 32, "rceil"),
        quantize_3d._QUANTIZE_3D.name: (_w_sliced().contiguous(), "1x32", "rceil", True),
        quantize_fp8._QUANTIZE_2D.name: (_x(), "row", None, True),
        quantize_fp8._QUANTIZE_DUAL.name: (_x(), None, True),
        quantize_fp8._QUANTIZE_3D.name: (_w_sliced().contiguous(), "K", True),
        swiglu._SWIGLU_FWD.name: (_x(), ends, True),  # the bounded variants (the offsets cases')
        swiglu._SWIGLU_BWD.name: (_x()[:, :128].contiguous(), _x(), ends, True),
        quantize_fp8._QUANTIZE_DUAL_3D.name: (_w_sliced().contiguous(), True),
        dequantize_fp8._DEQUANTIZE.name: (*_fp8_rows(), ends),
    }[op.name]
