"""Per-device kernel tables for the eager fast path of every public op.

``backend.select`` (device type, capability, DSL import) runs on a device's first kernel call;
after that the device's :class:`DeviceTarget` (its arch, SM count and the compiled kernels already
used there, keyed by each binding's own small keys) is found with one dict lookup on
``tensor.get_device()``, and eager calls skip the selection. ``"auto"`` and ``"cute"`` both pick the
kernel wherever it can run, so a registered device means the kernel runs there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cute_kernels import registry

from . import backend as _backend
from .kernel_cache import get_kernel, on_clear

_OUTPUT_DTYPES = (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float32)


class DeviceTarget:
    """A CUDA device the kernels run on: ``arch`` ("sm_90a" / "sm_100a"), ``num_sms``, ``name``
    (``torch.cuda.get_device_name``: the tuned tables' key), ``device`` (its ``torch.device``: the
    fast paths compare other tensors' devices with it), ``e4m3`` / ``e8m0`` / ``f32`` (empty tensors
    of the output dtypes there, whose ``new_empty`` allocates outputs) and ``kernels`` (binding key ->
    TVM-FFI callable, filled by :meth:`kernel`; a binding may also keep a tuple of callables it
    launches together under a key of its own whose first item is no registry name)."""

    __slots__ = ("arch", "num_sms", "name", "device", "kernels", "e4m3", "e8m0", "f32")

    def __init__(self, arch: str, num_sms: int, name: str = "", device: torch.device | None = None) -> None:
        self.arch = arch
        self.num_sms = num_sms
        self.name = name
        self.device = device
        # Empty tensors of the output dtypes on the device: ``target.e4m3.new_empty(rows, cols)``
        # allocates without a dtype argument to parse (cheaper than ``x.new_empty(..., dtype=)``;
        # notes/host-overhead.md).
        self.e4m3, self.e8m0, self.f32 = (
            (None, None, None)
            if device is None
            else tuple(torch.empty(0, dtype=d, device=device) for d in _OUTPUT_DTYPES)
        )
        self.kernels: dict[object, Callable | tuple] = {}

    def kernel(
        self,
        key: tuple,
        variant_of: Callable[[tuple, DeviceTarget], object],
        config_of: Callable[[tuple, object, DeviceTarget], object] | None = None,
    ) -> Callable:
        """The compiled kernel for the binding's ``key`` (a small ``NamedTuple`` of the kernel's
        static choices whose first field, ``kernel``, is its ``cute_kernels.registry`` name): from
        this table, else the registry entry compiles ``variant_of(key, self)`` (the key class's
        ``variant`` method) for this arch through ``kernel_cache.get_kernel`` (memory, disk, then a
        compile), with the arch's default config or ``config_of(key, variant, self)`` (kernels tuned
        per shape class)."""
        kernel = self.kernels.get(key)
        if kernel is None:
            variant = variant_of(key, self)
            config = None if config_of is None else config_of(key, variant, self)
            kernel = self.kernels[key] = compiled(key[0], variant, self.arch, config)
        return kernel


def compiled(name: str, variant: object, arch: str, config: object = None) -> Callable:
    """Registry kernel ``name``'s ``variant`` for ``arch`` (with ``config``, else the arch's
    default) as a TVM-FFI callable (memory, disk, then ``cute.compile``)."""
    key = (name, variant, arch) if config is None else (name, variant, arch, config)
    return get_kernel(key, lambda: registry.entry(name).compile(variant, arch, config=config))


_targets: dict[int, DeviceTarget] = {}
on_clear(lambda: [target.kernels.clear() for target in _targets.values()])


def known(tensor: torch.Tensor) -> DeviceTarget | None:
    """The target of ``tensor``'s device if a kernel already ran there (CPU tensors: ``None``)."""
    return _targets.get(tensor.get_device())


def target(device: torch.device, arch: str) -> DeviceTarget:
    """The target of CUDA ``device`` (registered on first use) after ``backend.select`` gave ``arch``."""
    index = _backend.cuda_index(device)
    found = _targets.get(index)
    if found is None:
        found = _targets[index] = DeviceTarget(
            arch,
            _backend.num_sms(index),
            torch.cuda.get_device_properties(index).name,
            torch.device("cuda", index),
        )
    return found


def select(op: str, backend: str, tensor: torch.Tensor) -> DeviceTarget | None:
    """``backend.select`` as a target: ``None`` when the reference runs."""
    arch = _backend.select(op, backend, tensor.device)
    return None if arch is None else target(tensor.device, arch)
