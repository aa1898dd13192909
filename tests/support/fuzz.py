"""Seeded fuzzing of every op that takes group offsets (and the 3D ops) against the reference.

Generator: `hypothesis <https://hypothesis.readthedocs.io>`_ draws each case (op arguments, shape,
dtype, group pattern) from strategies that favour the edges: empty first/last groups, runs of empty
groups, one-row (or one-block) groups, all rows in one group, no rows in any group, sizes around the
tile sizes (128 rows, 4 scale columns, the alignment), group counts around the kernels' scan limits
(32, 64, 256) up to 2048. A failing case is shrunk by hypothesis and printed with the seed that
reproduces it. Bulk randomness (data, group sizes) comes from generators seeded by drawn integers,
so a case stays small to print.

Every case runs the op with ``backend="cute"`` under ``torch.cuda.set_sync_debug_mode("error")`` on
dirty memory (the caching allocator's free blocks filled with random bytes first) and compares every
output byte with ``torch_bindings.reference``; for the ops bounded by the last group end
(the outputs :data:`BOUNDED` names), every byte of the rows below it (the rows past it are
unspecified).

Used by ``tests/torch_bindings/test_fuzz_gpu.py`` (fixed seeds, GPU suite), by ``make fuzz``
(minutes, any seed) and by ``make sanitize`` (small shapes and garbage offsets under compute-sanitizer)::

    python tests/support/fuzz.py --minutes 5 --seed 7          # every op, round robin, progress per batch
    python tests/support/fuzz.py --ops dual --examples 50 --seed 3
    python tests/support/fuzz.py --small --garbage --examples 8  # what make sanitize runs (memcheck)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the project root

from conftest import assert_same_bytes, no_sync, random_bits  # noqa: E402

import torch_bindings  # noqa: E402
from torch_bindings import checks, reference  # noqa: E402

MAX_GROUPS = checks.MAX_KERNEL_GROUPS
#: Group counts where the kernels switch scan paths (warp scan, one thread per group, 1x32 small key).
GROUP_COUNT_EDGES = (1, 2, 3, 31, 32, 33, 63, 64, 65, 255, 256, 257, 1024, MAX_GROUPS)
PATTERNS = (
    "random",
    "one_group",
    "empty_edges",
    "empty_runs",
    "single_units",
    "tile_edges",
    "all_empty",
)
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
#: Garbage offset patterns (the values, before the op's row count is mixed in): none may fault.
GARBAGE = (
    (-1,),
    (-5, 3, 2**30),
    (INT32_MAX, 0, INT32_MIN),
    (INT32_MIN, INT32_MAX),
    ("total", 7, "total+1", 1),
    (33, 31, 17, "total+129"),
    *(tuple(random.Random(g).randrange(INT32_MIN, INT32_MAX) for _ in range(g)) for g in (33, 257, 2048)),
)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Case sizes: ``max_elems`` bounds the input's elements, ``max_rows`` its rows."""

    max_elems: int = 1 << 23
    max_rows: int = 20000


SMALL = Limits(max_elems=1 << 16, max_rows=700)  # compute-sanitizer runs


# ----------------------------------------------------------------------------------------------
# Group patterns
# ----------------------------------------------------------------------------------------------


def _pattern_sizes(pattern: str, groups: int, total: int, tile: int, rng: random.Random) -> list[int]:
    """``groups`` sizes (in units) of ``pattern``; their sum may exceed ``total`` (clipped later)."""
    if pattern == "one_group":
        sizes = [0] * groups
        sizes[rng.choice([0, groups - 1, rng.randrange(groups)])] = total
        return sizes
    if pattern == "all_empty":
        return [0] * groups
    if pattern == "single_units":
        return [rng.choice([1, 1, 1, 0, rng.randrange(2 * tile + 2)]) for _ in range(groups)]
    if pattern == "tile_edges":
        return [
            rng.choice([0, 1, tile - 1, tile, tile + 1, 2 * tile - 1, 2 * tile + 1]) for _ in range(groups)
        ]
    cuts = sorted(rng.randrange(total + 1) for _ in range(groups))
    sizes = [b - a for a, b in zip([0, *cuts], cuts, strict=False)]
    if pattern == "empty_edges":
        lead, trail = rng.randrange(1, groups + 1), rng.randrange(groups + 1)
        sizes = [0] * lead + sizes[lead:]
        sizes[len(sizes) - trail :] = [0] * trail
    elif pattern == "empty_runs":
        run = rng.randrange(1, 9)
        sizes = [s if (i // run) % 2 else 0 for i, s in enumerate(sizes)]
    return sizes


@st.composite
def group_ends(draw, total: int, *, tile: int, max_groups: int = MAX_GROUPS) -> list[int]:
    """End offsets (in units: rows, 32-row blocks or scale columns) of an edge-favouring group pattern
    over ``total`` units: valid (non-decreasing, last <= total), sometimes covering every unit,
    sometimes leaving units past the last group."""
    groups = draw(
        st.one_of(st.sampled_from(GROUP_COUNT_EDGES), st.integers(1, 80), st.integers(1, max_groups))
    )
    groups = min(groups, max_groups)
    pattern = draw(st.sampled_from(PATTERNS))
    cover_all = draw(st.booleans())
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    ends, running = [], 0
    for size in _pattern_sizes(pattern, groups, total, tile, rng):
        running = min(running + size, total)
        ends.append(running)
    if cover_all:
        ends[-1] = total
    return ends


def _edge_int(low: int, high: int, edges: tuple[int, ...]) -> st.SearchStrategy[int]:
    """Integers in ``[low, high]``, often one of ``edges`` (those in range)."""
    inside = [e for e in edges if low <= e <= high]
    return st.one_of(st.sampled_from(inside), st.integers(low, high)) if inside else st.integers(low, high)


ROW_EDGES = (1, 31, 32, 33, 127, 128, 129, 255, 256, 1000, 1056, 4095, 4096, 4097, 16640, 17472)
COL_EDGES_32 = (32, 64, 96, 128, 160, 224, 288, 1024, 1408, 2048, 5120, 7168)


@st.composite
def matrix_shape(draw, limits: Limits, *, row_multiple: int = 1, col_multiple: int = 32) -> tuple[int, int]:
    """(rows, cols): rows a multiple of ``row_multiple``, cols of ``col_multiple``, within ``limits``."""
    col_edges = COL_EDGES_32 if col_multiple == 32 else (1, 2, 3, 4, 5, 7, 8, 16, 24, 96, 1536, 7168)
    cols = draw(
        _edge_int(
            1, 7168 // col_multiple, tuple(c // col_multiple for c in col_edges if c % col_multiple == 0)
        )
    )
    cols *= col_multiple
    row_cap = max(min(limits.max_rows, limits.max_elems // cols) // row_multiple, 0)
    rows = draw(_edge_int(0, row_cap, tuple(r // row_multiple for r in ROW_EDGES if r % row_multiple == 0)))
    return rows * row_multiple, cols


# ----------------------------------------------------------------------------------------------
# Data and dirty memory
# ----------------------------------------------------------------------------------------------

_SPECIALS = (0.0, -0.0, float("inf"), float("-inf"), float("nan"), 448.0, 480.0, 2.0**-126, 2.0**-133, 3.0e38)


def random_values(shape: tuple, dtype: torch.dtype, data_seed: int, device: str) -> torch.Tensor:
    """Normal values scaled per row by 10^U(-30, 30), with a sprinkle of SPEC's special values
    (zeros, infinities, NaN, 448, 480, the smallest normal, a bf16 subnormal) in one case of three."""
    gen = torch.Generator(device=device).manual_seed(data_seed)
    x = torch.randn(shape, generator=gen, device=device)
    scale = torch.empty((*shape[:-1], 1), device=device).uniform_(-30, 30, generator=gen)
    x = x * torch.pow(10.0, scale)
    if data_seed % 3 == 0:
        picks = torch.randint(0, len(_SPECIALS), shape, generator=gen, device=device)
        where = torch.rand(shape, generator=gen, device=device) < 0.002
        x = torch.where(where, torch.tensor(_SPECIALS, device=device)[picks], x)
    return x.to(dtype)


_SCALE_SPECIALS = (0.1, 3.0, 0.0, -0.0, float("inf"), float("nan"), 2.0**-149, -1.0)


def random_row_scales(rows: int, data_seed: int, device: str) -> torch.Tensor:
    """(rows,) fp32 row scales: powers of 2 from 2^-140 (subnormal products) to 2^126, and in one
    row of ten a value that rounds (0.1, 3), a zero, an infinity, NaN or a negative."""
    gen = torch.Generator(device=device).manual_seed(data_seed + 1)
    scales = torch.exp2(torch.randint(-140, 127, (rows,), generator=gen, device=device).float())
    picks = torch.randint(0, len(_SCALE_SPECIALS), (rows,), generator=gen, device=device)
    where = torch.rand(rows, generator=gen, device=device) < 0.1
    return torch.where(where, torch.tensor(_SCALE_SPECIALS, device=device)[picks], scales)


def dirty_memory(nbytes: int, data_seed: int) -> None:
    """Fill free memory of the caching allocator with random bytes: a large block (outputs over 1 MiB
    are split from it) and small ones (the small-allocation pool), freed again."""
    if not torch.cuda.is_available() or os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        return  # no cache to dirty (compute-sanitizer runs: fresh allocations every time)
    gen = torch.Generator(device="cuda").manual_seed(data_seed)
    torch.cuda.empty_cache()  # the blocks below become the only free memory the outputs can take
    blocks = [torch.empty(min(max(nbytes, 1 << 21), 1 << 31), dtype=torch.uint8, device="cuda")]
    blocks += [torch.empty((1 << 20) - 512, dtype=torch.uint8, device="cuda") for _ in range(8)]
    for block in blocks:
        block.random_(0, 256, generator=gen)
    del blocks


# ----------------------------------------------------------------------------------------------
# Ops: a case strategy and a runner each
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """One fuzz case: ``op`` with ``kwargs`` on an input made from ``shape``/``dtype``/``data_seed``;
    ``ends`` the group end offsets (rows; scale columns for swizzle_k), None for ungrouped calls;
    ``skew``: the input starts this many bytes into an allocation that ends where the input ends
    (swizzle, pad, unpad: unaligned bases and sources ending inside a word)."""

    op: str
    shape: tuple
    dtype: torch.dtype
    data_seed: int
    ends: tuple | None = None
    kwargs: tuple = ()
    skew: int = 0

    def __repr__(self) -> str:  # short: hypothesis prints it for a failing case
        ends = self.ends
        if ends is not None and len(ends) > 12:
            ends = f"{list(ends[:6])}...{list(ends[-6:])} (G={len(self.ends)})"
        return (
            f"Case(op={self.op!r}, shape={self.shape}, dtype={self.dtype}, data_seed={self.data_seed}, "
            f"ends={ends}, kwargs={dict(self.kwargs)}, skew={self.skew})"
        )


@dataclasses.dataclass(frozen=True)
class Run:
    """Where and how cases run: ``device`` of the inputs, ``backend`` of the op under test."""

    device: str = "cuda"
    backend: str = "cute"


_MODES = st.sampled_from(("floor", "rceil"))
_QUANT_DTYPES = st.sampled_from((torch.bfloat16, torch.float32))
_ALIGNMENTS = st.sampled_from(checks.ALIGNMENTS)
_PAD_DTYPES = st.sampled_from(
    (
        torch.bfloat16,
        torch.float32,
        torch.float16,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.int32,
        torch.int64,
        torch.float64,
    )
)
_SEEDS = st.integers(0, 2**31 - 1)


@st.composite
def _grouped_rows_case(draw, op: str, limits: Limits, *, row_multiple: int, extra: dict) -> Case:
    """A case over x (M, K) with row groups whose sizes are multiples of ``row_multiple``."""
    rows, cols = draw(matrix_shape(limits, row_multiple=row_multiple))
    ends = draw(group_ends(rows // row_multiple, tile=max(128 // row_multiple, 1)))
    ends = tuple(e * row_multiple for e in ends)
    kwargs = {name: draw(strategy) for name, strategy in extra.items()}
    return Case(op, (rows, cols), draw(_QUANT_DTYPES), draw(_SEEDS), ends, tuple(sorted(kwargs.items())))


@st.composite
def _dual_case(draw, limits: Limits) -> Case:
    """The dual op, grouped (row groups in 32-row blocks) or, one time in five, ungrouped."""
    case = draw(_grouped_rows_case("dual", limits, row_multiple=32, extra={"scaling_mode": _MODES}))
    if draw(st.integers(0, 4)) == 0:
        blocked = draw(st.booleans())
        return dataclasses.replace(case, ends=None, kwargs=(*case.kwargs, ("blocked_scales", blocked)))
    return case


@st.composite
def _swizzle_case(draw, limits: Limits, groups: str) -> Case:
    """E8M0 scales (R, C) of any size; M-groups over rows or K-groups over columns."""
    rows, cols = draw(matrix_shape(limits, col_multiple=1))
    cols = min(cols, 1200)
    total, tile = (rows, 128) if groups == "M" else (cols, 4)
    ends = tuple(draw(group_ends(total, tile=tile)))
    kwargs, skew = (("groups", groups),), draw(st.sampled_from((0, 0, 1, 2, 3)))
    return Case(f"swizzle_{groups.lower()}", (rows, cols), torch.uint8, draw(_SEEDS), ends, kwargs, skew)


@st.composite
def _pad_case(draw, limits: Limits, op: str) -> Case:
    """pad / unpad: x (M, D) of any 1, 2, 4 or 8-byte dtype, groups of any sizes, any alignment."""
    rows, cols = draw(matrix_shape(limits, col_multiple=1))
    alignment, dtype = draw(_ALIGNMENTS), draw(_PAD_DTYPES)
    ends = tuple(draw(group_ends(rows, tile=alignment)))
    skew = dtype.itemsize * draw(st.sampled_from((0, 0, 1, 2, 3)))
    return Case(op, (rows, cols), dtype, draw(_SEEDS), ends, (("alignment", alignment),), skew)


@st.composite
def _pad_quantize_case(draw, limits: Limits) -> Case:
    """Fused pad + quantize: group sizes around the alignment."""
    alignment = draw(_ALIGNMENTS)
    rows, cols = draw(matrix_shape(limits))
    ends = tuple(draw(group_ends(rows, tile=alignment)))
    kwargs = (("alignment", alignment), ("scaling_mode", draw(_MODES)))
    return Case("pad_and_quantize", (rows, cols), draw(_QUANT_DTYPES), draw(_SEEDS), ends, kwargs)


@st.composite
def _quantize_3d_case(draw, limits: Limits) -> Case:
    """Expert weights (E, N, K): 1x32 with any N, 32x1 with N a multiple of 32."""
    block = draw(st.sampled_from(("1x32", "32x1")))
    experts = draw(_edge_int(1, 33, (1, 2, 8, 16, 32)))
    n, k = draw(
        matrix_shape(Limits(limits.max_elems // experts, 9000), row_multiple=32 if block == "32x1" else 1)
    )
    n = max(n, 32 if block == "32x1" else 1)
    kwargs = (("block", block), ("blocked_scales", draw(st.booleans())), ("scaling_mode", draw(_MODES)))
    return Case("quantize_3d", (experts, n, k), draw(_QUANT_DTYPES), draw(_SEEDS), None, kwargs)


@st.composite
def _fp8_cols_case(draw, limits: Limits, op: str) -> Case:
    """FP8 column scales (``fp8_cols``) or the FP8 dual (``fp8_dual``): x (M, K) of any K, row
    groups of any sizes (one case in five ungrouped); power-of-2 or exact scales."""
    rows, cols = draw(matrix_shape(limits, col_multiple=1))
    ends = tuple(draw(group_ends(rows, tile=128)))
    if draw(st.integers(0, 4)) == 0:
        ends = None
    kwargs = (("round_scales_to_power_of_2", draw(st.booleans())),)
    return Case(op, (rows, cols), draw(_QUANT_DTYPES), draw(_SEEDS), ends, kwargs)


@st.composite
def _fp8_cols_padded_case(draw, limits: Limits, op: str) -> Case:
    """FP8 column scales into padded groups (``fp8_dual_padded``: and the rows): x (M, K) of any K,
    group sizes around the alignment."""
    alignment = draw(_ALIGNMENTS)
    rows, cols = draw(matrix_shape(limits, col_multiple=1))
    ends = tuple(draw(group_ends(rows, tile=alignment)))
    kwargs = (("alignment", alignment), ("round_scales_to_power_of_2", draw(st.booleans())))
    return Case(op, (rows, cols), draw(_QUANT_DTYPES), draw(_SEEDS), ends, kwargs)


@st.composite
def _fp8_rows_bounded_case(draw, limits: Limits) -> Case:
    """FP8 row scales of the rows below the last group end: x (M, K) of any K, row groups of any
    sizes, power-of-2 or exact scales; x sometimes a few elements into its allocation (element
    steps)."""
    rows, cols = draw(matrix_shape(limits, col_multiple=1))
    ends = tuple(draw(group_ends(rows, tile=128)))
    dtype = draw(_QUANT_DTYPES)
    skew = dtype.itemsize * draw(st.sampled_from((0, 0, 1, 3)))
    kwargs = (("round_scales_to_power_of_2", draw(st.booleans())),)
    return Case("fp8_rows_bounded", (rows, cols), dtype, draw(_SEEDS), ends, kwargs, skew)


@st.composite
def _swiglu_case(draw, limits: Limits, op: str) -> Case:
    """SwiGLU + FP8 rows below the last group end, forward (``swiglu``) or backward
    (``swiglu_bwd``): h13 (M, 2H) bf16 of any H, row groups of any sizes, power-of-2 or exact
    scales."""
    rows, cols = draw(matrix_shape(limits, col_multiple=2))
    ends = tuple(draw(group_ends(rows, tile=128)))
    kwargs = (("round_scales_to_power_of_2", draw(st.booleans())),)
    return Case(op, (rows, cols), torch.bfloat16, draw(_SEEDS), ends, kwargs)


@st.composite
def _fp8_dequant_case(draw, limits: Limits) -> Case:
    """FP8 row dequantization below the last group end: q (M, K) of any K and random bytes (NaNs
    included), scales of :func:`random_row_scales`; q sometimes a few bytes into its allocation."""
    rows, cols = draw(matrix_shape(limits, col_multiple=1))
    ends = tuple(draw(group_ends(rows, tile=128)))
    skew = draw(st.sampled_from((0, 0, 1, 8)))
    return Case("fp8_dequant", (rows, cols), torch.float8_e4m3fn, draw(_SEEDS), ends, (), skew)


@st.composite
def _fp8_3d_case(draw, limits: Limits, op: str) -> Case:
    """FP8 expert weights (E, N, K) of any N and K: scales along K or N (``fp8_3d``) or both
    (``fp8_3d_dual``)."""
    experts = draw(_edge_int(1, 33, (1, 2, 8, 16, 32)))
    n, k = draw(matrix_shape(Limits(limits.max_elems // experts, 9000), col_multiple=1))
    axis = (("axis", draw(st.sampled_from(("K", "N")))),) if op == "fp8_3d" else ()  # drawn first, as before
    kwargs = (*axis, ("round_scales_to_power_of_2", draw(st.booleans())))
    return Case(op, (experts, n, k), draw(_QUANT_DTYPES), draw(_SEEDS), None, kwargs)


def case_strategy(op: str, limits: Limits = Limits()) -> st.SearchStrategy[Case]:
    """The case strategy of ``op`` (a key of :data:`OPS`)."""
    modes = {"scaling_mode": _MODES}
    strategies = {
        "swizzle_m": lambda: _swizzle_case(limits, "M"),
        "swizzle_k": lambda: _swizzle_case(limits, "K"),
        "quantize_1x32": lambda: _grouped_rows_case("quantize_1x32", limits, row_multiple=1, extra=modes),
        "quantize_32x1": lambda: _grouped_rows_case("quantize_32x1", limits, row_multiple=32, extra=modes),
        "dual": lambda: _dual_case(limits),
        "pad": lambda: _pad_case(limits, "pad"),
        "unpad": lambda: _pad_case(limits, "unpad"),
        "pad_and_quantize": lambda: _pad_quantize_case(limits),
        "quantize_3d": lambda: _quantize_3d_case(limits),
        "fp8_cols": lambda: _fp8_cols_case(limits, "fp8_cols"),
        "fp8_dual": lambda: _fp8_cols_case(limits, "fp8_dual"),
        "fp8_cols_padded": lambda: _fp8_cols_padded_case(limits, "fp8_cols_padded"),
        "fp8_dual_padded": lambda: _fp8_cols_padded_case(limits, "fp8_dual_padded"),
        "fp8_3d": lambda: _fp8_3d_case(limits, "fp8_3d"),
        "fp8_3d_dual": lambda: _fp8_3d_case(limits, "fp8_3d_dual"),
        "fp8_rows_bounded": lambda: _fp8_rows_bounded_case(limits),
        "fp8_dequant": lambda: _fp8_dequant_case(limits),
        "swiglu": lambda: _swiglu_case(limits, "swiglu"),
        "swiglu_bwd": lambda: _swiglu_case(limits, "swiglu_bwd"),
    }
    return strategies[op]()


def _data(case: Case, device: str) -> torch.Tensor:
    if case.op == "fp8_dequant":
        return random_bits(case.shape, torch.uint8, case.data_seed, device).view(torch.float8_e4m3fn)
    if case.op in ("pad", "unpad"):
        return random_bits(case.shape, case.dtype, case.data_seed, device)
    if case.op.startswith("swizzle"):
        return random_bits(case.shape, torch.uint8, case.data_seed, device).view(torch.float8_e8m0fnu)
    return random_values(case.shape, case.dtype, case.data_seed, device)


def skewed(t: torch.Tensor, skew: int) -> torch.Tensor:
    """A contiguous copy of ``t`` that starts ``skew`` bytes (a multiple of its element size) into a
    fresh allocation of exactly ``skew + t.nbytes`` bytes: it ends where its allocation ends."""
    if not skew:
        return t
    buffer = torch.empty(skew + t.numel() * t.element_size(), dtype=torch.uint8, device=t.device)
    out = buffer[skew:].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


@dataclasses.dataclass(frozen=True)
class Inputs:
    """An op's tensor arguments, made before the no-sync block: ``x`` the data (unpad: the padded
    tensor; fp8_dequant: q), ``offsets`` the group ends (None: ungrouped), for unpad
    ``padded_start`` and ``num_tokens``, for fp8_dequant the row ``scales``."""

    x: torch.Tensor
    offsets: torch.Tensor | None
    padded_start: torch.Tensor | None = None
    num_tokens: int = 0
    scales: torch.Tensor | None = None


def make_inputs(case: Case, device: str, garbage: bool = False) -> Inputs:
    """The inputs of ``case``; ``garbage``: its offsets are garbage (unpad then gets a zero padded
    tensor and garbage ``padded_start`` too, since the reference cannot pad with such offsets)."""
    x = _data(case, device)
    offsets = None if case.ends is None else torch.tensor(case.ends, dtype=torch.int32, device=device)
    if case.op == "fp8_dequant":
        scales = random_row_scales(case.shape[0], case.data_seed, device)
        return Inputs(skewed(x, case.skew), offsets, scales=scales)
    if case.op == "swiglu_bwd":  # grad_h (M, H) rides in ``scales``: the gate half of x, reversed
        return Inputs(x, offsets, scales=x[:, : x.shape[1] // 2].flip(0).contiguous())
    if case.op != "unpad":
        return Inputs(skewed(x, case.skew), offsets)
    if garbage:
        groups = len(case.ends)
        padded = x.new_zeros(reference.padded_rows(x.shape[0], groups, 32), x.shape[1])
        start = torch.tensor([(i * 37) % 300 - 50 for i in range(groups)], dtype=torch.int32, device=device)
        return Inputs(skewed(padded, case.skew), offsets, start, x.shape[0])
    padded, start, _ = reference.pad_token_groups(x, offsets, **dict(case.kwargs))
    return Inputs(skewed(padded, case.skew), offsets, start, x.shape[0])


def _call(module, case: Case, inputs: Inputs, backend: dict) -> tuple:
    """Call ``case.op`` from ``module`` (``torch_bindings`` or its reference) on ``inputs``;
    ``backend`` holds the backend keyword of the public functions (empty for the reference).
    Returns the outputs with 32x1 data transposed back to memory order (bytes compare as stored)."""
    kw, x, offsets = dict(case.kwargs), inputs.x, inputs.offsets
    if case.op.startswith("swizzle"):
        return (module.swizzle_scales(x, group_end_offsets=offsets, **kw, **backend),)
    if case.op == "quantize_1x32":
        return module.quantize_mxfp8_2d(x, group_end_offsets=offsets, **kw, **backend)
    if case.op == "quantize_32x1":
        q, s = module.quantize_mxfp8_2d(x, block="32x1", group_end_offsets=offsets, **kw, **backend)
        return q.t(), s
    if case.op == "dual":
        q, s, qt, st_ = module.quantize_mxfp8_2d_dual(x, group_end_offsets=offsets, **kw, **backend)
        return q, s, qt.t(), st_
    if case.op == "pad":
        return module.pad_token_groups(x, offsets, **kw, **backend)
    if case.op == "unpad":
        start, tokens = inputs.padded_start, inputs.num_tokens
        return (module.unpad_token_groups(x, offsets, start, num_tokens=tokens, **backend),)
    if case.op == "pad_and_quantize":
        return module.pad_and_quantize_mxfp8_2d(x, offsets, **kw, **backend)
    if case.op == "fp8_cols":
        return module.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets, **kw, **backend)
    if case.op == "fp8_cols_padded":
        return module.pad_and_quantize_fp8_2d_cols(x, offsets, **kw, **backend)
    if case.op == "fp8_dual_padded":
        return module.pad_and_quantize_fp8_2d_dual(x, offsets, **kw, **backend)
    if case.op == "fp8_dual":
        return module.quantize_fp8_2d_dual(x, group_end_offsets=offsets, **kw, **backend)
    if case.op == "fp8_3d":
        return module.quantize_fp8_3d(x, **kw, **backend)
    if case.op == "fp8_3d_dual":
        return module.quantize_fp8_3d_dual(x, **kw, **backend)
    if case.op == "fp8_rows_bounded":
        return module.quantize_fp8_2d(x, axis="row", group_end_offsets=offsets, **kw, **backend)
    if case.op == "fp8_dequant":
        return (module.dequantize_fp8_rows(x, inputs.scales, offsets, **backend),)
    if case.op == "swiglu":
        return module.swiglu_quantize_fp8(x, group_end_offsets=offsets, **kw, **backend)
    if case.op == "swiglu_bwd":
        return module.swiglu_backward_quantize_fp8(
            inputs.scales, x, group_end_offsets=offsets, **kw, **backend
        )
    q, s = module.quantize_mxfp8_3d(x, **kw, **backend)
    return (q.transpose(1, 2) if kw["block"] == "32x1" else q), s


def check_case(case: Case, run: Run = Run()) -> None:
    """Run ``case`` through ``run.backend`` on dirty memory with no sync allowed, and compare every
    output byte with the reference."""
    inputs = make_inputs(case, run.device)
    expected = _call(reference, case, inputs, {})
    if run.device == "cuda":  # twice the outputs' bytes, so every output lands on dirty bytes
        dirty_memory(2 * sum(e.numel() * e.element_size() for e in expected) + (1 << 20), case.data_seed)
    with no_sync():
        actual = _call(torch_bindings, case, inputs, {"backend": run.backend})
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.shape == e.shape, f"{case!r} output {i}: shape {tuple(a.shape)} vs {tuple(e.shape)}"
        assert same_strides(a, e), f"{case!r} output {i}: strides {a.stride()} vs {e.stride()}"
        a, e = defined_rows(case, a, i), defined_rows(case, e, i)
        assert_same_bytes(a, e, f"{case!r} output {i}")


#: Ops with outputs defined only on the rows below the last group end (the kernels leave the other
#: rows unwritten), and which outputs (their indices; None: every one): their comparison stops there.
BOUNDED = {
    "fp8_rows_bounded": None,
    "fp8_dequant": None,
    "swiglu": None,
    "swiglu_bwd": None,
    "fp8_dual_padded": (0, 1),  # q_row, s_row; the padded column outputs are whole
    "fp8_dual": (0, 1),  # with groups: q_row, s_row; without, every row is defined
}
BOUNDED_OPS = tuple(BOUNDED)


def defined_rows(case: Case, output: torch.Tensor, index: int = 0) -> torch.Tensor:
    """``output`` (the op's output ``index``) restricted to the rows the contract defines: below
    the last end for the outputs :data:`BOUNDED` names (valid ends: 0 <= last <= M), every row
    otherwise."""
    outputs = BOUNDED.get(case.op, ())
    if case.ends is None or (outputs is not None and index not in outputs):
        return output
    return output[: case.ends[-1]]


def same_strides(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal strides on every dim of size > 1 (a size-1 dim's stride addresses nothing); empty
    tensors always match."""
    if actual.numel() == 0:
        return True
    return all(
        a == e for n, a, e in zip(actual.shape, actual.stride(), expected.stride(), strict=True) if n > 1
    )


def check_garbage(op: str, run: Run = Run(), rows: int = 320) -> int:
    """Every :data:`GARBAGE` offset pattern through ``op`` (x of ``rows`` rows, a multiple of 32): no
    fault, no sync. Returns the number of calls. (Values are not compared: garbage offsets give
    garbage rows by contract.)"""
    calls = 0
    for pattern in GARBAGE:
        ends = tuple(
            rows if v == "total" else rows + int(v[6:]) if isinstance(v, str) else v for v in pattern
        )
        dtype = {
            "pad": torch.int16,
            "unpad": torch.int16,
            "swizzle_m": torch.uint8,
            "swizzle_k": torch.uint8,
            "fp8_dequant": torch.float8_e4m3fn,
        }
        shape = (rows, 64)
        if op.startswith("swizzle"):  # odd sizes: the raw-word (ragged) kernels
            shape = (rows + 1, 41) if calls % 2 else (rows, 40)
        case = Case(op, shape, dtype.get(op, torch.bfloat16), calls, ends, _garbage_kwargs(op))
        inputs = make_inputs(case, run.device, garbage=True)
        with no_sync():
            outputs = _call(torch_bindings, case, inputs, {"backend": run.backend})
        if run.device == "cuda":
            torch.cuda.synchronize()  # surfaces a fault here, with the pattern in the traceback
        assert all(isinstance(t, torch.Tensor) for t in outputs), (case, outputs)
        calls += 1
    return calls


def _garbage_kwargs(op: str) -> tuple:
    kw = {"swizzle_m": {"groups": "M"}, "swizzle_k": {"groups": "K"}}.get(op, {})
    if op in ("pad", "unpad", "pad_and_quantize"):
        kw = {"alignment": 32}
    if op in ("fp8_cols_padded", "fp8_dual_padded"):
        kw = {"alignment": 128}
    return tuple(kw.items())  # fp8_cols / fp8_dual / fp8_rows_bounded / fp8_dequant: the defaults


#: Ops fuzzed (all that take group offsets, and the 3D ops) and the ops the garbage check covers.
OPS = (
    "swizzle_m",
    "swizzle_k",
    "quantize_1x32",
    "quantize_32x1",
    "dual",
    "pad",
    "unpad",
    "pad_and_quantize",
    "quantize_3d",
    "fp8_cols",
    "fp8_dual",
    "fp8_cols_padded",
    "fp8_dual_padded",
    "fp8_3d",
    "fp8_3d_dual",
    "fp8_rows_bounded",
    "fp8_dequant",
    "swiglu",
    "swiglu_bwd",
)
GROUPED_OPS = tuple(op for op in OPS if op not in ("quantize_3d", "fp8_3d", "fp8_3d_dual"))


# ----------------------------------------------------------------------------------------------
# Drivers
# ----------------------------------------------------------------------------------------------


def fuzz(
    op: str, fuzz_seed: int, examples: int, limits: Limits = Limits(), run: Run = Run(), shrink: bool = True
) -> int:
    """Up to ``examples`` hypothesis cases of ``op`` from ``fuzz_seed`` (returns how many ran);
    raises on the first mismatch, naming the case (shrunk first when ``shrink``)."""
    ran = []

    @seed(fuzz_seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=False,
        phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(case_strategy(op, limits))
    def one_case(case: Case) -> None:
        check_case(case, run)
        ran.append(1)

    one_case()
    return len(ran)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python tests/support/fuzz.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--ops", default="all", help=f"comma list of {', '.join(OPS)}, or 'all'")
    parser.add_argument("--seed", type=int, default=None, help="first fuzz seed (default: random)")
    parser.add_argument("--examples", type=int, default=25, help="cases per (op, seed) batch")
    parser.add_argument("--minutes", type=float, default=0.0, help="keep going with new seeds this long")
    parser.add_argument("--small", action="store_true", help="small shapes (compute-sanitizer runs)")
    parser.add_argument("--garbage", action="store_true", help="also run the garbage-offset patterns")
    parser.add_argument("--cpu", action="store_true", help="run the reference on CPU (checks the harness)")
    return parser.parse_args(argv)


def _batches(ops: list[str], first_seed: int, minutes: float) -> Iterator[tuple[str, int]]:
    """(op, seed) batches: one round over ``ops``, then more batches with new seeds until ``minutes``
    have passed (checked before each batch)."""
    deadline = time.monotonic() + 60 * minutes
    for round_ in itertools.count():
        for op in ops:
            if round_ and time.monotonic() >= deadline:
                return
            yield op, first_seed + round_


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    ops = list(OPS) if args.ops == "all" else args.ops.split(",")
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        print(f"unknown op(s) {unknown}; known: {', '.join(OPS)}", file=sys.stderr)
        return 2
    first_seed = args.seed if args.seed is not None else random.randrange(2**31)
    limits = SMALL if args.small else Limits()
    run = Run("cpu", "reference") if args.cpu else Run()
    started, cases = time.monotonic(), 0

    def report(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {text}", flush=True)

    if args.garbage and args.cpu:
        report("--garbage skipped: the reference validates offsets (raises), only the kernels clamp them")
    elif args.garbage:
        for op in (o for o in ops if o in GROUPED_OPS):
            report(f"{op}: {check_garbage(op, run)} garbage-offset calls, no fault")
    for op, fuzz_seed in _batches(ops, first_seed, args.minutes):
        try:
            ran = fuzz(op, fuzz_seed, args.examples, limits, run)
        except Exception:
            report(
                f"FAILED {op} seed {fuzz_seed}; reproduce: python tests/support/fuzz.py --ops {op} "
                f"--seed {fuzz_seed} --examples {args.examples}{' --small' if args.small else ''}"
            )
            raise
        cases += ran
        report(f"{op}: seed {fuzz_seed}, {ran} cases match the reference ({cases} in all)")
    print(f"fuzz: {cases} passed, 0 failed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
