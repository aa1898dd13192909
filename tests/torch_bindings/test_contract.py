"""Each public op's contract is declared once (``cute_kernels.op_specs``) and read by its checks,
its fake and its kernels' limits (``torch_bindings.contract``); these tests hold the pieces to it."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
import torch

import torch_bindings  # noqa: F401  (imports every binding, so every KernelOp exists)
from cute_kernels import op_specs
from torch_bindings import contract
from torch_bindings.op import KernelOp

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32


def _kernel_ops() -> dict[str, KernelOp]:
    return {o.name: o for o in gc.get_objects() if isinstance(o, KernelOp)}


def _specs() -> dict[str, op_specs.OpSpec]:
    return {s.name: s for s in vars(op_specs).values() if isinstance(s, op_specs.OpSpec)}


def test_every_kernel_op_checks_through_its_contract():
    ops = _kernel_ops()
    assert set(ops) == set(_specs())
    for name, op in ops.items():
        reader = op.check.__self__
        assert isinstance(reader, contract.Contract) and reader.spec is _specs()[name]


def test_op_specs_import_neither_torch_nor_the_dsl():
    code = "import sys, cute_kernels.op_specs; print(sorted({'torch', 'cutlass'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _ends(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=I32)


def _cases():
    x = torch.randn(96, 64, dtype=BF16)
    w = torch.randn(3, 64, 96, dtype=F32)
    ends = _ends(10, 10, 70, 96)
    ends32 = _ends(32, 32, 64, 96)  # whole 32x1 blocks
    h13 = torch.randn(40, 48, dtype=BF16)
    q = torch.randn(40, 48).to(torch.float8_e4m3fn)
    cases = []
    for block in ("1x32", "32x1"):
        for offsets, blocked in ((None, True), (None, False), (ends32.clone(), True)):
            cases.append(("quantize_mxfp8_2d", (x, block, offsets, "rceil", blocked)))
        cases.append(("quantize_mxfp8_3d", (w, block, "floor", True)))
        cases.append(("quantize_mxfp8_3d", (w, block, "rceil", False)))
    for offsets, blocked in ((None, False), (ends32.clone(), True)):
        cases.append(("quantize_mxfp8_2d_dual", (x, offsets, "rceil", blocked)))
    cases.append(("pad_and_quantize_mxfp8_2d", (x, ends.clone(), 32, "rceil")))
    scales = torch.randint(0, 255, (200, 7), dtype=torch.uint8)
    for offsets, groups in ((None, "M"), (_ends(50, 200), "M"), (_ends(3, 7), "K")):
        cases.append(("swizzle_scales", (scales, offsets, groups)))
    cases.append(("swizzle_scales", (scales.view(1, 200, 7).expand(2, 200, 7).contiguous(), None, "M")))
    cases.append(("pad_token_groups", (x, ends.clone(), 16)))
    cases.append(
        ("unpad_token_groups", (torch.zeros(160, 64, dtype=BF16), ends.clone(), _ends(0, 16, 16, 80), 96))
    )
    for axis in ("row", "col"):
        cases.append(("quantize_fp8_2d", (x, axis, None, True)))
        cases.append(("quantize_fp8_2d", (x, axis, ends.clone(), False)))
    cases.append(("quantize_fp8_2d_dual", (x, ends.clone(), True)))
    cases.append(("pad_and_quantize_fp8_2d_cols", (x, ends.clone(), 32, True)))
    cases.append(("pad_and_quantize_fp8_2d_dual", (x, ends.clone(), 64, False)))
    for axis in ("K", "N"):
        cases.append(("quantize_fp8_3d", (w, axis, False)))
    cases.append(("quantize_fp8_3d_dual", (w, True)))
    cases.append(("dequantize_fp8_rows", (q, torch.rand(40), _ends(17, 40))))
    cases.append(("swiglu_quantize_fp8", (h13, None, True)))
    cases.append(("swiglu_quantize_fp8", (h13, _ends(30), False)))
    cases.append(("swiglu_backward_quantize_fp8", (torch.randn(40, 24, dtype=BF16), h13, None, True)))
    return cases


@pytest.mark.parametrize("name, args", _cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_fake_outputs_are_the_references(name, args):
    """The fake (the spec's ``outputs``) gives the reference's shapes, dtypes and strides."""
    op = _kernel_ops()[name]
    want = op.reference(*args)
    want = (want,) if isinstance(want, torch.Tensor) else tuple(want)
    got = op.check.__self__.fake(*args)
    assert len(got) == len(want)
    for g, r in zip(got, want, strict=True):
        assert (g.shape, g.dtype) == (r.shape, r.dtype)
        if min(r.shape, default=0) > 1:
            assert g.stride() == r.stride(), (name, g.stride(), r.stride())


def test_every_spec_has_a_case():
    assert {name for name, _ in _cases()} == set(_specs())


def test_kernel_limits_read_the_spec():
    """The kernels' ``can_implement`` take their divisors and limits from the spec."""
    from cute_kernels.quantize import Quantize1x32Kernel
    from cute_kernels.quantize_dual import QuantizeDualKernel

    spec = op_specs.QUANTIZE_MXFP8_2D
    k = spec.divisor("x", "K")
    assert Quantize1x32Kernel.can_implement(k, spec.limits.max_groups, 0, op_specs.VECTOR_ALIGN)
    assert not Quantize1x32Kernel.can_implement(k, spec.limits.max_groups + 1)
    assert not Quantize1x32Kernel.can_implement(k // 2, None)
    assert not Quantize1x32Kernel.can_implement(k, None, op_specs.VECTOR_ALIGN // 2)
    dual = op_specs.QUANTIZE_MXFP8_2D_DUAL
    assert QuantizeDualKernel.can_implement(
        dual.divisor("x", "M"), dual.divisor("x", "K"), dual.limits.max_groups
    )
    assert not QuantizeDualKernel.can_implement(dual.divisor("x", "M") // 2, dual.divisor("x", "K"))


def test_fast_path_tables_are_the_specs():
    """The eager fast paths' dtype and choice tables come from the spec."""
    from torch_bindings import checks, swizzle

    assert (
        checks._QUANT_DTYPES == contract.QUANTIZE_MXFP8_2D.dtypes("x") == contract.QUANTIZE_FP8_3D.dtypes("w")
    )
    assert checks._MODES == contract.QUANTIZE_MXFP8_2D.choices("scaling_mode")
    assert swizzle._SCALE_DTYPES == contract.SWIZZLE_SCALES.dtypes("scales")
    assert checks._ALIGNMENT_SET == contract.PAD_TOKEN_GROUPS.choices("alignment")


def test_every_argument_multiple_and_rule_is_checked_once():
    """Each step's argument: a parameter, an (Operand, dtypes) pair, a (name, Multiple) pair or a rule."""
    from torch_bindings.contract import _check_plan

    def checked(arg):
        if isinstance(arg, tuple):
            return arg[1] if isinstance(arg[0], str) else arg[0]
        return arg

    for spec in _specs().values():
        got = [checked(arg) for _, arg in _check_plan(spec)]
        multiples = [m for p in spec.params if isinstance(p, op_specs.Operand) for m in p.multiples]
        expected = [*spec.params, *multiples, *spec.rules]
        assert sorted(map(id, got)) == sorted(map(id, expected)), spec.name


def test_a_spec_naming_a_missing_argument_is_refused():
    from torch_bindings.contract import _check_plan

    bad_when = op_specs.OpSpec(
        "bad",
        (
            op_specs.Operand(
                "x", (2,), ("bfloat16",), (op_specs.Multiple(0, "M", 32, when=("blok", "32x1")),)
            ),
        ),
        lambda a: (),
    )
    bad_flag = op_specs.OpSpec(
        "bad",
        (op_specs.Operand("x", (2,), ("bfloat16",)), op_specs.Offsets("ends", of="x", requires="blockd")),
        lambda a: (),
    )
    for spec in (bad_when, bad_flag):
        with pytest.raises(ValueError, match="not an argument"):
            _check_plan(spec)


def test_kernel_path_limits_are_the_specs():
    from torch_bindings import checks

    assert checks.MAX_KERNEL_GROUPS == op_specs.QUANTIZE_MXFP8_2D.limits.max_groups
    assert checks.MAX_KERNEL_EXPERTS == op_specs.QUANTIZE_FP8_3D.limits.max_experts
