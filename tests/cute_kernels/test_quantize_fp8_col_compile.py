"""The FP8 column-scale kernels (amax pass, cast pass) compile for sm_90a and sm_100a on a CPU-only
machine with the SASS we expect: no local memory, one 4-byte (bf16) / 8-byte (fp32) load per row
and column pair in the vector-load variants, the atomic max of the amax pass, the saturating E4M3
conversion and the fp64 scale division of the cast pass, 16-byte q stores in its vector-store
variants, and in the dual variants (2-D and experts) the row side: a CTA barrier, the row q's
2-byte stores with vector loads; the cast into padded groups (``quantize_fp8_col_pad_cast``, and its
dual) has the cast's SASS plus its group scan's barriers; the registry lists every variant."""

from __future__ import annotations

import pytest
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

TARGETS = kernel_targets("quantize_fp8_col_amax", "quantize_fp8_col_cast", "quantize_fp8_col_pad_cast")


def _register_cap(target: str, arch: str) -> int:
    """Registers a thread may take under the config's CTAs-per-SM cap (128-thread CTAs)."""
    from cute_kernels import configs, registry

    name = target.split("_bfloat16")[0].split("_float32")[0]  # the registry name: the target's prefix
    cls = registry.entry(name).kernel_class()
    variant = next(v for v in cls.variants() if cls.target_name(v) == target)
    return 65536 // (128 * configs.pick(cls.name, variant, arch).min_ctas_per_sm)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    arch = compiled[0]
    kernel, text = spill_free_kernel(compiled, target)
    pair_bits = 32 if "bfloat16" in target else 64
    if "_v2" in target:
        assert kernel.global_loads(pair_bits) >= 32, text
    if "_amax_" in target:
        assert kernel.registers <= _register_cap(target, arch), text
        assert any(m.startswith("RED") for m in kernel.counts), text
    else:
        assert kernel.registers <= _register_cap(target, arch), text
        assert kernel.opcode("F2FP") >= 16 and all("UE8M0" not in m for m in kernel.counts), text
        assert any(m.startswith(("DMUL", "DFMA")) for m in kernel.counts), "q_scale divides in fp64"
        if "_s16" in target or "_padded_" in target:  # the padded rows are a multiple of 16
            assert kernel.global_stores(128) >= 4, text
    if "_padded_" in target:  # the group scan and the row tile's halves, in shared memory
        assert kernel.opcode("BAR") >= 2, text
    if "_dual_" in target:  # the row side: row maxima / row q_scales through shared memory
        assert kernel.opcode("BAR") >= 1, text
        if "_cast_" in target and "_v2" in target:
            assert kernel.global_stores(16) >= 32, "one 2-byte row q store per row and lane"


def test_every_variant_is_registered():
    names = {
        f"{d}_{layout}{dual}_{v}"
        for d in ("bfloat16", "float32")
        for layout in ("plain", "groups", "experts")  # experts dual: quantize_fp8_3d_dual
        for dual in ("", "_dual")
        for v in ("v2", "v1")
    }
    expected = {f"quantize_fp8_col_amax_{n}" for n in names}
    expected |= {f"quantize_fp8_col_cast_{n}_{s}" for n in names for s in ("s16", "s1")}
    expected |= {
        f"quantize_fp8_col_pad_cast_{d}_padded{dual}_{v}"
        for d in ("bfloat16", "float32")
        for dual in ("", "_dual")  # dual: pad_and_quantize_fp8_2d_dual
        for v in ("v2", "v1")
    }
    assert set(TARGETS) == expected


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)
