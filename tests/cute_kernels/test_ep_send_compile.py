"""The EP send kernel (``cute_kernels.ep_send``) compiles for sm_90a and sm_100a on a CPU-only machine
with the SASS we expect: no local memory under the config's register cap, the row read as 16-byte
loads, q stored as 8-byte (E4M3) or 16-byte (bf16) vectors, the saturating E4M3 conversion, MX
scales from shuffles and byte stores, the FP8 row scale from an fp64 division after one CTA
barrier; the registry lists every variant, and the recorded instruction hashes hold."""

from __future__ import annotations

import pytest
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

TARGETS = kernel_targets("ep_send")


def _variant_and_config(target: str, arch: str):
    from cute_kernels import configs, registry

    cls = registry.entry("ep_send").kernel_class()
    variant = next(v for v in cls.variants() if cls.target_name(v) == target)
    return variant, configs.pick("ep_send", variant, arch)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    kernel, text = spill_free_kernel(compiled, target)
    variant, config = _variant_and_config(target, compiled[0])
    assert kernel.threads == (config.threads, 1, 1), text
    assert kernel.registers <= 65536 // (config.threads * config.ctas_per_sm), text
    # The chunk: every vector of a thread loaded as one 16-byte load (all issued before any use).
    assert kernel.global_loads(128) >= config.vectors, text
    if variant.recipe == "bf16":
        assert kernel.global_stores(128) >= config.vectors and kernel.opcode("F2FP") == 0, text
        return
    # E4M3 q: 8 bytes per vector; the conversion is the saturating one, no E8M0 conversion (sm_90a
    # has none: the scales are integer bit math on both archs).
    assert kernel.global_stores(64) >= config.vectors, text
    assert kernel.fp8_conversions.get("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C", 0) >= 4 * config.vectors, (
        text
    )
    assert all("UE8M0" not in m for m in kernel.counts), text
    if variant.recipe == "mxfp8":
        # Two butterfly shuffles per pair of vectors (two blocks' maxima per word), byte scale stores.
        assert kernel.counts.get("SHFL.BFLY", 0) >= config.vectors, text
        assert kernel.global_stores(8) >= config.vectors and kernel.opcode("BAR") == 0, text
    else:
        assert any(m.startswith(("DMUL", "DFMA")) for m in kernel.counts), "q_scale divides in fp64"
        assert kernel.opcode("BAR") >= 1, "the warps' maxima meet in shared memory"


def test_registry_names():
    assert set(TARGETS) == {
        "ep_send_bf16",
        "ep_send_mxfp8_floor",
        "ep_send_mxfp8_rceil",
        "ep_send_fp8_rowwise_pow2",
        "ep_send_fp8_rowwise_exact",
    }


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise", "bf16"])
def test_small_chunks_compile_without_local_memory(recipe):
    """A chunk shorter than the rows (one warp, one vector per thread: rows of several chunks, the
    fp8 row read twice) compiles without spills: the paths the default config takes only past
    D = 8192."""
    from cute_kernels.ep_send import QuantizeScatterKernel, SendConfig, SendVariant
    from cute_utils.sass import compile_options, cubin_of, resource_usage

    config = SendConfig(threads=32, vectors=1, ctas_per_sm=8)
    for arch in ("sm_90a", "sm_100a"):
        compiled = QuantizeScatterKernel.compile(
            SendVariant(recipe), arch, config=config, options=compile_options(arch)
        )
        assert not any(f["local_bytes"] for f in resource_usage(cubin_of(compiled)).values()), arch


def test_variants_and_configs_validate():
    from cute_kernels.ep_send import QuantizeScatterKernel, SendConfig, SendVariant

    with pytest.raises(ValueError, match="recipe"):
        SendVariant("nvfp4")
    with pytest.raises(ValueError, match="scaling_mode"):
        SendVariant("mxfp8", scaling_mode="even")
    with pytest.raises(ValueError, match="takes no scaling_mode"):
        SendVariant("fp8_rowwise", scaling_mode="floor")
    with pytest.raises(ValueError, match="takes no round_pow2"):
        SendVariant("mxfp8", round_pow2=False)
    with pytest.raises(ValueError, match="threads"):
        SendConfig(threads=100)
    with pytest.raises(ValueError, match="out of range"):
        SendConfig(threads=1024, ctas_per_sm=4)
    assert SendConfig().chunk_elements == 8192
    assert QuantizeScatterKernel.can_implement("mxfp8", 96, 0, 16)
    assert not QuantizeScatterKernel.can_implement("mxfp8", 72, 0, 16)
    assert QuantizeScatterKernel.can_implement("fp8_rowwise", 72, 0, 16)
    assert not QuantizeScatterKernel.can_implement("bf16", 64, 8)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_configs(arch):
    """Both archs: 128 threads x 8 vectors (the whole row up to D = 8192 in one chunk), 7 CTAs per
    SM (at 8 the mxfp8 variants spilled under the 64-register cap)."""
    from cute_kernels import configs, registry
    from cute_kernels.ep_send import SendConfig

    for variant in registry.entry("ep_send").variants():
        assert configs.pick("ep_send", variant, arch) == SendConfig(threads=128, vectors=8, ctas_per_sm=7)
