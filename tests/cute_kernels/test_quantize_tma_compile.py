"""The TMA-load 1x32 quantization kernel compiles for sm_90a and sm_100a on a CPU-only machine with the
SASS we expect: TMA loads (UTMALDG) and no cp.async (LDGSTS), no local memory, 128-bit shared reads,
saturating E4M3 conversions and no Blackwell-only E8M0 conversion; q leaves through TMA stores of
the lanes' staged boxes (default config) or 8-byte stores (``store_stages=0``). Three builds per arch
keep it short (bf16 rceil blocked, fp32 floor plain: both dtypes, modes and layouts; bf16 rceil
blocked with STG stores)."""

from __future__ import annotations

import pytest
from conftest import spill_free_kernel

TARGETS = (
    "quantize_tma_1x32_bfloat16_rceil_blocked",
    "quantize_tma_1x32_float32_floor_plain",
    "quantize_tma_1x32_bfloat16_rceil_blocked_stg",
)


def _builds() -> dict:
    from cute_kernels import registry
    from cute_kernels.experimental.quantize_tma import TmaQuantizeConfig, TmaVariant
    from cute_kernels.quantize import ScaleLayout
    from cute_utils.sass import compile_options

    entry = registry.entry("quantize_tma")
    builds = entry.sass_targets()
    stg = TmaQuantizeConfig(store_stages=0)
    variant = TmaVariant("bfloat16", "rceil", ScaleLayout.BLOCKED)
    builds["quantize_tma_1x32_bfloat16_rceil_blocked_stg"] = lambda arch: entry.compile(
        variant, arch, config=stg, options=compile_options(arch)
    )
    return builds


@pytest.fixture(scope="module", params=("sm_90a", "sm_100a"))
def compiled(request):
    """``(arch, {target: SASS summaries})``, compiled once per arch."""
    from cute_utils import sass

    arch = request.param
    builds = _builds()
    return arch, {name: sass.summarize(sass.cubin_of(builds[name](arch))) for name in TARGETS}


@pytest.mark.parametrize("target", TARGETS)
def test_compiles_with_expected_sass(compiled, target):
    kernel, text = spill_free_kernel(compiled, target)
    assert kernel.registers <= 64, text
    assert kernel.tma_loads >= 2, "TMA boxes: the prologue and the refill in the loop"
    assert kernel.opcode("LDGSTS") == 0 and kernel.global_loads() == 0, "every load of x goes through TMA"
    assert kernel.shared_loads() == kernel.shared_loads(128) >= 2, text
    if target.endswith("_stg"):
        assert kernel.global_stores(64) >= 2 and kernel.tma_stores == 0, "E4M3 data leaves as 8-byte stores"
    else:
        assert kernel.tma_stores >= 1 and kernel.shared_stores(64) >= 2, "E4M3 boxes staged, TMA-stored"
        assert kernel.global_stores(64) == 0 and kernel.global_stores(128) == 0, text
    assert kernel.opcode("SYNCS") >= 2, "mbarrier arrive / wait"
    assert kernel.opcode("F2FP") >= 8 and all("UE8M0" not in m for m in kernel.counts), text


def test_variants_cover_plain_and_blocked():
    from cute_kernels import registry

    expected = {
        f"quantize_tma_1x32_{d}_{m}_{layout}"
        for d in ("bfloat16", "float32")
        for m in ("floor", "rceil")
        for layout in ("plain", "blocked")
    }
    entry = registry.entry("quantize_tma")
    assert set(entry.sass_targets()) == expected and not entry.production
