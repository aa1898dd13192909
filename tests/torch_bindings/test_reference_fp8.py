"""The FP8 rowwise reference (SPEC section 7) on CPU: formulas on special values, layouts, empty
groups, and agreement with torchao's torch references where they exist (skipped without torchao)."""

from __future__ import annotations

import pytest
import torch

from torch_bindings import reference as R

INF, NAN = float("inf"), float("nan")


def _bits(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.uint8).flatten().tolist()


def test_scale_formula_and_power_of_2_rounding():
    amax = torch.tensor([0.0, 1e-13, 1.0, 3.0, 448.0, 1e30, INF, NAN])
    exact = R.fp8_quant_scale(amax, False)
    expected = (448.0 / amax.double().clamp(min=1e-12)).float()
    assert torch.equal(exact[:6], expected[:6])
    assert exact[6] == 0 and torch.isnan(exact[7])
    rounded = R.fp8_quant_scale(amax, True)
    finite = rounded[:6]
    assert torch.equal(finite, torch.exp2(torch.floor(torch.log2(exact[:6]))))
    assert rounded[6] == 0 and torch.isnan(rounded[7])


def test_special_rows():
    x = torch.tensor([[INF, 1.0, -2.0], [NAN, 1.0, -NAN], [0.0, -0.0, 0.0], [1e-20, -1e-20, 0.0]])
    q, s = R.quantize_fp8_2d(x)
    assert _bits(q[0]) == [0x7F, 0x00, 0x80]  # q_scale 0: finite -> +-0, Inf -> NaN
    assert s[0] == INF
    assert _bits(q[1]) == [0x7F] * 3 and torch.isnan(s[1])  # NaN anywhere: all 0x7F
    assert _bits(q[2]) == [0, 0x80, 0] and s[2] == 1.0 / 2.0**48  # amax 0 -> 448 / 1e-12 -> 2^48
    assert s[3] == 1.0 / 2.0**48  # below the 1e-12 floor


def test_saturation_and_dequantization():
    torch.manual_seed(0)
    x = torch.randn(64, 96, dtype=torch.bfloat16) * 1000
    for round_scales in (True, False):
        q, s = R.quantize_fp8_2d(x, round_scales_to_power_of_2=round_scales)
        assert q.float().abs().max() <= 448
        rel = (q.float() * s[:, None] - x.float()).abs() / x.float().abs().amax(1, keepdim=True)
        assert rel.max() < 2**-3  # e4m3: 3 mantissa bits, a power-of-2 scale loses at most one more


def test_layouts():
    x = torch.randn(40, 24)
    q, s = R.quantize_fp8_2d(x, axis="col")
    assert q.shape == (40, 24) and q.stride() == (1, 40) and s.shape == (24,)
    w = torch.randn(3, 40, 24)
    q, s = R.quantize_fp8_3d(w, axis="K")
    assert q.stride() == (960, 24, 1) and s.shape == (3, 40)
    q, s = R.quantize_fp8_3d(w, axis="N")
    assert q.stride() == (960, 1, 40) and s.shape == (3, 24)
    qn, sn = R.quantize_fp8_2d(w[1], axis="col")
    assert _bits(q[1]) == _bits(qn) and torch.equal(s[1], sn)


def test_groups_empty_and_tail():
    torch.manual_seed(1)
    x = torch.randn(50, 8)
    ends = torch.tensor([0, 20, 20, 45], dtype=torch.int32)
    q, s = R.quantize_fp8_2d(x, axis="col", group_end_offsets=ends)
    s = s.view(4, 8)
    assert torch.equal(s[0], torch.ones(8)) and torch.equal(s[2], torch.ones(8))
    for g, (lo, hi) in ((1, (0, 20)), (3, (20, 45))):
        qg, sg = R.quantize_fp8_2d(x[lo:hi], axis="col")
        assert _bits(q[lo:hi]) == _bits(qg) and torch.equal(s[g], sg)
    assert _bits(q[45:]) == [0] * 40  # rows past the last group


@pytest.mark.parametrize("last", [64, 40, 0])
def test_dual_is_the_two_single_calls(last):
    """With groups, the row outputs are the bounded row op's (below the last end the unbounded
    call's; past it q 0 and scale 1.0), the column outputs the grouped column op's."""
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    ends = torch.tensor([min(10, last), min(10, last), last], dtype=torch.int32)
    q_row, s_row, q_col, s_col = R.quantize_fp8_2d_dual(x, group_end_offsets=ends)
    q1, s1 = R.quantize_fp8_2d(x, axis="row", group_end_offsets=ends)
    q2, s2 = R.quantize_fp8_2d(x, axis="col", group_end_offsets=ends)
    assert _bits(q_row) == _bits(q1) and torch.equal(s_row, s1)
    assert q_col.stride() == q2.stride() and _bits(q_col) == _bits(q2) and torch.equal(s_col, s2)
    q_all, s_all = R.quantize_fp8_2d(x)
    assert _bits(q_row[:last]) == _bits(q_all[:last]) and torch.equal(s_row[:last], s_all[:last])
    assert _bits(q_row[last:]) == [0] * ((64 - last) * 32) and bool((s_row[last:] == 1.0).all())
    plain = R.quantize_fp8_2d_dual(x)  # no groups: every row
    assert _bits(plain[0]) == _bits(q_all) and torch.equal(plain[1], s_all)


@pytest.mark.parametrize("shape", [(3, 40, 24), (1, 17, 9), (2, 0, 8), (2, 5, 0), (0, 4, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dual_3d_is_the_two_single_calls(shape, dtype):
    torch.manual_seed(5)
    w = (torch.randn(shape) * torch.logspace(-6, 6, shape[1])[:, None]).to(dtype)
    for rounding in (True, False):
        q_k, s_k, q_n, s_n = R.quantize_fp8_3d_dual(w, round_scales_to_power_of_2=rounding)
        q1, s1 = R.quantize_fp8_3d(w, axis="K", round_scales_to_power_of_2=rounding)
        q2, s2 = R.quantize_fp8_3d(w, axis="N", round_scales_to_power_of_2=rounding)
        assert q_k.stride() == q1.stride() and _bits(q_k) == _bits(q1) and torch.equal(s_k, s1)
        assert q_n.stride() == q2.stride() and _bits(q_n) == _bits(q2) and torch.equal(s_n, s2)
        assert s_k.shape == shape[:2] and s_n.shape == (shape[0], shape[2])


def test_dual_3d_bad_arguments_name_the_op_and_argument():
    import torch_bindings as tb

    w = torch.zeros(2, 4, 8)
    for fn in (R.quantize_fp8_3d_dual, tb.quantize_fp8_3d_dual):
        with pytest.raises(ValueError, match=r"quantize_fp8_3d_dual: w must be a 3-D tensor"):
            fn(w[0])
        with pytest.raises(TypeError, match=r"quantize_fp8_3d_dual: w must be a 3-D tensor of dtype"):
            fn(w.half())
        with pytest.raises(ValueError, match=r"quantize_fp8_3d_dual: w must be contiguous"):
            fn(w.transpose(1, 2))
        with pytest.raises(TypeError, match=r"quantize_fp8_3d_dual: round_scales_to_power_of_2"):
            fn(w, round_scales_to_power_of_2=1)
    with pytest.raises(TypeError):
        tb.quantize_fp8_3d_dual(w, axis="K")  # no axis: both are returned
    with pytest.raises(ValueError, match=r"quantize_fp8_3d_dual: backend"):
        tb.quantize_fp8_3d_dual(w, backend="triton")


def test_empty_vectors_have_scale_one():
    assert R.quantize_fp8_2d(torch.zeros(0, 8))[1].shape == (0,)
    assert torch.equal(R.quantize_fp8_2d(torch.zeros(3, 0))[1], torch.ones(3))
    assert torch.equal(R.quantize_fp8_2d(torch.zeros(0, 4), axis="col")[1], torch.ones(4))


def test_bad_arguments():
    x = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="axis"):
        R.quantize_fp8_2d(x, axis="K")
    with pytest.raises(TypeError, match="group_end_offsets"):  # row groups bound axis="row" now
        R.quantize_fp8_2d(x, group_end_offsets=torch.tensor([4], dtype=torch.int64))
    with pytest.raises(TypeError, match="round_scales_to_power_of_2"):
        R.quantize_fp8_2d(x, round_scales_to_power_of_2=1)
    with pytest.raises(ValueError, match="axis"):
        R.quantize_fp8_3d(torch.zeros(2, 4, 8), axis="row")


# --- torchao's torch references (torchao.prototype.moe_training.utils) ---


@pytest.fixture(scope="module")
def torchao_utils():
    return pytest.importorskip("torchao.prototype.moe_training.utils")


@pytest.mark.parametrize("round_scales", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_match_torchao(torchao_utils, round_scales, dtype):
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated

    torch.manual_seed(2)
    x = (torch.randn(96, 160) * torch.logspace(-8, 8, 96)[:, None]).to(dtype)
    scale = tensor_to_scale(
        x,
        torch.float8_e4m3fn,
        scaling_granularity=ScalingGranularity.AXISWISE,
        axiswise_dim=-1,
        round_scales_to_power_of_2=round_scales,
    )
    expected = to_fp8_saturated(x.to(torch.float32) * scale, torch.float8_e4m3fn)
    q, s = R.quantize_fp8_2d(x, round_scales_to_power_of_2=round_scales)
    assert _bits(q) == _bits(expected)
    assert torch.equal(s, (1.0 / scale).view(-1))


@pytest.mark.parametrize("round_scales", [True, False])
def test_group_columns_match_torchao(torchao_utils, round_scales):
    torch.manual_seed(3)
    x = torch.randn(300, 48, dtype=torch.bfloat16) * 7
    ends = torch.tensor([17, 100, 101, 300], dtype=torch.int32)  # torchao's reference needs non-empty groups
    expected_q, expected_s = torchao_utils.torch_to_float8_per_group_colwise(
        x, ends, torch.float8_e4m3fn, round_scales_to_power_of_2=round_scales
    )
    q, s = R.quantize_fp8_2d(x, axis="col", group_end_offsets=ends, round_scales_to_power_of_2=round_scales)
    assert _bits(q) == _bits(expected_q)
    assert torch.equal(s, 1.0 / expected_s)


@pytest.mark.parametrize("round_scales", [True, False])
def test_3d_n_matches_torchao(torchao_utils, round_scales):
    torch.manual_seed(4)
    w = torch.randn(4, 64, 96, dtype=torch.bfloat16)  # (E, N, K)
    expected_q, expected_s = torchao_utils.torch_to_3d_rowwise_float8_transpose_rhs(
        w.transpose(-2, -1), torch.float8_e4m3fn, round_scales_to_power_of_2=round_scales
    )
    q, s = R.quantize_fp8_3d(w, axis="N", round_scales_to_power_of_2=round_scales)
    assert q.shape == expected_q.shape and q.stride() == expected_q.stride()
    assert _bits(q.transpose(-2, -1)) == _bits(expected_q.transpose(-2, -1))
    assert torch.equal(s, (1.0 / expected_s).view(4, 96))


# --- the public functions on CPU (the reference path) and their fakes ---


def test_public_functions_on_cpu_run_the_reference():
    import torch_bindings as tb

    x = torch.randn(32, 40, dtype=torch.bfloat16)
    for axis in ("row", "col"):
        got, want = tb.quantize_fp8_2d(x, axis=axis), R.quantize_fp8_2d(x, axis=axis)
        assert _bits(got[0]) == _bits(want[0]) and torch.equal(got[1], want[1])
    assert len(tb.quantize_fp8_2d_dual(x)) == 4
    with pytest.raises(RuntimeError, match="backend='cute'"):
        tb.quantize_fp8_2d(x, backend="cute")
    w = torch.randn(1, 3, 16).transpose(0, 1)  # (3, 1, 16), strides (16, 48, 1): contiguous by torch
    assert w.is_contiguous()
    got, want = tb.quantize_fp8_3d(w), R.quantize_fp8_3d(w.contiguous())
    assert _bits(got[0]) == _bits(want[0]) and torch.equal(got[1], want[1])
    got, want = tb.quantize_fp8_3d_dual(w), R.quantize_fp8_3d_dual(w.contiguous())
    for g, w_ in zip(got, want, strict=True):
        assert g.stride() == w_.stride() and _bits(g) == _bits(w_)
    with pytest.raises(RuntimeError, match="backend='cute'"):
        tb.quantize_fp8_3d_dual(w, backend="cute")


@pytest.mark.parametrize("shape", [(5, 24), (0, 8), (4, 0)])
def test_fakes_match_the_kernel_path_layout(shape):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_bindings import quantize_fp8 as binding

    with FakeTensorMode():
        x = torch.empty(shape, dtype=torch.bfloat16)
        q, s = binding._rows_2d_fake(x, True)
        w = torch.empty((2, *shape), dtype=torch.float32)
        qw, sw = binding._rows_3d_fake(w, False)
    assert q.shape == shape and q.dtype == torch.float8_e4m3fn
    assert q.numel() == 0 or q.stride() == (shape[1], 1)
    assert s.shape == (shape[0],) and s.dtype == torch.float32
    assert qw.shape == (2, *shape) and sw.shape == (2, shape[0])


@pytest.mark.parametrize("shape", [(2, 5, 24), (3, 1, 8), (2, 0, 8), (2, 4, 0), (0, 4, 8)])
def test_dual_3d_fake_matches_the_kernel_path_layout(shape):
    """The custom op's fake gives the reference's shapes, dtypes and strides (the kernel path
    allocates the same: row-major q_k, q_n with strides (N K, 1, N))."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_bindings import quantize_fp8 as binding

    want = R.quantize_fp8_3d_dual(torch.zeros(shape))
    with FakeTensorMode():
        got = binding._dual_3d_fake(torch.empty(shape, dtype=torch.bfloat16), True)
    for g, w in zip(got, want, strict=True):
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        assert g.numel() == 0 or g.stride() == w.stride(), (g.stride(), w.stride())


def test_expert_rows_sets_the_row_stride():
    from torch_bindings.quantize_3d import expert_rows

    w = torch.randn(1, 3, 16).transpose(0, 1)
    assert w.stride(1) == 48 and expert_rows(w).stride() == (16, 16, 1)
    assert torch.equal(expert_rows(w), w)
    plain = torch.randn(3, 2, 16)
    assert expert_rows(plain) is plain
