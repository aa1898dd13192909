"""The row passes bounded by the last group end on CPU (notes/bounded-row-passes.md): the references
of ``quantize_fp8_2d(axis="row", group_end_offsets=...)`` and ``dequantize_fp8_rows`` (their rows
below the bound against independent formulas, every E4M3 byte and special scales, the bf16
rounding bit by bit), the checks, the public functions and custom ops on CPU, and
``QuantizedTokens.dequantized``."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_bindings as tb
from torch_bindings import reference as R
from torch_bindings.moe.tokens import QuantizedTokens

I32, E4M3 = torch.int32, torch.float8_e4m3fn
INF, NAN = float("inf"), float("nan")


def _ends(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=I32)


def _x(rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scale = torch.pow(10.0, torch.empty(rows, 1).uniform_(-20, 20, generator=gen))
    return (torch.randn(rows, cols, generator=gen) * scale).to(dtype)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


ENDS = {  # (M = 300): bounds 0, 1, M, mid-tile; empty groups; one group; many groups
    "bound 0": (0,),
    "bound 0, G = 3": (0, 0, 0),
    "bound 1": (1,),
    "bound M": (300,),
    "mid tile": (64, 64, 200),
    "empty groups": (0, 10, 10, 10, 131, 131),
    "large G": tuple(e // 8 for e in range(2048)),  # 2048 groups of 0 or 1 row, bound 255
}


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", sorted(ENDS))
def test_bounded_row_reference(case, dtype, rounding):
    x = _x(300, 72, dtype)
    ends = ENDS[case]
    offsets = _ends(*ends)
    bound = ends[-1]
    q, s = R.quantize_fp8_2d(x, axis="row", group_end_offsets=offsets, round_scales_to_power_of_2=rounding)
    q_all, s_all = R.quantize_fp8_2d(x, axis="row", round_scales_to_power_of_2=rounding)
    assert q.shape == q_all.shape and q.stride() == q_all.stride() and s.shape == s_all.shape
    assert torch.equal(_bytes(q[:bound]), _bytes(q_all[:bound]))
    assert torch.equal(s[:bound], s_all[:bound])
    assert not _bytes(q[bound:]).any() and torch.all(s[bound:] == 1.0)  # the reference's choice


@pytest.mark.parametrize("ends", [(301,), (5, 3), (-1,)])
def test_bounded_references_validate_offsets(ends):
    x = _x(300, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="group_end_offsets"):
        R.quantize_fp8_2d(x, axis="row", group_end_offsets=_ends(*ends))
    q, s = R.quantize_fp8_2d(x)
    with pytest.raises(ValueError, match="group_end_offsets"):
        R.dequantize_fp8_rows(q, s, _ends(*ends))


def _every_byte() -> torch.Tensor:
    return torch.arange(256, dtype=torch.uint8).view(E4M3)


#: Scales: powers of 2 across the range (the tiny ones make subnormal and zero products), others
#: that round (0.1, 3, 1/3), the largest fp32, zeros, infinities and NaN.
SCALES = [2.0**e for e in (-149, -140, -133, -126, -120, -20, -1, 0, 1, 7, 20, 100, 120, 127)] + [
    0.1, 3.0, 1 / 3, 3.4028234663852886e38, 0.0, -0.0, -2.0, INF, -INF, NAN,
]  # fmt: skip


def _bf16_rne_bits(y: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 bits, round to nearest even, by integer arithmetic; NaN -> 0x7FFF."""
    bits = y.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = torch.where(torch.isnan(y), 0x7FFF, rounded)
    return torch.where(rounded >= 0x8000, rounded - 0x10000, rounded).to(torch.int16)


def test_dequantize_reference_every_byte_and_special_scales():
    """Each row: all 256 E4M3 bytes times one scale; against fp64 products rounded once to fp32 (an
    E4M3 times an fp32 is exact in fp64) and then to bf16 by integer rounding."""
    q = _every_byte().repeat(len(SCALES), 1)
    scales = torch.tensor(SCALES, dtype=torch.float32)
    x = R.dequantize_fp8_rows(q, scales, _ends(len(SCALES)))
    product = (q.to(torch.float64) * scales.to(torch.float64)[:, None]).to(torch.float32)
    assert torch.equal(x.view(torch.int16), _bf16_rne_bits(product))
    # exact for power-of-2 scales while the products stay normal and finite (2^-20 ... 2^100)
    pow2 = slice(5, 12)
    exact = q[pow2].float() * scales[pow2, None]
    torch.testing.assert_close(x[pow2].float(), exact, rtol=0, atol=0, equal_nan=True)


def test_bf16_rne_on_ties_subnormals_and_nans():
    bits = torch.tensor(
        [0x3F808000, 0x3F818000, 0x3F808001, 0x00008000, 0x00018000, 0x007FFFFF, 0x7F7FFFFF,
         0xFF7F8000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x80000000],
        dtype=torch.int64,
    )  # fmt: skip
    y = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)
    assert torch.equal(R.bf16_rne(y).view(torch.int16), _bf16_rne_bits(y))
    assert R.bf16_rne(y).view(torch.int16)[8:11].tolist() == [R.BF16_NAN_BITS] * 3


@pytest.mark.parametrize("case", sorted(ENDS))
def test_dequantize_reference_bound(case):
    ends = ENDS[case]
    q, s = R.quantize_fp8_2d(_x(300, 48, torch.bfloat16))
    x = R.dequantize_fp8_rows(q, s, _ends(*ends))
    bound = ends[-1]
    assert x.shape == q.shape and x.dtype == torch.bfloat16 and x.is_contiguous()
    assert torch.equal(x[:bound], (q[:bound].float() * s[:bound, None]).bfloat16())
    assert not x[bound:].view(torch.int16).any()


def test_checks():
    x = _x(64, 32, torch.bfloat16)
    tb.quantize_fp8_2d(x, axis="row", group_end_offsets=_ends(10))  # accepted now
    with pytest.raises(TypeError, match="quantize_fp8_2d: group_end_offsets must be a 1-D torch.int32"):
        tb.quantize_fp8_2d(x, axis="row", group_end_offsets=_ends(10).long())
    with pytest.raises(ValueError, match="at least one group"):
        tb.quantize_fp8_2d(x, axis="row", group_end_offsets=_ends())
    q, s = R.quantize_fp8_2d(x)
    ends = _ends(64)
    bad = [
        ((x, s, ends), TypeError, "q must be a 2-D tensor of dtype torch.float8_e4m3fn"),
        ((q[None], s, ends), ValueError, "q must be a 2-D tensor"),
        ((q.t(), s, ends), ValueError, "q must be contiguous"),
        ((q, s.double(), ends), TypeError, "scales must be a 1-D tensor of dtype torch.float32"),
        ((q, s[:, None], ends), ValueError, "scales must be a 1-D tensor"),
        ((q, s[::2], ends), ValueError, "scales must be contiguous"),
        ((q, s[:10], ends), ValueError, "scales must hold one scale per row of q \\(64\\), got 10"),
        ((q, s.to("meta"), ends), ValueError, "q and scales must be on one device"),
        ((q, s, ends.long()), TypeError, "group_end_offsets must be a 1-D torch.int32"),
        ((q, s, ends[None]), ValueError, "group_end_offsets must be a 1-D"),
        ((q, s, _ends()), ValueError, "group_end_offsets must hold at least one group"),
        ((q, s, [64]), TypeError, "group_end_offsets"),
    ]
    for args, error, message in bad:
        for run in (tb.dequantize_fp8_rows, R.dequantize_fp8_rows):
            with pytest.raises(error, match=f"^dequantize_fp8_rows: {message}"):
                run(*args)


def test_public_functions_on_cpu():
    x = _x(40, 32, torch.float32)
    ends = _ends(3, 17)
    q, s = tb.quantize_fp8_2d(x, group_end_offsets=ends)
    q_ref, s_ref = R.quantize_fp8_2d(x, group_end_offsets=ends)
    assert torch.equal(_bytes(q), _bytes(q_ref)) and torch.equal(s, s_ref)
    out = tb.dequantize_fp8_rows(q, s, ends)
    assert torch.equal(out.view(torch.int16), R.dequantize_fp8_rows(q, s, ends).view(torch.int16))
    with pytest.raises(RuntimeError, match="backend='cute' cannot run here"):
        tb.dequantize_fp8_rows(q, s, ends, backend="cute")
    with pytest.raises(RuntimeError, match="backend='cute' cannot run here"):
        tb.quantize_fp8_2d(x, group_end_offsets=ends, backend="cute")
    assert "dequantize_fp8_rows" in tb.__all__


def test_fake_implementation_shapes():
    with FakeTensorMode():
        x = torch.empty(1000, 96, dtype=torch.bfloat16)
        q = torch.empty(1000, 96, dtype=E4M3)
        s = torch.empty(1000, dtype=torch.float32)
        ends = torch.empty(6, dtype=I32)
        out = torch.ops.cute_kernels.dequantize_fp8_rows(q, s, ends)
        q1, s1 = torch.ops.cute_kernels.quantize_fp8_2d_row_bounded(x, ends, True)
    assert out.shape == (1000, 96) and out.dtype == torch.bfloat16
    assert q1.shape == (1000, 96) and q1.dtype == E4M3 and s1.shape == (1000,) and s1.dtype == torch.float32


def test_tokens_dequantized_rows_below_the_end():
    """fp8_rowwise tokens: the rows below the last end as the old PyTorch expression gave them."""
    q, s = R.quantize_fp8_2d(_x(96, 64, torch.bfloat16))
    ends = _ends(16, 16, 48)
    tokens = QuantizedTokens("fp8_rowwise", q, s, ends, alignment=16)
    out = tokens.dequantized()
    assert out.shape == (96, 64) and out.dtype == torch.bfloat16
    assert torch.equal(out[:48], (q[:48].float() * s[:48, None]).bfloat16())
