"""The SwiGLU + FP8 rowwise reference on CPU (docs/contract.md, "SwiGLU with FP8 rowwise"): the
exact-op silu against float64 on every bf16 gate value, special values, the bf16 outputs against
float64, the quantization being ``quantize_fp8_2d`` of the bf16 outputs, shapes and the errors;
the rows bounded by the last group end (``group_end_offsets``): the reference, the checks, the
custom ops' fakes and the launcher's kernel keys and arguments."""

from __future__ import annotations

import pytest
import torch

import torch_bindings
from cute_utils.constants import (
    SILU_TABLE_END,
    SILU_TABLE_FIRST,
    SILU_TABLE_FN,
    SILU_TABLE_SPAN,
    SWIGLU_CLAMP,
)
from torch_bindings import reference as R

INF, NAN = float("inf"), float("nan")
ROOT = -1.2784645427610738  # the zero of silu'(g)


def _every_bf16(finite: bool = True) -> torch.Tensor:
    """All 65536 bf16 bit patterns as fp32 (the finite ones with ``finite``)."""
    g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    return g[torch.isfinite(g)] if finite else g


def _ulps(value: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|value - exact| in fp32 ulps of ``exact`` (2^-149 in the subnormal range)."""
    magnitude = exact.abs().clamp(min=2.0**-126)
    return (value.double() - exact).abs() / torch.exp2(torch.floor(torch.log2(magnitude)) - 23)


def _silu64(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 ``(silu, silu', sigmoid)`` of fp32 g (exact to ~1e-16 relative)."""
    gd = g.double()
    sig = torch.sigmoid(gd)
    return gd * sig, sig * (1 + gd * (1 - sig)), sig


def _bits16(t: torch.Tensor) -> list[int]:
    return [b & 0xFFFF for b in t.contiguous().view(torch.int16).flatten().tolist()]


def _bf16_ulps(value: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|value - exact| in bf16 ulps of ``exact`` (finite, normal range)."""
    return (value.double() - exact).abs() / torch.exp2(torch.floor(torch.log2(exact.abs())) - 7)


# ---- the exact-op silu ------------------------------------------------------------------------


def test_silu_within_2_1_ulp_of_float64_on_every_bf16():
    g = _every_bf16()
    silu, _, _ = _silu64(g)
    assert _ulps(R.silu_fp32(g), silu).max() <= 2.1


def test_silu_backward_error_bound_on_every_bf16():
    """silu' within 2.4 (ulp(silu') + 2^-24 sigmoid(g)): a few ulps, except near its zero at g =
    -1.278 where ``1 + g (1 - s)`` cancels and the absolute error stays a few 2^-24 sigmoid."""
    g = _every_bf16()
    silu, dsilu, sig = _silu64(g)
    got_silu, got_dsilu = R.silu_backward_fp32(g)
    assert torch.equal(got_silu.view(torch.int32), R.silu_fp32(g).view(torch.int32))
    ulp = torch.exp2(torch.floor(torch.log2(dsilu.abs().clamp(min=2.0**-126))) - 23)
    assert ((got_dsilu.double() - dsilu).abs() / (ulp + 2.0**-24 * sig)).max() <= 2.4
    away = (g.double() - ROOT).abs() > 0.5
    assert _ulps(got_dsilu, dsilu)[away].max() <= 3.0


def _kernel_lookup(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """silu and silu' of fp32 ``g`` (widened bf16) as ``cute_utils.swiglu_math`` finds them: the
    table entry ``[sign][magnitude bits % 4096]`` inside the table's range, ``g * 0.5`` and 0.5
    below it, past it g and 1 for g > 0, -0 and -0 for g < 0, NaN for NaN."""
    bits = g.view(torch.int32)
    magnitude = bits & 0x7FFFFFFF
    index = ((bits >> 16) & (SILU_TABLE_SPAN - 1)) | ((bits >> 19) & SILU_TABLE_SPAN)
    table = R.silu_table()
    small, big = magnitude < SILU_TABLE_FIRST << 16, magnitude >= SILU_TABLE_END << 16
    negative, nan = bits <= -(1 << 23), magnitude > 0x7F800000
    minus_zero = torch.full_like(g, -0.0)
    silu = torch.where(small, g * 0.5, torch.where(big, torch.where(negative, minus_zero, g), table[index]))
    one = torch.where(nan, g, torch.ones_like(g))
    big_grad = torch.where(negative, minus_zero, one)
    dsilu = torch.where(small, 0.5, torch.where(big, big_grad, table[SILU_TABLE_FN + index]))
    return silu, dsilu


def test_the_kernels_lookup_is_the_sequence_on_every_bf16():
    """The kernels' table and closed forms give the contract's silu and silu' bit for bit on all
    65536 bf16 gates (NaN as NaN); no closed form holds a binade into the table (it is as small as
    it can be)."""
    g = _every_bf16(finite=False)
    silu, dsilu = R.silu_backward_fp32(g)
    got_silu, got_dsilu = _kernel_lookup(g)
    for got, want in ((got_silu, silu), (got_dsilu, dsilu)):
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))
    magnitude = g.view(torch.int32) >> 16 & 0x7FFF
    first = (magnitude >> 7) == SILU_TABLE_FIRST >> 7  # the table's first binade
    assert not torch.equal(silu[first].view(torch.int32), (g[first] * 0.5).view(torch.int32))
    last = ((magnitude >> 7) == (SILU_TABLE_END >> 7) - 1) & (g < 0)  # its last negative binade
    assert bool((silu[last] != 0).any())


def test_silu_table_layout():
    """``reference.silu_table``: ``[fn][sign][bits % 4096]``, fn 0 silu and 1 silu', sign 1 for
    negative g, over the bf16 magnitudes [SILU_TABLE_FIRST, SILU_TABLE_END)."""
    table = R.silu_table()
    assert table.dtype == torch.float32 and table.shape == (2 * SILU_TABLE_FN,)
    assert SILU_TABLE_FN == 2 * SILU_TABLE_SPAN == 2 * (SILU_TABLE_END - SILU_TABLE_FIRST) == 8192
    for bits in (SILU_TABLE_FIRST, 0x3F80, 0x4000, SILU_TABLE_END - 1):
        for sign in (0, 1):
            pattern = torch.tensor([bits | sign << 15], dtype=torch.int32).to(torch.int16)
            silu, dsilu = R.silu_backward_fp32(pattern.view(torch.bfloat16).float())
            at = sign * SILU_TABLE_SPAN + bits % SILU_TABLE_SPAN
            assert table[at].view(torch.int32) == silu.view(torch.int32)
            assert table[SILU_TABLE_FN + at].view(torch.int32) == dsilu.view(torch.int32)


def test_range_reduction_is_exact():
    """``y + nf * -LN2_HI`` (y = -|g| clamped) is exact for every bf16 g: the product has at most
    23 significant bits and the sum cancels (Sterbenz)."""
    from cute_utils.constants import SWIGLU_LN2_HI_BITS, SWIGLU_LOG2E_BITS, f32_of_bits

    y = -_every_bf16().abs().clamp(max=SWIGLU_CLAMP)
    nf = torch.round(y * f32_of_bits(SWIGLU_LOG2E_BITS))
    ln2_hi = f32_of_bits(SWIGLU_LN2_HI_BITS)
    assert torch.equal((y + nf * -ln2_hi).double(), y.double() - nf.double() * ln2_hi)


def test_silu_special_values():
    g = torch.tensor([0.0, -0.0, INF, -INF, NAN, -NAN, 1e30, -1e30, -SWIGLU_CLAMP, -120.0, 2.0**-133])
    silu, dsilu = R.silu_backward_fp32(g)
    assert _bits16(silu[:2].bfloat16()) == [0x0000, 0x8000]  # silu(+-0) = +-0
    assert silu[2] == INF and silu[3] == 0 and silu[3].signbit()  # silu(-Inf) = -0
    assert torch.isnan(silu[4:6]).all() and torch.isnan(dsilu[4:6]).all()
    assert silu[6] == 1e30 and silu[7] == 0 and silu[7].signbit()
    assert silu[8] == 0 and silu[9] == 0  # below -108.7 silu rounds to -0
    assert silu[10] == 2.0**-134  # g / 2 for a subnormal g
    assert dsilu[0] == 0.5 and dsilu[1] == 0.5 and dsilu[2] == 1.0 and dsilu[6] == 1.0
    assert dsilu[3] == 0 and dsilu[7] == 0  # silu'(-Inf) = -0 * ... = 0


def test_silu_keeps_subnormal_results():
    """silu(g) for fp32 g in [-108, -87] is subnormal or near it: the power of 2 goes on last, so it
    is rounded once (ulps of the subnormal grid are 2^-149)."""
    g = torch.linspace(-108.0, -87.0, 20001)
    silu, _, _ = _silu64(g)
    got = R.silu_fp32(g)
    assert _ulps(got, silu).max() <= 2.1
    assert (got != 0).all()


# ---- the bf16 outputs -------------------------------------------------------------------------


def _random_h13(rows: int, half: int, seed: int, spread: float = 4.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    h13 = torch.randn(rows, 2 * half, generator=gen) * spread
    return h13.bfloat16()


def test_h_is_rounded_from_float64_within_one_bf16_ulp():
    h13 = _random_h13(256, 512, 0, spread=8.0)
    h = R.swiglu(h13)
    silu, _, _ = _silu64(h13[:, :512].float())
    exact = silu * h13[:, 512:].double()
    nonzero = exact.abs() > 2.0**-120
    ulps = _bf16_ulps(h.float()[nonzero], exact[nonzero])
    assert ulps.max() <= 1.0
    # correctly rounded almost everywhere: the fp32 errors are far below half a bf16 ulp
    assert (h == exact.to(torch.bfloat16))[nonzero].float().mean() > 0.999


def test_backward_is_rounded_from_float64_within_one_bf16_ulp():
    h13 = _random_h13(256, 512, 1, spread=6.0)
    grad = (torch.randn(256, 512, generator=torch.Generator().manual_seed(2)) * 1e-3).bfloat16()
    out = R.swiglu_backward(grad, h13)
    silu, dsilu, _ = _silu64(h13[:, :512].float())
    gd, ud = grad.double(), h13[:, 512:].double()
    d_up, d_gate = gd * silu, gd * ud * dsilu
    away = (h13[:, :512].double() - ROOT).abs() > 0.5
    for got, exact, mask in ((out[:, 512:], d_up, d_up != 0), (out[:, :512], d_gate, away & (d_gate != 0))):
        assert _bf16_ulps(got.float()[mask], exact[mask]).max() <= 1.0


def test_backward_matches_autograd_of_float64_swiglu():
    h13 = _random_h13(64, 96, 3).double().requires_grad_()
    grad = torch.randn(64, 96, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    (torch.nn.functional.silu(h13[:, :96]) * h13[:, 96:]).backward(grad.bfloat16().double())
    got = R.swiglu_backward(grad.bfloat16(), h13.detach().bfloat16())
    assert torch.allclose(got.double(), h13.grad, rtol=2**-7, atol=1e-6)


def test_nan_outputs_are_canonical():
    """Every NaN output is the bf16 0x7FC0, whatever the NaN's sign or origin."""
    h13 = torch.tensor([[NAN, 0.0, -NAN, 1.0, 2.0, INF, INF, 3.0]]).bfloat16()  # gate | up, H = 4
    h = R.swiglu(h13)
    assert _bits16(h)[:3] == [0x7FC0] * 3 and torch.isfinite(h[0, 3])  # NaN g, 0 * Inf, -NaN g
    grad = torch.tensor([[1.0, 1.0, 1.0, NAN]]).bfloat16()
    bits = _bits16(R.swiglu_backward(grad, h13))
    # d_gate: NaN g, (1 * Inf) * 0.5 = Inf, -NaN g, NaN grad; d_up: NaN, 1 * silu(0) = 0, NaN, NaN
    assert bits == [0x7FC0, 0x7F80, 0x7FC0, 0x7FC0, 0x7FC0, 0x0000, 0x7FC0, 0x7FC0]


# ---- the fused ops: quantization, shapes, errors ------------------------------------------------


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("rows,half", [(0, 8), (1, 8), (3, 5), (7, 64), (33, 200), (4, 0)])
def test_forward_is_swiglu_then_quantize(rows, half, rounding):
    h13 = _random_h13(rows, half, rows + half)
    h, q, scales = R.swiglu_quantize_fp8(h13, round_scales_to_power_of_2=rounding)
    q_ref, s_ref = R.quantize_fp8_2d(R.swiglu(h13), axis="row", round_scales_to_power_of_2=rounding)
    assert h.shape == (rows, half) and h.dtype == torch.bfloat16 and h.is_contiguous()
    assert torch.equal(h.view(torch.int16), R.swiglu(h13).view(torch.int16))
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and q.stride() == q_ref.stride()
    assert torch.equal(scales.view(torch.int32), s_ref.view(torch.int32)) and scales.shape == (rows,)
    if half == 0:
        assert (scales == 1.0).all()


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("rows,half", [(0, 8), (1, 8), (3, 5), (7, 64), (33, 200), (4, 0)])
def test_backward_is_gradient_then_quantize_along_2h(rows, half, rounding):
    h13 = _random_h13(rows, half, 2 * rows + half)
    grad = _random_h13(rows, half, rows)[:, :half].contiguous()
    grad_h13, q, scales = R.swiglu_backward_quantize_fp8(grad, h13, round_scales_to_power_of_2=rounding)
    expected = R.swiglu_backward(grad, h13)
    q_ref, s_ref = R.quantize_fp8_2d(expected, axis="row", round_scales_to_power_of_2=rounding)
    assert grad_h13.shape == (rows, 2 * half) and torch.equal(
        grad_h13.view(torch.int16), expected.view(torch.int16)
    )
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and q.shape == (rows, 2 * half)
    assert torch.equal(scales.view(torch.int32), s_ref.view(torch.int32))


def test_row_amax_spans_both_halves_of_the_gradient():
    """One large d_up in a row sets the scale of the whole 2H row (its d_gate half included)."""
    h13 = torch.zeros(2, 16).bfloat16()
    h13[:, :8] = 1.0  # silu(1) = 0.73, silu'(1) = 0.93; u = 0: d_gate = 0
    grad = torch.ones(2, 8).bfloat16()
    grad[1, 3] = 1000.0
    _, q, scales = R.swiglu_backward_quantize_fp8(grad, h13)
    assert scales[1] > scales[0] * 512
    assert q[1, 8 + 3].float() * scales[1] == pytest.approx(731.0, rel=2**-3)


def test_special_rows_quantize_like_quantize_fp8_2d():
    h13 = torch.tensor([[1.0, -2.0, 3.0, 4.0], [INF, 1.0, 1.0, 1.0], [0.0, 1.0, INF, 1.0], [-INF, 0, 1, 1]])
    h, q, scales = R.swiglu_quantize_fp8(h13.bfloat16())
    assert scales[1] == INF and q[1].view(torch.uint8).tolist() == [0x7F, 0x00]  # h = (Inf, 0.73)
    assert torch.isnan(scales[2]) and q[2].view(torch.uint8).tolist() == [0x7F, 0x7F]  # 0 * Inf
    assert _bits16(h[3]) == [0x8000, 0x0000] and scales[3] == 1.0 / 2.0**48  # silu(-Inf) = -0


def test_chunked_rows_match_one_pass(monkeypatch):
    h13 = _random_h13(37, 24, 5)
    grad = _random_h13(37, 12, 6)
    whole = R.swiglu(h13), R.swiglu_backward(grad, h13)
    monkeypatch.setattr(R, "_SWIGLU_CHUNK_ELEMS", 100)  # 4 rows per chunk
    for got, want in zip((R.swiglu(h13), R.swiglu_backward(grad, h13)), whole, strict=True):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


BF16 = torch.bfloat16


@pytest.mark.parametrize(
    "h13,error,match",
    [
        (torch.zeros(4, 8), TypeError, "h13 must be a 2-D tensor of dtype torch.bfloat16"),
        (torch.zeros(4, 8, dtype=torch.float16), TypeError, "h13"),
        (torch.zeros(2, 4, 8, dtype=BF16), ValueError, "h13 must be a 2-D"),
        (torch.zeros(4, 7, dtype=BF16), ValueError, "h13's last dim must be even"),
        (torch.zeros(8, 4, dtype=BF16).t(), ValueError, "h13 must be contiguous"),
        ([[1.0, 2.0]], TypeError, "h13"),
    ],
)
def test_forward_errors(h13, error, match):
    for run in (R.swiglu_quantize_fp8, torch_bindings.swiglu_quantize_fp8):
        with pytest.raises(error, match=f"swiglu_quantize_fp8: {match}"):
            run(h13)


def test_forward_rounding_flag_error():
    with pytest.raises(TypeError, match="swiglu_quantize_fp8: round_scales_to_power_of_2 must be a bool"):
        torch_bindings.swiglu_quantize_fp8(torch.zeros(2, 8, dtype=BF16), round_scales_to_power_of_2=1)
    with pytest.raises(ValueError, match="swiglu_quantize_fp8: backend must be one of"):
        torch_bindings.swiglu_quantize_fp8(torch.zeros(2, 8, dtype=BF16), backend="triton")


@pytest.mark.parametrize(
    "grad_h,h13,error,match",
    [
        (torch.zeros(4, 4), torch.zeros(4, 8, dtype=BF16), TypeError, "grad_h must be a 2-D tensor"),
        (torch.zeros(4, 4, dtype=BF16), torch.zeros(4, 8), TypeError, "h13 must be a 2-D tensor"),
        (torch.zeros(4, dtype=BF16), torch.zeros(4, 8, dtype=BF16), ValueError, "grad_h must be a 2-D"),
        (
            torch.zeros(4, 4, dtype=BF16),
            torch.zeros(4, 9, dtype=BF16),
            ValueError,
            "h13.s last dim must be even",
        ),
        (
            torch.zeros(3, 4, dtype=BF16),
            torch.zeros(4, 8, dtype=BF16),
            ValueError,
            r"grad_h must have the shape",
        ),
        (
            torch.zeros(4, 8, dtype=BF16),
            torch.zeros(4, 8, dtype=BF16),
            ValueError,
            r"grad_h must have the shape \(M, H\) = \(4, 4\)",
        ),
        (
            torch.zeros(4, 4, dtype=BF16).t(),
            torch.zeros(4, 8, dtype=BF16),
            ValueError,
            "grad_h must be contiguous",
        ),
        (
            torch.zeros(4, 4, dtype=BF16, device="meta"),
            torch.zeros(4, 8, dtype=BF16),
            ValueError,
            "grad_h and h13 must be on one device",
        ),
    ],
)
def test_backward_errors(grad_h, h13, error, match):
    for run in (R.swiglu_backward_quantize_fp8, torch_bindings.swiglu_backward_quantize_fp8):
        with pytest.raises(error, match=f"swiglu_backward_quantize_fp8: {match}"):
            run(grad_h, h13)


def test_public_ops_on_cpu_run_the_reference():
    h13 = _random_h13(9, 40, 7)
    grad = _random_h13(9, 20, 8)
    for backend in ("auto", "reference"):
        got = torch_bindings.swiglu_quantize_fp8(h13, backend=backend)
        for a, b in zip(got, R.swiglu_quantize_fp8(h13), strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        got = torch_bindings.swiglu_backward_quantize_fp8(
            grad, h13, round_scales_to_power_of_2=False, backend=backend
        )
        want = R.swiglu_backward_quantize_fp8(grad, h13, round_scales_to_power_of_2=False)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    with pytest.raises(RuntimeError, match="swiglu_quantize_fp8: backend='cute' cannot run here"):
        torch_bindings.swiglu_quantize_fp8(h13, backend="cute")


def test_fake_implementations():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        h13 = torch.empty(300, 2 * 72, dtype=BF16)
        h, q, s = torch.ops.cute_kernels.swiglu_quantize_fp8(h13, True)
        g13, q2, s2 = torch.ops.cute_kernels.swiglu_backward_quantize_fp8(
            torch.empty(300, 72, dtype=BF16), h13, False
        )
    assert (h.shape, h.dtype, q.shape, q.dtype, s.shape, s.dtype) == (
        (300, 72),
        BF16,
        (300, 72),
        torch.float8_e4m3fn,
        (300,),
        torch.float32,
    )
    assert (g13.shape, g13.dtype, q2.shape, q2.dtype, s2.shape) == (
        (300, 144),
        BF16,
        (300, 144),
        torch.float8_e4m3fn,
        (300,),
    )


class _Recorder(dict):
    """A CPU target's kernel table whose kernels record their key and arguments and launch nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def get(self, key, default=None):
        return lambda *args: self.calls.append((key, args))


@pytest.mark.parametrize("backward", [False, True])
def test_launcher_variants_and_empty_shapes(backward):
    from torch_bindings import swiglu, targets

    target = targets.DeviceTarget("sm_90a", 132, device=torch.device("cpu"))
    target.kernels = _Recorder()
    op = swiglu._SWIGLU_BWD if backward else swiglu._SWIGLU_FWD

    def call(h13, grad=None):
        args = (grad if grad is not None else torch.zeros(h13.shape[0], h13.shape[1] // 2, dtype=BF16), h13)
        return op.run(target, *args, None, True) if backward else op.run(target, h13, None, True)

    aligned = torch.zeros(4, 2 * 64, dtype=BF16)
    odd = torch.zeros(4, 2 * 20, dtype=BF16)
    shifted = torch.zeros(4 * 128 + 8, dtype=BF16)[1 : 1 + 4 * 128].view(4, 128)
    for h13, vector in ((aligned, True), (odd, False), (shifted, False)):
        out, q, scales = call(h13)
        key, args = target.kernels.calls.pop()
        half = h13.shape[1] // 2
        assert key == swiglu.SwigluKey("swiglu_fp8", "bwd" if backward else "fwd", True, vector, False, half)
        assert args[0] is h13 and args[1] is out and args[2] is q and args[3] is scales
        assert (args[4] is not None) == backward and len(args) == 7 and args[6] == 132
        assert torch.equal(args[5].view(torch.int32), R.silu_table().view(torch.int32))  # the silu table
        assert out.shape == ((4, h13.shape[1]) if backward else (4, h13.shape[1] // 2)) and out.dtype == BF16
        assert q.shape == out.shape and q.dtype == torch.float8_e4m3fn and scales.shape == (4,)
    if backward:  # a misaligned grad_h takes the element steps too
        call(aligned, misaligned_grad := torch.zeros(4 * 64 + 8, dtype=BF16)[1 : 1 + 4 * 64].view(4, 64))
        assert target.kernels.calls.pop()[0][3] is False and misaligned_grad.data_ptr() % 16
    _, _, scales = call(torch.zeros(3, 0, dtype=BF16))
    assert scales.tolist() == [1.0] * 3 and not target.kernels.calls  # rows of no columns: no launch
    out, _, scales = call(torch.zeros(0, 16, dtype=BF16))
    assert out.shape[0] == 0 and scales.shape == (0,) and not target.kernels.calls


def test_configs_per_h_class(monkeypatch):
    """The bindings pick a config per direction and H class: the tuned table's entry for the vector
    variant, else the heuristic (also a bounded variant's, and the element variant's)."""
    from cute_kernels import configs
    from cute_kernels.swiglu import SwigluConfig, SwigluVariant
    from torch_bindings import swiglu, targets

    assert swiglu.swiglu_shape_class("fwd", 2048) == "fwd/h2048"
    assert swiglu.swiglu_shape_class("bwd", 7168) == "bwd/h8192"
    assert swiglu.swiglu_shape_class("fwd", 8) == "fwd/h256"
    tuned = {"fwd/h2048": {"threads": 128, "unroll": 2, "ctas_per_sm": 4, "row_per_cta": True}}
    monkeypatch.setattr(configs, "tuned_entry", lambda kernel, arch, device, cls: tuned.get(cls))
    target = targets.DeviceTarget("sm_90a", 132, device=torch.device("cpu"))
    key = swiglu.SwigluKey("swiglu_fp8", "fwd", True, True, False, 2048)
    assert key.config(key.variant(target), target) == SwigluConfig(128, 2, 4)
    bounded = key._replace(bounded=True)  # the bounded twin takes the tuned entry too
    assert bounded.config(bounded.variant(target), target) == SwigluConfig(128, 2, 4)
    heuristic = configs.pick("swiglu_fp8", SwigluVariant("fwd"), "sm_90a")
    for other in (key._replace(half=8192), key._replace(vector=False), key._replace(direction="bwd")):
        want = configs.pick("swiglu_fp8", other.variant(target), "sm_90a")
        assert other.config(other.variant(target), target) == want
    assert heuristic == SwigluConfig(256, 4, 3)


def test_bench_bytes_and_exit_without_a_gpu(capsys):
    from bench import bench_swiglu

    assert bench_swiglu.moved_bytes("fwd", 16384, 2048) == 16384 * 2048 * 7 + 4 * 16384
    assert bench_swiglu.moved_bytes("bwd", 3, 8) == 3 * 8 * 12 + 12
    if not torch.cuda.is_available():
        assert bench_swiglu.main(["--quick"]) == 2
        assert capsys.readouterr().err.count("\n") == 1


# ---- rows bounded by the last group end (group_end_offsets) --------------------------------------

I32 = torch.int32


def _ends(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=I32)


#: End offsets over 300 rows: bounds 0, 1, M and mid-CTA (mid-warp for a warp-per-row config),
#: empty groups, one group, many groups.
BOUNDED_ENDS = {
    "bound 0": (0,),
    "bound 0, G = 3": (0, 0, 0),
    "bound 1": (1,),
    "bound M": (300,),
    "mid CTA": (64, 64, 203),
    "empty groups": (0, 10, 10, 10, 131, 131),
    "large G": tuple(e // 8 for e in range(2048)),  # bound 255
}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _assert_bounded(got: tuple, whole: tuple, bound: int) -> None:
    """Rows below ``bound`` byte for byte the unbounded call's; past it the padding rows (out 0,
    q 0, scale 1.0); shapes, dtypes and strides the unbounded call's."""
    for a, b in zip(got, whole, strict=True):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
        assert torch.equal(_bytes(a[:bound]), _bytes(b[:bound]))
    out, q, scales = got
    assert not _bytes(out[bound:]).any() and not _bytes(q[bound:]).any()
    assert torch.all(scales[bound:] == 1.0)


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("case", sorted(BOUNDED_ENDS))
def test_bounded_reference_rows_below_the_bound(case, rounding):
    ends = BOUNDED_ENDS[case]
    h13 = _random_h13(300, 36, len(ends))
    grad = _random_h13(300, 18, 3)[:, :36].contiguous()
    fwd = R.swiglu_quantize_fp8(h13, group_end_offsets=_ends(*ends), round_scales_to_power_of_2=rounding)
    _assert_bounded(fwd, R.swiglu_quantize_fp8(h13, round_scales_to_power_of_2=rounding), ends[-1])
    bwd = R.swiglu_backward_quantize_fp8(
        grad, h13, group_end_offsets=_ends(*ends), round_scales_to_power_of_2=rounding
    )
    whole = R.swiglu_backward_quantize_fp8(grad, h13, round_scales_to_power_of_2=rounding)
    _assert_bounded(bwd, whole, ends[-1])


def test_bounded_reference_special_rows_and_empty_shapes():
    """NaN / Inf rows below the bound keep their bytes (NaN scale, 0x7F bytes); rows of no columns
    get the scale 1.0 everywhere; no rows, no work."""
    h13 = torch.tensor([[INF, 1.0, 1.0, 1.0], [0.0, 1.0, INF, 1.0], [NAN, 0.0, 1.0, 1.0]]).bfloat16()
    h, q, scales = R.swiglu_quantize_fp8(h13, group_end_offsets=_ends(1, 2))
    assert scales[0] == INF and torch.isnan(scales[1]) and scales[2] == 1.0
    assert q[1].view(torch.uint8).tolist() == [0x7F, 0x7F] and not _bytes(q[2]).any()
    assert not _bytes(h[2]).any()
    _, _, scales = R.swiglu_quantize_fp8(torch.zeros(5, 0, dtype=BF16), group_end_offsets=_ends(2))
    assert scales.tolist() == [1.0] * 5
    out, q, scales = R.swiglu_backward_quantize_fp8(
        torch.zeros(0, 8, dtype=BF16), torch.zeros(0, 16, dtype=BF16), group_end_offsets=_ends(0)
    )
    assert out.shape == (0, 16) and q.shape == (0, 16) and scales.shape == (0,)


@pytest.mark.parametrize("ends", [(301,), (5, 3), (-1,), (-1, 200)])
def test_bounded_reference_validates_the_offsets(ends):
    """The reference syncs and validates the offsets (the kernels clamp the last end instead)."""
    h13 = _random_h13(300, 8, 1)
    with pytest.raises(ValueError, match="group_end_offsets"):
        R.swiglu_quantize_fp8(h13, group_end_offsets=_ends(*ends))
    with pytest.raises(ValueError, match="group_end_offsets"):
        R.swiglu_backward_quantize_fp8(h13[:, :8].contiguous(), h13, group_end_offsets=_ends(*ends))


BAD_OFFSETS = [
    (_ends(4).long(), TypeError, "group_end_offsets must be a 1-D torch.int32 tensor"),
    (_ends(4).float(), TypeError, "group_end_offsets must be a 1-D torch.int32 tensor"),
    ([4], TypeError, "group_end_offsets must be a 1-D torch.int32 tensor"),
    (torch.tensor(4, dtype=I32), ValueError, "group_end_offsets must be a 1-D torch.int32 tensor"),
    (_ends(2, 4)[None], ValueError, "group_end_offsets must be a 1-D torch.int32 tensor"),
    (_ends(), ValueError, "group_end_offsets must hold at least one group"),
    (_ends(4).to("meta"), ValueError, "group_end_offsets must be on the same device as the data"),
    (torch.arange(8, dtype=I32)[::2], ValueError, "group_end_offsets must be contiguous"),
]


@pytest.mark.parametrize("offsets,error,match", BAD_OFFSETS)
def test_bounded_offsets_errors(offsets, error, match):
    h13 = torch.zeros(4, 16, dtype=BF16)
    grad = torch.zeros(4, 8, dtype=BF16)
    for run in (R.swiglu_quantize_fp8, torch_bindings.swiglu_quantize_fp8):
        with pytest.raises(error, match=f"^swiglu_quantize_fp8: {match}"):
            run(h13, group_end_offsets=offsets)
    for run in (R.swiglu_backward_quantize_fp8, torch_bindings.swiglu_backward_quantize_fp8):
        with pytest.raises(error, match=f"^swiglu_backward_quantize_fp8: {match}"):
            run(grad, h13, group_end_offsets=offsets)


def test_bounded_checks_come_after_the_data_checks():
    """A bad h13 is reported before bad offsets, in both ops."""
    with pytest.raises(TypeError, match="swiglu_quantize_fp8: h13 must be"):
        torch_bindings.swiglu_quantize_fp8(torch.zeros(4, 16), group_end_offsets=[4])
    with pytest.raises(ValueError, match="swiglu_backward_quantize_fp8: grad_h must have the shape"):
        torch_bindings.swiglu_backward_quantize_fp8(
            torch.zeros(4, 9, dtype=BF16), torch.zeros(4, 16, dtype=BF16), group_end_offsets=[4]
        )


def test_bounded_public_ops_on_cpu_run_the_reference():
    h13 = _random_h13(9, 40, 7)
    grad = _random_h13(9, 20, 8)
    ends = _ends(2, 5)
    for backend in ("auto", "reference"):
        got = torch_bindings.swiglu_quantize_fp8(h13, group_end_offsets=ends, backend=backend)
        for a, b in zip(got, R.swiglu_quantize_fp8(h13, group_end_offsets=ends), strict=True):
            assert torch.equal(_bytes(a), _bytes(b))
        got = torch_bindings.swiglu_backward_quantize_fp8(
            grad, h13, group_end_offsets=ends, round_scales_to_power_of_2=False, backend=backend
        )
        want = R.swiglu_backward_quantize_fp8(
            grad, h13, group_end_offsets=ends, round_scales_to_power_of_2=False
        )
        for a, b in zip(got, want, strict=True):
            assert torch.equal(_bytes(a), _bytes(b))
    with pytest.raises(RuntimeError, match="swiglu_backward_quantize_fp8: backend='cute' cannot run here"):
        torch_bindings.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=ends, backend="cute")


def test_bounded_fake_implementations():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        h13 = torch.empty(300, 2 * 72, dtype=BF16)
        ends = torch.empty(6, dtype=I32)
        h, q, s = torch.ops.cute_kernels.swiglu_quantize_fp8_bounded(h13, ends, True)
        g13, q2, s2 = torch.ops.cute_kernels.swiglu_backward_quantize_fp8_bounded(
            torch.empty(300, 72, dtype=BF16), h13, ends, False
        )
    assert [(t.shape, t.dtype) for t in (h, q, s)] == [
        ((300, 72), BF16),
        ((300, 72), torch.float8_e4m3fn),
        ((300,), torch.float32),
    ]
    assert [(t.shape, t.dtype) for t in (g13, q2, s2)] == [
        ((300, 144), BF16),
        ((300, 144), torch.float8_e4m3fn),
        ((300,), torch.float32),
    ]


@pytest.mark.parametrize("backward", [False, True])
def test_bounded_launcher_keys_and_arguments(backward):
    """The bounded variants' keys (the unbounded key plus "bounded") and arguments (the offsets
    last); no launch for rows of no columns (every scale 1.0) or no rows; without offsets the
    unbounded key."""
    from torch_bindings import swiglu, targets

    target = targets.DeviceTarget("sm_90a", 132, device=torch.device("cpu"))
    target.kernels = _Recorder()
    op = swiglu._SWIGLU_BWD if backward else swiglu._SWIGLU_FWD
    ends = _ends(1, 3)

    def call(h13, offsets):
        grad = torch.zeros(h13.shape[0], h13.shape[1] // 2, dtype=BF16)
        return op.run(target, grad, h13, offsets, False) if backward else op.run(target, h13, offsets, False)

    direction = "bwd" if backward else "fwd"
    for h13, vector in (
        (torch.zeros(4, 2 * 64, dtype=BF16), True),
        (torch.zeros(4, 2 * 20, dtype=BF16), False),
    ):
        out, q, scales = call(h13, ends)
        key, args = target.kernels.calls.pop()
        half = h13.shape[1] // 2
        assert key == swiglu.SwigluKey("swiglu_fp8", direction, False, vector, bounded=True, half=half)
        assert args[0] is h13 and args[1] is out and args[2] is q and args[3] is scales and args[5] is ends
        assert len(args) == 8 and (args[4] is not None) == backward
        assert args[6] is swiglu.silu_table(target.device) and args[7] == 132
        call(h13, None)
        key = swiglu.SwigluKey("swiglu_fp8", direction, False, vector, False, half)
        assert target.kernels.calls.pop()[0] == key
    assert swiglu.SwigluKey("swiglu_fp8", direction, False, True, True, 64).variant(target).bounded
    assert not swiglu.SwigluKey("swiglu_fp8", direction, False, True, False, 64).variant(target).bounded
    _, _, scales = call(torch.zeros(3, 0, dtype=BF16), ends)
    assert scales.tolist() == [1.0] * 3 and not target.kernels.calls
    out, _, scales = call(torch.zeros(0, 16, dtype=BF16), ends)
    assert out.shape[0] == 0 and scales.shape == (0,) and not target.kernels.calls
