"""Token-group padding and unpadding (SPEC section 4): ``pad`` and ``unpad``, one kernel each.

Both are row gathers. ``pad``: x (M, D) -> out (P, D) with ``P = A * ceil((M + G A) / A)``; group
g's rows ``[end[g-1], end[g])`` go to ``[A * prefix[g], A * prefix[g] + n_g)`` where
``prefix[g] = sum_{i<g} ceil(n_i / A)``; every other output row is zero. CTA 0 also writes
``padded_start[g] = A * prefix[g]`` and ``padded_end[g] = A * prefix[g + 1]``, so one launch gives
all three outputs. ``unpad``: padded (P, D) -> out (N, D); output row r of group g (rows
``[end[g-1], end[g])``) comes from padded row ``padded_start[g] + r - end[g-1]``; rows past the last
group are zero. N is the caller's static row count (``num_tokens``): no sync.

Work decomposition (both kernels): a *row chunk* is ``32 U`` vectors of one output row
(``U = vectors_per_lane``); item ``i`` is output row ``i // chunks``, vectors ``[32 U c, 32 U (c + 1))``
with ``c = i % chunks``. The grid is not persistent: each CTA moves a contiguous run of
``items_per_warp`` items per warp, its warps taking them round-robin, and the hardware schedules the
CTAs in waves (this beat a persistent grid of SMs x 4 CTAs, notes/pad-unpad-grid.md: fewer warps
idle in the last wave). Each CTA first scans the group sizes into shared memory
(:func:`cute_utils.groups.scan_group_sizes`, unit A for pad, 1 for unpad). A vector is 16
bytes when the row size, row strides and data pointers allow it, else 4 bytes or one element (a
compile-time choice). Consecutive rows of one group map to consecutive source rows, so a warp keeps
the *segment* of its last row (output rows ``[lo, hi)``, source row ``r + delta`` for ``r`` in
``[valid_lo, valid_hi)``, zero elsewhere) and searches the shared-memory prefix again only when a
row leaves it. Each lane loads its ``U`` vectors (zeros for rows without a source), then stores
them: every output byte is written exactly once, zero rows included. Row addresses are 64-bit (row
strides are 64-bit symbols).

Offsets are never trusted: ends are clamped to ``[0, rows]`` (see ``cute_utils.groups``), every
read and write is bounded by the tensors' row counts, unpad clamps ``padded_start`` and zero-fills
any row whose source would lie outside ``padded``. Garbage offsets give garbage rows, never a fault.

All sizes are symbolic (M, D, P, N, G, the alignment): one compile per (op, dtype, vector width,
config, arch); every dtype of one size compiles to the same instructions.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import (
    BFloat16,
    Float8E4M3FN,
    Float8E5M2,
    Float8E8M0FNU,
    Float16,
    Float32,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    Uint8,
)
from cutlass.memory import SmemAllocator

from cute_kernels.op_specs import PAD_TOKEN_GROUPS
from cute_utils.blocked import ceil_div
from cute_utils.constants import PAD_KERNEL_DTYPES
from cute_utils.groups import (
    find_group,
    prefix_smem_words,
    scan_group_sizes,
    smem_group_bounds,
    store_padded_offsets,
)
from cute_utils.rows import chunk_fragment, load_row_chunk, row_vector_view, store_row_chunk
from cute_utils.scan import WARP

from .base import Kernel, LoadsInFlight

VECTOR_BYTES = 16
#: Element types the kernels move, one per element size: padding copies bytes, so every dtype of 1,
#: 2, 4 or 8 bytes runs as the integer type of its size (the bindings pass a same-size view).
DTYPES = {"uint8": Uint8, "int16": Int16, "int32": Int32, "int64": Int64}
#: Every element type a kernel may be compiled for (``cute_utils.constants.PAD_KERNEL_DTYPES``, the
#: list the bindings read): the carriers, plus common dtypes the bindings pass as they are (no
#: host-side view per call). The data moves as words, so a dtype's instructions are those of its
#: size's carrier (tests/cute_kernels/test_pad_compile.py compares the hashes); SASS inspection
#: compiles the carriers only.
ELEMENT_TYPES = {
    **DTYPES,
    "int8": Int8,
    "bfloat16": BFloat16,
    "float16": Float16,
    "float32": Float32,
    "float64": Float64,
    "float8_e4m3fn": Float8E4M3FN,
    "float8_e5m2": Float8E5M2,
    "float8_e8m0fnu": Float8E8M0FNU,
}
assert set(ELEMENT_TYPES) == set(PAD_KERNEL_DTYPES), "cute_utils.constants.PAD_KERNEL_DTYPES"


@dataclass(frozen=True)
class PadConfig:
    """Launch shape: ``threads`` per CTA, ``vectors_per_lane`` loads in flight per lane and row chunk,
    ``items_per_warp`` row chunks per warp (the grid's size), and ``ctas_per_sm`` resident CTAs the
    register cap keeps room for (``65536 / (ctas_per_sm * threads)`` registers per thread)."""

    threads: int = 128
    vectors_per_lane: int = 4
    ctas_per_sm: int = 8
    items_per_warp: int = 2

    def __post_init__(self) -> None:
        if self.threads % WARP or not 0 < self.threads <= 1024:
            raise ValueError(f"threads={self.threads} must be a multiple of 32 in [32, 1024]")
        if self.vectors_per_lane < 1 or self.items_per_warp < 1:
            raise ValueError(
                f"vectors_per_lane={self.vectors_per_lane} and items_per_warp={self.items_per_warp} "
                "must be >= 1"
            )
        if self.ctas_per_sm < 1 or self.ctas_per_sm * self.threads > 2048:
            raise ValueError(f"ctas_per_sm={self.ctas_per_sm} x {self.threads} threads do not fit on an SM")

    @property
    def row_chunk(self) -> int:
        """Vectors of one row a warp moves per item."""
        return WARP * self.vectors_per_lane


def vector_widths(dtype_name: str) -> tuple[int, ...]:
    """Vector widths in bytes a kernel for ``dtype_name`` is built for: 16, then 4 or the element
    size if wider (8 for 8-byte elements), then one element."""
    size = ELEMENT_TYPES[dtype_name].width // 8
    return tuple(sorted({VECTOR_BYTES, max(4, size), size}, reverse=True))


@cute.jit
def _pad_segment(prefix, ends, num_groups, alignment, rows_out, row):
    """Segment of padded output ``row``: ``(lo, hi, valid_lo, valid_hi, delta)``.

    Rows ``[lo, hi)`` are one group's padded block (or the zero tail after the last group); rows
    in ``[valid_lo, valid_hi)`` come from source row ``row + delta``, the others are zero.
    """
    covered = prefix[num_groups] * alignment
    g = find_group(prefix, num_groups, row // alignment)
    start, end = smem_group_bounds(ends, g)
    lo = prefix[g] * alignment
    hi = prefix[g + 1] * alignment
    valid_hi = lo + end - start
    delta = start - lo
    if row >= covered:
        lo = covered
        hi = rows_out
        valid_hi = covered
        delta = Int32(0)
    return lo, hi, lo, valid_hi, delta


@cute.jit
def _unpad_segment(prefix, num_groups, padded_start, rows_in, rows_out, row):
    """Segment of unpadded output ``row``: ``(lo, hi, valid_lo, valid_hi, delta)`` (see
    :func:`_pad_segment`). ``padded_start`` is clamped; rows whose source would fall outside the
    ``rows_in`` padded rows stay zero."""
    covered = prefix[num_groups]
    g = find_group(prefix, num_groups, row)
    lo = prefix[g]
    hi = prefix[g + 1]
    source = cutlass.min(cutlass.max(padded_start[g], -rows_out), rows_in)
    delta = source - lo
    valid_lo = cutlass.max(lo, -delta)
    valid_hi = cutlass.min(hi, rows_in - delta)
    if row >= covered:
        lo = covered
        hi = rows_out
        valid_lo = covered
        valid_hi = covered
        delta = Int32(0)
    return lo, hi, valid_lo, valid_hi, delta


@dataclass(frozen=True)
class RowGatherVariant:
    """Compile-time choices of a pad or unpad kernel: ``dtype`` (an :data:`ELEMENT_TYPES` name;
    :meth:`variants` lists the integer carriers of :data:`DTYPES`) and ``vector_bytes`` (16, 4 or
    the element size; see :func:`vector_widths`)."""

    dtype: str
    vector_bytes: int = VECTOR_BYTES


class RowGatherKernel(Kernel):
    """What pad and unpad share: the launch shape, the group scan and the row-chunk loop."""

    def __init__(self, variant: RowGatherVariant, config: PadConfig) -> None:
        super().__init__(variant, config)
        self.vector_bytes = variant.vector_bytes
        self.threads = config.threads
        self.warps = config.threads // WARP
        self.per_lane = config.vectors_per_lane
        self.row_chunk = config.row_chunk
        self.cta_items = self.warps * config.items_per_warp

    @classmethod
    def loads_in_flight(cls, variant: RowGatherVariant, config: PadConfig, cols: int) -> LoadsInFlight:
        """Per warp one row chunk of ``32 x vectors_per_lane`` vectors (loaded, then stored), or the
        whole row where it is shorter (pad, unpad and the row scatter alike)."""
        row_bytes = cols * (ELEMENT_TYPES[variant.dtype].width // 8)
        chunk = WARP * config.vectors_per_lane * variant.vector_bytes
        warps = config.threads // WARP
        return LoadsInFlight(
            config.threads,
            warps * min(chunk, row_bytes),
            f"{warps} warps x min({WARP} lanes x {config.vectors_per_lane} vectors x "
            f"{variant.vector_bytes} B, {row_bytes} B row at K = {cols})",
        )

    @classmethod
    def variants(cls) -> list[RowGatherVariant]:
        return [RowGatherVariant(name, width) for name in DTYPES for width in vector_widths(name)]

    @classmethod
    def target_name(cls, variant: RowGatherVariant) -> str:
        return f"{cls.name}_{variant.dtype}_v{variant.vector_bytes}"

    @staticmethod
    def can_implement(num_groups: int, row_bytes: int, vector_bytes: int) -> bool:
        """At most ``MAX_GROUPS`` groups, and rows a whole number of vectors."""
        return PAD_TOKEN_GROUPS.limits.accepts(num_groups) and row_bytes % vector_bytes == 0

    @staticmethod
    def _fake_data_and_offsets(variant: RowGatherVariant):
        """Makers of the fake tensors: data (all sizes symbolic, D shared by input and output, a
        multiple of the vector's elements, pointers aligned to it) and Int32 (G,) offsets."""
        dtype = ELEMENT_TYPES[variant.dtype]
        elements = max(variant.vector_bytes // (dtype.width // 8), 1)
        cols = cute.sym_int(divisibility=elements)
        groups = cute.sym_int()

        def data():
            return cute.runtime.make_fake_compact_tensor(
                dtype, (cute.sym_int(), cols), stride_order=(1, 0), assumed_align=variant.vector_bytes
            )

        def offsets():
            return cute.runtime.make_fake_compact_tensor(Int32, (groups,), assumed_align=4)

        return data, offsets

    def _launch_options(self) -> dict:
        return {
            "block": [self.threads, 1, 1],
            "min_blocks_per_mp": self.config.ctas_per_sm,
            "preferred_smem_carveout": 100,
        }

    def _grid(self, out: cute.Tensor):
        """CTAs: enough for ``items_per_warp`` row chunks per warp, at least 1 (CTA 0 of pad writes
        the padded offsets even when there is no data)."""
        row_bytes = out.shape[1] * (out.element_type.width // 8)
        chunks = ceil_div(ceil_div(row_bytes, self.vector_bytes), self.row_chunk)
        return [cutlass.max(ceil_div(out.shape[0] * chunks, self.cta_items), 1), 1, 1]

    @cute.jit
    def _scan(self, offsets, total, unit, tid):
        """Group scan into shared memory (all threads; ends with a barrier): the prefix of the group
        sizes rounded up to ``unit`` (G + 1 words) and the clamped ends."""
        smem = SmemAllocator()
        prefix = smem.allocate_tensor(Int32, cute.make_layout(prefix_smem_words()), 16)
        ends = smem.allocate_tensor(Int32, cute.make_layout(prefix_smem_words()), 16)
        warp_totals = smem.allocate_tensor(Int32, cute.make_layout(self.warps), 16)
        num_groups = offsets.shape[0]
        scan_group_sizes(offsets, num_groups, total, unit, prefix, warp_totals, tid, self.threads, ends)
        return prefix, ends

    @cute.jit
    def _move_rows(self, src, dst, tid, segment_of):
        """This CTA's row chunks of ``dst``; ``segment_of(row)`` gives a row's segment (see
        :func:`_pad_segment`), looked up again only when a warp's row leaves its cached one."""
        warps, row_chunk = self.warps, self.row_chunk
        cta, _, _ = cute.arch.block_idx()
        src_v = row_vector_view(src, self.vector_bytes)
        dst_v = row_vector_view(dst, self.vector_bytes)
        chunks = ceil_div(dst_v.shape[1], row_chunk)
        warp = cute.arch.make_warp_uniform(tid // WARP)
        lane = tid % WARP
        # A contiguous run per CTA: a warp's rows advance slowly and its cached segment stays valid.
        first_item = cta * self.cta_items
        last_item = cutlass.min(first_item + self.cta_items, dst.shape[0] * chunks)
        frag = chunk_fragment(dst_v, self.per_lane)
        lo, hi, valid_lo, valid_hi, delta = Int32(0), Int32(0), Int32(0), Int32(0), Int32(0)
        for item in cutlass.range(first_item + warp, last_item, warps):
            row = item // chunks
            if row >= hi or row < lo:
                lo, hi, valid_lo, valid_hi, delta = segment_of(row)
            valid = row >= valid_lo and row < valid_hi
            first = (item - row * chunks) * row_chunk
            load_row_chunk(src_v, frag, row + delta, first, valid, lane, self.per_lane)
            store_row_chunk(frag, dst_v, row, first, lane, self.per_lane)


class PadKernel(RowGatherKernel):
    """``pad``: x (M, D) -> out (P, D) plus padded_start / padded_end (module docstring).

    Launch: ``kernel(x, out, offsets, padded_start, padded_end, alignment)`` with x and out of one
    dtype, row-major; offsets, padded_start, padded_end Int32 (G,); the variant's ``vector_bytes``
    must divide the row size in bytes and both data pointers' alignment.
    """

    name = "pad"

    @classmethod
    def fake_arguments(cls, variant: RowGatherVariant) -> tuple:
        data, offsets = cls._fake_data_and_offsets(variant)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return data(), data(), offsets(), offsets(), offsets(), Int32(32), stream

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # (M, D) row-major
        out: cute.Tensor,  # (P, D) row-major, x's dtype
        offsets: cute.Tensor,  # Int32 (G,) group end rows
        padded_start: cute.Tensor,  # Int32 (G,) written
        padded_end: cute.Tensor,  # Int32 (G,) written
        alignment: Int32,
        stream,
    ):
        self.kernel(x, out, offsets, padded_start, padded_end, alignment).launch(
            grid=self._grid(out), stream=stream, **self._launch_options()
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, out: cute.Tensor, offsets, padded_start, padded_end, alignment: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        num_groups = offsets.shape[0]
        rows_out = out.shape[0]
        prefix, ends = self._scan(offsets, x.shape[0], alignment, tid)
        if cta == 0:
            store_padded_offsets(prefix, num_groups, alignment, padded_start, padded_end, tid, self.threads)
        self._move_rows(
            x, out, tid, lambda row: _pad_segment(prefix, ends, num_groups, alignment, rows_out, row)
        )


class UnpadKernel(RowGatherKernel):
    """``unpad``: padded (P, D) -> out (N, D) (module docstring).

    Launch: ``kernel(padded, out, offsets, padded_start)``; same dtype and vector rules as
    :class:`PadKernel`.
    """

    name = "unpad"

    @classmethod
    def fake_arguments(cls, variant: RowGatherVariant) -> tuple:
        data, offsets = cls._fake_data_and_offsets(variant)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return data(), data(), offsets(), offsets(), stream

    @cute.jit
    def __call__(
        self,
        padded: cute.Tensor,  # (P, D) row-major
        out: cute.Tensor,  # (N, D) row-major, padded's dtype
        offsets: cute.Tensor,  # Int32 (G,) group end rows of out
        padded_start: cute.Tensor,  # Int32 (G,) first padded row of each group
        stream,
    ):
        self.kernel(padded, out, offsets, padded_start).launch(
            grid=self._grid(out), stream=stream, **self._launch_options()
        )

    @cute.kernel
    def kernel(self, padded: cute.Tensor, out: cute.Tensor, offsets, padded_start):
        tid, _, _ = cute.arch.thread_idx()
        num_groups = offsets.shape[0]
        rows_in = padded.shape[0]
        rows_out = out.shape[0]
        prefix, _ = self._scan(offsets, rows_out, 1, tid)
        self._move_rows(
            padded,
            out,
            tid,
            lambda row: _unpad_segment(prefix, num_groups, padded_start, rows_in, rows_out, row),
        )


__all__ = [
    "DTYPES",
    "ELEMENT_TYPES",
    "PadConfig",
    "PadKernel",
    "RowGatherKernel",
    "RowGatherVariant",
    "UnpadKernel",
    "vector_widths",
]
