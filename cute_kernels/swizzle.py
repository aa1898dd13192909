"""``swizzle_scales``: E8M0 scale matrices to the blocked layout (SPEC section 3), one kernel:
:class:`SwizzleKernel`, built from a :class:`SwizzleVariant` and a :class:`SwizzleConfig`.

Layouts (a compile-time choice, :class:`SwizzleLayout`):

- ``plain``: src (E, R, C) -> E independent blocked matrices (2D is E = 1), dst (E, Rp, Cp).
- ``m_groups``: src (1, R, C), row groups from end offsets -> (R + 128 G, Cp); group g's rows are
  blocked from row ``P_g = 128 * sum_{i<g} ceil(n_i / 128)``.
- ``k_groups``: src (1, R, C), column groups from end offsets -> (Rp, C + 4 G); group g's blocked
  tiles start at flat byte ``Rp * Q_g``, ``Q_g = 4 * sum_{i<g} ceil(k_i / 4)``.

Work decomposition: a *work item* is (128-row output block, window of ``window_cols`` padded scale
columns). The grid is persistent: ``n_windows * k`` CTAs with ``k = max(1, ctas // n_windows)`` for
``ctas = num_sms * ctas_per_sm`` (``num_sms``: a launch argument, the device's SM count); CTA ``c``
keeps window ``c % n_windows`` for its whole life and
walks the row blocks ``c // n_windows, + k, + 2k, ...`` (experts flattened into row blocks). So the
CTAs resident at any moment cover every window of a band of consecutive rows: whole source rows
and whole runs of output are read and written together (a window-by-window order re-reads the
DRAM bursts that straddle windows once the source outgrows L2), and everything that depends only
on the window or the groups (group scan, K-groups column map) is resolved once per CTA.

Per row block the CTA stages the 128 x window bytes in shared memory and each warp writes whole
512-byte tiles with 16-byte stores; the loads of the next row block are issued into registers
before the stores of the current one (software pipelining over a single staging buffer). Loads
are 4-byte words: with ``word_loads`` (rows of whole, aligned words, no K-groups) one word per tile
column; otherwise the aligned words covering each row's source bytes of the window (17 per row)
are staged raw and every tile column is funnel-shifted out of two of them (group column starts,
odd row lengths and unaligned bases need no byte loads). A source that ends inside an aligned word
takes the ``ragged_end`` variant: the row blocks that reach that last word read it as bytes, so no
load leaves the tensor (notes/sanitizer-clean-reads.md). Every output byte is written exactly
once, padding and uncovered bytes as 0.

Grouped layouts keep the per-CTA prologue short, since every CTA of the persistent grid runs it at
the same moment: up to ``threads`` groups are scanned in straight-line code, and M-groups resolves
the source rows of 32 row blocks at once (one binary search per lane) and hands them to the loop
by warp shuffle. Before the scan, each CTA asks the L2 for the lines its first work item would
read if no group padded anything (``SwizzleConfig.prefetch``), so the first loads after the scan
mostly hit the L2 (a guess: M-groups is exact inside the first group, K-groups windows are shifted
by at most 3 columns per group before them).

E, R, C, the group count and the SM count are symbolic: one compile per variant (layout, rank,
load mode, window) and arch. The per-arch configs, and the measurements behind them, are in
``cute_kernels/configs/sm90.py`` (``swizzle``). Source and destination are the caller's
``float8_e8m0fnu`` tensors, reinterpreted in-kernel.
"""

from dataclasses import dataclass
from enum import Enum

import cutlass
import cutlass.cute as cute
from cutlass import Float8E8M0FNU, Int32, Uint8, Uint32
from cutlass.memory import SmemAllocator

from cute_kernels.op_specs import SWIZZLE_SCALES
from cute_utils.blocked import (
    CHUNKS_PER_TILE,
    TILE_COLS,
    TILE_ROWS,
    allocate_staging,
    byte_mask,
    ceil_div,
    funnel_word,
    store_chunk,
)
from cute_utils.constants import BLOCK_SIZE, MAX_GROUPS, SWIZZLE_WIDE_MAX_BYTES
from cute_utils.group_tiles import group_tile, grouped_tile_count, m_groups_row_block, tile_count
from cute_utils.groups import prefix_smem_words, scan_group_sizes
from cute_utils.prefetch import LINE_BYTES, prefetch_row_ranges

from .base import Kernel, LoadsInFlight


class SwizzleLayout(str, Enum):
    PLAIN = "plain"
    M_GROUPS = "m_groups"
    K_GROUPS = "k_groups"


@dataclass(frozen=True)
class SwizzleConfig:
    """Launch shape: ``threads`` per CTA, ``window_cols`` scale columns per work item, and
    ``ctas_per_sm`` resident CTAs per SM: the persistent grid's size and the register cap
    (``65536 / (ctas_per_sm * threads)`` registers per thread) that keeps them all resident;
    ``prefetch`` (grouped layouts): L2-prefetch a guess of the first work item's source bytes
    while the group scan runs."""

    threads: int = 256
    window_cols: int = 64
    ctas_per_sm: int = 4
    prefetch: bool = True

    def __post_init__(self) -> None:
        tiles = self.window_cols // TILE_COLS
        if self.window_cols % TILE_COLS or (tiles * CHUNKS_PER_TILE) % self.threads:
            raise ValueError(f"window_cols={self.window_cols} does not split over {self.threads} threads")
        if (TILE_ROWS * tiles) % self.threads or self.threads % 32 or self.threads < self.window_cols:
            raise ValueError(f"threads={self.threads} must be a multiple of 32 dividing the window")
        if self.threads % tiles:
            raise ValueError(
                f"threads={self.threads} must be a multiple of the window's {tiles} tile columns"
            )
        if self.ctas_per_sm < 1 or self.ctas_per_sm * self.threads > 2048:
            raise ValueError(f"ctas_per_sm={self.ctas_per_sm} x {self.threads} threads do not fit on an SM")


#: Grouped scales of at most this many bytes (and more than 64 columns) take the 128-column window
#: (``SwizzleVariant.wide``; the reasons are in ``cute_kernels/configs/sm90.py``).
WIDE_MAX_BYTES = SWIZZLE_WIDE_MAX_BYTES
#: Source columns left of its padded position that a K-groups window's prefetch also takes.
K_GROUPS_PREFETCH_SLACK = 64


def wide_window(layout: SwizzleLayout, rows: int, cols: int) -> bool:
    """Whether ``layout`` on (``rows``, ``cols``) scales uses its ``<layout>_wide`` config."""
    return layout is not SwizzleLayout.PLAIN and cols > 64 and rows * cols <= WIDE_MAX_BYTES


@cute.jit
def _k_group_column(ends, prefix, num_groups, row_blocks, tile, grid_tiles):
    """Padded tile column ``tile`` of K-groups: ``(first source column, byte count 0..4, base,
    stride)``; its tile of row block b is output tile ``base + b * stride`` (stride -1: past the
    output). Tiles past the groups' padded width form the zero tail after the last group's tiles.
    """
    covered = prefix[num_groups]
    g, source, end = group_tile(prefix, ends, num_groups, tile, TILE_COLS)
    count = tile_count(source, end, TILE_COLS)
    stride = prefix[g + 1] - prefix[g]
    base = row_blocks * prefix[g] + tile - prefix[g]
    if tile >= covered:
        count = Int32(0)
        stride = grid_tiles - covered
        base = row_blocks * covered + tile - covered
    if tile >= grid_tiles:
        stride = Int32(-1)
    return source, count, base, stride


@cute.jit
def _m_group_rows(prefix, ends, num_groups, block, rows):
    """``(first source row, valid rows)`` of M-groups output row block ``block`` (0 rows: a block no
    group covers, all padding)."""
    row0, valid, covered, _ = m_groups_row_block(prefix, ends, num_groups, block, rows)
    if not covered:
        valid = Int32(0)
    return row0, valid


@cute.jit
def _m_group_schedule(groups, ahead, total_blocks, rows):
    """:func:`_m_group_rows` of row block ``ahead`` (0 rows past ``total_blocks``): one lane's entry
    of the M-groups schedule, handed to the loop by warp shuffle."""
    row0, valid = _m_group_rows(groups.prefix, groups.ends, groups.num_groups, ahead, rows)
    if ahead >= total_blocks:
        valid = Int32(0)
    return row0, valid


@cute.jit
def _prefetch_first_block(
    src: cute.Tensor,
    layout: cutlass.Constexpr,
    bid: Int32,
    grid_tiles: Int32,
    tid: Int32,
    threads: cutlass.Constexpr,
    window_tiles: cutlass.Constexpr,
):
    """Grouped layouts: before the group scan, prefetch into the L2 the source bytes of this CTA's
    first work item as if no group padded anything (row block ``b`` = source rows ``128 b ..``, tile
    column ``t`` = source column ``4 t``). M-groups blocks before the first group's end are exactly
    there; K-groups windows start at most ``3 G`` columns to the left, so the guess takes 64 more.
    """
    rows, cols = src.shape
    n_windows = ceil_div(grid_tiles, window_tiles)
    first = (bid % n_windows) * window_tiles * TILE_COLS
    last = first + window_tiles * TILE_COLS
    lines = ceil_div(window_tiles * TILE_COLS, LINE_BYTES) + 1
    if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
        first = first - K_GROUPS_PREFETCH_SLACK
        last = last + TILE_COLS
        lines = lines + 1
    prefetch_row_ranges(
        src.iterator.toint(),
        (bid // n_windows) * TILE_ROWS,
        rows,
        cols,
        first,
        last,
        tid,
        threads,
        TILE_ROWS,
        lines,
    )


@cute.jit
def _plain_rows(block, rows, row_blocks, rank: cutlass.Constexpr):
    """``(first source row, valid rows)`` of plain output row block ``block``; experts are
    flattened into rows (expert ``e``'s rows start at ``e * rows``)."""
    if cutlass.const_expr(rank == 3):
        expert = block // row_blocks
        local = (block - expert * row_blocks) * TILE_ROWS
        row0 = expert * rows + local
    else:
        local = block * TILE_ROWS
        row0 = local
    return row0, cutlass.min(rows - local, TILE_ROWS)


def _slot(i: int, tid, threads: int, window_tiles: int):
    """Staged word ``(row, word)`` of a thread's load slot ``i`` and whether the slot exists.

    Slots ``i < 128 * window_tiles / threads`` cover words ``0 .. window_tiles - 1`` of every row
    (affine in ``i``: few live registers); the rest cover word ``window_tiles`` of each row (raw
    word loads stage one word more per row)."""
    main = TILE_ROWS * window_tiles // threads
    if i < main:
        return i * (threads // window_tiles) + tid // window_tiles, tid % window_tiles, True
    row = (i - main) * threads + tid
    return row, window_tiles, (i - main + 1) * threads <= TILE_ROWS or row < TILE_ROWS


def _slot_count(threads: int, window_tiles: int, word_loads: bool) -> int:
    main = TILE_ROWS * window_tiles // threads
    return main if word_loads else main + ceil_div(TILE_ROWS, threads)


@cute.jit
def _source_words(
    src: cute.Tensor, rows: Int32, cols: Int32, word_loads: cutlass.Constexpr, ragged_end: cutlass.Constexpr
):
    """The source seen as 4-byte words: ``(src_words, skew, tail)`` for :func:`_load_block`.
    ``word_loads``: (rows, C / 4) words of an aligned source, ``skew`` 0. Otherwise the flat aligned
    words from the aligned-down base, ``skew`` = base address % 4, and ``tail`` = ``(src, bytes)``
    when ``ragged_end`` (else None). ``rows``: all rows (3-D: experts x rows)."""
    skew = Int32(0)
    tail = None
    if cutlass.const_expr(word_loads):
        src_words = cute.make_tensor(
            cute.recast_ptr(src.iterator, dtype=Uint32),
            cute.make_layout((rows, cols // TILE_COLS), stride=(cols // TILE_COLS, 1)),
        )
    else:
        address = src.iterator.toint()
        skew = Int32(address & 3)
        src_words = cute.make_tensor(
            cute.make_ptr(Uint32, address - (address & 3), cute.AddressSpace.gmem, assumed_align=4),
            cute.make_layout((skew + rows * cols + 3) // TILE_COLS),
        )
        if cutlass.const_expr(ragged_end):
            tail = (src, rows * cols)
    return src_words, skew, tail


@cute.jit
def _tail_word(src: cute.Tensor, skew: Int32, nbytes: Int32) -> Uint32:
    """The last aligned word of the source when the source ends inside it, from byte loads (bytes
    past the end read as 0; a word load would read up to 3 bytes outside the tensor). ``skew``:
    the base address % 4; ``nbytes``: the source's size."""
    src_bytes = cute.make_tensor(cute.recast_ptr(src.iterator, dtype=Uint8), cute.make_layout(nbytes))
    first = (skew + nbytes) // TILE_COLS * TILE_COLS - skew  # source byte of the word's first byte
    word = Uint32(0)
    for j in cutlass.range_constexpr(TILE_COLS):
        if first + j >= 0 and first + j < nbytes:
            word = word | ((Uint32(src_bytes[first + j]) & Uint32(0xFF)) << (8 * j))
    return word


@dataclass(frozen=True)
class SwizzleVariant:
    """Compile-time choices of a swizzle kernel.

    ``layout``: :class:`SwizzleLayout`; ``rank``: 2, or 3 for ``plain`` (E, R, C) scales.
    ``word_loads`` (needs C % 4 == 0 and a 4-byte aligned source; not for ``k_groups``) loads one
    4-byte word per tile column; without it, aligned words are funnel-shifted (any C, any base).
    ``wide`` (grouped layouts): the 128-column-window config (see :func:`wide_window`).
    ``ragged_end`` (raw words only; needed when the source ends inside an aligned word, i.e.
    ``(address + bytes) % 4 != 0``): that last word is read as bytes, never as a word reaching past
    the tensor (notes/sanitizer-clean-reads.md). Without it the source must end on a word.
    """

    layout: SwizzleLayout
    rank: int = 2
    word_loads: bool = False
    wide: bool = False
    ragged_end: bool = False

    def __post_init__(self) -> None:
        grouped = self.layout is not SwizzleLayout.PLAIN
        if self.word_loads and self.layout is SwizzleLayout.K_GROUPS:
            raise ValueError("k_groups windows start at arbitrary columns: word loads do not apply")
        if self.word_loads and self.ragged_end:
            raise ValueError("word loads read whole words of the rows: there is no ragged end")
        if self.rank not in (2, 3) or (self.rank == 3 and grouped):
            raise ValueError("grouped layouts take 2-D scales, plain ones 2-D or 3-D")
        if self.wide and not grouped:
            raise ValueError("the wide window is a grouped layouts' config")


@dataclass(frozen=True)
class _Groups:
    """The group scan of a grouped layout, in shared memory: ``prefix`` (padded units before each
    group, G + 1 words) and the clamped ``ends``."""

    num_groups: Int32
    prefix: cute.Tensor
    ends: cute.Tensor


@dataclass(frozen=True)
class _Columns:
    """K-groups: the per-CTA column map of the window in shared memory, one entry per tile column:
    first source column and byte count (0..4), output tile base and stride (see
    :func:`_k_group_column`)."""

    source: cute.Tensor
    count: cute.Tensor
    base: cute.Tensor
    stride: cute.Tensor


@dataclass(frozen=True)
class _Window:
    """What one thread's loads and stores know of its CTA's window (DSL values, fixed for the CTA's
    life): its thread, warp and lane; the window's first tile column, the source's tile columns and
    columns ``cols``; ``lo``/``span``: the window's source bytes of a row are columns
    ``[lo, lo + span)``; the source as words (:func:`_source_words`): ``words``, ``skew`` and
    ``tail``."""

    tid: Int32
    warp: Int32
    lane: Int32
    first_tile: Int32
    col_tiles: Int32
    cols: Int32
    lo: Int32
    span: Int32
    words: cute.Tensor
    skew: Int32
    tail: object


@dataclass(frozen=True)
class _Output:
    """The blocked output as 32-bit ``words`` and as 16-byte ``chunks`` (``full`` whole ones)."""

    chunks: cute.Tensor
    words: cute.Tensor
    full: Int32

    @staticmethod
    def of(dst: cute.Tensor) -> "_Output":
        total_words = cute.size(dst) // TILE_COLS
        words = cute.make_tensor(cute.recast_ptr(dst.iterator, dtype=Uint32), cute.make_layout(total_words))
        chunks = cute.make_tensor(
            cute.recast_ptr(dst.iterator, dtype=Uint32),
            cute.make_layout((total_words // TILE_COLS, TILE_COLS), stride=(TILE_COLS, 1)),
        )
        return _Output(chunks, words, total_words // TILE_COLS)


@dataclass(frozen=True)
class _Walk:
    """A CTA's row blocks: ``first_block, + block_step, ...`` below ``total_blocks`` (experts
    flattened; M-groups: padded blocks), over sources of ``rows`` rows (``row_blocks`` blocks per
    expert); ``groups``: the M-groups scan (else None)."""

    first_block: Int32
    block_step: Int32
    total_blocks: Int32
    rows: Int32
    row_blocks: Int32
    groups: object


class SwizzleKernel(Kernel):
    """``swizzle_scales``' kernel (module docstring) for one :class:`SwizzleVariant` and
    :class:`SwizzleConfig`.

    Launch: ``kernel(src, dst, offsets, num_sms)``. ``src``: Float8E8M0FNU (R, C) or, for ``plain``
    with ``rank=3``, (E, R, C), row-major. ``dst``: the blocked Float8E8M0FNU output of the same
    rank, 16-byte aligned (its byte count is a multiple of 4). ``offsets``: Int32 (G,) end offsets
    (rows for ``m_groups``, scale columns for ``k_groups``), ``None`` for ``plain``. ``num_sms``:
    the device's SM count, which sizes the persistent grid.
    """

    name = "swizzle"

    @classmethod
    def loads_in_flight(cls, variant: SwizzleVariant, config: SwizzleConfig, cols: int) -> LoadsInFlight:
        """One 128-row block of the CTA's window (4-byte words, staged in registers while the
        previous block is stored); raw (not ``word_loads``) rows take up to one aligned word more.
        ``cols``: K of the data the scales belong to (K / 32 scale columns)."""
        scale_cols = cols // BLOCK_SIZE
        words = -(-min(config.window_cols, scale_cols) // TILE_COLS) + (0 if variant.word_loads else 1)
        extra = "" if variant.word_loads else ", up to 1 spill word"
        return LoadsInFlight(
            config.threads,
            TILE_ROWS * words * 4,
            f"{TILE_ROWS} rows x {words} words{extra} x 4 B of E8M0 "
            f"({config.window_cols}-col window of K/32 = {scale_cols} cols; {config.threads} thr)",
        )

    def __init__(self, variant: SwizzleVariant, config: SwizzleConfig) -> None:
        super().__init__(variant, config)
        self.layout = variant.layout
        self.rank = variant.rank
        self.word_loads = variant.word_loads
        self.ragged_end = variant.ragged_end
        self.grouped = variant.layout is not SwizzleLayout.PLAIN
        self.threads = config.threads
        self.window = config.window_cols
        self.window_tiles = config.window_cols // TILE_COLS
        self.warps = config.threads // 32
        self.loads_per_thread = _slot_count(self.threads, self.window_tiles, self.word_loads)
        self.stores_per_thread = self.window_tiles * CHUNKS_PER_TILE // self.threads

    @classmethod
    def variants(cls) -> list[SwizzleVariant]:
        """Every variant the bindings may ask for. Raw (not word-load) plain and M-groups sources
        are raw only when C % 4 != 0 or the base is not 4-byte aligned, so they may end inside a
        word for some M: only their ``ragged_end`` form is built. K-groups sources (always raw) end
        on a word when K % 4 == 0 and the base is aligned: both forms."""
        base = [
            (SwizzleLayout.PLAIN, 2, False, False),
            (SwizzleLayout.PLAIN, 2, True, False),
            (SwizzleLayout.PLAIN, 3, False, False),
            (SwizzleLayout.PLAIN, 3, True, False),
            (SwizzleLayout.M_GROUPS, 2, False, False),
            (SwizzleLayout.M_GROUPS, 2, True, False),
            (SwizzleLayout.M_GROUPS, 2, False, True),
            (SwizzleLayout.M_GROUPS, 2, True, True),
            (SwizzleLayout.K_GROUPS, 2, False, False),
            (SwizzleLayout.K_GROUPS, 2, False, True),
        ]
        return [SwizzleVariant(*v, False) for v in base if v[2] or v[0] is SwizzleLayout.K_GROUPS] + [
            SwizzleVariant(*v, True) for v in base if not v[2]
        ]

    @classmethod
    def target_name(cls, variant: SwizzleVariant) -> str:
        """``swizzle_<layout>_<rank>d[_words][_ragged][_wide]``."""
        loads = "_words" if variant.word_loads else "_ragged" if variant.ragged_end else ""
        return f"swizzle_{variant.layout.value}_{variant.rank}d{loads}{'_wide' if variant.wide else ''}"

    @classmethod
    def fake_arguments(cls, variant: SwizzleVariant) -> tuple:
        """Fake tensors (all sizes symbolic), the SM count and the env stream ``__call__`` compiles
        against."""
        rank = variant.rank
        order = tuple(range(rank - 1, -1, -1))
        src = cute.runtime.make_fake_compact_tensor(
            Float8E8M0FNU,
            tuple(cute.sym_int() for _ in range(rank)),
            stride_order=order,
            assumed_align=4 if variant.word_loads else 1,
        )
        dst = cute.runtime.make_fake_compact_tensor(
            Float8E8M0FNU, tuple(cute.sym_int() for _ in range(rank)), stride_order=order, assumed_align=16
        )
        offsets = None
        if variant.layout is not SwizzleLayout.PLAIN:
            offsets = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return src, dst, offsets, Int32(1), stream

    @staticmethod
    def can_implement(variant: SwizzleVariant, shape: tuple, address: int, num_groups: int = 0) -> bool:
        """Whether ``variant`` runs scales of ``shape`` ((R, C), or (E, R, C) for a 3-D ``plain``)
        whose data start at ``address``, with ``num_groups`` groups: 1 to ``MAX_GROUPS`` groups
        (none for ``plain``); word loads only for rows of whole, aligned words; the raw form
        without ``ragged_end`` only for a source that ends on a word. (Which window a grouped call
        should take is :func:`wide_window`'s choice, not a limit.)"""
        *_, cols = shape
        nbytes = 1
        for dim in shape:
            nbytes *= dim
        grouped = variant.layout is not SwizzleLayout.PLAIN
        if len(shape) != variant.rank or (0 < num_groups <= SWIZZLE_SCALES.limits.max_groups) != grouped:
            return False
        if variant.word_loads:
            return cols % TILE_COLS == 0 and address % TILE_COLS == 0
        return variant.ragged_end or (address + nbytes) % TILE_COLS == 0

    @cute.jit
    def __call__(
        self,
        src: cute.Tensor,  # (R, C) or (E, R, C) Float8E8M0FNU, row-major
        dst: cute.Tensor,  # blocked Float8E8M0FNU of src's rank, 16-byte aligned
        offsets,  # Int32 (G,) group end offsets (rows or scale columns), None for plain
        num_sms: Int32,  # the device's SM count: sizes the persistent grid
        stream,
    ):
        experts = 1
        if cutlass.const_expr(self.rank == 3):
            experts, rows, cols = src.shape
        else:
            rows, cols = src.shape
        blocks = experts * ceil_div(rows, TILE_ROWS)
        tiles = ceil_div(cols, TILE_COLS)
        if cutlass.const_expr(self.layout is SwizzleLayout.M_GROUPS):
            blocks = grouped_tile_count(rows, offsets.shape[0], TILE_ROWS)
        if cutlass.const_expr(self.layout is SwizzleLayout.K_GROUPS):
            tiles = grouped_tile_count(cols, offsets.shape[0], TILE_COLS)
        n_windows = ceil_div(tiles, self.window_tiles)
        max_ctas = num_sms * self.config.ctas_per_sm
        per_window = cutlass.max(cutlass.min(blocks, max_ctas // n_windows), 1)
        self.kernel(src, dst, offsets).launch(
            grid=[n_windows * per_window, 1, 1],
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.ctas_per_sm,
            preferred_smem_carveout=100,
        )

    @cute.kernel
    def kernel(self, src: cute.Tensor, dst: cute.Tensor, offsets):
        layout, window, window_tiles = self.layout, self.window, self.window_tiles
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        warp = tid // 32
        lane = tid % 32
        experts = 1
        if cutlass.const_expr(self.rank == 3):
            experts, rows, cols = src.shape
        else:
            rows, cols = src.shape
        out = _Output.of(dst)
        row_blocks = ceil_div(rows, TILE_ROWS)
        col_tiles = ceil_div(cols, TILE_COLS)
        total_blocks = experts * row_blocks
        grid_tiles = col_tiles

        smem = SmemAllocator()
        stage = allocate_staging(smem, window)

        groups = None
        if cutlass.const_expr(self.grouped):
            num_groups = offsets.shape[0]
            if cutlass.const_expr(layout is SwizzleLayout.M_GROUPS):
                total_blocks = grouped_tile_count(rows, num_groups, TILE_ROWS)
            else:
                grid_tiles = grouped_tile_count(cols, num_groups, TILE_COLS)
            total = rows if cutlass.const_expr(layout is SwizzleLayout.M_GROUPS) else cols
            groups = self._scan_groups(smem, src, offsets, num_groups, total, bid, grid_tiles, tid)

        n_windows = ceil_div(grid_tiles, window_tiles)
        first_tile = (bid % n_windows) * window_tiles
        first_block = bid // n_windows
        block_step = num_ctas // n_windows

        # ``lo``/``span``: the window's source bytes of a row are columns [lo, lo + span).
        lo = first_tile * TILE_COLS
        span = cutlass.max(cutlass.min(cols - lo, window), 0)
        columns = None
        if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
            columns, lo, span = self._k_group_columns(
                smem, groups, row_blocks, first_tile, grid_tiles, tid, cols
            )

        src_words, skew, tail = _source_words(src, experts * rows, cols, self.word_loads, self.ragged_end)
        win = _Window(tid, warp, lane, first_tile, col_tiles, cols, lo, span, src_words, skew, tail)
        walk = _Walk(first_block, block_step, total_blocks, rows, row_blocks, groups)
        self._pipeline(stage, win, walk, columns, out)

    @cute.jit
    def _pipeline(self, stage: cute.Tensor, win: _Window, walk: _Walk, columns, out: _Output):
        """The CTA's walk over its row blocks, software-pipelined: the loads of row block
        ``block + step`` are in flight while block ``block`` is stored. M-groups: each lane resolves
        (binary search in shared memory) the rows of one of the next 32 row blocks at once; the loop
        takes them by warp shuffle."""
        first_block, block_step, total_blocks = walk.first_block, walk.block_step, walk.total_blocks
        rows, row_blocks, lane = walk.rows, walk.row_blocks, win.lane
        m_groups = self.layout is SwizzleLayout.M_GROUPS
        regs = cute.make_rmem_tensor(cute.make_layout(self.loads_per_thread), Uint32)
        if cutlass.const_expr(m_groups):
            sched_row0, sched_valid = _m_group_schedule(
                walk.groups, first_block + lane * block_step, total_blocks, rows
            )
            row0 = cute.arch.shuffle_sync(sched_row0, 0)
            valid = cute.arch.shuffle_sync(sched_valid, 0)
        else:
            row0, valid = _plain_rows(first_block, rows, row_blocks, self.rank)
        self._load_block(regs, win, row0, valid)
        step_index = Int32(0)
        for block in cutlass.range(first_block, total_blocks, block_step):
            self._stage_block(stage, regs, win.tid)
            cute.arch.sync_threads()

            step_index = step_index + 1
            if cutlass.const_expr(m_groups):
                if step_index % 32 == 0:
                    sched_row0, sched_valid = _m_group_schedule(
                        walk.groups, block + (lane + 1) * block_step, total_blocks, rows
                    )
                next_row0 = cute.arch.shuffle_sync(sched_row0, step_index % 32)
                next_valid = cute.arch.shuffle_sync(sched_valid, step_index % 32)
            else:
                next_row0, next_valid = _plain_rows(block + block_step, rows, row_blocks, self.rank)
                if block + block_step >= total_blocks:
                    next_valid = Int32(0)
            self._load_block(regs, win, next_row0, next_valid)

            self._store_block(stage, win, columns, out, block, row0, valid)
            cute.arch.sync_threads()
            row0 = next_row0
            valid = next_valid

    @cute.jit
    def _scan_groups(self, smem, src, offsets, num_groups, total, bid, grid_tiles, tid):
        """The group scan into shared memory (all threads; ``total``: the rows or columns the
        groups split), after the L2 prefetch of this CTA's first work item
        (``SwizzleConfig.prefetch``)."""
        if cutlass.const_expr(self.config.prefetch):
            _prefetch_first_block(src, self.layout, bid, grid_tiles, tid, self.threads, self.window_tiles)
        prefix = smem.allocate_tensor(Int32, cute.make_layout(prefix_smem_words()), 16)
        ends = smem.allocate_tensor(Int32, cute.make_layout(prefix_smem_words()), 16)
        warp_totals = smem.allocate_tensor(Int32, cute.make_layout(self.warps), 16)
        unit = TILE_ROWS if cutlass.const_expr(self.layout is SwizzleLayout.M_GROUPS) else TILE_COLS
        scan_group_sizes(offsets, num_groups, total, unit, prefix, warp_totals, tid, self.threads, ends)
        return _Groups(num_groups, prefix, ends)

    @cute.jit
    def _k_group_columns(self, smem, groups, row_blocks, first_tile, grid_tiles, tid, cols):
        """K-groups: the per-CTA column map of the window (tile column -> source column and byte
        count, output tile base and stride), built by warp 0 and read back from shared memory for
        every row block, and the window's ``(columns, lo, span)``. Column starts of consecutive
        tile columns rise by 1..4 (by 4 inside a group) and only the zero tail has no bytes, so
        the window's bytes lie in [lo, lo + window) from the first tile column's start; garbage
        offsets are clamped into the staged row (meaningless bytes, never out of bounds)."""
        window_tiles = self.window_tiles
        col_source = smem.allocate_tensor(Int32, cute.make_layout(window_tiles), 16)
        col_count = smem.allocate_tensor(Int32, cute.make_layout(window_tiles), 16)
        tile_base = smem.allocate_tensor(Int32, cute.make_layout(window_tiles), 16)
        tile_stride = smem.allocate_tensor(Int32, cute.make_layout(window_tiles), 16)
        if tid < window_tiles:
            source, count, base, stride = _k_group_column(
                groups.ends, groups.prefix, groups.num_groups, row_blocks, first_tile + tid, grid_tiles
            )
            col_source[tid] = source
            col_count[tid] = count
            tile_base[tid] = base
            tile_stride[tid] = stride
        cute.arch.sync_threads()
        lo = col_source[0]
        span = cutlass.max(cutlass.min(cols - lo, self.window), 0)
        if col_count[0] == 0:
            lo = Int32(0)
            span = Int32(0)
        return _Columns(col_source, col_count, tile_base, tile_stride), lo, span

    @cute.jit
    def _load_block(self, regs: cute.Tensor, win: _Window, row0: Int32, valid: Int32):
        """Issue one thread's loads of a row block into ``regs`` (0 where nothing is loaded).

        Slot ``i`` is staged word ``(r, k)`` (:func:`_slot`). With ``word_loads`` that is tile
        column ``first_tile + k`` of source row ``row0 + r``; otherwise the ``k``-th aligned word of
        the flat source from the one holding byte ``(row0 + r) * cols + lo`` (``skew`` = base
        address % 4), loaded only if it holds one of the row's ``span`` bytes. ``win.tail`` (raw
        loads of a source that ends inside a word; else None) = ``(src, nbytes)``: the source and
        its size. Words from ``full_words = (skew + nbytes) // 4`` on reach past its end and are
        not loaded; the one such word a row can need is read as bytes (:func:`_tail_word`). Only a
        block whose rows end past word ``full_words`` can need it, so only such a block checks
        word indices.
        """
        if cutlass.const_expr(self.word_loads):
            for i in cutlass.range_constexpr(self.loads_per_thread):
                r, k, _ = _slot(i, win.tid, self.threads, self.window_tiles)
                value = Uint32(0)
                if r < valid and win.first_tile + k < win.col_tiles:
                    value = Uint32(win.words[row0 + r, win.first_tile + k])
                regs[i] = value
        elif cutlass.const_expr(win.tail is None):
            self._load_raw_words(regs, win, row0, valid, None)
        else:
            src, nbytes = win.tail
            full_words = (win.skew + nbytes) // TILE_COLS
            if win.skew + (row0 + valid) * win.cols > full_words * TILE_COLS:
                last = (full_words, _tail_word(src, win.skew, nbytes))
                self._load_raw_words(regs, win, row0, valid, last)
            else:
                self._load_raw_words(regs, win, row0, valid, None)

    @cute.jit
    def _load_raw_words(self, regs: cute.Tensor, win: _Window, row0: Int32, valid: Int32, last):
        """The raw-word loads of :meth:`_load_block`. ``last``: ``(full_words, tail_word)``, the
        first word index past the source's whole words and the bytes of that word; None: no word of
        the block reaches past the source."""
        for i in cutlass.range_constexpr(self.loads_per_thread):
            r, k, exists = _slot(i, win.tid, self.threads, self.window_tiles)
            value = Uint32(0)
            offset = win.skew + (row0 + r) * win.cols + win.lo
            if exists and r < valid and k * TILE_COLS < (offset & 3) + win.span:
                word = (offset >> 2) + k
                if cutlass.const_expr(last is None):
                    value = Uint32(win.words[word])
                else:
                    full_words, value = last
                    if word < full_words:
                        value = Uint32(win.words[word])
            regs[i] = value

    @cute.jit
    def _stage_block(self, stage: cute.Tensor, regs: cute.Tensor, tid: Int32):
        """Write one thread's loaded words of a row block into the staging buffer."""
        for i in cutlass.range_constexpr(self.loads_per_thread):
            r, k, exists = _slot(i, tid, self.threads, self.window_tiles)
            if exists:
                stage[r, k] = regs[i]

    @cute.jit
    def _store_block(self, stage, win: _Window, columns, out: _Output, block, row0, valid):
        """Each warp's whole tiles of the staged row block ``block`` (source rows ``row0 ..``,
        ``valid`` of them) to the output, 16-byte chunks, one per lane."""
        cols, lo, lane, window = win.cols, win.lo, win.lane, self.window
        row_skew = win.skew + row0 * cols + lo
        for i in cutlass.range_constexpr(self.stores_per_thread):
            # Tile column ``tile`` of the window: output tile ``base + block * stride`` (none if
            # stride < 0); its bytes sit at byte ``rel`` of the staged rows, ``mask`` keeps them.
            tile = i * self.warps + win.warp
            if cutlass.const_expr(self.layout is SwizzleLayout.K_GROUPS):
                base = columns.base[tile]
                stride = columns.stride[tile]
                rel = cutlass.max(cutlass.min(columns.source[tile] - lo, window - TILE_COLS), 0)
                mask = byte_mask(columns.count[tile])
            else:
                base = win.first_tile + tile
                stride = win.col_tiles
                if base >= win.col_tiles:
                    stride = Int32(-1)
                rel = tile * TILE_COLS
                mask = byte_mask(cutlass.max(cutlass.min(win.span - rel, TILE_COLS), 0))
            if stride >= 0:
                frag = cute.make_rmem_tensor(cute.make_layout(TILE_COLS), Uint32)
                for q in cutlass.range_constexpr(TILE_ROWS // CHUNKS_PER_TILE):
                    r = lane + CHUNKS_PER_TILE * q
                    if cutlass.const_expr(self.word_loads):
                        frag[q] = stage[r, tile]
                    else:
                        word = Uint32(0)
                        if r < valid:
                            word = funnel_word(stage, r, ((row_skew + r * cols) & 3) + rel) & mask
                        frag[q] = word
                chunk = (base + block * stride) * CHUNKS_PER_TILE + lane
                store_chunk(frag, out.chunks, out.words, chunk, out.full)


__all__ = [
    "MAX_GROUPS",
    "WIDE_MAX_BYTES",
    "SwizzleConfig",
    "SwizzleKernel",
    "SwizzleLayout",
    "SwizzleVariant",
    "wide_window",
]
