"""quantize_mxfp8_2d (1x32) kernel on the GPU: bit-exact to the reference, no sync, graphs, compile."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_same_bytes, cuda_offsets, no_sync, random_group_ends

import torch_bindings
from torch_bindings import reference

pytestmark = pytest.mark.gpu

MODES = ("floor", "rceil")


def _random_x(shape, dtype, gen: torch.Generator) -> torch.Tensor:
    """Normal data with a per-row magnitude from 1e-30 to 1e30 (fp32 rows reach subnormals too)."""
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    exponents = torch.empty(shape[0], 1).uniform_(-30, 30, generator=gen)
    x = x * torch.pow(10.0, exponents)
    return x.to(dtype).cuda()


def _check(x: torch.Tensor, **kwargs) -> None:
    with no_sync():
        q, s = torch_bindings.quantize_mxfp8_2d(x, backend="cute", **kwargs)
    q_ref, s_ref = reference.quantize_mxfp8_2d(x, **kwargs)
    assert_same_bytes(q, q_ref, "q")
    assert_same_bytes(s, s_ref, "scales")


BF16_SHAPES = [(1, 32), (127, 96), (128, 7168), (384, 1408), (8192, 2048), (16640, 5120), (131072, 7168)]
FP32_SHAPES = [(1, 32), (127, 96), (128, 7168), (384, 1408), (1000, 4096)]


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "dtype,shape",
    [(torch.bfloat16, s) for s in BF16_SHAPES] + [(torch.float32, s) for s in FP32_SHAPES],
)
def test_ungrouped(dtype, shape, mode, blocked, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    x = _random_x(shape, dtype, gen)
    poison_cuda_allocator()
    _check(x, scaling_mode=mode, blocked_scales=blocked)


def _special_blocks(dtype: torch.dtype) -> torch.Tensor:
    """One 32-element row per SPEC case (and then some), fp32 values exactly representable in dtype."""
    inf, nan = math.inf, math.nan
    tiny = 2.0**-133 if dtype == torch.bfloat16 else 2.0**-149  # subnormal in dtype
    bf16_max = float(torch.finfo(torch.bfloat16).max)
    rows = [
        [0.0] * 32,
        [-0.0] * 32,
        [2.0**-126] * 32,
        [1.0] * 31 + [inf],
        [1.0] * 31 + [-inf],
        [1.0] * 31 + [nan],
        [448.0] + [1.0] * 31,
        [bf16_max] + [1.0] * 31,
        [-bf16_max] + [3.0] * 31,
        [480.0] + [-1.0] * 31,
        [tiny] * 32,
        [tiny, -tiny] * 16,
        [2.0**-127] * 32,
        [float(2**k) for k in range(-16, 16)],
        [(-1.0) ** k * (1 + k / 64) * 2.0**100 for k in range(32)],
        [1e-30 * (k + 1) for k in range(32)],
        [464.0, 0.5] * 16,  # 464 rounds up past 448: saturates
    ]
    x = torch.tensor(rows, dtype=torch.float32)
    x[5, 3] = -nan  # a negative NaN too
    return x.to(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values(dtype, mode):
    blocks = _special_blocks(dtype)
    _check(blocks.cuda(), scaling_mode=mode)
    # Every special block at random positions of 128-column tiles and of a ragged tail tile.
    gen = torch.Generator().manual_seed(1)
    picks = torch.randint(0, blocks.shape[0], (41 * 5,), generator=gen)
    x = blocks[picks].reshape(41, 5 * 32).cuda()
    _check(x, scaling_mode=mode)
    _check(x, scaling_mode=mode, blocked_scales=False)


@pytest.mark.parametrize(
    "rows,cols,num_groups",
    [
        (1, 32, 1),
        (700, 96, 4),
        (5000, 1376, 8),
        (4096, 2048, 64),
        (20000, 512, 256),
        (70000, 160, 1024),
        (0, 64, 3),
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_m_groups(rows, cols, num_groups, mode, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(rows * 31 + num_groups)
    x = _random_x((rows, cols), torch.bfloat16, gen)
    ends = cuda_offsets(random_group_ends(rows, num_groups, gen))
    poison_cuda_allocator()
    _check(x, group_end_offsets=ends, scaling_mode=mode)


def test_m_groups_fp32_and_full_coverage():
    gen = torch.Generator().manual_seed(4)
    x = _random_x((3000, 288), torch.float32, gen)
    for ends in ([3000], [1, 45, 172, 301, 3000], [0, 0, 2999], [128, 256, 2048]):
        _check(x, group_end_offsets=cuda_offsets(ends))


def test_garbage_offsets_stay_in_bounds():
    """Offsets the kernel cannot validate (decreasing, negative, past the end) must not fault."""
    gen = torch.Generator().manual_seed(3)
    x = _random_x((300, 256), torch.bfloat16, gen)
    ends = cuda_offsets([5000, -7, 120, 3, 1 << 30])
    q, s = torch_bindings.quantize_mxfp8_2d(x, group_end_offsets=ends, backend="cute")
    torch.cuda.synchronize()
    assert q.shape == x.shape and s.dtype == torch.float8_e8m0fnu


def test_cuda_graph_replay():
    gen = torch.Generator().manual_seed(11)
    x = _random_x((3000, 1024), torch.bfloat16, gen)
    ends = cuda_offsets(random_group_ends(3000, 8, gen))
    torch_bindings.quantize_mxfp8_2d(x, group_end_offsets=ends)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = torch_bindings.quantize_mxfp8_2d(x, group_end_offsets=ends)
    for seed in range(3):
        gen.manual_seed(100 + seed)
        x.copy_(_random_x((3000, 1024), torch.bfloat16, gen))
        ends.copy_(cuda_offsets(random_group_ends(3000, 8, gen)))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = reference.quantize_mxfp8_2d(x, group_end_offsets=ends)
        assert_same_bytes(q, q_ref, "q")
        assert_same_bytes(s, s_ref, "scales")


def test_torch_compile_fullgraph():
    gen = torch.Generator().manual_seed(5)

    @torch.compile(fullgraph=True, dynamic=True)
    def quantize_both(x, ends):
        grouped = torch_bindings.quantize_mxfp8_2d(x, group_end_offsets=ends)
        plain = torch_bindings.quantize_mxfp8_2d(x, scaling_mode="floor", blocked_scales=False)
        return grouped, plain

    for rows in (1000, 2500):
        x = _random_x((rows, 256), torch.bfloat16, gen)
        ends = cuda_offsets(random_group_ends(rows, 4, gen))
        (q, s), (qp, sp) = quantize_both(x, ends)
        q_ref, s_ref = reference.quantize_mxfp8_2d(x, group_end_offsets=ends)
        assert_same_bytes(q, q_ref, "q")
        assert_same_bytes(s, s_ref, "scales")
        qp_ref, sp_ref = reference.quantize_mxfp8_2d(x, scaling_mode="floor", blocked_scales=False)
        assert_same_bytes(qp, qp_ref, "q plain")
        assert_same_bytes(sp, sp_ref, "scales plain")


def test_no_recompiles_across_sizes_and_offsets():
    gen = torch.Generator().manual_seed(9)
    warm = _random_x((100, 64), torch.bfloat16, gen)
    torch_bindings.quantize_mxfp8_2d(warm, group_end_offsets=cuda_offsets([50, 100]))
    torch_bindings.quantize_mxfp8_2d(warm)
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    for rows, cols, num_groups in [
        (17, 32, 1),
        (999, 96, 3),
        (4096, 1408, 17),
        (130, 7168, 64),
        (70001, 64, 5),
    ]:
        x = _random_x((rows, cols), torch.bfloat16, gen)
        torch_bindings.quantize_mxfp8_2d(
            x, group_end_offsets=cuda_offsets(random_group_ends(rows, num_groups, gen))
        )
        torch_bindings.quantize_mxfp8_2d(x)
    after = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    assert after == before


def test_misaligned_input_is_refused():
    x = torch.zeros(4 * 64 + 4, dtype=torch.bfloat16, device="cuda")[4:].view(4, 64)  # 8 bytes off
    with pytest.raises(ValueError, match="16-byte aligned"):
        torch_bindings.quantize_mxfp8_2d(x, backend="cute")
