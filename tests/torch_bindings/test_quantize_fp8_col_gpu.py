"""FP8 column scales on the GPU (SPEC section 7): quantize_fp8_2d(axis="col") with and without row
groups, quantize_fp8_2d_dual, quantize_fp8_3d(axis="N") and quantize_fp8_3d_dual, bit-exact to the
reference (q bytes, strides and fp32 scale bits; the 3-D dual also to the two single kernel calls)
on random data (per-row and per-column magnitudes) and special values, both roundings, every
load/store variant (K odd, M or N % 16 != 0, unaligned x), empty groups and rows past the last
group, no sync, no recompile when M, K or the offsets change, CUDA graphs, fullgraph
torch.compile. The group patterns are fuzzed in tests/torch_bindings/test_fuzz_gpu.py (ops fp8_cols, fp8_dual,
fp8_3d)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_bytes, no_sync
from test_quantize_gpu import _random_x, _special_blocks

import torch_bindings
from tests.support.fuzz import same_strides
from torch_bindings import reference

pytestmark = pytest.mark.gpu

SHAPES = [(1, 2), (3, 1), (5, 13), (16, 256), (33, 1000), (48, 258), (256, 7168), (1000, 5120), (4096, 2048)]


def _by_column(shape, dtype, gen) -> torch.Tensor:
    """Random data whose magnitude varies per column (10^U(-30, 30))."""
    return _random_x(shape[::-1], dtype, gen).t().contiguous()


def _row_bound(ends, rows: int) -> int:
    """The rows a grouped dual's row outputs define: below the clamped last end (all without groups)."""
    return rows if ends is None else max(0, min(int(ends[-1]), rows))


def _check_cols(x: torch.Tensor, ends=None, rounding: bool = True, dual: bool = False) -> None:
    """quantize_fp8_2d(axis="col") (``dual``: quantize_fp8_2d_dual, all four outputs; with groups
    the row outputs below the last end) against the reference: bytes and strides."""
    offsets = None if ends is None else torch.tensor(ends, dtype=torch.int32, device="cuda")
    kw = {"group_end_offsets": offsets, "round_scales_to_power_of_2": rounding}
    if not dual:
        kw["axis"] = "col"
    ours = torch_bindings.quantize_fp8_2d_dual if dual else torch_bindings.quantize_fp8_2d
    theirs = reference.quantize_fp8_2d_dual if dual else reference.quantize_fp8_2d
    with no_sync():
        got = ours(x, backend="cute", **kw)
    want = theirs(x, **kw)
    bound = _row_bound(ends, x.shape[0])
    for name, g, w in zip(("q_row", "s_row", "q", "scales")[-len(got) :], got, want, strict=True):
        assert same_strides(g, w), (name, g.stride(), w.stride())
        rows = slice(0, bound) if name in ("q_row", "s_row") else slice(None)
        assert_same_bytes(g[rows], w[rows], name)


@pytest.mark.parametrize("dual", [False, True], ids=["cols", "dual"])
@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_columns_match_reference(rows, cols, dtype, rounding, dual, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(rows * 7 + cols)
    for x in (_random_x((rows, cols), dtype, gen), _by_column((rows, cols), dtype, gen)):
        poison_cuda_allocator()
        _check_cols(x, None, rounding, dual)


GROUPS = [
    [0, 0, 5, 5, 17],  # empty first groups, rows past the last
    [1, 2, 3, 4, 40],  # one-row groups, one block crossing many ends
    [40, 40, 40],  # empty last groups
    [0],  # no rows in any group
    [32, 64, 100, 128, 300],
    [7, 290, 300],
]


@pytest.mark.parametrize("dual", [False, True], ids=["cols", "dual"])
@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ends", GROUPS, ids=str)
@pytest.mark.parametrize("cols", [64, 258, 7])
def test_groups_match_reference(ends, cols, dtype, rounding, dual, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(len(ends) * 31 + cols)
    rows = max(ends[-1] + 3, 16 if cols == 64 else 17)
    for x in (_random_x((rows, cols), dtype, gen), _by_column((rows, cols), dtype, gen)):
        poison_cuda_allocator()
        _check_cols(x, ends, rounding, dual)


def test_many_groups_and_a_large_matrix():
    gen = torch.Generator().manual_seed(11)
    x = _by_column((16384, 2048), torch.bfloat16, gen)
    sizes = torch.randint(0, 600, (64,), generator=gen)
    ends = torch.cumsum(sizes, 0).clamp(max=16384).tolist()
    _check_cols(x, ends)
    _check_cols(x, list(range(1, 2049)))  # 2048 one-row groups
    _check_cols(x, ends, dual=True)


@pytest.mark.parametrize("dual", [False, True], ids=["cols", "dual"])
@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values(dtype, rounding, dual):
    blocks = _special_blocks(dtype).cuda()  # rows of 32: Inf, NaN, 0, -0, subnormals, max
    columns = blocks.t().contiguous()  # each special run down a column
    _check_cols(columns, None, rounding, dual)
    _check_cols(columns, [8, 8, 20], rounding, dual)
    _check_cols(blocks, None, rounding, dual)
    _check_cols(blocks, [1, 3], rounding, dual)
    odd = torch.cat([columns, columns[:, :1]], 1)  # K odd: element loads
    _check_cols(odd, [3, 31], rounding, dual)
    for whole in (columns[:, :16], columns[:, 1:]):  # (32, 16): one whole block, no load masks
        _check_cols(whole.contiguous(), None, rounding, dual)
    tall = blocks.repeat(4, 1)[:64].contiguous()  # (64, 32): two whole blocks of specials along rows
    _check_cols(tall, [32, 64], rounding, dual)


@pytest.mark.parametrize("dual", [False, True], ids=["cols", "dual"])
def test_unaligned_x_takes_the_element_loads(dual):
    base = _random_x((1, 64 * 40 + 1), torch.bfloat16, torch.Generator().manual_seed(4))
    x = base[0, 1:].view(64, 40)  # 2 bytes past a 4-byte boundary
    _check_cols(x, dual=dual)
    _check_cols(x, [10, 50], dual=dual)


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "experts,n,k", [(1, 1, 8), (3, 50, 64), (2, 129, 96), (4, 256, 7168), (2, 7, 13), (2, 48, 258)]
)
def test_3d_n_matches_reference(experts, n, k, dtype, rounding, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(experts + n + k)
    w = _random_x((experts * n, k), dtype, gen).view(experts, n, k)
    poison_cuda_allocator()
    with no_sync():
        q, s = torch_bindings.quantize_fp8_3d(
            w, axis="N", round_scales_to_power_of_2=rounding, backend="cute"
        )
    q_ref, s_ref = reference.quantize_fp8_3d(w, axis="N", round_scales_to_power_of_2=rounding)
    assert same_strides(q, q_ref), (q.stride(), q_ref.stride())
    assert_same_bytes(q, q_ref, "q")
    assert_same_bytes(s, s_ref, "scales")


@pytest.mark.parametrize("ends", [None, [0, 100, 100, 250], [5]], ids=str)
def test_dual_matches_the_two_single_calls(ends):
    x = _random_x((256, 520), torch.bfloat16, torch.Generator().manual_seed(12))
    offsets = None if ends is None else torch.tensor(ends, dtype=torch.int32, device="cuda")
    with no_sync():
        got = torch_bindings.quantize_fp8_2d_dual(x, group_end_offsets=offsets, backend="cute")
    want = reference.quantize_fp8_2d_dual(x, group_end_offsets=offsets)
    bound = _row_bound(ends, x.shape[0])
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert same_strides(g, w), (g.stride(), w.stride())
        rows = slice(0, bound) if i < 2 else slice(None)
        assert_same_bytes(g[rows], w[rows])
    rounding = dict(round_scales_to_power_of_2=True)
    rows_op = torch_bindings.quantize_fp8_2d(x, axis="row", group_end_offsets=offsets, **rounding)
    cols_op = torch_bindings.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets, **rounding)
    for i, (g, w) in enumerate(zip(got, (*rows_op, *cols_op), strict=True)):
        rows = slice(0, bound) if i < 2 else slice(None)
        assert_same_bytes(g[rows], w[rows], f"output {i} against the single kernel calls")


def test_grouped_dual_leaves_the_rows_past_the_last_end_unwritten():
    """With groups, q_row and s_row past the last end are left as the allocator gave them (as the
    bounded row op leaves them): outputs from a fresh memory pool whose free blocks were filled
    with 0xA5 keep those bytes there (q_row, 2 MiB, comes from the large block; s_row, 16 KiB,
    from the small pool's 2 MiB segment, filled by two 1 MiB tensors)."""
    x = _random_x((4096, 512), torch.bfloat16, torch.Generator().manual_seed(13))
    ends = torch.tensor([0, 1000, 2500], dtype=torch.int32, device="cuda")
    torch_bindings.quantize_fp8_2d_dual(x, group_end_offsets=ends)  # compile first
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        fillers = [
            torch.full((size,), 0xA5, dtype=torch.uint8, device="cuda")
            for size in (64 << 20, 1 << 20, 1 << 20)
        ]
        del fillers
        q_row, s_row, *_ = torch_bindings.quantize_fp8_2d_dual(x, group_end_offsets=ends)
    assert bool((q_row[2500:].view(torch.uint8) == 0xA5).all()), "q_row past the last end"
    assert bool((s_row[2500:].view(torch.uint8) == 0xA5).all()), "s_row past the last end"
    want = reference.quantize_fp8_2d_dual(x, group_end_offsets=ends)
    assert_same_bytes(q_row[:2500], want[0][:2500])
    assert_same_bytes(s_row[:2500], want[1][:2500])
    del q_row, s_row, _


@pytest.mark.parametrize("shape", [(0, 64), (4, 0), (0, 3)])
def test_empty_dims(shape):
    x = torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
    offsets = torch.tensor([0, 0], dtype=torch.int32, device="cuda")
    for kw in ({}, {"group_end_offsets": offsets}):
        with no_sync():
            q, s = torch_bindings.quantize_fp8_2d(x, axis="col", backend="cute", **kw)
        q_ref, s_ref = reference.quantize_fp8_2d(x, axis="col", **kw)
        assert_same_bytes(q, q_ref, "q")
        assert_same_bytes(s, s_ref, "scales")
        _check_cols(x, None if not kw else [0, 0], dual=True)
    w = torch.zeros((2, *shape), dtype=torch.bfloat16, device="cuda")
    with no_sync():
        q, s = torch_bindings.quantize_fp8_3d(w, axis="N", backend="cute")
    assert_same_bytes(s, reference.quantize_fp8_3d(w, axis="N")[1], "scales")


def test_no_recompiles_across_shapes_and_offsets():
    """After one call per compile class (K class, group bucket, K parity, M % 16), other M, K, G and
    offsets in those classes compile nothing."""
    gen = torch.Generator().manual_seed(5)
    # (rows, cols, ends) and a second case of the same classes: M % 16, K's class and parity, G's bucket
    cases = [
        ((32, 8, [5, 9]), (80, 16, [7, 30, 31])),
        ((999, 7168, [100]), (1047, 5120, [200])),
        ((4096, 2048, list(range(0, 4096, 64))), (4144, 1500, list(range(0, 4000, 100)))),
        ((7, 5, [7]), (55, 3, [20])),
    ]

    def one_round(which: int) -> None:
        for case in cases:
            rows, cols, ends = case[which]
            x = _random_x((rows, cols), torch.bfloat16, gen)
            _check_cols(x, None)
            _check_cols(x, ends)
            _check_cols(x, ends, dual=True)
        experts = (2, 8)[which]  # both in the bucket of 8
        w = _random_x((experts * (16 + 32 * which), 64), torch.bfloat16, gen).view(experts, -1, 64)
        assert_same_bytes(
            torch_bindings.quantize_fp8_3d(w, axis="N")[1], reference.quantize_fp8_3d(w, axis="N")[1]
        )

    one_round(0)
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    one_round(1)
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before


# --- quantize_fp8_3d_dual: both layouts of an expert weight from the experts dual variants ---


def _check_3d_dual(w: torch.Tensor, rounding: bool = True) -> None:
    """quantize_fp8_3d_dual (no host sync) against the two single kernel calls and the reference:
    strides and every byte of q_k, s_k, q_n, s_n."""
    kw = {"round_scales_to_power_of_2": rounding}
    with no_sync():
        got = torch_bindings.quantize_fp8_3d_dual(w, backend="cute", **kw)
    singles = (
        *torch_bindings.quantize_fp8_3d(w, axis="K", backend="cute", **kw),
        *torch_bindings.quantize_fp8_3d(w, axis="N", backend="cute", **kw),
    )
    want = reference.quantize_fp8_3d_dual(w, **kw)
    for name, g, one, ref in zip(("q_k", "s_k", "q_n", "s_n"), got, singles, want, strict=True):
        assert same_strides(g, ref), (name, g.stride(), ref.stride())
        assert torch.equal(g.view(torch.uint8), one.view(torch.uint8)), f"{name}: not the single call's bytes"
        assert_same_bytes(g, ref, name)


def _by_expert_column(shape, dtype, gen) -> torch.Tensor:
    """w (E, N, K) whose magnitude varies per (expert, column) (10^U(-30, 30))."""
    experts, n, k = shape
    return _random_x((experts * k, n), dtype, gen).view(experts, k, n).transpose(1, 2).contiguous()


EXPERT_SHAPES = [
    (1, 1, 8),  # E = 1, one row
    (1, 300, 7),  # E = 1, K odd: element loads and stores
    (3, 50, 64),  # N % 16 != 0: byte stores of q_n
    (2, 129, 96),
    (2, 7, 13),  # K odd, N < 16
    (2, 48, 258),  # a second column tile of two columns
    (3, 33, 1000),
    (4, 256, 7168),
    (9, 160, 520),  # 9 experts: the bucket of 64
]


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("experts,n,k", EXPERT_SHAPES)
def test_3d_dual_matches_single_calls_and_reference(experts, n, k, dtype, rounding, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(experts * 1000 + n + k)
    by_row = _random_x((experts * n, k), dtype, gen).view(experts, n, k)
    for w in (by_row, _by_expert_column((experts, n, k), dtype, gen)):
        poison_cuda_allocator()
        _check_3d_dual(w, rounding)


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_3d_dual_special_values(dtype, rounding, poison_cuda_allocator):
    blocks = _special_blocks(dtype).cuda()  # (17, 32) rows: Inf, NaN, 0, -0, subnormals, bf16 max
    columns = blocks.t().contiguous()  # (32, 17): each special run down a column
    odd = torch.cat([columns, columns[:, :2]], 1)  # K = 19: element loads
    for w in (
        blocks.view(1, 17, 32),  # each special run along a row (the K side)
        torch.stack([blocks, blocks.flip(0)]),
        columns.view(2, 16, 17),  # and down the columns of each expert (the N side)
        odd.view(2, 16, 19),
        columns[:, :16].contiguous().view(1, 32, 16),  # whole 32-row blocks: loads with no masks
        columns[:, 1:].contiguous().view(1, 32, 16),
        blocks.repeat(4, 1)[:64].contiguous().view(2, 32, 32),
        torch.zeros(2, 40, 64, dtype=dtype, device="cuda"),
    ):
        poison_cuda_allocator()
        _check_3d_dual(w, rounding)


def test_3d_dual_unaligned_w_takes_the_element_loads():
    base = _random_x((1, 3 * 40 * 64 + 1), torch.bfloat16, torch.Generator().manual_seed(8))
    _check_3d_dual(base[0, 1:].view(3, 40, 64))  # 2 bytes past a 4-byte boundary


@pytest.mark.parametrize("shape", [(2, 0, 64), (2, 5, 0), (0, 4, 8), (3, 1, 16)])
def test_3d_dual_empty_dims_and_one_row(shape):
    _check_3d_dual(torch.randn(shape, dtype=torch.bfloat16, device="cuda"))


def test_3d_dual_one_row_with_a_free_row_stride():
    w = torch.randn(1, 3, 16, device="cuda").transpose(0, 1)  # (3, 1, 16), strides (16, 48, 1)
    assert w.is_contiguous()
    _check_3d_dual(w)


def test_3d_dual_no_recompiles_and_torch_compile_fullgraph():
    """One call per compile class (N % 16, K's class and parity, E's bucket) compiles nothing for
    other N, K and E of those classes; ``torch.compile(fullgraph=True, dynamic=True)`` runs the
    custom op (bytes against the reference)."""
    gen = torch.Generator().manual_seed(9)
    classes = [((2, 32, 64), (8, 80, 48)), ((3, 50, 7168), (5, 7, 5120)), ((2, 9, 13), (6, 21, 7))]
    for shape, _ in classes:
        _check_3d_dual(_random_x((shape[0] * shape[1], shape[2]), torch.bfloat16, gen).view(shape))
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    for _, shape in classes:
        _check_3d_dual(_random_x((shape[0] * shape[1], shape[2]), torch.bfloat16, gen).view(shape))
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before

    @torch.compile(fullgraph=True, dynamic=True)
    def dual(w):
        return torch_bindings.quantize_fp8_3d_dual(w)

    for experts, n in ((2, 96), (3, 300)):
        w = _random_x((experts * n, 128), torch.float32, gen).view(experts, n, 128)
        for g, want in zip(dual(w), reference.quantize_fp8_3d_dual(w), strict=True):
            assert same_strides(g, want)
            assert_same_bytes(g, want)


def test_cuda_graph_replay_with_new_offsets():
    x = _random_x((512, 2048), torch.bfloat16, torch.Generator().manual_seed(6))
    offsets = torch.tensor([100, 300, 512], dtype=torch.int32, device="cuda")
    torch_bindings.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = torch_bindings.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets)
    for seed, ends in enumerate(([0, 256, 400], [512, 512, 512])):
        x.copy_(_random_x((512, 2048), torch.bfloat16, torch.Generator().manual_seed(10 + seed)))
        offsets.copy_(torch.tensor(ends, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = reference.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets)
        assert_same_bytes(q, q_ref, "q")
        assert_same_bytes(s, s_ref, "scales")


def test_torch_compile_fullgraph():
    @torch.compile(fullgraph=True, dynamic=True)
    def ops(x, offsets, w):
        return (
            *torch_bindings.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets),
            *torch_bindings.quantize_fp8_2d(x, axis="col"),
            *torch_bindings.quantize_fp8_2d_dual(x, group_end_offsets=offsets),
            *torch_bindings.quantize_fp8_3d(w, axis="N"),
        )

    gen = torch.Generator().manual_seed(7)
    for rows in (96, 300):
        x = _random_x((rows, 256), torch.bfloat16, gen)
        w = _random_x((2 * rows, 128), torch.bfloat16, gen).view(2, rows, 128)
        offsets = torch.tensor([rows // 3, rows], dtype=torch.int32, device="cuda")
        got = ops(x, offsets, w)
        want = (
            *reference.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets),
            *reference.quantize_fp8_2d(x, axis="col"),
            *reference.quantize_fp8_2d_dual(x, group_end_offsets=offsets),
            *reference.quantize_fp8_3d(w, axis="N"),
        )
        for g, w_ in zip(got, want, strict=True):
            assert_same_bytes(g, w_)


def test_more_experts_than_the_grid_takes_is_a_clear_error():
    """One grid z index per expert: E > 65535 raises before launch (it used to fail the launch);
    E = 65535 runs; the reference takes any E."""
    w = torch.zeros(65536, 32, 32, dtype=torch.bfloat16, device="cuda")
    for op in (
        lambda: torch_bindings.quantize_fp8_3d(w, axis="N", backend="cute"),
        lambda: torch_bindings.quantize_fp8_3d_dual(w, backend="cute"),
        lambda: torch_bindings.quantize_mxfp8_3d(w, block="32x1", backend="cute"),
    ):
        with pytest.raises(ValueError, match="65535"):
            op()
    q, s = torch_bindings.quantize_fp8_3d(w, axis="N", backend="reference")
    assert s.shape == (65536, 32)
    w[-1, -1, -1] = 3.0
    most = w[1:]
    for got, want in zip(
        torch_bindings.quantize_fp8_3d(most, axis="N", backend="cute"),
        reference.quantize_fp8_3d(most, axis="N"),
        strict=True,
    ):
        assert_same_bytes(got, want)
