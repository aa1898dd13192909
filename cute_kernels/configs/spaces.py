"""The config spaces the tuner sweeps (``python -m bench.tune KERNEL``), per registry kernel.

A space is a named list of candidate configs: ``"default"`` is what a plain run sweeps, ``"quick"``
(where given) what ``--quick`` sweeps, and other names are chosen with ``--space NAME`` (the
fused-padding variant's grid sizes, the K-groups grid sizes, the whole pad grid). The first config
of a space is the one the others' output bytes are checked against. The chosen configs themselves
live in ``sm90.py`` / ``sm100.py`` (or, per shape class, in the tuned table ``tuned.json``).

Imports the kernel modules (the DSL) when a space is asked for, not before.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

#: The name of the space a plain run sweeps.
DEFAULT = "default"


def _swizzle() -> dict[str, list]:
    from cute_kernels.swizzle import SwizzleConfig

    default = [  # the window at 4 CTAs per SM, with and without the grouped layouts' L2 prefetch
        SwizzleConfig(threads=256, window_cols=w, ctas_per_sm=4, prefetch=p)
        for p, w in itertools.product((True, False), (64, 128))
    ]
    return {DEFAULT: default, "quick": default[:2]}


def _quantize_1x32() -> dict[str, list]:
    from cute_kernels.quantize import QuantizeConfig

    grid = [(2, 3, 16384, 1), (2, 3, 8192, 4), (2, 3, 16384, 4), (2, 3, 32768, 4), (4, 3, 16384, 4)]
    grid += [(2, 4, 16384, 4), (2, 3, 16384, 2)]
    default = [
        QuantizeConfig(batch_vectors=b, stages=s, target_ctas=t, max_groups=64, warp_tiles=w)
        for b, s, t, w in grid
    ]
    padded = [  # the fused-padding variant: grid size, CTAs numbered run-fastest
        QuantizeConfig(target_ctas=t, max_groups=64, warp_tiles=4, chunk_major=True)
        for t in (32768, 4096, 2048, 1024)
    ]
    return {DEFAULT: default, "quick": default[:2], "padded": padded}


def _quantize_32x1() -> dict[str, list]:
    from cute_kernels.quantize_32x1 import Quantize32x1Config

    default = [
        Quantize32x1Config(),
        Quantize32x1Config(min_ctas_per_sm=0),
        Quantize32x1Config(pair_stores=False),
        *(Quantize32x1Config(target_ctas=t) for t in (4096, 65536)),  # the default: 32768
    ]
    groups = [Quantize32x1Config(target_ctas=t) for t in (32768, 16384, 8192, 4096, 2048)]
    return {DEFAULT: default, "quick": default[:2], "groups": groups}


def _quantize_dual() -> dict[str, list]:
    from cute_kernels.quantize_dual import DualConfig

    default = [
        DualConfig(stages=s, tiles_per_cta=n) for s, n in ((1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (2, 8))
    ]
    default.append(DualConfig(stages=1, tiles_per_cta=1, spread_rows=False))
    return {DEFAULT: default, "quick": default[:2]}


def _pad() -> dict[str, list]:
    from cute_kernels.pad import PadConfig

    default = [
        PadConfig(),
        PadConfig(items_per_warp=1),
        PadConfig(items_per_warp=4),
        PadConfig(vectors_per_lane=8, items_per_warp=1),
        PadConfig(threads=256, ctas_per_sm=4, items_per_warp=1),
        PadConfig(threads=256, ctas_per_sm=4),
    ]
    full = [
        PadConfig(threads=t, vectors_per_lane=v, ctas_per_sm=2048 // t, items_per_warp=i)
        for t, v, i in itertools.product((128, 256, 512), (2, 4, 8), (1, 2, 4))
    ]
    return {DEFAULT: default, "full": full}


def _quantize_tma() -> dict[str, list]:
    from cute_kernels.experimental.quantize_tma import TmaQuantizeConfig

    grid = [  # box rows, stages, warps along K, target CTAs, TMA store stages (0: 8-byte STG of q)
        (8, 3, 4, 32768, 2),
        (8, 3, 4, 32768, 0),
        (8, 4, 4, 32768, 2),
        (4, 4, 4, 32768, 2),
        (4, 6, 4, 32768, 3),
        (16, 3, 4, 32768, 2),
        (16, 2, 4, 32768, 2),
        (16, 3, 4, 32768, 0),
        (32, 2, 4, 16384, 2),
        (8, 3, 1, 32768, 2),
        (8, 3, 4, 8192, 2),
    ]
    default = [
        TmaQuantizeConfig(box_rows=b, stages=s, warp_tiles=w, target_ctas=t, store_stages=q)
        for b, s, w, t, q in grid
    ]
    return {DEFAULT: default, "quick": default[:2] + default[3:4] + default[5:6]}


def _quantize_fp8_row() -> dict[str, list]:
    from cute_kernels.quantize_fp8 import Fp8RowConfig

    whole_cta = [  # a whole CTA per row (the tuned kind)
        Fp8RowConfig(threads=t, unroll=u, ctas_per_sm=1, row_per_cta=True)
        for t, u in itertools.product((128, 256, 512, 1024), (1, 2, 4, 8))
    ]
    per_warp = [
        Fp8RowConfig(threads=t, unroll=u, ctas_per_sm=1) for t, u in itertools.product((256, 512), (8, 16))
    ]
    return {DEFAULT: whole_cta + per_warp, "quick": whole_cta}


def _quantize_fp8_col_amax() -> dict[str, list]:
    from cute_kernels.quantize_fp8_col import Fp8ColAmaxConfig

    return {DEFAULT: [Fp8ColAmaxConfig(t, 4) for t in (4096, 8192, 16384)]}


def _quantize_fp8_col_cast() -> dict[str, list]:
    from cute_kernels.quantize_fp8_col import Fp8ColCastConfig

    return {DEFAULT: [Fp8ColCastConfig(32768, c, b) for c, b in itertools.product((2, 3, 4), (1, 2))]}


def _grouped_gemm_sm90() -> dict[str, list]:
    """The sm_90a grouped GEMM's tile widths and ring depths that fit 227 KiB of shared memory
    (``GroupedGemmSm90Kernel.shared_bytes``), at CUTLASS's register split. The 2d2d boxes'
    alignment stays 128: another ``reduction_align`` moves where the wgrad's k-blocks split each
    group, so its fp32 sums round differently and the tuner's same-bytes check cannot hold (16 was
    slower as well: notes/grouped-gemm-sm90.md). Each compiles for sm_90a at the 168 registers
    the split needs (``GroupedGemmConfig.launch_registers``; tile_n = 64 builds at 77 and would hang
    in ``setmaxregister``: left out). Clusters of two, and the default tile without a cluster."""
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmConfig

    grid = [(256, 3), (192, 4), (128, 4), (128, 5), (128, 3)]
    default = [GroupedGemmConfig(tile_n=n, stages=s, cluster=2) for n, s in grid]
    default.append(GroupedGemmConfig(cluster=1))
    return {DEFAULT: default, "quick": [default[0], default[-1]]}


def _swiglu_fp8() -> dict[str, list]:
    """Whole-CTA rows (128 to 512 threads) and warp rows, steps in flight per thread, and the CTAs
    per SM the register cap keeps room for (configs that spill are skipped by the tuner)."""
    from cute_kernels.swiglu import SwigluConfig

    rows = [(t, u, c) for t in (128, 256, 512) for u in (1, 2, 4) for c in (2, 3, 4) if t * c <= 2048]
    warps = [(t, u, c) for t in (128, 256, 512) for u in (2, 4, 8) for c in (2, 4) if t * c <= 2048]
    # the forward's heuristic first (the backward's, 256 / 2 / 2, is in the grid; the forward's
    # spills in the backward and is skipped there); every config is also checked against the reference
    default = [SwigluConfig(256, 4, 3)]
    default += [SwigluConfig(t, u, c) for t, u, c in rows if (t, u, c) != (256, 4, 3)]
    default += [SwigluConfig(t, u, c, row_per_cta=False) for t, u, c in warps]
    return {DEFAULT: default, "quick": default[:4]}


_SPACES: dict[str, Callable[[], dict[str, list]]] = {
    "swizzle": _swizzle,
    "quantize_1x32": _quantize_1x32,
    "quantize_32x1": _quantize_32x1,
    "quantize_dual": _quantize_dual,
    "pad": _pad,
    "unpad": _pad,
    "quantize_tma": _quantize_tma,
    "quantize_fp8_row": _quantize_fp8_row,
    "quantize_fp8_col_amax": _quantize_fp8_col_amax,
    "quantize_fp8_col_cast": _quantize_fp8_col_cast,
    "grouped_gemm_sm90": _grouped_gemm_sm90,
    "swiglu_fp8": _swiglu_fp8,
}


def tunable() -> list[str]:
    """Registry names of the kernels with a declared config space."""
    return list(_SPACES)


def spaces(kernel: str) -> dict[str, list]:
    """``{space name: candidate configs}`` of registry kernel ``kernel``."""
    if kernel not in _SPACES:
        raise KeyError(f"no config space for kernel {kernel!r} (tunable: {', '.join(_SPACES)})")
    return _SPACES[kernel]()


def space(kernel: str, name: str = DEFAULT, *, quick: bool = False) -> list:
    """The candidate configs of ``kernel``'s space ``name``; with ``quick``, its ``"quick"`` space
    where ``name`` is the default and one is declared."""
    declared = spaces(kernel)
    if quick and name == DEFAULT and "quick" in declared:
        name = "quick"
    if name not in declared:
        raise KeyError(f"kernel {kernel!r} has no config space {name!r} (declared: {', '.join(declared)})")
    return declared[name]
