"""The FP8 rowwise row kernel compiles for sm_90a and sm_100a on a CPU-only machine with the SASS we
expect: no local memory, 16-byte loads and 8-byte q stores in the vector variants, the saturating
E4M3 conversion, the fp64 scale division; the registry lists every variant."""

from __future__ import annotations

import pytest
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

TARGETS = kernel_targets("quantize_fp8_row")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    kernel, text = spill_free_kernel(compiled, target)
    assert kernel.registers <= 128, text  # a CTA of 512 (or 1024) threads per row (configs/sm90.py)
    assert kernel.opcode("F2FP") >= 1 and all("UE8M0" not in m for m in kernel.counts), text
    assert any(m.startswith(("DMUL", "DFMA")) for m in kernel.counts), "q_scale divides in fp64"
    if "_v8" in target:
        assert kernel.global_loads(128) >= 2 and kernel.global_stores(64) >= 1, text


def test_every_variant_is_registered():
    expected = {
        f"quantize_fp8_row_{d}_{r}_{v}{suffix}"
        for d in ("bfloat16", "float32")
        for r in ("pow2", "exact")
        for v in ("v8", "v1")
        for suffix in ("", "_3d")
    }
    assert set(TARGETS) == expected


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)
