"""The 32x1 quantization kernel compiles for sm_90a and sm_100a on a CPU-only machine, with
the SASS we expect: no local memory, a bounded register count, coalesced column-pair loads,
128-bit E4M3 stores of whole sectors (lane-pair shuffles), saturating E4M3 conversions, and no
Blackwell-only E8M0 conversion (integer bit math: both archs compute the same bits)."""

from __future__ import annotations

import pytest
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

TARGETS = kernel_targets("quantize_32x1")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    kernel, text = spill_free_kernel(compiled, target)
    assert kernel.registers <= 128, text
    width = 64 if "float32" in target else 32  # one column pair per row: 2 elements per load
    assert kernel.global_loads(width) >= 32, text
    assert kernel.global_stores(128) >= 4, "32x1 blocks leave as 16-byte halves of 32-byte sectors"
    assert kernel.counts.get("SHFL.BFLY", 0) >= 8, "lane pairs swap halves"
    assert kernel.opcode("F2FP") >= 32 and all("UE8M0" not in m for m in kernel.counts), text
    if "k_groups" in target:
        assert kernel.counts.get("SHFL.UP", 0) >= 1, "K-groups scan the group sizes in-kernel"
        # Group-aligned row tiles: each column's 4 scales are one word of the layout, as in blocked.
        assert kernel.global_stores(8) == 0, text
        assert kernel.opcode("VOTE") >= 1, "up to 32 groups: a warp scan and a ballot find the row tile"


def test_every_variant_is_registered():
    single = {
        f"quantize_32x1_{d}_{m}_{layout}"
        for d in ("bfloat16", "float32")
        for m in ("floor", "rceil")
        for layout in ("plain", "blocked", "k_groups")
    }
    assert set(TARGETS) == single | {name + "_2d" for name in single}


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("layout", ["plain", "blocked", "k_groups"])
def test_rank_2_entry_has_the_rank_3_device_code(arch, layout):
    """The 2-D op's entry turns (M, K) operands into E = 1 ones in the launcher: same instructions."""
    from cute_utils.sass import cubin_of, disassemble, instruction_hash

    name = f"quantize_32x1_bfloat16_rceil_{layout}"
    hashes = [instruction_hash(disassemble(cubin_of(TARGETS[n](arch)))) for n in (name, name + "_2d")]
    assert hashes[0] == hashes[1]


def test_limits_and_variants():
    from cute_kernels.quantize_32x1 import Quantize32x1Kernel, Quantize32x1Variant, ScaleLayout
    from cute_utils.constants import MAX_GROUPS

    variant = Quantize32x1Variant("bfloat16", "rceil", ScaleLayout.K_GROUPS)
    assert Quantize32x1Kernel.target_name(variant) == "quantize_32x1_bfloat16_rceil_k_groups"
    assert len(Quantize32x1Kernel.variants()) == 24
    assert Quantize32x1Kernel.can_implement(64, 96) and Quantize32x1Kernel.can_implement(32, 32, MAX_GROUPS)
    assert not Quantize32x1Kernel.can_implement(48, 32)  # M % 32
    assert not Quantize32x1Kernel.can_implement(32, 48)  # K % 32
    assert not Quantize32x1Kernel.can_implement(32, 32, MAX_GROUPS + 1)
    with pytest.raises(ValueError, match="mode"):
        Quantize32x1Variant("bfloat16", "nearest", ScaleLayout.PLAIN)


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)
