"""The TMA-load 1x32 quantization kernel (``cute_kernels.experimental.quantize_tma``) on the GPU:
bit-exact to the reference for plain and blocked scales, both modes, bf16 and fp32, ragged M and K,
several configs."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_bytes
from test_quantize_gpu import _random_x, _special_blocks

from cute_utils.blocked import ceil_div
from torch_bindings import reference

pytestmark = pytest.mark.gpu

MODES = ("floor", "rceil")
BF16_SHAPES = [(1, 32), (127, 96), (128, 7168), (384, 1408), (8192, 2048), (16640, 5120)]
FP32_SHAPES = [(1, 32), (127, 96), (128, 7168), (384, 1408), (1000, 4096)]

_KERNELS: dict = {}


def _kernel(dtype: torch.dtype, mode: str, blocked: bool, config=None):
    """Compiled TMA kernel for the current GPU (cached per variant and config)."""
    from cute_kernels import registry
    from cute_kernels.experimental.quantize_tma import TmaVariant
    from cute_kernels.quantize import ScaleLayout
    from torch_bindings.backend import kernel_arch

    key = (dtype, mode, blocked, config)
    if key not in _KERNELS:
        arch, reason = kernel_arch(torch.device("cuda"))
        assert arch is not None, reason
        layout = ScaleLayout.BLOCKED if blocked else ScaleLayout.PLAIN
        variant = TmaVariant(str(dtype).removeprefix("torch."), mode, layout)
        _KERNELS[key] = registry.entry("quantize_tma").compile(variant, arch, config=config)
    return _KERNELS[key]


def _outputs(x: torch.Tensor, blocked: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=x.device)
    shape = (ceil_div(rows, 128) * 128, ceil_div(cols, 128) * 4) if blocked else (rows, cols // 32)
    return q, torch.empty(shape, dtype=torch.float8_e8m0fnu, device=x.device)


def _check(x: torch.Tensor, mode: str, blocked: bool, poison, config=None) -> None:
    kernel = _kernel(x.dtype, mode, blocked, config)
    poison()
    q, s = _outputs(x, blocked)
    kernel(x, q, s)
    q_ref, s_ref = reference.quantize_mxfp8_2d(x, scaling_mode=mode, blocked_scales=blocked)
    assert_same_bytes(q, q_ref, "q")
    assert_same_bytes(s, s_ref, "scales")


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "dtype,shape",
    [(torch.bfloat16, s) for s in BF16_SHAPES] + [(torch.float32, s) for s in FP32_SHAPES],
)
def test_bit_exact(dtype, shape, mode, blocked, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    _check(_random_x(shape, dtype, gen), mode, blocked, poison_cuda_allocator)


def _special_rows(dtype: torch.dtype) -> torch.Tensor:
    """SPEC section 2's cases, one per 32-element row, tiled to 160 rows x 224 columns (ragged in
    both directions)."""
    rows = _special_blocks(dtype)
    return rows.repeat(ceil_div(160, rows.shape[0]), 7)[:160].contiguous().cuda()


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values(dtype, mode, blocked, poison_cuda_allocator):
    _check(_special_rows(dtype), mode, blocked, poison_cuda_allocator)


def _configs():
    from cute_kernels.experimental.quantize_tma import TmaQuantizeConfig

    return [
        TmaQuantizeConfig(box_rows=8, stages=4, store_stages=0),  # 8-byte STG of q instead of TMA stores
        TmaQuantizeConfig(box_rows=2, stages=3, warp_tiles=1, store_stages=0),
        TmaQuantizeConfig(box_rows=32, stages=2, warp_tiles=2, store_stages=3),
        TmaQuantizeConfig(box_rows=16, stages=5, warp_tiles=4, target_ctas=64, store_stages=1),
    ]


@pytest.mark.parametrize("config_index", range(4))
@pytest.mark.parametrize(
    "dtype,shape",
    [
        (torch.bfloat16, (1, 32)),
        (torch.bfloat16, (127, 96)),
        (torch.bfloat16, (1000, 1440)),
        (torch.float32, (300, 4160)),
    ],
)
def test_configs(dtype, shape, config_index, poison_cuda_allocator):
    """Other box sizes, ring depths, q store paths and decompositions (``target_ctas=64``: long
    per-CTA loops, many ring wraps), on ragged shapes."""
    gen = torch.Generator().manual_seed(config_index)
    config = _configs()[config_index]
    for mode, blocked in (("rceil", True), ("floor", False)):
        _check(_random_x(shape, dtype, gen), mode, blocked, poison_cuda_allocator, config)
