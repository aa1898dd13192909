"""The shape every kernel class has (after CUTLASS's CuTeDSL examples).

A kernel class is built from one *variant* (a frozen dataclass of compile-time choices: dtype,
layout, vector width, ...) and one *config* (launch shape: threads, stages, register cap, ...):

- ``variants()``: every variant the bindings may ask for; ``target_name(variant)``: its SASS name;
- ``default_config(variant, arch)``: the arch's choice, from ``cute_kernels.configs``;
- ``fake_arguments(variant)``: the symbolic tensors it compiles against (sizes symbolic: one
  compile per variant and arch, never per shape);
- ``__call__`` (``@cute.jit``, the host launcher) and ``kernel`` (``@cute.kernel``); a class whose
  variants differ in their arguments returns another ``@cute.jit`` method from ``launcher()``;
- ``can_implement(...)``: the limits a caller checks before launching;
- ``shared_bytes(variant, config)`` and ``loads_in_flight(variant, config, cols)``: the resources
  one CTA takes, stated next to the code that allocates and issues them (the bytes-in-flight
  model, ``cute_kernels.model``, asks the classes).

:meth:`Kernel.compile` ties them together; the registry (``cute_kernels.registry``) calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from cute_utils.jit import compile_tvm_ffi

#: Threads per warp.
WARP = 32


@dataclass(frozen=True)
class LoadsInFlight:
    """``threads``: threads per CTA; ``bytes_per_cta``: bytes of x (the input the kernel streams,
    at its own dtype's size) one CTA has requested and not yet consumed once every warp is in its
    steady-state loop (small loads: group offsets, amax and scale words, are left out);
    ``derivation``: one line saying how that product was formed."""

    threads: int
    bytes_per_cta: int
    derivation: str


def ring_units_in_flight(stages: int) -> int:
    """Units of a ``cp.async`` / TMA ring in flight while one converts: ``stages - 1``, or the one
    tile a single-stage ring issues and then waits for."""
    return max(stages - 1, 1)


class Kernel:
    """Base of the kernel classes: the compile path shared by all. Subclasses set :attr:`name` and
    define the methods listed in the module docstring."""

    #: Registry name (``cute_kernels.registry``); also the configs' function name.
    name: ClassVar[str] = ""
    #: The archs the kernel compiles for (an sm_90a-only kernel, e.g. wgmma, says so here; the
    #: SASS tool and tests build it for these alone).
    archs: ClassVar[tuple[str, ...]] = ("sm_90a", "sm_100a")

    def __init__(self, variant: Any, config: Any) -> None:
        self.variant = variant
        self.config = config

    @classmethod
    def variants(cls) -> list:
        raise NotImplementedError

    @classmethod
    def target_name(cls, variant: Any) -> str:
        raise NotImplementedError

    @classmethod
    def fake_arguments(cls, variant: Any) -> tuple:
        raise NotImplementedError

    @classmethod
    def shared_bytes(cls, variant: Any, config: Any) -> int:
        """Dynamic shared memory one CTA takes, in bytes, where ``config`` sizes it (rings): the
        size of the ``@cute.struct`` the kernel allocates, never a recount of its allocations; 0
        where it is small or not modelled (occupancy estimates, ``cute_kernels.model``)."""
        return 0

    @classmethod
    def loads_in_flight(cls, variant: Any, config: Any, cols: int) -> LoadsInFlight:
        """Threads per CTA and bytes of x one CTA keeps in flight (:class:`LoadsInFlight`) for
        ``variant`` under ``config``, counted from what the kernel issues before it waits for the
        first of those loads; ``cols``: K, the row width in elements of x, where the count depends
        on it. Defined by the bandwidth-bound kernels (``registry.modelled()``)."""
        raise NotImplementedError(f"kernel {cls.name!r} states no loads in flight")

    def launcher(self) -> Any:
        """What ``cute.compile`` traces: the object itself (its ``__call__``), unless a variant
        takes other arguments and the class returns another ``@cute.jit`` method of it."""
        return self

    @classmethod
    def default_config(cls, variant: Any, arch: str) -> Any:
        """The config ``cute_kernels.configs`` picks for ``variant`` on ``arch``."""
        from . import configs

        return configs.pick(cls.name, variant, arch)

    @classmethod
    def compile(cls, variant: Any, arch: str, *, config: Any = None, options: str = "") -> Any:
        """``cute.compile`` the launcher of ``variant`` for ``arch`` with TVM-FFI on the env stream;
        ``options`` are appended (``cute_utils.sass.compile_options`` keeps the cubin). ``ValueError``
        for an arch not in :attr:`archs`."""
        if arch not in cls.archs:
            raise ValueError(f"{cls.name} compiles for {', '.join(cls.archs)} only, not {arch}")
        kernel = cls(variant, config if config is not None else cls.default_config(variant, arch))
        return compile_tvm_ffi(kernel.launcher(), cls.fake_arguments(variant), arch, options)
