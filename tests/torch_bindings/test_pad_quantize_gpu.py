"""pad_and_quantize_mxfp8_2d (the 1x32 kernel's ``padded`` variant) on the GPU: bit-exact to
``quantize_mxfp8_2d(pad_token_groups(x)[0], group_end_offsets=padded_end)`` (the reference), no
sync, clamped garbage offsets, CUDA graphs, fullgraph torch.compile, no recompiles."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_bytes, cuda_offsets, no_sync, random_group_ends
from test_quantize_gpu import _random_x

import torch_bindings
from torch_bindings import reference

pytestmark = pytest.mark.gpu

_SPECIAL = (0, 1, 31, 33, 0, 127, 129, 1)  # empty groups, 1 row, just under / over an alignment
_B, _F = torch.bfloat16, torch.float32

# (tokens, D, G, alignment, dtype, mode): a sample of the cross product covering every value of each
# axis, every alignment with both dtypes and both modes.
CASES = [
    (0, 32, 1, 32, _B, "rceil"),
    (0, 1536, 8, 128, _F, "floor"),
    (1, 32, 1, 16, _B, "floor"),
    (1, 1536, 4, 64, _F, "rceil"),
    (128, 32, 2, 128, _F, "rceil"),
    (128, 7168, 1024, 32, _B, "floor"),
    (157, 1536, 16, 16, _B, "rceil"),
    (157, 32, 64, 64, _F, "floor"),
    (157, 7168, 1024, 128, _B, "rceil"),
    (4096, 32, 256, 32, _B, "floor"),
    (4096, 1536, 8, 128, _F, "rceil"),
    (4096, 7168, 4, 16, _F, "floor"),
    (16392, 7168, 16, 32, _B, "rceil"),
    (16392, 1536, 1024, 64, _B, "floor"),
    (16392, 32, 2, 16, _F, "rceil"),
    (16392, 1536, 256, 128, _F, "floor"),
    (131072, 7168, 8, 32, _B, "rceil"),
    (131072, 1536, 64, 128, _B, "floor"),
    (131072, 32, 256, 64, _F, "rceil"),
]


def _check(x: torch.Tensor, ends: torch.Tensor, alignment: int, mode: str) -> None:
    with no_sync():
        got = torch_bindings.pad_and_quantize_mxfp8_2d(
            x, ends, alignment=alignment, scaling_mode=mode, backend="cute"
        )
    want = reference.pad_and_quantize_mxfp8_2d(x, ends, alignment=alignment, scaling_mode=mode)
    for name, a, e in zip(("q", "scales", "padded_start", "padded_end"), got, want, strict=True):
        assert_same_bytes(a, e, name)


@pytest.mark.parametrize("tokens,cols,groups,alignment,dtype,mode", CASES)
def test_matches_reference(tokens, cols, groups, alignment, dtype, mode, poison_cuda_allocator):
    seed = tokens * 7 + cols * 3 + groups
    gen = torch.Generator().manual_seed(seed)
    x = _random_x((tokens, cols), dtype, gen)
    ends = cuda_offsets(random_group_ends(tokens, groups, gen, special=_SPECIAL))
    poison_cuda_allocator()
    _check(x, ends, alignment, mode)


def test_groups_not_covering_all_rows_and_full_groups():
    gen = torch.Generator().manual_seed(4)
    x = _random_x((3000, 288), torch.bfloat16, gen)
    for ends in ([3000], [1, 45, 172, 301, 2900], [0, 0, 2999], [128, 256, 2048], [0]):
        for alignment in (16, 128):
            _check(x, cuda_offsets(ends), alignment, "rceil")


def test_garbage_offsets_stay_in_bounds():
    gen = torch.Generator().manual_seed(3)
    x = _random_x((300, 256), torch.bfloat16, gen)
    ends = cuda_offsets([5000, -7, 120, 3, 1 << 30])
    q, s, start, end = torch_bindings.pad_and_quantize_mxfp8_2d(x, ends, backend="cute")
    torch.cuda.synchronize()
    assert q.shape == (reference.padded_rows(300, 5, 32), 256) and s.dtype == torch.float8_e8m0fnu


def test_cuda_graph_replay():
    gen = torch.Generator().manual_seed(11)
    x = _random_x((3000, 1024), torch.bfloat16, gen)
    ends = cuda_offsets(random_group_ends(3000, 8, gen))
    torch_bindings.pad_and_quantize_mxfp8_2d(x, ends)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = torch_bindings.pad_and_quantize_mxfp8_2d(x, ends)
    for seed in range(3):
        gen.manual_seed(100 + seed)
        x.copy_(_random_x((3000, 1024), torch.bfloat16, gen))
        ends.copy_(cuda_offsets(random_group_ends(3000, 8, gen)))
        graph.replay()
        torch.cuda.synchronize()
        want = reference.pad_and_quantize_mxfp8_2d(x, ends)
        for a, e in zip(got, want, strict=True):
            assert_same_bytes(a, e)


def test_torch_compile_fullgraph_and_no_recompiles():
    gen = torch.Generator().manual_seed(5)

    @torch.compile(fullgraph=True, dynamic=True)
    def pad_quantize(x, ends):
        return torch_bindings.pad_and_quantize_mxfp8_2d(x, ends, alignment=64)

    pad_quantize(_random_x((100, 256), torch.bfloat16, gen), cuda_offsets([50, 100]))
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    for rows, groups in [(1000, 4), (2500, 4), (777, 9), (4096, 17), (130, 2)]:
        x = _random_x((rows, 256), torch.bfloat16, gen)
        ends = cuda_offsets(random_group_ends(rows, groups, gen))
        got = pad_quantize(x, ends)
        want = reference.pad_and_quantize_mxfp8_2d(x, ends, alignment=64)
        for a, e in zip(got, want, strict=True):
            assert_same_bytes(a, e)
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before


def test_eager_no_recompiles_across_sizes_and_offsets():
    gen = torch.Generator().manual_seed(9)
    torch_bindings.pad_and_quantize_mxfp8_2d(
        _random_x((100, 64), torch.bfloat16, gen), cuda_offsets([50, 100])
    )
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    for rows, cols, groups in [(17, 32, 1), (999, 96, 3), (4096, 1408, 17), (130, 7168, 64), (70001, 64, 5)]:
        x = _random_x((rows, cols), torch.bfloat16, gen)
        torch_bindings.pad_and_quantize_mxfp8_2d(x, cuda_offsets(random_group_ends(rows, groups, gen)))
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before
