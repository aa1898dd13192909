"""FP8 rowwise kernels on the GPU (SPEC section 7): one scale per row for quantize_fp8_2d(axis="row")
and quantize_fp8_3d(axis="K"): bit-exact to the reference (q bytes and fp32 scale bits) on random
and special values, both roundings, vector and element variants, no sync, no recompile across
shapes, CUDA graphs, fullgraph torch.compile. The column scales, the dual and quantize_fp8_3d(axis="N"):
tests/torch_bindings/test_quantize_fp8_col_gpu.py."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_bytes, no_sync
from test_quantize_gpu import _random_x, _special_blocks

import torch_bindings
from torch_bindings import reference

pytestmark = pytest.mark.gpu

SHAPES = [(0, 64), (1, 8), (3, 1), (5, 13), (7, 24), (33, 1000), (256, 7168), (1000, 5120), (16384, 2048)]


def _check_2d(x: torch.Tensor, rounding: bool) -> None:
    with no_sync():
        q, s = torch_bindings.quantize_fp8_2d(x, round_scales_to_power_of_2=rounding, backend="cute")
    q_ref, s_ref = reference.quantize_fp8_2d(x, round_scales_to_power_of_2=rounding)
    assert q.stride() == q_ref.stride() or q.numel() == 0
    assert_same_bytes(q, q_ref, "q")
    assert_same_bytes(s, s_ref, "scales")


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_rows_match_reference(rows, cols, dtype, rounding, poison_cuda_allocator):
    x = _random_x((rows, cols), dtype, torch.Generator().manual_seed(rows * 7 + cols))
    poison_cuda_allocator()
    _check_2d(x, rounding)


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values(dtype, rounding):
    blocks = _special_blocks(dtype)  # rows of 32 special elements: Inf, NaN, 0, -0, subnormals, max
    picks = torch.randint(0, blocks.shape[0], (96 * 3,), generator=torch.Generator().manual_seed(3))
    x = blocks[picks].reshape(96, 3 * 32).cuda()
    _check_2d(x, rounding)
    _check_2d(blocks.cuda(), rounding)


def test_unaligned_rows_take_the_element_variant():
    base = _random_x((1, 64 * 40 + 1), torch.bfloat16, torch.Generator().manual_seed(4))
    x = base[0, 1:].view(64, 40)  # 2 bytes past a 16-byte boundary
    _check_2d(x, True)


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("experts,n,k", [(1, 1, 8), (3, 50, 64), (2, 129, 96), (8, 256, 7168), (2, 7, 13)])
def test_3d_k_matches_reference(experts, n, k, rounding, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(experts + n + k)
    w = _random_x((experts * n, k), torch.bfloat16, gen).view(experts, n, k)
    poison_cuda_allocator()
    with no_sync():
        q, s = torch_bindings.quantize_fp8_3d(w, round_scales_to_power_of_2=rounding, backend="cute")
    q_ref, s_ref = reference.quantize_fp8_3d(w, round_scales_to_power_of_2=rounding)
    assert_same_bytes(q, q_ref, "q")
    assert_same_bytes(s, s_ref, "scales")


def test_no_recompiles_across_shapes():
    """One compile per (variant, K class): M and K within a class change nothing."""
    gen = torch.Generator().manual_seed(5)
    # K classes 256, 1024, 2048, 8192; vector (K % 8 == 0) and element steps: each pair the second
    # loop meets (1024 vector and 1001 element are two compiles of class 1024)
    for cols in (8, 5, 1001, 1024, 2048, 7168):
        torch_bindings.quantize_fp8_2d(_random_x((4, cols), torch.bfloat16, gen))
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    for rows, cols in [(1, 8), (999, 7168), (4096, 2048), (7, 5), (100, 1001), (3, 5120), (9, 1024)]:
        _check_2d(_random_x((rows, cols), torch.bfloat16, gen), True)
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before


def test_cuda_graph_replay():
    x = _random_x((512, 2048), torch.bfloat16, torch.Generator().manual_seed(6))
    torch_bindings.quantize_fp8_2d(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = torch_bindings.quantize_fp8_2d(x)
    for seed in range(2):
        x.copy_(_random_x((512, 2048), torch.bfloat16, torch.Generator().manual_seed(10 + seed)))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = reference.quantize_fp8_2d(x)
        assert_same_bytes(q, q_ref, "q")
        assert_same_bytes(s, s_ref, "scales")


def test_torch_compile_fullgraph():
    @torch.compile(fullgraph=True, dynamic=True)
    def both(x, w):
        return torch_bindings.quantize_fp8_2d(x), torch_bindings.quantize_fp8_3d(w)

    gen = torch.Generator().manual_seed(7)
    for rows in (96, 300):
        x = _random_x((rows, 256), torch.bfloat16, gen)
        w = _random_x((2 * rows, 128), torch.bfloat16, gen).view(2, rows, 128)
        (q, s), (qw, sw) = both(x, w)
        expected = (*reference.quantize_fp8_2d(x), *reference.quantize_fp8_3d(w))
        for got, want in zip((q, s, qw, sw), expected, strict=True):
            assert_same_bytes(got, want)


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values_element_variant_and_3d(dtype, rounding):
    blocks = _special_blocks(dtype).cuda()
    _check_2d(torch.cat([blocks, blocks[:, :1]], 1), rounding)  # K = 33: one element per step
    w = blocks[:16].reshape(1, 16, 32)
    with no_sync():
        q, s = torch_bindings.quantize_fp8_3d(w, round_scales_to_power_of_2=rounding, backend="cute")
    q_ref, s_ref = reference.quantize_fp8_3d(w, round_scales_to_power_of_2=rounding)
    assert_same_bytes(q, q_ref, "q")
    assert_same_bytes(s, s_ref, "scales")


@pytest.mark.parametrize("shape", [(4, 0), (0, 3, 8), (2, 0, 8), (2, 3, 0)])
def test_empty_dims(shape):
    x = torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
    run = torch_bindings.quantize_fp8_3d if len(shape) == 3 else torch_bindings.quantize_fp8_2d
    ref = reference.quantize_fp8_3d if len(shape) == 3 else reference.quantize_fp8_2d
    with no_sync():
        q, s = run(x, backend="cute")
    q_ref, s_ref = ref(x)
    assert_same_bytes(q, q_ref, "q")
    assert_same_bytes(s, s_ref, "scales")


def test_3d_with_n_one_as_a_transposed_view():
    """(E, 1, K) taken from a (1, E, K) tensor: contiguous, but its size-1 dim's stride is E K."""
    w = (
        _random_x((1, 5 * 64), torch.bfloat16, torch.Generator().manual_seed(9))
        .view(1, 5, 64)
        .transpose(0, 1)
    )
    with no_sync():
        q, s = torch_bindings.quantize_fp8_3d(w, backend="cute")
        q1, s1 = torch_bindings.quantize_mxfp8_3d(w, backend="cute")
    for got, want in zip((q, s), reference.quantize_fp8_3d(w.contiguous()), strict=True):
        assert_same_bytes(got, want)
    for got, want in zip((q1, s1), reference.quantize_mxfp8_3d(w.contiguous()), strict=True):
        assert_same_bytes(got, want)
