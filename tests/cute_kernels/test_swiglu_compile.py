"""The SwiGLU + FP8 rowwise kernel compiles for sm_90a and sm_100a on a CPU-only machine with the SASS
we expect: no local memory, 16-byte loads and stores of bf16 and 8-byte q stores in the vector
variants, the saturating E4M3 conversion, IEEE division (no approximate reciprocal alone), the fp64
scale division; the bounded variants read the last group end and exit before any load of h13;
every variant is registered and its instruction hash recorded."""

from __future__ import annotations

import pytest
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

TARGETS = kernel_targets("swiglu_fp8")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    kernel, text = spill_free_kernel(compiled, target)
    # the default configs' register caps (configs/sm90.py): 3 CTAs of 256 threads per SM forward, 2 backward
    assert kernel.registers <= (128 if "_bwd_" in target else 85), text
    assert kernel.opcode("F2FP") >= 1 and all("UE8M0" not in m for m in kernel.counts), text
    assert any(m.startswith(("DMUL", "DFMA")) for m in kernel.counts), "q_scale divides in fp64"
    # silu from the shared table: nothing of the contract's sequence (its rint) is left
    assert not any(m.startswith("FRND") for m in kernel.counts), text
    assert kernel.memory.get("LDGSTS.128", 0) >= 1, "the table copy is cp.async"
    backward = "_bwd_" in target
    if "_v8" in target:
        # compute pass: gate and up (and grad_h) per step of the batch; cast pass: the outputs again
        unroll = 2 if backward else 4
        loads = unroll * (3 + 2) if backward else unroll * (2 + 1)
        assert kernel.global_loads(128) == loads, text
        assert kernel.global_stores(128) == unroll * (2 if backward else 1), text  # bf16 outputs
        assert kernel.global_stores(64) == unroll * (2 if backward else 1), text  # q bytes


def test_every_variant_is_registered():
    expected = {
        f"swiglu_fp8_{d}_{r}_{v}{suffix}"
        for d in ("fwd", "bwd")
        for r in ("pow2", "exact")
        for v in ("v8", "v1")
        for suffix in ("", "_bounded")
    }
    assert set(TARGETS) == expected


@pytest.mark.parametrize("target", sorted(t for t in TARGETS if t.endswith("_bounded")))
def test_bounded_variants_add_one_load(compiled, target):
    """A bounded variant is its unbounded twin plus one 4-byte load (the last group end) and an
    early exit: the same loads and stores otherwise, registers within eight of its twin's (the
    bound stays live through the persistent row loop), no local memory; the end is loaded, and the CTA may
    exit, before the first load of h13."""
    kernel, text = spill_free_kernel(compiled, target)
    _, summaries = compiled
    (unbounded,) = summaries[target.removesuffix("_bounded")]
    memory = dict(unbounded.memory)
    memory["LDG.32"] = memory.get("LDG.32", 0) + 1
    assert kernel.memory == memory, text
    assert abs(kernel.registers - unbounded.registers) <= 8, text


@pytest.mark.parametrize("arch,direction", [("sm_90a", "bwd"), ("sm_100a", "fwd")])
def test_bounded_variant_exits_before_loading_h13(arch, direction):
    """In the SASS: the end's ``LDG.E`` (32-bit), then an ``EXIT``, then the first wider load."""
    from cute_kernels.swiglu import SwigluFp8Kernel, SwigluVariant
    from cute_utils.sass import compile_options, cubin_of, disassemble

    compiled = SwigluFp8Kernel.compile(
        SwigluVariant(direction, bounded=True), arch, options=compile_options(arch)
    )
    lines = [line for line in disassemble(cubin_of(compiled)).splitlines() if "/*" in line]
    loads = [i for i, line in enumerate(lines) if " LDG." in line]
    first_exit = next(i for i, line in enumerate(lines) if "EXIT" in line)
    assert "LDG.E " in lines[loads[0]] and loads[0] < first_exit < loads[1], "\n".join(lines[:60])


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_configs(arch):
    from cute_kernels import registry

    kernel = registry.entry("swiglu_fp8").kernel_class()
    for variant in kernel.variants():
        config = kernel.default_config(variant, arch)
        assert config.row_per_cta and config.threads == 256
        fwd = variant.direction == "fwd"
        assert (config.unroll, config.ctas_per_sm) == ((4, 3) if fwd else (2, 2))


def test_variant_and_config_validate():
    from cute_kernels.swiglu import SwigluConfig, SwigluFp8Kernel, SwigluVariant

    with pytest.raises(ValueError, match="direction"):
        SwigluVariant("sideways")
    with pytest.raises(ValueError, match="threads"):
        SwigluConfig(threads=100)
    with pytest.raises(ValueError, match="unroll"):
        SwigluConfig(unroll=0)
    assert SwigluFp8Kernel.can_implement(13, False, 2)
    assert SwigluFp8Kernel.can_implement(16, True, 0, 32) and not SwigluFp8Kernel.can_implement(16, True, 8)
    assert not SwigluFp8Kernel.can_implement(12, True, 0)


@pytest.mark.parametrize("bounded", [False, True])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_warp_per_row_config_builds_without_local_memory(direction, bounded):
    """The other launch shape of the config (a warp per row), which no default takes."""
    from cute_kernels.swiglu import SwigluConfig, SwigluFp8Kernel, SwigluVariant
    from cute_utils.sass import compile_options, cubin_of, resource_usage

    config = SwigluConfig(threads=128, unroll=2, ctas_per_sm=4, row_per_cta=False)
    compiled = SwigluFp8Kernel.compile(
        SwigluVariant(direction, bounded=bounded), "sm_90a", config=config, options=compile_options("sm_90a")
    )
    assert not any(f["local_bytes"] for f in resource_usage(cubin_of(compiled)).values())
