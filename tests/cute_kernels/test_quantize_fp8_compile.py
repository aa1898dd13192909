"""The FP8 rowwise row kernel compiles for sm_90a and sm_100a on a CPU-only machine with the SASS we
expect: no local memory, 16-byte loads and 8-byte q stores in the vector variants, the saturating
E4M3 conversion, the fp64 scale division; the bounded variants read the last group end and exit
before any load of x; the registry lists every variant."""

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
        for suffix in ("", "_3d", "_bounded")
    }
    assert set(TARGETS) == expected


@pytest.mark.parametrize("target", sorted(t for t in TARGETS if t.endswith("_bounded")))
def test_bounded_variants_add_one_load(compiled, target):
    """A bounded variant is its unbounded twin plus one 4-byte load (the last group end): the same
    vector loads and stores, no local memory."""
    kernel, text = spill_free_kernel(compiled, target)
    _, summaries = compiled
    (unbounded,) = summaries[target.removesuffix("_bounded")]
    memory = dict(unbounded.memory)
    memory["LDG.32"] = memory.get("LDG.32", 0) + 1
    assert kernel.memory == memory, text


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)


@pytest.mark.parametrize("vector", [True, False])
@pytest.mark.parametrize("k_class", [256, 1024, 4096, 16384, 65536])
def test_sm100_heuristic_builds_without_local_memory(k_class, vector):
    """The sm_100a row heuristic (the bindings' config there: no tuned entries) at K classes past the
    one the SASS targets use (8192): no spills, element steps included."""
    from cute_kernels import configs
    from cute_kernels.quantize_fp8 import Fp8RowKernel, Fp8RowVariant
    from cute_utils.sass import compile_options, cubin_of, resource_usage

    variant = Fp8RowVariant("bfloat16", vector=vector)
    config = configs.pick_for_shape("quantize_fp8_row", variant, "sm_100a", "", f"bfloat16/k{k_class}")
    cubin = cubin_of(
        Fp8RowKernel.compile(variant, "sm_100a", config=config, options=compile_options("sm_100a"))
    )
    assert not any(f["local_bytes"] for f in resource_usage(cubin).values()), config
