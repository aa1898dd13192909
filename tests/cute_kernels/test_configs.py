"""``cute_kernels.configs``: ``sm100`` states only its own choices and ``pick`` falls back to
``sm90`` for the rest (CPU: the configs are Python; no compile)."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("cutlass")

from cute_kernels import configs, registry  # noqa: E402
from cute_kernels.configs import sm90, sm100  # noqa: E402


def test_sm100_states_only_its_own_choices():
    own = {name for name, f in vars(sm100).items() if inspect.isfunction(f)}
    assert own == {"swizzle", "quantize_fp8_row", "quantize_fp8_row_for_shape"}
    assert all(f.__module__ == sm100.__name__ for name, f in vars(sm100).items() if name in own)
    assert not hasattr(sm100, "sm90")  # no re-export list


@pytest.mark.parametrize("name", sorted(registry.KERNELS))
def test_pick_falls_back_to_sm90(name):
    blackwell = "sm_100a" in registry.entry(name).kernel_class().archs
    for variant in registry.entry(name).variants()[:4]:
        hopper = configs.pick(name, variant, "sm_90a")
        assert hopper == getattr(sm90, name)(variant)
        own = getattr(sm100, name, None)
        if blackwell:
            assert configs.pick(name, variant, "sm_100a") == (own or getattr(sm90, name))(variant)
        else:  # an sm_90a-only kernel (wgmma) has no sm_100a config to fall back to
            with pytest.raises(ValueError, match="does not compile for sm_100a"):
                configs.pick(name, variant, "sm_100a")


def test_sm100_overrides_come_with_their_shape_functions():
    """Where sm100 states a kernel's config and sm90 picks it per shape, sm100 states the per-shape
    choice too (else ``pick_for_shape`` would bypass the sm100 choice through sm90's)."""
    for name, function in vars(sm100).items():
        if inspect.isfunction(function) and hasattr(sm90, f"{name}_for_shape"):
            assert hasattr(sm100, f"{name}_for_shape"), name


def test_pick_for_shape_falls_back_to_sm90():
    from cute_kernels.quantize_fp8_col import Fp8ColVariant

    variant, shape_class = Fp8ColVariant("bfloat16", "groups"), "bfloat16/groups/k8192/g8"
    for kernel in ("quantize_fp8_col_amax", "quantize_fp8_col_cast"):
        fallback = getattr(sm90, f"{kernel}_for_shape")(variant, shape_class, None)
        assert configs.pick_for_shape(kernel, variant, "sm_100a", "no such device", shape_class) == fallback


def test_unknown_arch_and_kernel():
    with pytest.raises(ValueError, match="no configs for arch"):
        configs.pick("swizzle", None, "sm_80")
    with pytest.raises(AttributeError, match="no config function 'nope'"):
        configs.pick("nope", None, "sm_100a")
