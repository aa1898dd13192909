"""The sm_90a FP8 grouped GEMM (``cute_kernels.grouped_gemm_sm90``) compiles on a CPU-only machine for
sm_90a (its only arch: wgmma) with the SASS its design needs: fp8 wgmma (``QGMMA``) into fp32, TMA
loads of both operands (``UTMALDG``), the producer/consumer register split (``USETMAXREG``), mbarrier
waits, no local memory; and its instruction hashes are the recorded ones. Not run on a GPU here."""

from __future__ import annotations

import pytest
from conftest import _recorded_hashes, kernel_targets, spill_free_kernel

ARCH = "sm_90a"
TARGETS = kernel_targets("grouped_gemm_sm90")


@pytest.fixture(scope="module")
def compiled():
    """``(arch, {target: SASS summaries})`` and each target's instruction hash, sm_90a only."""
    from cute_utils import sass

    summaries, hashes = {}, {}
    for name, build in TARGETS.items():
        cubin = sass.cubin_of(build(ARCH))
        text = sass.disassemble(cubin)
        summaries[name] = sass.summarize(cubin, sass=text)
        hashes[name] = sass.instruction_hash(text)
    return (ARCH, summaries), hashes


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    kernel, text = spill_free_kernel(compiled[0], target)
    qgmma = {op: n for op, n in kernel.counts.items() if op.startswith("QGMMA")}
    assert qgmma and all(".F32.E4M3.E4M3" in op for op in qgmma), text
    # one (64 x tile_n x 32) wgmma per 32 reduction elements of a 128-element slot; 2d2d: a second
    # copy of the four for slots cut by a group's bounds (each wgmma issued only where it meets the
    # group), beside the straight-line four of the other slots
    assert sum(qgmma.values()) == (8 if target.endswith("2d2d") else 4), qgmma
    assert kernel.tma_loads >= 2, "both operands arrive by TMA"
    assert kernel.opcode("USETMAXREG") >= 2, "producer gives registers to the consumers"
    assert kernel.opcode("SYNCS") >= 2, "mbarrier ring"
    assert kernel.threads == (384, 1, 1)
    # epilogue: the tile goes into shared memory by stmatrix (16 x4 per thread: 128 x 256 bf16 over
    # 256 threads) and out as four (128 x 64) TMA store boxes; a 2d3d tile cut by its group's end
    # goes out as 16-byte row vectors, 16 per thread
    assert kernel.counts.get("STSM.16.M88.4") == 16, kernel.counts
    form = "3D" if target.endswith("2d2d") else "2D"
    assert kernel.tma.get(f"UTMASTG.{form}") == 4, kernel.tma
    if target.endswith("2d2d"):  # the masking stores 64-bit words, never single bytes
        assert kernel.global_stores() == 0 and kernel.shared_loads(128) == 0, kernel.memory
        assert kernel.shared_stores(8) == 0 and kernel.shared_stores(64) > 0, kernel.memory
    else:
        assert kernel.global_stores() == kernel.global_stores(128) == 16, kernel.memory
        assert kernel.shared_loads(128) == 16, kernel.memory
    assert kernel.registers <= 168, text  # 384 threads fit one CTA per SM before setmaxregister
    # setmaxregister.inc waits until the CTA's pool holds the registers it asks for: what the
    # producer warpgroup gives back must cover the consumers' increase, or they wait forever.
    from cute_kernels.grouped_gemm_sm90 import CONSUMER_THREADS, WARPGROUP, GroupedGemmConfig

    config = GroupedGemmConfig()
    released = WARPGROUP * (kernel.registers - config.producer_registers)
    assert released >= CONSUMER_THREADS * (config.consumer_registers - kernel.registers), kernel.registers
    assert kernel.registers >= config.launch_registers() == 168  # the tuner's guard, same rule


def test_instruction_hashes_are_the_recorded_ones(compiled):
    import cutlass

    version, table = _recorded_hashes()
    if version != cutlass.__version__:
        pytest.skip(f"hashes recorded with nvidia-cutlass-dsl {version}, this is {cutlass.__version__}")
    recorded = {name: table.get((name, ARCH)) for name in compiled[1]}
    changed = [f"{n}: {recorded[n]} -> {h}" for n, h in compiled[1].items() if recorded[n] != h]
    assert not changed, "SASS changed (regenerate tests/support/sass_hashes.txt):\n" + "\n".join(changed)
    assert not any(name.startswith("grouped_gemm_sm90") and arch != ARCH for name, arch in table)


def test_registry_entry_is_production_and_sm90_only():
    from cute_kernels import registry

    entry = registry.entry("grouped_gemm_sm90")
    assert entry.production and not entry.bandwidth_bound
    assert set(TARGETS) == {"grouped_gemm_sm90_2d3d", "grouped_gemm_sm90_2d2d"}
    assert all(build.archs == (ARCH,) for build in TARGETS.values())
    variant = entry.variants()[0]
    with pytest.raises(ValueError, match="sm_90a only"):
        entry.compile(variant, "sm_100a")


def test_shared_memory_and_limits():
    from cute_kernels.grouped_gemm_sm90 import MAX_GROUPS, GroupedGemmConfig, GroupedGemmSm90Kernel

    kernel = GroupedGemmSm90Kernel
    config = kernel.default_config(kernel.variants()[0], ARCH)
    assert config == GroupedGemmConfig(cluster=2)
    ring = config.stages * (128 + config.tile_n) * 128
    assert ring < kernel.shared_bytes(kernel.variants()[0], config) <= 232448
    assert kernel.can_implement("2d3d", 17, 2048, 7168, 8)
    assert not kernel.can_implement("2d3d", 17, 64, 100, 8), "K % 16: TMA row stride"
    assert not kernel.can_implement("2d3d", 17, 68, 128, 8), "N % 8: 16-byte output rows"
    assert not kernel.can_implement("2d3d", 17, 64, 0, 8), "K = 0: no TMA box"
    assert kernel.can_implement("2d2d", 16384, 2048, 7168, 8)
    assert not kernel.can_implement("2d2d", 100, 64, 64, 2), "M % 16: TMA row stride"
    assert not kernel.can_implement("2d2d", 128, 64, 68, 2), "K % 8: 16-byte output rows"
    assert not kernel.can_implement("2d3d", 128, 64, 64, MAX_GROUPS + 1)
    with pytest.raises(ValueError):
        GroupedGemmConfig(tile_n=24)


@pytest.mark.parametrize("align", [0, 8, 48, 256])
def test_reduction_align_must_be_a_multiple_of_16_within_a_box(align):
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmConfig

    with pytest.raises(ValueError, match="reduction_align"):
        GroupedGemmConfig(reduction_align=align)
    assert GroupedGemmConfig().reduction_align == 128


@pytest.mark.parametrize("cluster", [0, 3, 4])
def test_cluster_is_one_or_two_ctas(cluster):
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmConfig

    with pytest.raises(ValueError, match="cluster"):
        GroupedGemmConfig(cluster=cluster)


@pytest.mark.parametrize("cluster", [1, 2])
@pytest.mark.parametrize("form", ["2d3d", "2d2d"])
def test_cluster_multicasts_the_shared_operand(form, cluster):
    """``cluster=2`` (the default): one of the two TMA loads is a multicast (2d3d: A, 2d2d: B), the
    consumers release slots in both CTAs (remote arrives), the CTAs meet at a cluster barrier after
    the ring's barriers are made. ``cluster=1``: plain loads, no cluster barrier. Neither spills."""
    from dataclasses import replace

    from cute_kernels import registry
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmSm90Kernel, GroupedGemmVariant
    from cute_utils import sass

    variant = GroupedGemmVariant(form)
    config = replace(GroupedGemmSm90Kernel.default_config(variant, ARCH), cluster=cluster)
    build = registry.entry("grouped_gemm_sm90").compile(variant, ARCH, config=config,
                                                         options=sass.compile_options(ARCH))  # fmt: skip
    cubin = sass.cubin_of(build)
    (kernel,) = sass.summarize(cubin, sass=sass.disassemble(cubin))
    text = kernel.format()
    assert kernel.local_bytes == 0 and kernel.local_stores == 0, text
    loads = {op: n for op, n in kernel.tma.items() if op.startswith("UTMALDG")}
    multicast = sum(n for op, n in loads.items() if "MULTICAST" in op)
    assert multicast == cluster - 1 and sum(loads.values()) == 2, kernel.tma
    if form == "2d3d" and cluster == 2:  # A (M, K) is the 2-D load, B (N, K, E) the 3-D one
        assert loads.get("UTMALDG.2D.MULTICAST") == 1 and loads.get("UTMALDG.3D") == 1, kernel.tma
    remote = any(op.startswith("SYNCS.ARRIVE.TRANS64.RED") for op in kernel.counts)
    assert remote == (cluster == 2), kernel.counts
    assert kernel.opcode("UCGABAR_ARV") == kernel.opcode("UCGABAR_WAIT") == cluster - 1, kernel.counts
