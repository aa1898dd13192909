"""pad_and_quantize_fp8_2d_cols and pad_and_quantize_fp8_2d_dual (the same, with the row operand) on
the GPU: the grouped FP8 column operand written into padded token groups, bit-exact to the
reference (quantize_fp8_2d(pad_token_groups(x)[0], axis="col", group_end_offsets=padded_end)): q
bytes and strides, fp32 scale bits and the padded offsets (the dual: also its rows below the last
group end, and no write past it), on random data and special values (a NaN column's padding rows
are 0x7F), every alignment, both roundings, bf16 and fp32, element loads (K odd, unaligned x),
empty groups and rows past the last group, on poisoned memory, no sync, no recompile when M, K or
the offsets change, CUDA-graph replay with new data and offsets, fullgraph torch.compile. The group
patterns are fuzzed in tests/torch_bindings/test_fuzz_gpu.py (ops fp8_cols_padded,
fp8_dual_padded)."""

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


_NAMES = ("q", "scales", "padded_start", "padded_end")
_DUAL_NAMES = ("q_row", "s_row", *_NAMES)


def _check(x: torch.Tensor, ends: list[int], alignment: int, rounding: bool = True) -> None:
    """Both ops against their references: the column op, and the dual (its row outputs compared
    below the last group end, the rows the contract defines; the garbage the allocator was
    poisoned with stays in the others)."""
    offsets = torch.tensor(ends, dtype=torch.int32, device=x.device)
    kw = {"alignment": alignment, "round_scales_to_power_of_2": rounding}
    with no_sync():
        got = torch_bindings.pad_and_quantize_fp8_2d_cols(x, offsets, backend="cute", **kw)
        got_dual = torch_bindings.pad_and_quantize_fp8_2d_dual(x, offsets, backend="cute", **kw)
    want = reference.pad_and_quantize_fp8_2d_cols(x, offsets, **kw)
    want_dual = reference.pad_and_quantize_fp8_2d_dual(x, offsets, **kw)
    bound = min(max(ends[-1], 0), x.shape[0])
    for names, outs, wants in ((_NAMES, got, want), (_DUAL_NAMES, got_dual, want_dual)):
        for name, g, w in zip(names, outs, wants, strict=True):
            assert g.shape == w.shape, (name, g.shape, w.shape)
            assert same_strides(g, w), (name, g.stride(), w.stride())
            if name in ("q_row", "s_row"):
                g, w = g[:bound], w[:bound]
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


@pytest.mark.parametrize("dual", [False, True])
def test_cuda_graph_replay(dual):
    """New data and new offsets between replays: the padded offsets and the q rows follow them (the
    dual's row outputs compared below the last end)."""
    op = torch_bindings.pad_and_quantize_fp8_2d_dual if dual else torch_bindings.pad_and_quantize_fp8_2d_cols
    want_op = reference.pad_and_quantize_fp8_2d_dual if dual else reference.pad_and_quantize_fp8_2d_cols
    gen = torch.Generator().manual_seed(11)
    x = _random_x((3000, 1024), torch.bfloat16, gen)
    ends = torch.tensor([100, 100, 1500, 2990], dtype=torch.int32, device="cuda")
    op(x, ends, alignment=128)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = op(x, ends, alignment=128)
    for new_ends in ([0, 700, 701, 3000], [3000, 3000, 3000, 3000], [5, 6, 7, 8]):
        x.copy_(_random_x((3000, 1024), torch.bfloat16, gen))
        ends.copy_(torch.tensor(new_ends, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        rows = 2 if dual else 0  # the dual's row outputs: defined below the last end
        for i, (a, e) in enumerate(zip(got, want_op(x, ends, alignment=128), strict=True)):
            assert_same_bytes(a[: new_ends[-1]] if i < rows else a, e[: new_ends[-1]] if i < rows else e)


def test_dual_rows_past_the_last_end_are_left_alone():
    """The dual writes no row of q_row past the last group end (a dispatch's static worst-case
    rows): its outputs taken from a fresh memory pool whose one free block was filled with 0xA5
    (q_row, 2 MiB, is split from it), those bytes stay 0xA5."""
    x = _random_x((4096, 512), torch.bfloat16, torch.Generator().manual_seed(12))
    ends = torch.tensor([0, 1000, 2500], dtype=torch.int32, device="cuda")
    torch_bindings.pad_and_quantize_fp8_2d_dual(x, ends)  # compile first
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        filler = torch.full((64 << 20,), 0xA5, dtype=torch.uint8, device="cuda")
        del filler
        q_row, s_row, *_ = torch_bindings.pad_and_quantize_fp8_2d_dual(x, ends)
    assert bool((q_row[2500:].view(torch.uint8) == 0xA5).all())
    want = reference.pad_and_quantize_fp8_2d_dual(x, ends)
    assert_same_bytes(q_row[:2500], want[0][:2500])
    assert_same_bytes(s_row[:2500], want[1][:2500])
    del q_row, s_row, _


def test_fullgraph_compile():
    x = _random_x((300, 64), torch.bfloat16, torch.Generator().manual_seed(6))
    offsets = torch.tensor([0, 100, 290], dtype=torch.int32, device="cuda")

    def fn(x, offsets):
        return torch_bindings.pad_and_quantize_fp8_2d_cols(x, offsets, alignment=128)

    got = torch.compile(fn, fullgraph=True)(x, offsets)
    for g, w in zip(got, reference.pad_and_quantize_fp8_2d_cols(x, offsets, alignment=128), strict=True):
        assert_same_bytes(g, w)

    def dual(x, offsets):
        return torch_bindings.pad_and_quantize_fp8_2d_dual(x, offsets, alignment=128)

    got = torch.compile(dual, fullgraph=True)(x, offsets)
    want = reference.pad_and_quantize_fp8_2d_dual(x, offsets, alignment=128)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same_bytes(g[:290] if i < 2 else g, w[:290] if i < 2 else w)
