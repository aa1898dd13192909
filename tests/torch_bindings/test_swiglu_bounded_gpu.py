"""The SwiGLU + FP8 rowwise ops bounded by the last group end on the GPU (``group_end_offsets``;
the kernel's bounded variants, notes/swiglu-fp8-kernel.md): bytes equal to the reference on the
rows below ``clamp(ends[-1], 0, M)``, the bytes past it untouched (outputs poisoned first), for
bounds 0, 1, M and mid-CTA, empty groups, G = 1 and G = 2048, garbage ends (clamped), both
directions, vector and element steps, both config kinds (a CTA per row, a warp per row); no host
sync, CUDA graphs (the bound read at replay), fullgraph torch.compile, no recompiles across M, H
and the ends."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import assert_same_bytes, cuda_offsets, no_sync
from test_swiglu_gpu import _inputs, _special_values

import torch_bindings as tb
from torch_bindings import reference

pytestmark = pytest.mark.gpu

BF16, E4M3, U8 = torch.bfloat16, torch.float8_e4m3fn, torch.uint8
POISON = 0xA5
ROWS = 300
#: End offsets over ROWS rows (garbage ones included: the kernels clamp the last end to [0, M]).
#: 203 is inside a CTA of the warp-per-row config (4 rows per CTA) and past a whole warp's rows.
ENDS = {
    "bound 0": (0,),
    "bound 0, G = 3": (0, 0, 0),
    "bound 1": (1,),
    "bound M": (ROWS,),
    "mid CTA": (64, 64, 203),
    "empty groups": (0, 10, 10, 10, 131, 131),
    "G = 2048": tuple(e // 8 for e in range(2048)),  # bound 255
    "garbage: past M": (5, 1 << 30),
    "garbage: negative": (200, -7),
    "garbage: decreasing": (250, 17),
}
NAMES = {"fwd": ("h", "q", "scales"), "bwd": ("grad_h13", "q", "scales")}


def _bound(ends: tuple, rows: int = ROWS) -> int:
    return min(max(ends[-1], 0), rows)


def _poisoned(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A fresh tensor of ``shape`` and ``dtype`` whose every byte is POISON."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return torch.full((*shape[:-1], shape[-1] * itemsize), POISON, dtype=U8, device="cuda").view(dtype)


def _assert_poison_kept(t: torch.Tensor, bound: int, what: str) -> None:
    past = t[bound:].contiguous().view(U8)
    assert bool((past == POISON).all()), f"{what}: bytes past row {bound} were written"


def _arch() -> str:
    from torch_bindings.backend import kernel_arch

    return kernel_arch(torch.device("cuda"))[0]


@functools.cache
def _kernel(direction: str, vector: bool, warp_per_row: bool):
    """The bounded kernel under the default config (a CTA per row) or a warp per row (4 rows per
    CTA), compiled here so that both config kinds run."""
    from cute_kernels import registry
    from cute_kernels.swiglu import SwigluConfig, SwigluVariant

    config = SwigluConfig(threads=128, unroll=2, ctas_per_sm=4, row_per_cta=False) if warp_per_row else None
    variant = SwigluVariant(direction, True, vector, bounded=True)
    return registry.entry("swiglu_fp8").compile(variant, _arch(), config=config)


def _reference(direction: str, h13: torch.Tensor, grad: torch.Tensor, rounding: bool = True) -> tuple:
    if direction == "bwd":
        return reference.swiglu_backward_quantize_fp8(grad, h13, round_scales_to_power_of_2=rounding)
    return reference.swiglu_quantize_fp8(h13, round_scales_to_power_of_2=rounding)


@pytest.mark.parametrize("warp_per_row", [False, True])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("half", [1032, 1031, 8])
@pytest.mark.parametrize("case", sorted(ENDS))
def test_kernel_writes_only_below_the_bound(case, half, direction, warp_per_row):
    h13, grad = _inputs(ROWS, half, half)
    out_cols = 2 * half if direction == "bwd" else half
    outs = (
        _poisoned((ROWS, out_cols), BF16),
        _poisoned((ROWS, out_cols), E4M3),
        _poisoned((ROWS,), torch.float32),
    )
    kernel = _kernel(direction, half % 8 == 0, warp_per_row)
    offsets = cuda_offsets(ENDS[case])  # a host-to-device copy: outside the no-sync block
    table = tb.swiglu.silu_table(h13.device)
    with no_sync():  # 3 SMs' worth of CTAs: each walks several row blocks up to the bound
        kernel(h13, *outs, grad if direction == "bwd" else None, offsets, table, 3)
    bound = _bound(ENDS[case])
    for name, got, want in zip(NAMES[direction], outs, _reference(direction, h13, grad), strict=True):
        assert_same_bytes(got[:bound], want[:bound], name)
        _assert_poison_kept(got, bound, name)


SHAPES = [(0, 64), (5, 0), (1, 8), (257, 13), (300, 1032), (1000, 2048), (4097, 8192)]


def _ends_for(rows: int) -> list[tuple]:
    """Bounds 0, M - 1, M and one inside the last third, over one to three groups."""
    return [(0,), (max(rows - 1, 0),), (rows,), (rows // 3, rows // 3, (2 * rows) // 3 + 1)]


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("rows,half", SHAPES)
def test_public_ops_match_reference_below_the_bound(rows, half, rounding, poison_cuda_allocator):
    h13, grad = _inputs(rows, half, rows + half)
    want = {d: _reference(d, h13, grad, rounding) for d in ("fwd", "bwd")}
    for ends in _ends_for(rows):
        bound = min(ends[-1], rows)
        offsets = cuda_offsets([min(e, rows) for e in ends])
        poison_cuda_allocator()
        with no_sync():
            got = {
                "fwd": tb.swiglu_quantize_fp8(
                    h13, group_end_offsets=offsets, round_scales_to_power_of_2=rounding, backend="cute"
                ),
                "bwd": tb.swiglu_backward_quantize_fp8(
                    grad, h13, group_end_offsets=offsets, round_scales_to_power_of_2=rounding, backend="cute"
                ),
            }
        for d in ("fwd", "bwd"):
            bounded = reference.swiglu_quantize_fp8 if d == "fwd" else reference.swiglu_backward_quantize_fp8
            args = (h13,) if d == "fwd" else (grad, h13)
            ref_bounded = bounded(*args, group_end_offsets=offsets, round_scales_to_power_of_2=rounding)
            for name, a, b, c in zip(NAMES[d], got[d], want[d], ref_bounded, strict=True):
                assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride()), name
                assert_same_bytes(a[:bound], b[:bound], f"{d} {name} {ends}")
                assert_same_bytes(a[:bound], c[:bound], f"{d} {name} {ends} (bounded reference)")
            if not half:
                assert bool((got[d][2] == 1.0).all())  # rows of no columns: every scale 1.0


def test_special_values_below_the_bound():
    pool = _special_values()
    gen = torch.Generator().manual_seed(3)
    picks = torch.randint(0, pool.numel(), (3, 96, 64), generator=gen)
    gate, up, grad = (pool[p].to(BF16).cuda() for p in picks)
    h13 = torch.cat([gate, up], 1)
    ends = cuda_offsets([40, 40, 77])
    with no_sync():
        fwd = tb.swiglu_quantize_fp8(h13, group_end_offsets=ends, backend="cute")
        bwd = tb.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=ends, backend="cute")
    for d, got in (("fwd", fwd), ("bwd", bwd)):
        for name, a, b in zip(NAMES[d], got, _reference(d, h13, grad), strict=True):
            assert_same_bytes(a[:77], b[:77], f"{d} {name}")


def test_cuda_graph_reads_the_bound_at_replay():
    h13, grad = _inputs(512, 2048, 7)
    ends = cuda_offsets([100, 300])
    tb.swiglu_quantize_fp8(h13, group_end_offsets=ends)
    tb.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=ends)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fwd = tb.swiglu_quantize_fp8(h13, group_end_offsets=ends)
        bwd = tb.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=ends)
    for seed, bound in ((10, 300), (11, 512), (12, 1), (13, 0), (14, 257)):
        new_h13, new_grad = _inputs(512, 2048, seed)
        h13.copy_(new_h13)
        grad.copy_(new_grad)
        ends.copy_(cuda_offsets([min(bound, 64), bound]))
        graph.replay()
        torch.cuda.synchronize()
        for d, got in (("fwd", fwd), ("bwd", bwd)):
            for name, a, b in zip(NAMES[d], got, _reference(d, h13, grad), strict=True):
                assert_same_bytes(a[:bound], b[:bound], f"{d} {name} bound {bound}")


def test_torch_compile_fullgraph():
    @torch.compile(fullgraph=True, dynamic=True)
    def both(h13, grad, ends):
        return (
            tb.swiglu_quantize_fp8(h13, group_end_offsets=ends),
            tb.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=ends),
        )

    for rows, bound in ((96, 50), (300, 300), (257, 0)):
        h13, grad = _inputs(rows, 256, rows)
        fwd, bwd = both(h13, grad, cuda_offsets([bound // 2, bound]))
        for d, got in (("fwd", fwd), ("bwd", bwd)):
            for name, a, b in zip(NAMES[d], got, _reference(d, h13, grad), strict=True):
                assert a.shape == b.shape and a.dtype == b.dtype, name
                assert_same_bytes(a[:bound], b[:bound], f"{d} {name} rows {rows}")


def test_no_recompiles_across_shapes_and_bounds():
    # warm up: the vector and the element variants, both directions, every H class used below
    # (a class picks its own config: 2048 and 7168 may have tuned ones; 8 and 1024 the heuristic)
    for half in (8, 13, 1024, 2048, 7168):
        h13, grad = _inputs(4, half, 6)
        tb.swiglu_quantize_fp8(h13, group_end_offsets=cuda_offsets([4]))
        tb.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=cuda_offsets([4]))
    before = tb.compile_stats.compiles + tb.compile_stats.disk_loads
    for rows, half, ends in [(999, 7168, [5, 900]), (4096, 2048, [0]), (100, 1001, [3] * 40), (9, 1024, [9])]:
        h13, grad = _inputs(rows, half, rows + half)
        offsets = cuda_offsets(ends)
        with no_sync():
            tb.swiglu_quantize_fp8(h13, group_end_offsets=offsets)
            tb.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=offsets)
    assert tb.compile_stats.compiles + tb.compile_stats.disk_loads == before


def test_wrong_offsets_raise_with_the_fast_path_live():
    h13, grad = _inputs(4, 8, 9)
    ends = cuda_offsets([4])
    tb.swiglu_quantize_fp8(h13, group_end_offsets=ends)  # the fast path is live
    tb.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=ends)
    with pytest.raises(TypeError, match="swiglu_quantize_fp8: group_end_offsets must be a 1-D torch.int32"):
        tb.swiglu_quantize_fp8(h13, group_end_offsets=ends.long())
    with pytest.raises(ValueError, match="swiglu_quantize_fp8: group_end_offsets must be on the same device"):
        tb.swiglu_quantize_fp8(h13, group_end_offsets=ends.cpu())
    with pytest.raises(ValueError, match="swiglu_backward_quantize_fp8: group_end_offsets must hold"):
        tb.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=ends[:0])
    with pytest.raises(ValueError, match="swiglu_backward_quantize_fp8: group_end_offsets must be a 1-D"):
        tb.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=ends.view(1, 1))
