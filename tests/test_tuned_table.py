"""Every config of the shipped per-device table (``cute_kernels/configs/tuned.json``) is one the
bindings can launch: it builds for its arch without local memory (the tuners skip spilling
configs; this holds them to it after a DSL or kernel change), and its shape class is one the
bindings produce."""

from __future__ import annotations

import re

import pytest

from cute_kernels import configs

#: shape-class formats per kernel (torch_bindings.quantize_fp8: k_class, col_shape_class)
_CLASS = {
    "quantize_fp8_row": re.compile(r"(bfloat16|float32)/k(\d+)$"),
    "quantize_fp8_col_amax": re.compile(r"(bfloat16|float32)/(plain|groups|experts)/k(\d+)/g(\d+)$"),
    "quantize_fp8_col_cast": re.compile(r"(bfloat16|float32)/(plain|groups|experts)/k(\d+)/g(\d+)$"),
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
    if kernel == "quantize_fp8_row":
        from cute_kernels.quantize_fp8 import Fp8RowVariant

        return Fp8RowVariant(match[1])
    from cute_kernels.quantize_fp8_col import Fp8ColVariant

    return Fp8ColVariant(match[1], match[2])


def test_shape_classes_are_the_bindings():
    from torch_bindings.quantize_fp8 import col_shape_class, group_bucket, k_class

    for kernel, _, _, shape_class, _ in _entries():
        match = _CLASS[kernel].match(shape_class)
        assert match, (kernel, shape_class)
        k = int(match[2] if kernel == "quantize_fp8_row" else match[3])
        assert k_class(k) == k
        if kernel != "quantize_fp8_row":
            assert group_bucket(int(match[4])) == int(match[4])
            assert col_shape_class(match[1], match[2], k, int(match[4])) == shape_class


@pytest.mark.parametrize("kernel", sorted(_CLASS))
def test_tuned_configs_build_without_local_memory(kernel):
    from cute_utils.sass import compile_options, cubin_of, resource_usage

    built = {}
    from cute_kernels import registry

    cls = registry.entry(kernel).kernel_class()
    for name, arch, device, shape_class, fields in _entries():
        if name != kernel:
            continue
        variant = _variant(kernel, shape_class)
        config = configs.pick_for_shape(kernel, variant, arch, device, shape_class)  # what binds
        assert config == type(config)(**fields), (device, shape_class, config, fields)
        if (variant, config, arch) in built:
            continue
        cubin = cubin_of(cls.compile(variant, arch, config=config, options=compile_options(arch)))
        usage = resource_usage(cubin)
        built[variant, config, arch] = usage
        assert not any(f["local_bytes"] for f in usage.values()), (device, shape_class, config, usage)
    assert built, f"no tuned entries for {kernel}"
