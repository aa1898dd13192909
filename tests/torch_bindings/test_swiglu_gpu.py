"""SwiGLU + FP8 rowwise kernels on the GPU: every output byte equal to the reference's
(``torch_bindings.reference.swiglu_quantize_fp8`` / ``swiglu_backward_quantize_fp8``, run on the same
CUDA tensors) on random data of many shapes (odd M, M = 0 and 1, H not a multiple of 8 or of a
batch), every bf16 gate value, special values, poisoned output memory, both roundings, vector and
element variants; no host sync, no recompile across shapes, CUDA graphs, fullgraph torch.compile;
and the reference giving the same bytes on CPU and CUDA."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_same_bytes, no_sync

import torch_bindings
from torch_bindings import reference
from torch_bindings.device_constants import ConstantCache

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
# (M, H): M = 0 / 1 / odd; H odd, not a multiple of 8, a multiple of 8 but not of a batch (the
# forward's batch is 256 threads x 4 steps x 8 = 8192 columns, the backward's 4096), the MoE widths
SHAPES = [
    (0, 64),
    (1, 8),
    (1, 1),
    (3, 13),
    (5, 24),
    (7, 1000),
    (33, 1001),
    (64, 4104),
    (17, 8200),
    (256, 2048),
    (1000, 1536),
    (4097, 8192),
    (16384, 2048),
]


def _random(rows: int, cols: int, gen: torch.Generator, spread: float) -> torch.Tensor:
    """Normal bf16 data times ``spread`` with a per-row magnitude from 1e-20 to 1e20 in one row of
    eight (the rest O(spread): silu's interesting range)."""
    x = torch.randn(rows, cols, generator=gen) * spread
    wide = torch.rand(rows, 1, generator=gen) < 0.125
    magnitude = torch.pow(10.0, torch.empty(rows, 1).uniform_(-20, 20, generator=gen))
    return torch.where(wide, x * magnitude, x).to(BF16).cuda()


def _inputs(rows: int, half: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return _random(rows, 2 * half, gen, 4.0), _random(rows, half, gen, 1e-2)


def _check_forward(h13: torch.Tensor, rounding: bool = True) -> None:
    with no_sync():
        got = torch_bindings.swiglu_quantize_fp8(h13, round_scales_to_power_of_2=rounding, backend="cute")
    want = reference.swiglu_quantize_fp8(h13, round_scales_to_power_of_2=rounding)
    for name, a, b in zip(("h", "q", "scales"), got, want, strict=True):
        assert a.stride() == b.stride() or a.numel() == 0, name
        assert_same_bytes(a, b, name)


def _check_backward(grad_h: torch.Tensor, h13: torch.Tensor, rounding: bool = True) -> None:
    with no_sync():
        got = torch_bindings.swiglu_backward_quantize_fp8(
            grad_h, h13, round_scales_to_power_of_2=rounding, backend="cute"
        )
    want = reference.swiglu_backward_quantize_fp8(grad_h, h13, round_scales_to_power_of_2=rounding)
    for name, a, b in zip(("grad_h13", "q", "scales"), got, want, strict=True):
        assert a.stride() == b.stride() or a.numel() == 0, name
        assert_same_bytes(a, b, name)


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("rows,half", SHAPES)
def test_forward_matches_reference(rows, half, rounding, poison_cuda_allocator):
    h13, _ = _inputs(rows, half, rows * 7 + half)
    poison_cuda_allocator()
    _check_forward(h13, rounding)


@pytest.mark.parametrize("rounding", [True, False])
@pytest.mark.parametrize("rows,half", SHAPES)
def test_backward_matches_reference(rows, half, rounding, poison_cuda_allocator):
    h13, grad_h = _inputs(rows, half, rows * 11 + half)
    poison_cuda_allocator()
    _check_backward(grad_h, h13, rounding)


def _every_bf16() -> torch.Tensor:
    """The 65536 bf16 bit patterns (every NaN payload and sign included)."""
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(BF16)


@pytest.mark.parametrize("up", [1.0, -3.0, 2.0**100])
def test_every_bf16_gate_value(up):
    """silu of every bf16 g (the exp's whole range: clamps, subnormal results, NaN payloads), in
    rows of 128: vector (H = 128) and element (H = 127) steps."""
    gates = _every_bf16().view(512, 128).cuda()
    ups = torch.full_like(gates, up)
    _check_forward(torch.cat([gates, ups], 1))
    _check_forward(torch.cat([gates[:, :127], ups[:, :127]], 1))
    _check_backward(torch.full_like(gates, 0.5), torch.cat([gates, ups], 1))
    _check_backward(torch.full_like(gates[:, :127], -0.25), torch.cat([gates[:, :127], ups[:, :127]], 1))


def _special_values() -> torch.Tensor:
    inf, nan = math.inf, math.nan
    bf16_max = float(torch.finfo(BF16).max)
    values = [0.0, -0.0, inf, -inf, nan, -nan, bf16_max, -bf16_max, 2.0**-133, -(2.0**-133), 2.0**-126]
    values += [-112.0, -120.0, -108.5, -104.0, -88.0, -87.0, -20.0, -1.28125, 1.0, 17.0, 20.0, 112.0, 1e30]
    return torch.tensor(values)


@pytest.mark.parametrize("vector", [True, False])
def test_special_values(vector):
    pool = _special_values()
    gen = torch.Generator().manual_seed(3)
    half = 64 if vector else 61
    picks = torch.randint(0, pool.numel(), (3, 96, half), generator=gen)
    gate, up, grad = (pool[p].to(BF16).cuda() for p in picks)
    gate[:8] = pool[torch.arange(8 * half) % pool.numel()].view(8, half).to(BF16)  # every value
    up[8:16] = 1.0  # rows whose only specials are in the gate
    grad[16:24] = 1.0
    h13 = torch.cat([gate, up], 1)
    _check_forward(h13)
    _check_backward(grad, h13)
    _check_forward(h13, rounding=False)
    _check_backward(grad, h13, rounding=False)


def test_unaligned_inputs_take_the_element_variant():
    base, grad = _inputs(1, 64 * 80 + 1, 4)
    h13 = base[0, 1 : 1 + 64 * 80].view(64, 80)  # 2 bytes past a 16-byte boundary, H = 40
    _check_forward(h13)
    aligned, _ = _inputs(64, 40, 5)
    _check_backward(grad[0, 1 : 1 + 64 * 40].view(64, 40), aligned)


@pytest.mark.parametrize("half", [2048, 4096, 7168, 8192])
def test_each_h_class_matches_reference(half):
    """The config the bindings pick per H class (this device's tuned entry, else the heuristic)
    writes the reference's bytes, rows of a CTA and a warp apart."""
    h13, grad = _inputs(37, half, half)
    _check_forward(h13)
    _check_backward(grad, h13)
    ends = torch.tensor([20, 30], dtype=torch.int32, device="cuda")  # the bounded twins: rows < 30
    got = torch_bindings.swiglu_quantize_fp8(h13, group_end_offsets=ends)
    want = reference.swiglu_quantize_fp8(h13[:30])
    got_bwd = torch_bindings.swiglu_backward_quantize_fp8(grad, h13, group_end_offsets=ends)
    want_bwd = reference.swiglu_backward_quantize_fp8(grad[:30], h13[:30])
    for name, a, b in zip(("h", "q", "scales") * 2, (*got, *got_bwd), (*want, *want_bwd), strict=True):
        assert_same_bytes(a[:30], b, f"bounded {name}")


def test_no_recompiles_across_shapes():
    """One compile per variant and H class (its config): neither M nor H within a class recompiles
    (vector H and element H are two variants; the element variant takes one config for every H)."""
    for half in (8, 13, 1024, 2048, 7168):  # every H class of the loop below
        h13, grad = _inputs(4, half, 6)
        torch_bindings.swiglu_quantize_fp8(h13)
        torch_bindings.swiglu_backward_quantize_fp8(grad, h13)
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    for rows, half in [(1, 8), (999, 7168), (4096, 2048), (7, 5), (100, 1001), (3, 8192), (9, 1024)]:
        h13, grad = _inputs(rows, half, rows + half)
        _check_forward(h13)
        _check_backward(grad, h13)
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before


def test_cuda_graph_replay():
    h13, grad = _inputs(512, 2048, 7)
    torch_bindings.swiglu_quantize_fp8(h13)
    torch_bindings.swiglu_backward_quantize_fp8(grad, h13)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fwd = torch_bindings.swiglu_quantize_fp8(h13)
        bwd = torch_bindings.swiglu_backward_quantize_fp8(grad, h13)
    for seed in range(2):
        new_h13, new_grad = _inputs(512, 2048, 10 + seed)
        h13.copy_(new_h13)
        grad.copy_(new_grad)
        graph.replay()
        torch.cuda.synchronize()
        expected = (*reference.swiglu_quantize_fp8(h13), *reference.swiglu_backward_quantize_fp8(grad, h13))
        for got, want in zip((*fwd, *bwd), expected, strict=True):
            assert_same_bytes(got, want)


def test_torch_compile_fullgraph():
    @torch.compile(fullgraph=True, dynamic=True)
    def both(h13, grad):
        return torch_bindings.swiglu_quantize_fp8(h13), torch_bindings.swiglu_backward_quantize_fp8(grad, h13)

    for rows in (96, 300):
        h13, grad = _inputs(rows, 256, rows)
        (h, q, s), (g13, q2, s2) = both(h13, grad)
        expected = (*reference.swiglu_quantize_fp8(h13), *reference.swiglu_backward_quantize_fp8(grad, h13))
        for got, want in zip((h, q, s, g13, q2, s2), expected, strict=True):
            assert_same_bytes(got, want)


def test_reference_is_the_same_on_cpu_and_cuda():
    """The reference's bytes do not depend on the device (bf16 NaNs written as 0x7FC0): the kernels
    match it on CPU data too. Only a NaN scale's payload may differ (``1 / NaN`` on each device)."""
    h13, grad = _inputs(333, 200, 8)
    h13[0, :10] = float("nan")
    h13[1, 200:210] = float("inf")
    for cuda, cpu in (
        (reference.swiglu_quantize_fp8(h13), reference.swiglu_quantize_fp8(h13.cpu())),
        (
            reference.swiglu_backward_quantize_fp8(grad, h13),
            reference.swiglu_backward_quantize_fp8(grad.cpu(), h13.cpu()),
        ),
    ):
        assert_same_bytes(cuda[0].cpu(), cpu[0], "bf16 outputs")
        assert_same_bytes(cuda[1].cpu(), cpu[1], "q")
        finite = ~torch.isnan(cpu[2])
        assert_same_bytes(cuda[2].cpu()[finite], cpu[2][finite], "scales")
        assert torch.isnan(cuda[2].cpu()[~finite]).all() and (~finite).any()


def test_wrong_inputs_raise_before_a_launch():
    h13 = torch.zeros(4, 16, dtype=BF16, device="cuda")
    torch_bindings.swiglu_quantize_fp8(h13)  # the fast path is live
    with pytest.raises(TypeError, match="swiglu_quantize_fp8: h13 must be"):
        torch_bindings.swiglu_quantize_fp8(h13.float())
    with pytest.raises(ValueError, match="h13's last dim must be even"):
        torch_bindings.swiglu_quantize_fp8(torch.zeros(4, 15, dtype=BF16, device="cuda"))
    with pytest.raises(ValueError, match="h13 must be contiguous"):
        torch_bindings.swiglu_quantize_fp8(h13[:, :8])
    with pytest.raises(ValueError, match="grad_h and h13 must be on one device"):
        torch_bindings.swiglu_backward_quantize_fp8(torch.zeros(4, 8, dtype=BF16), h13)
    with pytest.raises(ValueError, match="grad_h must have the shape"):
        torch_bindings.swiglu_backward_quantize_fp8(h13, h13)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("vector", [True, False])
def test_other_launch_shapes(direction, vector):
    """Configs no default takes (a warp per row; one step per batch), called through the compiled
    kernel directly, bytes equal to the reference."""
    from cute_kernels import registry
    from cute_kernels.swiglu import SwigluConfig, SwigluVariant
    from torch_bindings.backend import kernel_arch

    arch, _ = kernel_arch(torch.device("cuda"))
    rows, half = 37, 1032 if vector else 1031
    h13, grad = _inputs(rows, half, 12)
    out_cols = 2 * half if direction == "bwd" else half
    want = (
        reference.swiglu_backward_quantize_fp8(grad, h13)
        if direction == "bwd"
        else reference.swiglu_quantize_fp8(h13)
    )
    for config in (
        SwigluConfig(threads=128, unroll=2, ctas_per_sm=4, row_per_cta=False),
        SwigluConfig(threads=64, unroll=1, ctas_per_sm=4, row_per_cta=True),
    ):
        kernel = registry.entry("swiglu_fp8").compile(
            SwigluVariant(direction, True, vector), arch, config=config
        )
        out = torch.full((rows, out_cols), 7.0, dtype=BF16, device="cuda")
        q = torch.full((rows, out_cols), 0x55, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        scales = torch.full((rows,), -1.0, device="cuda")
        table = torch_bindings.swiglu.silu_table(h13.device)
        kernel(h13, out, q, scales, grad if direction == "bwd" else None, table, 2)
        for name, a, b in zip(("out", "q", "scales"), (out, q, scales), want, strict=True):
            assert_same_bytes(a, b, f"{config}: {name}")


def test_silu_table_built_on_the_device_is_the_cpu_one():
    """The kernels' table, built on the GPU by the reference's fp32 ops, holds the bits the CPU
    computes (the kernels' bytes rest on it)."""
    got = torch_bindings.swiglu.silu_table(torch.device("cuda", torch.cuda.current_device()))
    assert_same_bytes(got, reference.silu_table())


def test_first_call_inside_a_cuda_graph_capture(monkeypatch):
    """A table first needed inside a capture is built into the graph (with a warning) and kept
    alive, not cached: the replays write the reference's bytes, and a later eager call builds and
    caches its own. A table built just before a capture, its event never queried, is used as built
    inside the next one (no rebuild in the graph)."""
    from torch_bindings import swiglu

    h13, grad = _inputs(300, 1024, 9)
    torch_bindings.swiglu_quantize_fp8(h13)  # the kernels compile outside the capture
    torch_bindings.swiglu_backward_quantize_fp8(grad, h13)
    monkeypatch.setattr(swiglu, "_tables", ConstantCache())
    monkeypatch.setattr(swiglu, "_captured_tables", [])
    graph = torch.cuda.CUDAGraph()
    with pytest.warns(UserWarning, match="inside a CUDA graph capture"), torch.cuda.graph(graph):
        fwd = torch_bindings.swiglu_quantize_fp8(h13)
        bwd = torch_bindings.swiglu_backward_quantize_fp8(grad, h13)
    assert not swiglu._tables and len(swiglu._captured_tables) == 2
    graph.replay()
    torch.cuda.synchronize()
    expected = (*reference.swiglu_quantize_fp8(h13), *reference.swiglu_backward_quantize_fp8(grad, h13))
    for got, want in zip((*fwd, *bwd), expected, strict=True):
        assert_same_bytes(got, want)
    _check_forward(h13)
    assert len(swiglu._tables) == 1
    monkeypatch.setattr(swiglu, "_tables", ConstantCache())
    torch_bindings.swiglu_quantize_fp8(h13)  # built eagerly, its event not queried yet
    assert swiglu._tables.pending(h13.device)
    second = torch.cuda.CUDAGraph()
    with torch.cuda.graph(second):
        again = torch_bindings.swiglu_quantize_fp8(h13)
    assert len(swiglu._captured_tables) == 2 and not swiglu._tables.pending(h13.device)
    second.replay()
    torch.cuda.synchronize()
    for got, want in zip(again, reference.swiglu_quantize_fp8(h13), strict=True):
        assert_same_bytes(got, want)


def test_a_call_on_another_stream_waits_for_the_tables_build(monkeypatch, poison_cuda_allocator):
    """The table is built on the stream of the first call; a call on another stream while that
    build is still queued (behind a sleep) waits for it on the device and writes the reference's
    bytes (unbuilt, the table would hold fresh or poisoned memory)."""
    from torch_bindings import swiglu

    h13, _ = _inputs(64, 1024, 10)
    torch_bindings.swiglu_quantize_fp8(h13)  # compiled outside the race
    monkeypatch.setattr(swiglu, "_tables", ConstantCache())
    poison_cuda_allocator()
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    for stream in (first, second):
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(first):
        torch.cuda._sleep(200_000_000)  # the build below waits behind this for a while
        torch_bindings.swiglu_quantize_fp8(h13)
    with torch.cuda.stream(second):
        got = torch_bindings.swiglu_quantize_fp8(h13)
    torch.cuda.synchronize()
    for a, b in zip(got, reference.swiglu_quantize_fp8(h13), strict=True):
        assert_same_bytes(a, b)
    torch_bindings.swiglu_quantize_fp8(h13)
    assert not swiglu._tables.pending(h13.device)  # the build is done: no more event queries


def test_two_results_held_alive_are_both_the_references():
    """Two calls per direction on different inputs share the cached table; all four results, held
    at once, are read afterwards and match the reference."""
    (h13_a, grad_a), (h13_b, grad_b) = _inputs(300, 1024, 21), _inputs(300, 1024, 22)
    fwd_a, fwd_b = torch_bindings.swiglu_quantize_fp8(h13_a), torch_bindings.swiglu_quantize_fp8(h13_b)
    bwd_a = torch_bindings.swiglu_backward_quantize_fp8(grad_a, h13_a)
    bwd_b = torch_bindings.swiglu_backward_quantize_fp8(grad_b, h13_b)
    for got, want in (
        (fwd_a, reference.swiglu_quantize_fp8(h13_a)),
        (fwd_b, reference.swiglu_quantize_fp8(h13_b)),
        (bwd_a, reference.swiglu_backward_quantize_fp8(grad_a, h13_a)),
        (bwd_b, reference.swiglu_backward_quantize_fp8(grad_b, h13_b)),
    ):
        for a, b in zip(got, want, strict=True):
            assert_same_bytes(a, b)
