"""The row passes bounded by the last group end on the GPU (notes/bounded-row-passes.md):
``quantize_fp8_2d(axis="row", group_end_offsets=ends)`` (the bounded FP8 row kernel) and
``dequantize_fp8_rows``. Bytes equal to the reference on the rows below ``clamp(ends[-1], 0, M)``,
the bytes past it untouched (outputs poisoned first), for bounds 0, 1, M and mid-tile, empty
groups, G = 1 and G = 2048, garbage ends (clamped), bf16 and fp32 x, vector and element steps,
both row-kernel configs (a warp per row, a CTA per row); no host sync, CUDA graphs (the bound read
at replay), fullgraph torch.compile, no recompiles across M, K (within its class) and the ends."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import assert_same_bytes, cuda_offsets, no_sync
from test_quantize_gpu import _random_x, _special_blocks

import torch_bindings as tb
from torch_bindings import reference
from torch_bindings.moe.tokens import QuantizedTokens

pytestmark = pytest.mark.gpu

E4M3, U8 = torch.float8_e4m3fn, torch.uint8
POISON = 0xA5
ROWS = 300
#: End offsets over ROWS rows (garbage ones included: the kernels clamp the last end to [0, M]).
ENDS = {
    "bound 0": (0,),
    "bound 0, G = 3": (0, 0, 0),
    "bound 1": (1,),
    "bound M": (ROWS,),
    "mid tile": (64, 64, 200),
    "empty groups": (0, 10, 10, 10, 131, 131),
    "G = 2048": tuple(e // 8 for e in range(2048)),  # bound 255
    "garbage: past M": (5, 1 << 30),
    "garbage: negative": (200, -7),
    "garbage: decreasing": (250, 17),
}


def _bound(ends: tuple, rows: int = ROWS) -> int:
    return min(max(ends[-1], 0), rows)


def _poisoned(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A fresh tensor of ``shape`` and ``dtype`` whose every byte is POISON."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = (*shape[:-1], shape[-1] * itemsize) if shape else (itemsize,)
    return torch.full(nbytes, POISON, dtype=U8, device="cuda").view(dtype)


def _assert_poison_kept(t: torch.Tensor, bound: int, what: str) -> None:
    past = t[bound:].contiguous().view(U8)
    assert bool((past == POISON).all()), f"{what}: bytes past row {bound} were written"


def _arch() -> str:
    from torch_bindings.backend import kernel_arch

    return kernel_arch(torch.device("cuda"))[0]


@functools.cache
def _row_kernel(dtype: str, vector: bool, row_per_cta: bool, rounding: bool = True):
    """The bounded row kernel under one of the two config kinds (compiled here, not the binding's
    choice, so both kinds run whatever the tuned table says)."""
    from cute_kernels import registry
    from cute_kernels.quantize_fp8 import Fp8RowConfig, Fp8RowVariant

    config = Fp8RowConfig(threads=256, unroll=4, ctas_per_sm=1, row_per_cta=row_per_cta)
    variant = Fp8RowVariant(dtype, rounding, vector, 2, bounded=True)
    return registry.entry("quantize_fp8_row").compile(variant, _arch(), config=config)


@functools.cache
def _dequant_kernel(vector: bool):
    from cute_kernels import registry
    from cute_kernels.dequant_fp8 import DequantFp8RowsVariant

    return registry.entry("dequantize_fp8_rows").compile(DequantFp8RowsVariant(vector), _arch())


@pytest.mark.parametrize("row_per_cta", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cols", [2048, 72, 13])
@pytest.mark.parametrize("case", sorted(ENDS))
def test_row_kernel_writes_only_below_the_bound(case, cols, dtype, row_per_cta):
    x = _random_x((ROWS, cols), dtype, torch.Generator().manual_seed(cols))
    q, s = _poisoned((ROWS, cols), E4M3), _poisoned((ROWS,), torch.float32)
    kernel = _row_kernel(str(dtype).removeprefix("torch."), cols % 8 == 0, row_per_cta)
    ends = cuda_offsets(ENDS[case])
    with no_sync():
        kernel(x, q, s, ends)
    bound = _bound(ENDS[case])
    q_ref, s_ref = reference.quantize_fp8_2d(x)
    assert_same_bytes(q[:bound], q_ref[:bound], "q")
    assert_same_bytes(s[:bound], s_ref[:bound], "scales")
    _assert_poison_kept(q, bound, "q")
    _assert_poison_kept(s, bound, "scales")


def _fp8_rows(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random E4M3 bytes (NaNs included) and scales: powers of 2 mostly, some that round (0.1,
    3), 0, Inf, NaN and subnormal-making ones."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (rows, cols), generator=gen, dtype=U8).view(E4M3)
    exponents = torch.randint(-140, 127, (rows,), generator=gen).float()
    scales = torch.exp2(exponents)
    specials = torch.tensor([0.1, 3.0, 0.0, -0.0, float("inf"), float("nan"), 2.0**-149, -1.0])
    picks = torch.rand(rows, generator=gen) < 0.1
    scales[picks] = specials[torch.randint(0, len(specials), (int(picks.sum()),), generator=gen)]
    return q.cuda(), scales.cuda()


@pytest.mark.parametrize("cols", [7168, 48, 13])
@pytest.mark.parametrize("case", sorted(ENDS))
def test_dequant_kernel_writes_only_below_the_bound(case, cols):
    q, scales = _fp8_rows(ROWS, cols, cols)
    x = _poisoned((ROWS, cols), torch.bfloat16)
    offsets = cuda_offsets(ENDS[case])  # a host-to-device copy: outside the no-sync block
    with no_sync():
        _dequant_kernel(cols % 16 == 0)(q, scales, offsets, x)
    bound = _bound(ENDS[case])
    expected = reference.dequantize_fp8_rows(q, scales, cuda_offsets([bound]))
    assert_same_bytes(x[:bound], expected[:bound], "x")
    _assert_poison_kept(x, bound, "x")


SHAPES = [(0, 64), (5, 0), (1, 16), (257, 13), (300, 72), (1000, 5120), (16384, 7168)]


def _ends_for(rows: int) -> list[tuple]:
    return [(0,), (max(rows - 1, 0),), (rows,), (rows // 3, rows // 3, (2 * rows) // 3 + 1)]


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_public_ops_match_reference_below_the_bound(rows, cols, dtype, rounding, poison_cuda_allocator):
    x = _random_x((rows, cols), dtype, torch.Generator().manual_seed(rows + cols))
    for ends in _ends_for(rows):
        bound = min(ends[-1], rows)
        offsets = cuda_offsets([min(e, rows) for e in ends])
        poison_cuda_allocator()
        with no_sync():
            q, s = tb.quantize_fp8_2d(x, group_end_offsets=offsets, round_scales_to_power_of_2=rounding)
            out = tb.dequantize_fp8_rows(q, s, offsets)
        q_ref, s_ref = reference.quantize_fp8_2d(x, round_scales_to_power_of_2=rounding)
        assert q.shape == q_ref.shape and q.stride() == q_ref.stride() and s.shape == s_ref.shape
        assert out.shape == x.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
        assert_same_bytes(q[:bound], q_ref[:bound], f"q {ends}")
        assert_same_bytes(s[:bound], s_ref[:bound], "scales")  # K = 0: 1.0 (every row)
        want = reference.dequantize_fp8_rows(q_ref, s_ref, cuda_offsets([bound]))
        assert_same_bytes(out[:bound], want[:bound], f"x {ends}")
        if rounding and cols:  # power-of-2 scales: the old PyTorch expression, exactly
            assert_same_bytes(out[:bound], (q[:bound].float() * s[:bound, None]).bfloat16(), "x")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values(dtype):
    blocks = _special_blocks(dtype)
    picks = torch.randint(0, blocks.shape[0], (96 * 3,), generator=torch.Generator().manual_seed(3))
    x = blocks[picks].reshape(96, 3 * 32).cuda()
    ends = cuda_offsets([40, 40, 77])
    with no_sync():
        q, s = tb.quantize_fp8_2d(x, group_end_offsets=ends, backend="cute")
        out = tb.dequantize_fp8_rows(q, s, ends, backend="cute")
    q_ref, s_ref = reference.quantize_fp8_2d(x)
    assert_same_bytes(q[:77], q_ref[:77], "q")
    assert_same_bytes(s[:77], s_ref[:77], "scales")
    assert_same_bytes(out[:77], reference.dequantize_fp8_rows(q_ref, s_ref, ends)[:77], "x")


def test_tokens_dequantized_without_sync():
    q, s = tb.quantize_fp8_2d(_random_x((512, 256), torch.bfloat16, torch.Generator().manual_seed(8)))
    ends = cuda_offsets([16, 16, 208])
    tokens = QuantizedTokens("fp8_rowwise", q, s, ends, alignment=16)
    with no_sync():
        out = tokens.dequantized()
    assert_same_bytes(out[:208], (q[:208].float() * s[:208, None]).bfloat16(), "x")


def test_cuda_graph_reads_the_bound_at_replay():
    x = _random_x((512, 2048), torch.bfloat16, torch.Generator().manual_seed(6))
    ends = cuda_offsets([100, 300])
    tb.dequantize_fp8_rows(*tb.quantize_fp8_2d(x, group_end_offsets=ends), ends)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = tb.quantize_fp8_2d(x, group_end_offsets=ends)
        out = tb.dequantize_fp8_rows(q, s, ends)
    for seed, bound in ((10, 300), (11, 512), (12, 1), (13, 0)):
        x.copy_(_random_x((512, 2048), torch.bfloat16, torch.Generator().manual_seed(seed)))
        ends.copy_(cuda_offsets([min(bound, 64), bound]))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = reference.quantize_fp8_2d(x)
        assert_same_bytes(q[:bound], q_ref[:bound], "q")
        assert_same_bytes(s[:bound], s_ref[:bound], "scales")
        assert_same_bytes(out[:bound], (q_ref[:bound].float() * s_ref[:bound, None]).bfloat16(), "x")


def test_torch_compile_fullgraph():
    @torch.compile(fullgraph=True, dynamic=True)
    def round_trip(x, ends):
        q, s = tb.quantize_fp8_2d(x, group_end_offsets=ends)
        return q, s, tb.dequantize_fp8_rows(q, s, ends)

    gen = torch.Generator().manual_seed(7)
    for rows, bound in ((96, 50), (300, 300), (257, 0)):
        x = _random_x((rows, 256), torch.bfloat16, gen)
        q, s, out = round_trip(x, cuda_offsets([bound // 2, bound]))
        q_ref, s_ref = reference.quantize_fp8_2d(x)
        assert_same_bytes(q[:bound], q_ref[:bound], "q")
        assert_same_bytes(s[:bound], s_ref[:bound], "scales")
        assert_same_bytes(out[:bound], (q_ref[:bound].float() * s_ref[:bound, None]).bfloat16(), "x")


def test_no_recompiles_across_shapes_and_bounds():
    gen = torch.Generator().manual_seed(5)
    for cols in (2048, 1001, 7168):  # warm up: K classes 2048, 1024 (elements), 8192
        x = _random_x((4, cols), torch.bfloat16, gen)
        tb.dequantize_fp8_rows(*tb.quantize_fp8_2d(x, group_end_offsets=cuda_offsets([4])), cuda_offsets([4]))
    before = tb.compile_stats.compiles + tb.compile_stats.disk_loads
    for rows, cols, ends in [(999, 7168, [5, 900]), (4096, 2048, [0]), (100, 1001, [3] * 40), (9, 5120, [9])]:
        x = _random_x((rows, cols), torch.bfloat16, gen)
        offsets = cuda_offsets(ends)
        with no_sync():
            tb.dequantize_fp8_rows(*tb.quantize_fp8_2d(x, group_end_offsets=offsets), offsets)
    assert tb.compile_stats.compiles + tb.compile_stats.disk_loads == before
