"""The swizzle kernel compiles for sm_90a and sm_100a on a CPU-only machine, with SASS we expect."""

from __future__ import annotations

import pytest
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

TARGETS = kernel_targets("swizzle")


def _register_cap(target: str, arch: str) -> int:
    """Registers a thread may take with the arch config's CTAs per SM resident."""
    from cute_kernels import configs, registry

    cls = registry.entry("swizzle").kernel_class()
    variant = next(v for v in cls.variants() if cls.target_name(v) == target)
    config = configs.pick("swizzle", variant, arch)
    return 65536 // (config.threads * config.ctas_per_sm)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    kernel, _ = spill_free_kernel(compiled, target)
    assert kernel.registers <= _register_cap(target, compiled[0]), kernel.format()
    # Whole 16-byte chunks of 512-byte blocked tiles: 128-bit stores (plus 32-bit ones for the
    # ragged end of an output whose size is not a multiple of 16 bytes).
    assert kernel.global_stores(128) >= 1, kernel.format()
    assert kernel.global_stores() == kernel.global_stores(128) + kernel.global_stores(32), kernel.format()
    # Loads are 4-byte words: one per tile column (``_words``) or aligned words funnel-shifted into
    # place (any row length, base address or K-group start). Raw words stop before the source's
    # end: in the ragged variants the last word, if the source ends inside it, is read as up to 4
    # bytes by the row blocks that reach it (4 byte loads at each of the two block-load sites,
    # prologue and loop).
    byte_loads = 8 if "_ragged" in target else 0
    assert kernel.global_loads(8) == byte_loads and kernel.global_loads(32) >= 8, kernel.format()
    if "_words" not in target:
        assert kernel.counts.get("SHF.R.U64", 0) >= 1, "unaligned words are funnel-shifted"
    if not target.startswith("swizzle_plain"):
        assert kernel.counts.get("SHFL.UP", 0) >= 1, "grouped layouts scan the group sizes in-kernel"
        # The first work item's source lines are L2-prefetched while the scan runs.
        assert kernel.counts.get("CCTL.E.PF2", 0) >= 1, kernel.format()


def test_registry_names():
    assert set(TARGETS) == {
        "swizzle_plain_2d_words",
        "swizzle_plain_3d_words",
        "swizzle_m_groups_2d_words",
        "swizzle_m_groups_2d_words_wide",
        "swizzle_k_groups_2d",
        "swizzle_k_groups_2d_wide",
        # raw-word variants that read a last, partial word as bytes (plain/M-groups: only these)
        "swizzle_plain_2d_ragged",
        "swizzle_plain_3d_ragged",
        "swizzle_m_groups_2d_ragged",
        "swizzle_m_groups_2d_ragged_wide",
        "swizzle_k_groups_2d_ragged",
        "swizzle_k_groups_2d_ragged_wide",
    }


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_configs_take_the_wide_window_where_asked(arch):
    """``cute_kernels.configs``: on sm_90a the 128-column window exactly for the ``wide`` variants;
    on sm_100a every variant takes it, over 128 threads (more bytes in flight for B200)."""
    from cute_kernels import registry

    kernel = registry.entry("swizzle").kernel_class()
    for variant in kernel.variants():
        config = kernel.default_config(variant, arch)
        if arch == "sm_100a":
            assert (config.window_cols, config.threads) == (128, 128), variant
        else:
            assert config.window_cols == (128 if variant.wide else 64), variant


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)
