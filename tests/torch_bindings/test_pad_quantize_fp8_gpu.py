"""pad_and_quantize_fp8_2d_cols on the GPU: the grouped FP8 column operand written into padded token
groups, bit-exact to the reference (quantize_fp8_2d(pad_token_groups(x)[0], axis="col",
group_end_offsets=padded_end)): q bytes and strides, fp32 scale bits and the padded offsets, on
random data and special values (a NaN column's padding rows are 0x7F), every alignment, both
roundings, bf16 and fp32, element loads (K odd, unaligned x), empty groups and rows past the last
group, on poisoned memory, no sync, no recompile when M, K or the offsets change, CUDA-graph
replay with new data and offsets, fullgraph torch.compile. The group patterns are fuzzed in
tests/torch_bindings/test_fuzz_gpu.py (op fp8_cols_padded)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_bytes, no_sync
from test_quantize_gpu import _random_x, _special_blocks

import torch_bindings
from tests.support.fuzz import same_strides
from torch_bindings import reference

pytestmark = pytest.mark.gpu

ALIGNMENTS = (16, 32, 64, 128)
GROUPS = [
    [0, 0, 5, 5, 17],  # empty first groups, rows past the last
    [1, 2, 3, 4, 40],  # one-row groups: several padded groups in one 128-row tile
    [40, 40, 40],  # empty last groups
    [0],  # no rows in any group
    [32, 64, 100, 128, 300],  # whole halves and blocks, then partial ones
    [7, 290, 300],
]


def _check(x: torch.Tensor, ends: list[int], alignment: int, rounding: bool = True) -> None:
    offsets = torch.tensor(ends, dtype=torch.int32, device=x.device)
    kw = {"alignment": alignment, "round_scales_to_power_of_2": rounding}
    with no_sync():
        got = torch_bindings.pad_and_quantize_fp8_2d_cols(x, offsets, backend="cute", **kw)
    want = reference.pad_and_quantize_fp8_2d_cols(x, offsets, **kw)
    for name, g, w in zip(("q", "scales", "padded_start", "padded_end"), got, want, strict=True):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert same_strides(g, w), (name, g.stride(), w.stride())
        assert_same_bytes(g, w, name)


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("ends", GROUPS, ids=str)
@pytest.mark.parametrize("cols", [64, 258, 7])
def test_matches_reference(ends, cols, alignment, dtype, rounding, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(len(ends) * 31 + cols + alignment)
    rows = max(ends[-1] + 3, 17)
    x = _random_x((rows, cols), dtype, gen)
    poison_cuda_allocator()
    _check(x, ends, alignment, rounding)


@pytest.mark.parametrize("alignment", [16, 128])
def test_expert_block_shapes(alignment):
    """Skewed groups at an expert block's sizes (M 16384, K 2048 / 5120, 16 groups)."""
    gen = torch.Generator().manual_seed(alignment)
    sizes = torch.randint(0, 2048, (16,), generator=gen)
    sizes[3] = 0
    ends = torch.cumsum(sizes, 0).clamp(max=16384).tolist()
    for cols in (2048, 5120):
        _check(_random_x((16384, cols), torch.bfloat16, gen), ends, alignment)
    _check(_random_x((16384, 2048), torch.bfloat16, gen), list(range(1, 2049)), alignment)  # 2048 groups


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values(dtype, rounding):
    blocks = _special_blocks(dtype).cuda()  # rows of 32: Inf, NaN, 0, -0, subnormals, max
    columns = blocks.t().contiguous()  # each special run down a column: NaN columns pad to 0x7F
    for alignment in ALIGNMENTS:
        _check(columns, [8, 8, 20], alignment, rounding)
        _check(blocks, [1, 3], alignment, rounding)
        _check(torch.cat([columns, columns[:, :1]], 1), [3, 31], alignment, rounding)  # K odd


def test_unaligned_x_takes_the_element_loads():
    base = _random_x((1, 64 * 40 + 1), torch.bfloat16, torch.Generator().manual_seed(4))
    x = base[0, 1:].view(64, 40)  # 2 bytes past a 4-byte boundary
    _check(x, [10, 50], 32)


@pytest.mark.parametrize("shape", [(0, 64), (4, 0), (0, 3)])
def test_empty_dims(shape):
    _check(torch.zeros(shape, dtype=torch.bfloat16, device="cuda"), [0, 0], 16)


def test_no_recompiles_across_shapes_and_offsets():
    """After one call per compile class (K class and parity, group bucket), other M, K, G, offsets
    and alignments in those classes compile nothing."""
    gen = torch.Generator().manual_seed(5)
    cases = [
        ((32, 8, [5, 9], 16), (80, 16, [7, 30, 31], 128)),
        ((999, 7168, [100], 32), (1047, 5120, [200], 64)),
    ]

    def one_round(which: int) -> None:
        for case in cases:
            rows, cols, ends, alignment = case[which]
            _check(_random_x((rows, cols), torch.bfloat16, gen), ends, alignment)

    one_round(0)
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    one_round(1)
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before


def test_cuda_graph_replay():
    """New data and new offsets between replays: the padded offsets and the q rows follow them."""
    gen = torch.Generator().manual_seed(11)
    x = _random_x((3000, 1024), torch.bfloat16, gen)
    ends = torch.tensor([100, 100, 1500, 2990], dtype=torch.int32, device="cuda")
    torch_bindings.pad_and_quantize_fp8_2d_cols(x, ends, alignment=128)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = torch_bindings.pad_and_quantize_fp8_2d_cols(x, ends, alignment=128)
    for new_ends in ([0, 700, 701, 3000], [3000, 3000, 3000, 3000], [5, 6, 7, 8]):
        x.copy_(_random_x((3000, 1024), torch.bfloat16, gen))
        ends.copy_(torch.tensor(new_ends, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = reference.pad_and_quantize_fp8_2d_cols(x, ends, alignment=128)
        for a, e in zip(got, want, strict=True):
            assert_same_bytes(a, e)


def test_fullgraph_compile():
    x = _random_x((300, 64), torch.bfloat16, torch.Generator().manual_seed(6))
    offsets = torch.tensor([0, 100, 290], dtype=torch.int32, device="cuda")

    def fn(x, offsets):
        return torch_bindings.pad_and_quantize_fp8_2d_cols(x, offsets, alignment=128)

    got = torch.compile(fn, fullgraph=True)(x, offsets)
    for g, w in zip(got, reference.pad_and_quantize_fp8_2d_cols(x, offsets, alignment=128), strict=True):
        assert_same_bytes(g, w)
