"""Every config of the shipped per-device table (``cute_kernels/configs/tuned.json``) is one the
bindings can launch: it builds for its arch without local memory (the tuners skip spilling
configs; this holds them to it after a DSL or kernel change), and its shape class is one the
bindings produce."""

from __future__ import annotations

import re

import pytest

from cute_kernels import configs

#: shape-class formats per kernel (torch_bindings.quantize_fp8: k_class, col_shape_class;
#: torch_bindings.swiglu: swiglu_shape_class)
_CLASS = {
    "swiglu_fp8": re.compile(r"(fwd|bwd)/h(\d+)$"),
    "quantize_fp8_row": re.compile(r"(bfloat16|float32)/k(\d+)$"),
    "quantize_fp8_col_amax": re.compile(r"(bfloat16|float32)/(plain|groups|experts)(\+dual)?/k(\d+)/g(\d+)$"),
    "quantize_fp8_col_cast": re.compile(r"(bfloat16|float32)/(plain|groups|experts)(\+dual)?/k(\d+)/g(\d+)$"),
}


def _entries() -> list[tuple[str, str, str, str, dict]]:
    return [
        (kernel, arch, device, shape_class, fields)
        for kernel, per_arch in configs._tuned().items()
        for arch, per_device in per_arch.items()
        for device, per_class in per_device.items()
        for shape_class, fields in per_class.items()
    ]


def _variant(kernel: str, shape_class: str):
    """The variant a tuned entry applies to: the tuners measure bf16 with vector loads and stores."""
    match = _CLASS[kernel].match(shape_class)
    if kernel == "swiglu_fp8":
        from cute_kernels.swiglu import SwigluVariant

        return SwigluVariant(match[1])  # its twins: _twins
    if kernel == "quantize_fp8_row":
        from cute_kernels.quantize_fp8 import Fp8RowVariant

        return Fp8RowVariant(match[1])
    from cute_kernels.quantize_fp8_col import Fp8ColVariant

    return Fp8ColVariant(match[1], match[2], dual=bool(match[3]))


def test_shape_classes_are_the_bindings():
    from torch_bindings.quantize_fp8 import col_shape_class, group_bucket, k_class
    from torch_bindings.swiglu import swiglu_shape_class

    for kernel, _, _, shape_class, _ in _entries():
        match = _CLASS[kernel].match(shape_class)
        assert match, (kernel, shape_class)
        if kernel == "swiglu_fp8":
            assert swiglu_shape_class(match[1], int(match[2])) == shape_class
            continue
        k = int(match[2] if kernel == "quantize_fp8_row" else match[4])
        assert k_class(k) == k
        if kernel != "quantize_fp8_row":
            groups = int(match[5])
            assert group_bucket(groups) == groups
            assert col_shape_class(match[1], match[2], k, groups, bool(match[3])) == shape_class


def _twins(variant) -> list:
    """The variants an entry measured on ``variant`` also serves: SwiGLU's exact-scale and bounded
    twins take the vector variant's entry."""
    from dataclasses import replace

    from cute_kernels.swiglu import SwigluVariant

    if not isinstance(variant, SwigluVariant):
        return [variant]
    return [replace(variant, round_pow2=p, bounded=b) for p in (True, False) for b in (False, True)]


@pytest.mark.parametrize("kernel", sorted(_CLASS))
def test_tuned_configs_build_without_local_memory(kernel):
    from cute_utils.sass import compile_options, cubin_of, resource_usage

    built = {}
    from cute_kernels import registry

    cls = registry.entry(kernel).kernel_class()
    for name, arch, device, shape_class, fields in _entries():
        if name != kernel:
            continue
        for variant in _twins(_variant(kernel, shape_class)):
            config = configs.pick_for_shape(kernel, variant, arch, device, shape_class)  # what binds
            assert config == type(config)(**fields), (device, shape_class, variant, config, fields)
            if (variant, config, arch) in built:
                continue
            cubin = cubin_of(cls.compile(variant, arch, config=config, options=compile_options(arch)))
            usage = resource_usage(cubin)
            built[variant, config, arch] = usage
            assert not any(f["local_bytes"] for f in usage.values()), (device, shape_class, variant, usage)
    assert built, f"no tuned entries for {kernel}"


def test_the_bindings_launch_the_tuned_column_configs(monkeypatch):
    """``torch_bindings.quantize_fp8._col_passes`` asks for the tuned entry of the call's class: a
    (K, G) of each tuned class on each device gets that entry's configs for both passes."""
    import torch

    from torch_bindings import quantize_fp8, targets

    monkeypatch.setattr(targets, "compiled", lambda name, variant, arch, config=None: (name, variant, config))
    for kernel, arch, device, shape_class, fields in _entries():
        match = _CLASS[kernel].match(shape_class)
        if kernel != "quantize_fp8_col_cast" or arch != "sm_90a":
            continue
        dtype, layout, dual, k, groups = match[1], match[2], bool(match[3]), int(match[4]), int(match[5])
        cols, g = k - k // 8, max(groups - 1, 1)  # another K and G of the class
        target = targets.DeviceTarget(arch, 132, device)
        key = quantize_fp8.ColPassesKey(getattr(torch, dtype), layout, True, True, dual, cols, g)
        passes = quantize_fp8._col_passes(target, key)
        (_, _, amax_config), (_, variant, cast_config) = passes
        assert (variant.layout, variant.dual) == (layout, dual)
        assert cast_config == type(cast_config)(**fields), (device, shape_class)
        amax_fields = configs.tuned_entry("quantize_fp8_col_amax", arch, device, shape_class)
        assert amax_config == type(amax_config)(**amax_fields), (device, shape_class)
        if layout == "groups" and not dual:  # the cast into padded groups takes the grouped entries
            padded = key._replace(layout=quantize_fp8.PADDED)
            (_, amax_variant, pad_amax), (name, variant, pad_cast) = quantize_fp8._col_passes(target, padded)
            assert (name, variant.layout, amax_variant.layout) == (
                "quantize_fp8_col_pad_cast",
                "padded",
                "groups",
            )
            assert (pad_cast, pad_amax) == (cast_config, amax_config), (device, shape_class)
