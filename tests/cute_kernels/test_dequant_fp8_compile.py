"""The bounded FP8 row dequantization kernel compiles for sm_90a and sm_100a on a CPU-only machine
with the SASS we expect: no local memory, E4M3 -> f16 unpacks, fp32 products without flush to zero,
bf16 packs, 16-byte loads of q and 16-byte stores of x in the vector variant; the registry lists
both variants."""

from __future__ import annotations

import pytest
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

TARGETS = kernel_targets("dequantize_fp8_rows")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    kernel, text = spill_free_kernel(compiled, target)
    assert kernel.registers <= 64, text  # 4 CTAs of 256 threads per SM (configs/sm90.py)
    assert any(m.startswith("F2FP.F16.E4M3") for m in kernel.counts), text
    assert any(m.startswith("F2FP.BF16.F32") for m in kernel.counts), text
    assert kernel.opcode("FMUL") >= 1 and not any("FTZ" in m for m in kernel.counts), text
    assert kernel.shared_bytes == 0 and not kernel.barriers, text
    if target.endswith("_v16"):
        assert kernel.global_loads(128) >= 1 and kernel.global_stores(128) >= 2, text
        assert kernel.global_stores() == kernel.global_stores(128), text


def test_every_variant_is_registered():
    assert set(TARGETS) == {"dequantize_fp8_rows_v16", "dequantize_fp8_rows_v1"}


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)
