"""Each kernel that states its shared memory as one ``@cute.struct`` reports that struct's size as
``shared_bytes`` (what the bytes-in-flight model counts), for every variant and every config of its
tuner's spaces, and the size is non-zero where the kernel takes shared memory (no compile)."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

from cute_kernels.configs.spaces import spaces  # noqa: E402


def _configs(kernel: str) -> list:
    return [config for space in spaces(kernel).values() for config in space]


def test_quantize_32x1_k_groups_struct():
    from cute_kernels.quantize_32x1 import Quantize32x1Kernel, ScaleLayout, shared_storage
    from cute_utils.groups import prefix_smem_words

    for config in _configs("quantize_32x1"):
        for variant in Quantize32x1Kernel.variants():
            got = Quantize32x1Kernel.shared_bytes(variant, config)
            if variant.layout is ScaleLayout.K_GROUPS:
                assert got == shared_storage(variant.layout, config).size_in_bytes()
                words = 2 * prefix_smem_words(config.max_groups) + 4  # prefix, ends, warp_totals
                assert got >= 4 * words
            else:  # no group scan: no shared memory
                assert shared_storage(variant.layout, config) is None and got == 0


def test_quantize_tma_struct():
    from cute_kernels.experimental.quantize_tma import QuantizeTmaKernel, shared_storage
    from cute_kernels.quantize import DTYPES
    from cute_utils.mx_rows import TILE_K, WARPS

    for config in _configs("quantize_tma"):
        for variant in QuantizeTmaKernel.variants():
            got = QuantizeTmaKernel.shared_bytes(variant, config)
            assert got == shared_storage(DTYPES[variant.dtype], config).size_in_bytes() > 0
            element = DTYPES[variant.dtype].width // 8
            slots = WARPS * TILE_K * config.box_rows * (config.stages * element + config.store_stages)
            barriers = 8 * WARPS * config.stages
            assert slots + barriers <= got < slots + barriers + 2 * 128  # the two 128-byte alignments


def test_quantize_1x32_struct():
    from cute_kernels.quantize import Quantize1x32Kernel, shared_storage

    for config in _configs("quantize_1x32"):
        for variant in Quantize1x32Kernel.variants():
            got = Quantize1x32Kernel.shared_bytes(variant, config)
            assert got == shared_storage(variant.dtype, variant.layout, config).size_in_bytes() > 0


def test_quantize_dual_struct():
    """The dual's rings and staging tiles (grouped, the scan shares the staging bytes)."""
    from cute_kernels.quantize import DTYPES
    from cute_kernels.quantize_dual import (
        LANE_COLS,
        LANE_ROWS,
        QuantizeDualKernel,
        ScaleLayout,
        shared_storage,
    )

    for config in _configs("quantize_dual"):
        for variant in QuantizeDualKernel.variants():
            got = QuantizeDualKernel.shared_bytes(variant, config)
            assert got == shared_storage(variant, config).size_in_bytes()
            ring = 8 * config.stages * 32 * LANE_ROWS * LANE_COLS * (DTYPES[variant.dtype].width // 8)
            staging = 2 * 128 * 128 + (0 if variant.layout is ScaleLayout.PLAIN else 2 * 512)
            assert got == ring + staging  # both multiples of 128 bytes; the grouped scan fits the staging
