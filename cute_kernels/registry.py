"""The one registry of the toolkit's kernels: every consumer (bindings, SASS tool, tests, benches,
tuners) finds a kernel here by name.

An entry names the kernel's module and class; nothing is imported until a kernel is compiled or
listed, so the bindings import this module on machines without the DSL. Each kernel class (see
:class:`cute_kernels.base.Kernel`) carries its variants, fake arguments, per-arch config, compile
and limits; :func:`sass_targets` turns every variant of every entry into a named SASS target.

Adding a kernel: one class (``cute_kernels/<module>.py``), one entry in :data:`KERNELS`, its config in
``cute_kernels/configs/sm90.py`` (and ``sm100.py`` only where Blackwell's differs), one binding
function.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KernelEntry:
    """``name``: registry key and SASS-target prefix; ``module`` / ``class_name``: where the kernel
    class lives; ``production``: whether a public op runs it (experimental kernels are compiled and
    inspected, never launched by the bindings); ``bandwidth_bound``: whether it streams memory at a
    copy's speed, so the bytes-in-flight model (``cute_kernels.inflight``, ``cute_kernels.model``)
    covers it (the EP routing kernels move a few bytes per pair and are not modelled)."""

    name: str
    module: str
    class_name: str
    production: bool = True
    bandwidth_bound: bool = True

    def kernel_class(self) -> Any:
        """The kernel class (imports the DSL)."""
        return getattr(importlib.import_module(self.module), self.class_name)

    def variants(self) -> list:
        """Every compile-time variant the bindings (or, experimental, the benches) may ask for."""
        return self.kernel_class().variants()

    def compile(self, variant: Any, arch: str, *, config: Any = None, options: str = "") -> Any:
        """``cute.compile`` one variant for ``arch`` (TVM-FFI, env stream); ``config`` defaults to the
        arch's (``cute_kernels.configs``)."""
        return self.kernel_class().compile(variant, arch, config=config, options=options)

    def sass_targets(self) -> dict[str, Callable[[str], object]]:
        """``{target name: build(arch)}`` for every variant, compiled with the cubin kept; each build
        carries ``archs``, the archs the kernel compiles for (``Kernel.archs``)."""
        cls = self.kernel_class()

        def build(variant: Any) -> Callable[[str], object]:
            def compile_for(arch: str) -> object:
                from cute_utils.sass import compile_options

                return cls.compile(variant, arch, options=compile_options(arch))

            compile_for.archs = cls.archs
            return compile_for

        return {cls.target_name(v): build(v) for v in cls.variants()}


KERNELS: dict[str, KernelEntry] = {
    entry.name: entry
    for entry in (
        KernelEntry("swizzle", "cute_kernels.swizzle", "SwizzleKernel"),
        KernelEntry("quantize_1x32", "cute_kernels.quantize", "Quantize1x32Kernel"),
        KernelEntry("quantize_32x1", "cute_kernels.quantize_32x1", "Quantize32x1Kernel"),
        KernelEntry("quantize_dual", "cute_kernels.quantize_dual", "QuantizeDualKernel"),
        KernelEntry("pad", "cute_kernels.pad", "PadKernel"),
        KernelEntry("unpad", "cute_kernels.pad", "UnpadKernel"),
        KernelEntry("row_scatter", "cute_kernels.row_scatter", "RowScatterKernel"),
        KernelEntry("combine_sum", "cute_kernels.combine_sum", "CombineSumKernel"),
        KernelEntry("ep_send", "cute_kernels.ep_send", "QuantizeScatterKernel"),
        KernelEntry("ep_route", "cute_kernels.ep_route", "EpRouteKernel", bandwidth_bound=False),
        KernelEntry("ep_layout", "cute_kernels.ep_route", "EpLayoutKernel", bandwidth_bound=False),
        KernelEntry("ep_zero_fill", "cute_kernels.ep_route", "EpZeroFillKernel", bandwidth_bound=False),
        KernelEntry("quantize_fp8_row", "cute_kernels.quantize_fp8", "Fp8RowKernel"),
        KernelEntry("quantize_fp8_col_amax", "cute_kernels.quantize_fp8_col", "Fp8ColAmaxKernel"),
        KernelEntry("quantize_fp8_col_cast", "cute_kernels.quantize_fp8_col", "Fp8ColCastKernel"),
        KernelEntry("quantize_fp8_col_pad_cast", "cute_kernels.quantize_fp8_col", "Fp8ColPadCastKernel"),
        KernelEntry("swiglu_fp8", "cute_kernels.swiglu", "SwigluFp8Kernel"),
        KernelEntry("dequantize_fp8_rows", "cute_kernels.dequant_fp8", "DequantFp8RowsKernel"),
        KernelEntry("quantize_tma", "cute_kernels.experimental.quantize_tma", "QuantizeTmaKernel", False),
        KernelEntry(
            "grouped_gemm_sm90", "cute_kernels.grouped_gemm_sm90", "GroupedGemmSm90Kernel", True, False
        ),
    )
}


def entry(name: str) -> KernelEntry:
    """The entry called ``name``; ``KeyError`` naming the registered kernels otherwise."""
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"no kernel {name!r} in the registry (registered: {', '.join(KERNELS)})") from None


def modelled() -> list[str]:
    """Names of the kernels the bytes-in-flight model covers (``KernelEntry.bandwidth_bound``)."""
    return [name for name, kernel in KERNELS.items() if kernel.bandwidth_bound]


def sass_targets() -> dict[str, Callable[[str], object]]:
    """Every variant of every registered kernel as a SASS target: name -> build(arch)."""
    targets: dict[str, Callable[[str], object]] = {}
    for kernel in KERNELS.values():
        targets.update(kernel.sass_targets())
    return targets
