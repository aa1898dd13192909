"""``cute_kernels.inflight``: the global-load bytes one CTA keeps in flight, per kernel the model
covers (``registry.modelled()``; CPU: the counts are Python arithmetic on the configs; one test
compiles each representative variant to read the CTA size from its cubin)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

from cute_kernels import configs, inflight, registry  # noqa: E402
from cute_kernels.configs import sm90  # noqa: E402

ARCH = "sm_90a"
ROW_SHAPE_CLASS = "bfloat16/k8192"  # the row kernel's K class of K = 7168 (the benchmark width)


def _config(name: str, variant):
    """The sm_90a config of ``variant``: the per-shape heuristic for the row kernel (K = 7168),
    else ``configs.pick``."""
    if name == "quantize_fp8_row":
        return sm90.quantize_fp8_row_for_shape(variant, ROW_SHAPE_CLASS, None)
    return configs.pick(name, variant, ARCH)


def _kernel_threads(name: str, variant, config) -> int:
    """Threads per CTA as the kernel object (or its module's constant) has them."""
    entry = registry.entry(name)
    kernel = entry.kernel_class()(variant, config)
    if hasattr(kernel, "threads"):
        return kernel.threads
    if hasattr(kernel, "warps"):
        return 32 * kernel.warps
    return __import__(entry.module, fromlist=["THREADS"]).THREADS


@pytest.mark.parametrize("name", sorted(registry.modelled()))
def test_representative_counts(name):
    variant = inflight.representative_variant(name)
    assert variant in registry.entry(name).variants()
    assert getattr(variant, "dtype", "bfloat16") in ("bfloat16", "int16")  # swizzle has no dtype field
    config = _config(name, variant)
    got = inflight.loads_in_flight(name, variant, config)
    assert got.threads > 0 and got.bytes_per_cta > 0
    assert got.threads == _kernel_threads(name, variant, config)
    assert got.derivation and "\n" not in got.derivation


@pytest.mark.parametrize("name", sorted(registry.modelled()))
def test_every_variant_counts(name):
    for variant in registry.entry(name).variants():
        config = configs.pick(name, variant, ARCH)
        got = inflight.loads_in_flight(name, variant, config)
        assert got.bytes_per_cta > 0 and got.threads == _kernel_threads(name, variant, config), variant


RECORDED = Path(__file__).parents[1] / "support" / "inflight_counts.txt"


def test_counts_are_the_recorded_ones():
    """Every variant's count on both archs at K = 2048 and 7168 is the one recorded when the counts
    moved from this module into the kernel classes (``tests/support/inflight_counts.txt``)."""
    recorded = {}
    for line in RECORDED.read_text().splitlines()[1:]:
        name, target, arch, cols, threads, nbytes = line.split()
        recorded[name, target, arch, int(cols)] = (int(threads), int(nbytes))
    got = {}
    for name in registry.modelled():
        cls = registry.entry(name).kernel_class()
        for variant in cls.variants():
            for arch in ("sm_90a", "sm_100a"):
                config = configs.pick(name, variant, arch)
                for cols in (2048, 7168):
                    count = inflight.loads_in_flight(name, variant, config, cols=cols)
                    got[name, cls.target_name(variant), arch, cols] = (count.threads, count.bytes_per_cta)
    assert got == recorded


def test_every_modelled_class_states_its_loads():
    for name in registry.modelled():
        assert "loads_in_flight" in vars(registry.entry(name).kernel_class()) or name in (
            "pad",
            "unpad",
            "row_scatter",
        ), name  # the row gathers share their base class's
    with pytest.raises(NotImplementedError, match="ep_route"):
        registry.entry("ep_route").kernel_class().loads_in_flight(None, None, 0)


def test_hand_computed():
    """Values worked out by hand from the kernels' loops and the sm_90a configs."""
    expected = {
        # 4 warps x 32 lanes x (3 stages - 1) units x 2 vectors x 8 bf16 x 2 B
        "quantize_1x32": (128, 8192),
        # 128 threads x 32 rows x 2 columns x 2 B, all loads before the block max
        "quantize_32x1": (128, 16384),
        # 128 threads x 2 blocks (load_blocks) x 32 rows x 2 columns x 2 B
        "quantize_fp8_col_cast": (128, 32768),
        # K = 7168: 512 threads x 2 unroll = 1024 steps > 896 steps of 8: the whole row, 7168 x 2 B
        "quantize_fp8_row": (512, 14336),
        # 128 rows x 64 E8M0 bytes of the window (16 words of 4 B)
        "swizzle": (256, 8192),
    }
    for name, (threads, nbytes) in expected.items():
        variant = inflight.representative_variant(name)
        got = inflight.loads_in_flight(name, variant, _config(name, variant))
        assert (got.threads, got.bytes_per_cta) == (threads, nbytes), (name, got)


@pytest.mark.parametrize(
    "name", ["quantize_1x32", "quantize_32x1", "quantize_dual", "quantize_fp8_col_amax", "quantize_tma"]
)
def test_fp32_doubles_the_bytes(name):
    bf16 = inflight.representative_variant(name)
    config = _config(name, bf16)
    fp32 = replace(bf16, dtype="float32")
    assert (
        inflight.loads_in_flight(name, fp32, config).bytes_per_cta
        == 2 * inflight.loads_in_flight(name, bf16, config).bytes_per_cta
    )


def test_row_kernel_shapes():
    from cute_kernels.quantize_fp8 import Fp8RowConfig

    vector = inflight.representative_variant("quantize_fp8_row")
    element = replace(vector, vector=False)
    whole_cta = Fp8RowConfig(threads=512, unroll=2, ctas_per_sm=1, row_per_cta=True)
    # a row shorter than the batch: the row (2048 x 2 B); a longer one: the batch (1024 steps of 8)
    assert inflight.loads_in_flight("quantize_fp8_row", vector, whole_cta, cols=2048).bytes_per_cta == 4096
    assert inflight.loads_in_flight("quantize_fp8_row", vector, whole_cta, cols=16384).bytes_per_cta == 16384
    # element steps: 512 threads x 2 unroll x 1 element x 2 B
    assert inflight.loads_in_flight("quantize_fp8_row", element, whole_cta).bytes_per_cta == 2048
    # a warp per row (16 warps, 16 unroll): 16 rows x 512 steps x 16 B
    warp_rows = Fp8RowConfig(threads=512, unroll=16, ctas_per_sm=1)
    assert inflight.loads_in_flight("quantize_fp8_row", vector, warp_rows).bytes_per_cta == 16 * 512 * 16


def test_unknown_kernel():
    with pytest.raises(KeyError, match="no in-flight count"):
        inflight.loads_in_flight("nope", None, None)
    with pytest.raises(KeyError, match="no representative"):
        inflight.representative_variant("nope")


@pytest.mark.parametrize("name", sorted(registry.modelled()))
def test_threads_match_the_cubin(name):
    """The CTA size the compiled kernel declares (``.reqntid``) is the one counted."""
    from cute_utils.sass import compile_options, cubin_of, resource_usage

    variant = inflight.representative_variant(name)
    config = _config(name, variant)
    compiled = registry.entry(name).compile(variant, ARCH, config=config, options=compile_options(ARCH))
    (usage,) = resource_usage(cubin_of(compiled)).values()
    assert usage["threads"] == (inflight.loads_in_flight(name, variant, config).threads, 1, 1)
