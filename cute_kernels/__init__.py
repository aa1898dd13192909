"""CuTeDSL kernels of cute-kernels, one module per kernel, each with its config space.

``sass_targets()`` is the registry ``python -m cute_utils.sass`` and the CI SASS tests compile:
target name -> function(arch) returning a ``cute.compile`` result that keeps its cubin. Each kernel
module contributes its variants through its own ``sass_targets()``.
"""

import importlib
from collections.abc import Callable

#: Kernel modules that register SASS targets (each defines ``sass_targets() -> dict``).
KERNEL_MODULES = ("swizzle", "quantize", "pad", "quantize_32x1", "quantize_tma", "quantize_dual")


def sass_targets() -> dict[str, Callable[[str], object]]:
    """Every kernel variant of the toolkit, compiled for inspection on a chosen arch."""
    targets: dict[str, Callable[[str], object]] = {}
    for name in KERNEL_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
            continue  # kernel not written yet
        targets.update(module.sass_targets())
    return targets
