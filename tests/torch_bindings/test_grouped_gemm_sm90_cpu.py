"""The fp32 reference of the FP8 rowwise grouped GEMM (``reference.grouped_gemm_fp8_rowwise_reference``,
the sm_90a kernel's contract) against the math ``torch._scaled_grouped_mm`` does with SPEC section 7
operands: per group, dequantized operands (q * scale) multiplied in fp32; for the forward, dgrad and
wgrad operands of an expert layer, ragged groups (empty, one row, not multiples of 16), and end
offsets read as the kernels read them (clamped)."""

from __future__ import annotations

import pytest
import torch

from torch_bindings import reference

ENDS = {
    "ragged": [17, 17, 18, 60, 100],
    "empty first and last": [0, 33, 100, 100],
    "all in one": [100],
    "garbage: past M, decreasing": [40, 1 << 20, 7],
}


def _sqnr_db(actual: torch.Tensor, expected: torch.Tensor) -> float:
    noise = (actual.float() - expected.float()).norm()
    return float(20 * torch.log10(expected.float().norm() / noise.clamp(min=1e-30)))


def _bounds(ends: list[int], total: int) -> list[tuple[int, int]]:
    out, start = [], 0
    for end in ends:
        end = max(min(max(end, 0), total), start)
        out.append((start, end))
        start = end
    return out


def _data(m: int, n: int, k: int, e: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = (torch.randn(e, n, k, generator=gen) * 0.05).to(torch.bfloat16)
    grad_y = torch.randn(m, n, generator=gen).to(torch.bfloat16)
    return x, w, grad_y


@pytest.mark.parametrize("name", sorted(ENDS))
def test_forward_and_dgrad_forms(name):
    m, n, k = 100, 48, 64
    ends = ENDS[name]
    x, w, grad_y = _data(m, n, k, len(ends))
    offsets = torch.tensor(ends, dtype=torch.int32)
    q, s = reference.quantize_fp8_2d(x, axis="row")
    q_w, s_w = reference.quantize_fp8_3d(w, axis="K")
    y = reference.grouped_gemm_fp8_rowwise_reference("2d3d", q, q_w, s, s_w, offsets)
    q_gy, s_gy = reference.quantize_fp8_2d(grad_y, axis="row")
    q_wn, s_wn = reference.quantize_fp8_3d(w, axis="N")
    b_dgrad = q_wn.transpose(-2, -1)  # (E, K, N): N contiguous, as the kernel takes it
    assert b_dgrad.is_contiguous()
    grad_x = reference.grouped_gemm_fp8_rowwise_reference("2d3d", q_gy, b_dgrad, s_gy, s_wn, offsets)
    assert y.shape == (m, n) and grad_x.shape == (m, k) and y.dtype == grad_x.dtype == torch.bfloat16
    last = 0
    for g, (start, end) in enumerate(_bounds(ends, m)):
        last = end
        rows = slice(start, end)
        # torch._scaled_grouped_mm's math: dequantized operands, fp32 products
        expect_y = (q[rows].float() * s[rows, None]) @ (q_w[g].float() * s_w[g][:, None]).t()
        torch.testing.assert_close(y[rows].float(), expect_y, rtol=1e-2, atol=1e-3)
        expect_dx = (q_gy[rows].float() * s_gy[rows, None]) @ (q_wn[g].float() * s_wn[g][None, :])
        torch.testing.assert_close(grad_x[rows].float(), expect_dx, rtol=1e-2, atol=1e-3)
        if end - start > 8:
            assert _sqnr_db(y[rows], x[rows].float() @ w[g].float().t()) > 25
            assert _sqnr_db(grad_x[rows], grad_y[rows].float() @ w[g].float()) > 25
    assert not y[last:].any() and not grad_x[last:].any()


@pytest.mark.parametrize("name", sorted(ENDS))
def test_wgrad_form(name):
    m, n, k = 100, 40, 24
    ends = ENDS[name]
    x, _, grad_y = _data(m, n, k, 1, seed=1)
    offsets = torch.tensor(ends, dtype=torch.int32)
    bounds = _bounds(ends, m)
    valid = torch.tensor([max(e, 0) for e in torch.tensor(ends).cummax(0).values.tolist()], dtype=torch.int32)
    valid = valid.clamp(max=m)
    q_gy, s_gy = reference.quantize_fp8_2d(grad_y, axis="col", group_end_offsets=valid)
    q_x, s_x = reference.quantize_fp8_2d(x, axis="col", group_end_offsets=valid)
    a, b = q_gy.t(), q_x.t()  # (N, M), (K, M): M contiguous
    assert a.is_contiguous() and b.is_contiguous()
    grad_w = reference.grouped_gemm_fp8_rowwise_reference("2d2d", a, b, s_gy, s_x, offsets)
    assert grad_w.shape == (len(ends), n, k) and grad_w.dtype == torch.bfloat16
    for g, (start, end) in enumerate(bounds):
        if end == start:
            assert not grad_w[g].any(), "an empty group's gradient is zeros"
            continue
        rows = slice(start, end)
        dq_gy = q_gy[rows].float() * s_gy[g * n : (g + 1) * n][None, :]
        dq_x = q_x[rows].float() * s_x[g * k : (g + 1) * k][None, :]
        torch.testing.assert_close(grad_w[g].float(), dq_gy.t() @ dq_x, rtol=1e-2, atol=1e-3)
        if end - start > 8:
            assert _sqnr_db(grad_w[g], grad_y[rows].float().t() @ x[rows].float()) > 25


def test_form_is_checked():
    with pytest.raises(ValueError, match="form"):
        offsets = torch.zeros(1, dtype=torch.int32)
        reference.grouped_gemm_fp8_rowwise_reference("3d3d", *(torch.zeros(1),) * 4, offsets)


def test_launcher_checks_sizes_and_launches_nothing_for_empty_problems():
    """The launcher's host checks and its empty-problem paths (no kernel runs in any of these)."""
    from torch_bindings.grouped_gemm_sm90 import grouped_gemm_fp8_rowwise_sm90 as launch

    e4m3 = torch.float8_e4m3fn
    offsets = torch.tensor([0, 0], dtype=torch.int32)
    a, b = torch.zeros(4, 0, dtype=e4m3), torch.zeros(8, 0, dtype=e4m3)  # 2d2d with M = 0
    out = launch("2d2d", a, b, torch.ones(8), torch.ones(16), offsets, torch.full((2, 4, 8), 7.0).bfloat16())
    assert out.shape == (2, 4, 8) and not out.any(), "M = 0: every group empty, zeros"
    with pytest.raises(ValueError, match="G\\*N=8"):
        launch("2d2d", a, b, torch.ones(7), torch.ones(16), offsets)
    with pytest.raises(ValueError, match="out must have shape"):
        launch("2d2d", a, b, torch.ones(8), torch.ones(16), offsets, torch.zeros(2, 8, 4).bfloat16())
    empty = launch("2d3d", torch.zeros(0, 32, dtype=e4m3), torch.zeros(2, 8, 32, dtype=e4m3), torch.ones(0),
                   torch.ones(2, 8), offsets)  # fmt: skip
    assert empty.shape == (0, 8)
    with pytest.raises(ValueError, match="not supported"):
        launch("2d3d", torch.zeros(4, 0, dtype=e4m3), torch.zeros(2, 8, 0, dtype=e4m3), torch.ones(4),
               torch.ones(2, 8), offsets)  # fmt: skip
