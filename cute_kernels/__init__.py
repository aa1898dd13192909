"""CuTeDSL kernels of cute-kernels, one module per kernel, each with its config space.

``sass_targets()`` is the registry ``python -m cute_utils.sass`` and the CI SASS tests compile:
target name -> function(arch) returning a ``cute.compile`` result that keeps its cubin.
"""

from collections.abc import Callable


def sass_targets() -> dict[str, Callable[[str], object]]:
    """Every kernel variant of the toolkit, compiled for inspection on a chosen arch."""
    from cute_utils.sass import compile_options

    from .swizzle import compile_swizzle, variants

    def swizzle_target(layout, rank: int, word_loads: bool) -> Callable[[str], object]:
        return lambda arch: compile_swizzle(layout, arch, rank, word_loads, options=compile_options(arch))

    return {
        f"swizzle_{layout.value}_{rank}d{'_words' if word_loads else ''}": swizzle_target(
            layout, rank, word_loads
        )
        for layout, rank, word_loads in variants()
    }
