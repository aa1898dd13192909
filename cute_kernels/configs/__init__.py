"""Launch configs per GPU arch: ``sm90`` (Hopper) and ``sm100`` (Blackwell), one function per kernel
(named as in ``cute_kernels.registry``) taking the variant and returning its config, each choice
with a one-line reason and the note that measured it. ``sm90`` has every kernel's; ``sm100`` only
the choices it makes differently (:func:`pick` falls back to ``sm90`` for the rest).

Kernels whose best config depends on the shape also have ``<kernel>_for_shape(variant, shape_class,
tuned)`` there: ``shape_class`` a string the binding derives from the call (``"bfloat16/k2048"``),
``tuned`` the entry of the per-device table ``tuned.json`` (written by ``python -m bench.tune KERNEL
--write``: ``{kernel: {arch: {device name: {shape class: config fields}}}}``) or None, when the
function falls back to its heuristic. The candidates that tuner sweeps are declared in ``spaces``."""

from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path
from typing import Any

_MODULES = {"sm_90a": "sm90", "sm_100a": "sm100"}
#: The arch whose configs an arch takes where its own module does not state one.
_FALLBACK = {"sm_100a": "sm_90a"}


def _function(name: str, arch: str) -> Any:
    """The function ``name`` of ``arch``'s config module, else of the arch it falls back to; never
    for an arch the kernel does not compile for (``Kernel.archs``)."""
    if arch not in _MODULES:
        raise ValueError(f"no configs for arch {arch!r} (known: {', '.join(_MODULES)})")
    asked = arch
    while True:
        module = importlib.import_module(f"{__name__}.{_MODULES[arch]}")
        function = getattr(module, name, None)
        if function is not None:
            if arch != asked:
                _check_arch(name, asked)
            return function
        if arch not in _FALLBACK:
            raise AttributeError(f"no config function {name!r} for {arch} in {module.__name__}")
        arch = _FALLBACK[arch]


def _check_arch(name: str, arch: str) -> None:
    """A fallback config only for a kernel that compiles for ``arch`` (``name`` a registry kernel,
    or ``<kernel>_for_shape``)."""
    from cute_kernels import registry

    entry = registry.KERNELS.get(name.removesuffix("_for_shape"))
    if entry is not None and arch not in entry.kernel_class().archs:
        raise ValueError(f"kernel {entry.name!r} does not compile for {arch}: it has no config there")


def pick(kernel: str, variant: Any, arch: str) -> Any:
    """The config of ``kernel``'s ``variant`` on ``arch`` (``"sm_90a"`` or ``"sm_100a"``): the arch
    module's function ``kernel``, or, where ``sm100`` states none, ``sm90``'s."""
    return _function(kernel, arch)(variant)


#: The per-device table ``python -m bench.tune KERNEL --write`` merges into.
TUNED_TABLE = Path(__file__).with_name("tuned.json")


@functools.cache
def _tuned() -> dict:
    return json.loads(TUNED_TABLE.read_text()) if TUNED_TABLE.exists() else {}


def tuned_entry(kernel: str, arch: str, device: str, shape_class: str) -> dict | None:
    """The tuned config fields of ``kernel`` for ``shape_class`` on the device named ``device``
    (``torch.cuda.get_device_name()``), or None when the table has none."""
    return _tuned().get(kernel, {}).get(arch, {}).get(device, {}).get(shape_class)


def pick_for_shape(kernel: str, variant: Any, arch: str, device: str, shape_class: str) -> Any:
    """The config of ``kernel``'s ``variant`` for ``shape_class`` on ``device`` (an ``arch`` GPU):
    the tuned table's entry, else the arch module's heuristic."""
    function = _function(f"{kernel}_for_shape", arch)
    return function(variant, shape_class, tuned_entry(kernel, arch, device, shape_class))
