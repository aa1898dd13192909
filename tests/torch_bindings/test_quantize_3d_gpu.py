"""quantize_mxfp8_3d with 1x32 blocks on the GPU (the 1x32 kernel's ``experts`` and ``plain``
variants): bit-exact to the reference, per-expert blocked scales with every padding byte 0, no sync,
CUDA graphs, fullgraph torch.compile. (32x1: tests/torch_bindings/test_quantize_32x1_gpu.py.)"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_bytes, no_sync
from test_quantize_gpu import _random_x, _special_blocks

import torch_bindings
from torch_bindings import reference

pytestmark = pytest.mark.gpu

MODES = ("floor", "rceil")
SHAPES = [(32, 32), (96, 416), (1536, 5120), (7168, 2048), (8192, 5120), (5120, 8192)]


def _weights(experts: int, n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return _random_x((experts * n, k), dtype, gen).view(experts, n, k)


def _check(w: torch.Tensor, **kwargs) -> None:
    with no_sync():
        q, s = torch_bindings.quantize_mxfp8_3d(w, block="1x32", backend="cute", **kwargs)
    q_ref, s_ref = reference.quantize_mxfp8_3d(w, block="1x32", **kwargs)
    assert_same_bytes(q, q_ref, "q")
    assert_same_bytes(s, s_ref, "scales")


def _cases():
    """E in {1, 2, 8, 32} over every (N, K), keeping the largest E N K products few."""
    for n, k in SHAPES:
        for experts in (1, 2, 8, 32):
            big = n * k > 1536 * 5120
            if not big or experts in (1, 8):
                yield experts, n, k


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("experts,n,k", list(_cases()))
def test_bf16(experts, n, k, mode, blocked, poison_cuda_allocator):
    w = _weights(experts, n, k, torch.bfloat16, experts * 131 + n + k)
    poison_cuda_allocator()
    _check(w, scaling_mode=mode, blocked_scales=blocked)


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "experts,n,k", [(1, 32, 32), (2, 96, 416), (8, 160, 1024), (32, 64, 96), (3, 1536, 640)]
)
def test_fp32(experts, n, k, mode, blocked, poison_cuda_allocator):
    w = _weights(experts, n, k, torch.float32, experts * 7 + n + k)
    poison_cuda_allocator()
    _check(w, scaling_mode=mode, blocked_scales=blocked)


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "experts,n,k", [(1, 1, 32), (3, 50, 64), (2, 129, 96), (5, 200, 1024), (2, 4097, 160)]
)
def test_any_n(experts, n, k, dtype, blocked, poison_cuda_allocator):
    """1x32 blocks run along K, so N need not be a multiple of 32 (scales padded to 128 rows)."""
    w = _weights(experts, n, k, dtype, experts * 3 + n + k)
    poison_cuda_allocator()
    _check(w, scaling_mode="rceil", blocked_scales=blocked)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values(dtype, mode):
    blocks = _special_blocks(dtype)
    picks = torch.randint(0, blocks.shape[0], (3 * 96 * 5,), generator=torch.Generator().manual_seed(2))
    w = blocks[picks].reshape(3, 96, 5 * 32).cuda()
    _check(w, scaling_mode=mode)
    _check(w, scaling_mode=mode, blocked_scales=False)


def test_cuda_graph_replay():
    w = _weights(4, 224, 640, torch.bfloat16, 1)
    torch_bindings.quantize_mxfp8_3d(w)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = torch_bindings.quantize_mxfp8_3d(w)
    for seed in range(2):
        w.copy_(_weights(4, 224, 640, torch.bfloat16, 10 + seed))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = reference.quantize_mxfp8_3d(w)
        assert_same_bytes(q, q_ref, "q")
        assert_same_bytes(s, s_ref, "scales")


def test_torch_compile_fullgraph_and_no_recompiles():
    @torch.compile(fullgraph=True, dynamic=True)
    def quantize(w):
        return torch_bindings.quantize_mxfp8_3d(w, scaling_mode="floor")

    quantize(_weights(2, 96, 416, torch.bfloat16, 0))
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    for experts, n, k in [(1, 32, 64), (3, 288, 416), (8, 1536, 256)]:
        w = _weights(experts, n, k, torch.bfloat16, n)
        q, s = quantize(w)
        q_ref, s_ref = reference.quantize_mxfp8_3d(w, scaling_mode="floor")
        assert_same_bytes(q, q_ref, "q")
        assert_same_bytes(s, s_ref, "scales")
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before
