"""The dual 1x32 + 32x1 quantization kernel (plain, blocked and grouped scales, both dtypes and
modes) compiles for sm_90a and sm_100a on a CPU-only machine with the SASS we expect."""

from __future__ import annotations

import pytest
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

TARGETS = kernel_targets("quantize_dual")


def test_every_layout_and_dtype_is_registered():
    assert set(TARGETS) == {
        f"quantize_dual_{d}_{m}_{layout}"
        for d in ("bfloat16", "float32")
        for m in ("floor", "rceil")
        for layout in ("plain", "blocked", "groups")
    }


def test_variant_names_and_limits():
    """The class's SASS names and the limits a caller checks before launching."""
    from cute_kernels.quantize_dual import DualVariant, QuantizeDualKernel, ScaleLayout
    from cute_utils.constants import MAX_GROUPS

    variant = DualVariant("float32", "floor", ScaleLayout.GROUPS)
    assert QuantizeDualKernel.target_name(variant) == "quantize_dual_float32_floor_groups"
    ok = QuantizeDualKernel.can_implement
    assert ok(64, 96) and ok(0, 0) and ok(64, 96, MAX_GROUPS, (0, 16, 512))
    assert not ok(40, 96) and not ok(64, 100), "M and K multiples of 32"
    assert not ok(64, 96, MAX_GROUPS + 1), "the group scan holds MAX_GROUPS groups"
    assert not ok(64, 96, None, (16, 8)), "16-byte aligned data"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    """One read for both quantizations: 16-byte cp.async loads, 128-bit shared reads (maxima, then
    conversion), q rows and q^T rows staged as 8-byte shared stores and stored as whole lines in
    16-byte chunks (blocked and grouped scales too: whole 512-byte tiles), packed 16-bit maxima for
    bf16, and an 80-register cap (3 CTAs of 256 threads per SM) with no spills."""
    kernel, text = spill_free_kernel(compiled, target)
    assert kernel.registers <= 80, text
    assert kernel.opcode("LDGSTS") >= 8, text
    assert kernel.memory.get("LDGSTS.128", 0) == kernel.opcode("LDGSTS"), text
    assert kernel.shared_loads(128) >= 8, text
    assert kernel.memory.get("STS.64", 0) >= 9, "q rows (rolled loop) and 8 q^T rows staged as 8 bytes"
    assert kernel.global_stores(128) >= 8 and kernel.global_stores(64) == 0, "q, q^T leave in 16-byte chunks"
    assert kernel.opcode("F2FP") >= 36 and all("UE8M0" not in m for m in kernel.counts), text
    if "bfloat16" in target:
        assert any(m.startswith("VIMNMX") and "U16x2" in m for m in kernel.counts), "packed bf16 maxima"
    if "plain" in target:
        assert kernel.global_stores(8) >= 4, "plain scales: 2 + 2 bytes per lane"
    else:
        # The whole 512-byte blocked tiles of both scale matrices leave as 16-byte chunks too.
        assert kernel.global_stores(8) == 0, "scales staged in shared memory, no byte stores"
        assert kernel.shared_stores(8) >= 4, "each lane stages 2 + 2 scale bytes"
    if "groups" in target:
        assert kernel.counts.get("SHFL.UP", 0) >= 1, "the dual kernel scans the group sizes in-kernel"


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)
