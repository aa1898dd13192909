"""CuTeDSL kernels of cute-kernels: one kernel class per module, found through one registry.

``cute_kernels.registry`` lists every kernel (name, module, class, production or experimental);
each class carries its variants, fake arguments, compile and limits (``cute_kernels.base``), and
its launch configs live per arch in ``cute_kernels.configs``. ``sass_targets()`` is what
``python -m cute_utils.sass`` and the CI SASS tests compile: target name -> function(arch) returning
a ``cute.compile`` result that keeps its cubin. Importing this package imports no DSL.
"""

from collections.abc import Callable

from .registry import KERNELS, entry


def sass_targets() -> dict[str, Callable[[str], object]]:
    """Every variant of every registered kernel (experimental ones included), compiled for
    inspection on a chosen arch."""
    from .registry import sass_targets as _targets

    return _targets()


__all__ = ["KERNELS", "entry", "sass_targets"]
