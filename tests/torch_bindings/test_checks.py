"""Tests of the host-side input checks (``torch_bindings.checks``) and their wiring into the reference.

Every bad input must raise the right exception type with a message naming the argument. The checks
must never read tensor values: they are exercised on ``meta`` tensors (which have no data, so any
value read would fail) and the source is scanned for syncing calls.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from torch_bindings import checks, contract
from torch_bindings import reference as ref

I32 = torch.int32


def offs(*v: int, device: str = "cpu") -> torch.Tensor:
    return torch.tensor(v, dtype=I32, device=device)


def x2d(m: int = 64, k: int = 64, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.zeros(m, k, dtype=dtype)


NONCONTIG_X = torch.zeros(64, 64, dtype=torch.bfloat16).t()
NONCONTIG_OFFS = torch.arange(8, dtype=I32)[::2]
META_OFFS = offs(32, device="meta")


# (id, check call, reference call or None, exception, message regex)
def q2d_cases():
    op = "quantize_mxfp8_2d"
    good = dict(block="1x32", group_end_offsets=None, scaling_mode="rceil", blocked_scales=True)
    cases = [
        (
            "list",
            dict(x=[[1.0]]),
            TypeError,
            r"quantize_mxfp8_2d: x must be a 2-D tensor of dtype torch\.bfloat16",
        ),
        ("int", dict(x=torch.zeros(4, 32, dtype=I32)), TypeError, r"x must be a 2-D tensor of dtype"),
        ("fp16", dict(x=x2d(dtype=torch.float16)), TypeError, r"torch\.bfloat16 or torch\.float32, got"),
        ("3d", dict(x=torch.zeros(2, 32, 32)), ValueError, r"x must be a 2-D tensor"),
        ("noncontig", dict(x=NONCONTIG_X), ValueError, r"x must be contiguous"),
        ("k48", dict(x=x2d(64, 48)), ValueError, r"x\.shape\[1\] \(K\) \(48\) must be a multiple of 32"),
        (
            "m48",
            dict(x=x2d(48, 64), block="32x1"),
            ValueError,
            r"x\.shape\[0\] \(M\) \(48\) must be a multiple of 32",
        ),
        (
            "block",
            dict(x=x2d(), block="2x16"),
            ValueError,
            r"block must be one of '1x32', '32x1', got '2x16'",
        ),
        ("block_none", dict(x=x2d(), block=None), ValueError, r"block must be one of"),
        (
            "mode",
            dict(x=x2d(), scaling_mode="round"),
            ValueError,
            r"scaling_mode must be one of 'floor', 'rceil'",
        ),
        ("blocked", dict(x=x2d(), blocked_scales=1), TypeError, r"blocked_scales must be a bool"),
        (
            "offs_i64",
            dict(x=x2d(), group_end_offsets=torch.tensor([3])),
            TypeError,
            r"group_end_offsets must be a 1-D torch\.int32 tensor",
        ),
        ("offs_list", dict(x=x2d(), group_end_offsets=[3]), TypeError, r"group_end_offsets must be a 1-D"),
        (
            "offs_2d",
            dict(x=x2d(), group_end_offsets=offs(3).view(1, 1)),
            ValueError,
            r"group_end_offsets must be a 1-D",
        ),
        (
            "offs_empty",
            dict(x=x2d(), group_end_offsets=offs()),
            ValueError,
            r"group_end_offsets must hold at least",
        ),
        (
            "offs_device",
            dict(x=x2d(), group_end_offsets=META_OFFS),
            ValueError,
            r"group_end_offsets must be on the same device as the data \(cpu\), got meta",
        ),
        (
            "offs_noncontig",
            dict(x=x2d(), group_end_offsets=NONCONTIG_OFFS),
            ValueError,
            r"group_end_offsets must be contiguous",
        ),
        (
            "offs_unblocked",
            dict(x=x2d(), group_end_offsets=offs(32), blocked_scales=False),
            ValueError,
            r"group_end_offsets is only supported with blocked_scales=True",
        ),
    ]
    out = []
    for cid, kw, exc, msg in cases:
        args = {**good, **kw}
        out.append(
            pytest.param(
                lambda a=args: contract.QUANTIZE_MXFP8_2D.check(
                    a["x"], a["block"], a["group_end_offsets"], a["scaling_mode"], a["blocked_scales"]
                ),
                lambda a=args: ref.quantize_mxfp8_2d(
                    a["x"],
                    block=a["block"],
                    group_end_offsets=a["group_end_offsets"],
                    scaling_mode=a["scaling_mode"],
                    blocked_scales=a["blocked_scales"],
                ),
                exc,
                msg if msg.startswith(op) else f"{op}: .*{msg}",
                id=f"q2d-{cid}",
            )
        )
    return out


def dual_cases():
    op = "quantize_mxfp8_2d_dual"
    good = dict(group_end_offsets=None, scaling_mode="rceil", blocked_scales=True)
    cases = [
        ("dtype", dict(x=x2d(dtype=torch.float64)), TypeError, r"x must be a 2-D tensor of dtype"),
        ("rank", dict(x=torch.zeros(64)), ValueError, r"x must be a 2-D tensor"),
        ("m", dict(x=x2d(40, 64)), ValueError, r"x\.shape\[0\] \(M\) \(40\) must be a multiple of 32"),
        ("k", dict(x=x2d(64, 40)), ValueError, r"x\.shape\[1\] \(K\) \(40\) must be a multiple of 32"),
        ("noncontig", dict(x=NONCONTIG_X), ValueError, r"x must be contiguous"),
        ("mode", dict(x=x2d(), scaling_mode="ceil"), ValueError, r"scaling_mode must be one of"),
        ("blocked", dict(x=x2d(), blocked_scales="yes"), TypeError, r"blocked_scales must be a bool"),
        (
            "offs",
            dict(x=x2d(), group_end_offsets=offs(1, 2).to(torch.int16)),
            TypeError,
            r"group_end_offsets must be a 1-D torch\.int32",
        ),
        (
            "offs_unblocked",
            dict(x=x2d(), group_end_offsets=offs(32), blocked_scales=False),
            ValueError,
            r"only supported with blocked_scales=True",
        ),
    ]
    return [
        pytest.param(
            lambda a={**good, **kw}: contract.QUANTIZE_MXFP8_2D_DUAL.check(
                a["x"], a["group_end_offsets"], a["scaling_mode"], a["blocked_scales"]
            ),
            lambda a={**good, **kw}: ref.quantize_mxfp8_2d_dual(
                a["x"],
                group_end_offsets=a["group_end_offsets"],
                scaling_mode=a["scaling_mode"],
                blocked_scales=a["blocked_scales"],
            ),
            exc,
            f"{op}: .*{msg}",
            id=f"dual-{cid}",
        )
        for cid, kw, exc, msg in cases
    ]


def q3d_cases():
    op = "quantize_mxfp8_3d"
    good = dict(block="1x32", scaling_mode="rceil", blocked_scales=True)
    w = torch.zeros(2, 64, 64, dtype=torch.float32)
    cases = [
        ("rank", dict(w=x2d()), ValueError, r"w must be a 3-D tensor of dtype"),
        ("dtype", dict(w=w.to(torch.float16)), TypeError, r"w must be a 3-D tensor of dtype"),
        ("noncontig", dict(w=w.transpose(1, 2)), ValueError, r"w must be contiguous"),
        (
            "n_32x1",
            dict(w=torch.zeros(2, 48, 64), block="32x1"),
            ValueError,
            r"w\.shape\[1\] \(N\) \(48\) must be a multiple of 32 for block='32x1'",
        ),
        (
            "k",
            dict(w=torch.zeros(2, 64, 48)),
            ValueError,
            r"w\.shape\[2\] \(K\) \(48\) must be a multiple of 32",
        ),
        ("k_32x1", dict(w=torch.zeros(2, 64, 48), block="32x1"), ValueError, r"w\.shape\[2\] \(K\)"),
        ("block", dict(w=w, block="1x16"), ValueError, r"block must be one of"),
        ("mode", dict(w=w, scaling_mode="FLOOR"), ValueError, r"scaling_mode must be one of"),
        ("blocked", dict(w=w, blocked_scales=None), TypeError, r"blocked_scales must be a bool"),
    ]
    return [
        pytest.param(
            lambda a={**good, **kw}: contract.QUANTIZE_MXFP8_3D.check(
                a["w"], a["block"], a["scaling_mode"], a["blocked_scales"]
            ),
            lambda a={**good, **kw}: ref.quantize_mxfp8_3d(
                a["w"], block=a["block"], scaling_mode=a["scaling_mode"], blocked_scales=a["blocked_scales"]
            ),
            exc,
            f"{op}: .*{msg}",
            id=f"q3d-{cid}",
        )
        for cid, kw, exc, msg in cases
    ]


def swizzle_cases():
    op = "swizzle_scales"
    good = dict(group_end_offsets=None, groups="M")
    s = torch.zeros(8, 8, dtype=torch.uint8)
    cases = [
        (
            "dtype",
            dict(scales=torch.zeros(8, 8)),
            TypeError,
            r"scales must be a 2-D or 3-D tensor of dtype torch\.float8_e8m0fnu or torch\.uint8",
        ),
        (
            "rank",
            dict(scales=torch.zeros(2, 2, 2, 2, dtype=torch.uint8)),
            ValueError,
            r"scales must be a 2-D or 3-D",
        ),
        ("rank1", dict(scales=torch.zeros(8, dtype=torch.uint8)), ValueError, r"scales must be a 2-D or 3-D"),
        ("noncontig", dict(scales=s.t()[:, :4]), ValueError, r"scales must be contiguous"),
        ("groups", dict(scales=s, groups="N"), ValueError, r"groups must be one of 'M', 'K', got 'N'"),
        (
            "3d_offsets",
            dict(scales=torch.zeros(2, 8, 8, dtype=torch.uint8), group_end_offsets=offs(8)),
            ValueError,
            r"group_end_offsets is not supported with 3-D scales",
        ),
        (
            "offs_dtype",
            dict(scales=s, group_end_offsets=torch.tensor([8.0])),
            TypeError,
            r"group_end_offsets must be a 1-D torch\.int32",
        ),
        (
            "offs_device",
            dict(scales=s, group_end_offsets=META_OFFS),
            ValueError,
            r"group_end_offsets must be on the same",
        ),
    ]
    return [
        pytest.param(
            lambda a={**good, **kw}: contract.SWIZZLE_SCALES.check(
                a["scales"], a["group_end_offsets"], a["groups"]
            ),
            lambda a={**good, **kw}: ref.swizzle_scales(
                a["scales"], group_end_offsets=a["group_end_offsets"], groups=a["groups"]
            ),
            exc,
            f"{op}: .*{msg}",
            id=f"swizzle-{cid}",
        )
        for cid, kw, exc, msg in cases
    ]


def pad_cases():
    op = "pad_token_groups"
    good = dict(x=x2d(), group_end_offsets=offs(10, 64), alignment=32)
    cases = [
        (
            "dtype",
            dict(x=torch.zeros(4, 4, dtype=torch.complex128)),
            TypeError,
            r"x must be a 2-D tensor of a dtype of 1, 2, 4 or 8 bytes, got .*complex128",
        ),
        ("rank", dict(x=torch.zeros(4)), ValueError, r"x must be a 2-D tensor"),
        ("noncontig", dict(x=NONCONTIG_X), ValueError, r"x must be contiguous"),
        (
            "offs_none",
            dict(group_end_offsets=None),
            TypeError,
            r"group_end_offsets must be a 1-D torch\.int32",
        ),
        (
            "offs_empty",
            dict(group_end_offsets=offs()),
            ValueError,
            r"group_end_offsets must hold at least one",
        ),
        (
            "offs_device",
            dict(group_end_offsets=META_OFFS),
            ValueError,
            r"group_end_offsets must be on the same device",
        ),
        ("align8", dict(alignment=8), ValueError, r"alignment must be one of 16, 32, 64, 128, got 8"),
        ("align_float", dict(alignment=32.0), TypeError, r"alignment must be an int"),
        ("align_bool", dict(alignment=True), TypeError, r"alignment must be an int"),
    ]
    return [
        pytest.param(
            lambda a={**good, **kw}: contract.PAD_TOKEN_GROUPS.check(
                a["x"], a["group_end_offsets"], a["alignment"]
            ),
            lambda a={**good, **kw}: ref.pad_token_groups(
                a["x"], a["group_end_offsets"], alignment=a["alignment"]
            ),
            exc,
            f"{op}: .*{msg}",
            id=f"pad-{cid}",
        )
        for cid, kw, exc, msg in cases
    ]


def unpad_cases():
    op = "unpad_token_groups"
    good = dict(padded=x2d(), group_end_offsets=offs(10, 20), padded_start=offs(0, 32))
    cases = [
        (
            "dtype",
            dict(padded=torch.zeros(4, 4, dtype=torch.complex128)),
            TypeError,
            r"padded must be a 2-D tensor",
        ),
        ("rank", dict(padded=torch.zeros(2, 2, 2)), ValueError, r"padded must be a 2-D tensor"),
        (
            "offs",
            dict(group_end_offsets=offs(1).to(torch.int64)),
            TypeError,
            r"group_end_offsets must be a 1-D",
        ),
        (
            "start_dtype",
            dict(padded_start=offs(0, 32).to(torch.int64)),
            TypeError,
            r"padded_start must be a 1-D torch\.int32",
        ),
        (
            "start_len",
            dict(padded_start=offs(0)),
            ValueError,
            r"padded_start must have the same length as group_end_offsets \(2\), got 1",
        ),
        (
            "start_device",
            dict(padded_start=offs(0, 32, device="meta")),
            ValueError,
            r"padded_start must be on the same device",
        ),
    ]
    return [
        pytest.param(
            lambda a={**good, **kw}: contract.UNPAD_TOKEN_GROUPS.check(
                a["padded"], a["group_end_offsets"], a["padded_start"], None
            ),
            lambda a={**good, **kw}: ref.unpad_token_groups(
                a["padded"], a["group_end_offsets"], a["padded_start"]
            ),
            exc,
            f"{op}: .*{msg}",
            id=f"unpad-{cid}",
        )
        for cid, kw, exc, msg in cases
    ]


def pad_quant_cases():
    op = "pad_and_quantize_mxfp8_2d"
    good = dict(x=x2d(), group_end_offsets=offs(10, 64), alignment=32, scaling_mode="rceil")
    cases = [
        (
            "dtype",
            dict(x=torch.zeros(4, 32, dtype=torch.float8_e4m3fn)),
            TypeError,
            r"x must be a 2-D tensor of dtype torch\.bfloat16 or torch\.float32",
        ),
        ("rank", dict(x=torch.zeros(2, 2, 32)), ValueError, r"x must be a 2-D"),
        ("k", dict(x=x2d(64, 40)), ValueError, r"x\.shape\[1\] \(K\) \(40\) must be a multiple of 32"),
        ("offs", dict(group_end_offsets=offs(3).view(1, 1)), ValueError, r"group_end_offsets must be a 1-D"),
        ("align", dict(alignment=256), ValueError, r"alignment must be one of"),
        ("mode", dict(scaling_mode=None), ValueError, r"scaling_mode must be one of"),
    ]
    return [
        pytest.param(
            lambda a={**good, **kw}: contract.PAD_AND_QUANTIZE_MXFP8_2D.check(
                a["x"], a["group_end_offsets"], a["alignment"], a["scaling_mode"]
            ),
            lambda a={**good, **kw}: ref.pad_and_quantize_mxfp8_2d(
                a["x"], a["group_end_offsets"], alignment=a["alignment"], scaling_mode=a["scaling_mode"]
            ),
            exc,
            f"{op}: .*{msg}",
            id=f"padq-{cid}",
        )
        for cid, kw, exc, msg in cases
    ]


ALL_CASES = (
    q2d_cases()
    + dual_cases()
    + q3d_cases()
    + swizzle_cases()
    + pad_cases()
    + unpad_cases()
    + pad_quant_cases()
)


@pytest.mark.parametrize("check_call, ref_call, exc, msg", ALL_CASES)
def test_bad_input_raises(check_call, ref_call, exc, msg):
    with pytest.raises(exc, match=msg):
        check_call()
    # the reference runs the same check first, so it raises the same error
    with pytest.raises(exc, match=msg):
        ref_call()


def test_type_errors_are_not_value_errors():
    # SPEC: wrong types/dtypes are TypeError, everything else ValueError; keep the two apart
    with pytest.raises(TypeError) as info:
        contract.QUANTIZE_MXFP8_2D.check(x2d(dtype=torch.float16), "1x32", None, "rceil", True)
    assert not isinstance(info.value, ValueError)


def test_valid_inputs_pass():
    x = x2d(128, 64)
    contract.QUANTIZE_MXFP8_2D.check(x, "1x32", offs(64, 128), "floor", True)
    contract.QUANTIZE_MXFP8_2D.check(x, "32x1", None, "rceil", False)
    contract.QUANTIZE_MXFP8_2D_DUAL.check(x, offs(128), "rceil", True)
    contract.QUANTIZE_MXFP8_3D.check(torch.zeros(2, 64, 32), "32x1", "floor", False)
    contract.SWIZZLE_SCALES.check(torch.zeros(3, 5, dtype=torch.float8_e8m0fnu), offs(1, 3), "K")
    contract.SWIZZLE_SCALES.check(torch.zeros(2, 3, 5, dtype=torch.uint8), None, "M")
    contract.PAD_TOKEN_GROUPS.check(torch.zeros(5, 3, dtype=torch.float8_e4m3fn), offs(5), 16)
    contract.UNPAD_TOKEN_GROUPS.check(x, offs(5), offs(0), None)
    contract.PAD_AND_QUANTIZE_MXFP8_2D.check(x, offs(5), 128, "floor")
    checks.check_backend("cute")
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'cute', 'reference'"):
        checks.check_backend("triton", op="quantize_mxfp8_2d")


def test_checks_work_on_meta_tensors_without_reading_values():
    """Meta tensors carry no data: a check that read a value (a sync on CUDA) would fail here."""
    big = torch.empty(131072, 7168, dtype=torch.bfloat16, device="meta")
    o = torch.empty(64, dtype=I32, device="meta")
    contract.QUANTIZE_MXFP8_2D.check(big, "1x32", o, "rceil", True)
    contract.QUANTIZE_MXFP8_2D.check(big, "32x1", o, "floor", True)
    contract.QUANTIZE_MXFP8_2D_DUAL.check(big, o, "rceil", True)
    contract.QUANTIZE_MXFP8_3D.check(torch.empty(8, 4096, 7168, device="meta"), "32x1", "rceil", True)
    contract.SWIZZLE_SCALES.check(torch.empty(131072, 224, dtype=torch.float8_e8m0fnu, device="meta"), o, "M")
    contract.SWIZZLE_SCALES.check(torch.empty(7168, 4096, dtype=torch.uint8, device="meta"), o, "K")
    contract.PAD_TOKEN_GROUPS.check(big, o, 128)
    contract.UNPAD_TOKEN_GROUPS.check(big, o, torch.empty(64, dtype=I32, device="meta"), None)
    contract.PAD_AND_QUANTIZE_MXFP8_2D.check(big, o, 32, "floor")
    with pytest.raises(ValueError, match="same device as the data \\(meta\\), got cpu"):
        contract.PAD_TOKEN_GROUPS.check(big, offs(1), 32)


@pytest.mark.parametrize("module", ["checks", "contract", "op_specs"])
def test_checks_source_has_no_syncing_calls(module):
    from cute_kernels import op_specs

    src = Path({"checks": checks, "contract": contract, "op_specs": op_specs}[module].__file__).read_text()
    code = "\n".join(line.split("#", 1)[0] for line in src.splitlines())
    forbidden = [
        r"\.item\(",
        r"\.tolist\(",
        r"nonzero",
        r"\.cpu\(",
        r"['\"]cpu['\"]",
        r"\.numpy\(",
        r"\bbool\(",
        r"\bint\(",
        r"\bfloat\(",
        r"torch\.equal",
        r"\.any\(",
        r"\.all\(",
    ]
    for pat in forbidden:
        assert not re.search(pat, code), f"{module}.py must not read tensor values: found {pat}"


def test_kernel_expert_limit():
    checks.check_kernel_experts("quantize_fp8_3d", checks.MAX_KERNEL_EXPERTS)
    with pytest.raises(ValueError, match="at most 65535; got E = 65536"):
        checks.check_kernel_experts("quantize_fp8_3d", 65536)
