"""The 1x32 quantization kernel (every scale layout) compiles for sm_90a and sm_100a on a CPU-only
machine, with the SASS we expect: no local memory, 16-byte cp.async
loads and 128-bit shared reads in the main loop, 8-byte E4M3 stores, saturating E4M3 conversions,
and no Blackwell-only E8M0 conversion (the scale math is integer bit math, so both archs compute the
same bits)."""

from __future__ import annotations

import pytest
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

TARGETS = kernel_targets("quantize_1x32")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    kernel, text = spill_free_kernel(compiled, target)
    assert kernel.registers <= 64, text
    assert kernel.opcode("LDGSTS") >= 2 and kernel.memory.get("LDGSTS.128", 0) == kernel.opcode("LDGSTS"), (
        text
    )
    assert kernel.global_loads() == kernel.global_loads(32), (
        "only the group scan reads global memory directly"
    )
    assert kernel.shared_loads(128) >= 2, text
    assert kernel.global_stores(64) >= 2, text
    assert kernel.opcode("F2FP") >= 8 and all("UE8M0" not in m for m in kernel.counts), text
    if "m_groups" in target or "padded" in target:
        assert kernel.counts.get("SHFL.UP", 0) >= 1, "M-groups scan the group sizes in-kernel"


def test_every_layout_and_dtype_is_registered():
    layouts = {"plain", "blocked", "experts", "m_groups_g64", "m_groups_g2048", "padded_g64", "padded_g2048"}
    expected = {
        f"quantize_1x32_{d}_{m}_{layout}"
        for d in ("bfloat16", "float32")
        for m in ("floor", "rceil")
        for layout in layouts | {"experts_3d", "plain_3d"}
    }
    assert set(TARGETS) == expected


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("layout", ["experts", "plain"])
def test_rank_3_entry_has_the_rank_2_device_code(arch, layout):
    """The 3-D op's entry flattens (E, N, K) to rows in the launcher: same instructions."""
    from cute_utils.sass import cubin_of, disassemble, instruction_hash

    name = f"quantize_1x32_bfloat16_rceil_{layout}"
    hashes = [instruction_hash(disassemble(cubin_of(TARGETS[n](arch)))) for n in (name, name + "_3d")]
    assert hashes[0] == hashes[1]


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)
