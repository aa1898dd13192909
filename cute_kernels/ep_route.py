"""Expert-parallel routing and layout on the device (SPEC section 9, ``torch_bindings.ep``): the
sender's per-expert counts and stable ranks, each pair's destination row, and the receiver's zero
fill, with no host sync (design and costs: notes/ep-routing-kernel.md).

Three kernels, each one launch:

- :class:`EpRouteKernel` (before the count exchange): ``ids`` (P,) int32/int64 expert ids of the
  (token, slot) pairs in pair order (``topk_idx`` flattened, token-major) -> ``counts[e]`` pairs of
  expert e for e < E (ids outside ``[0, E)`` are dropped: counted nowhere), ``counts[E] = tail``
  when ``counts`` is longer (the slot ticket the exchange carries), and ``position[i]`` the rank
  of pair i among the pairs of its expert in pair order (-1 for a dropped pair). CTA ``c`` owns a
  chunk of ``warps * 32 * steps`` pairs: it counts every pair before its chunk into a shared
  histogram (warp-aggregated shared atomics: ``match.any`` groups the lanes of one expert, the
  lowest adds the group's size), counts its warps' sub-chunks into one shared row per warp, turns
  the rows into running starts (a scan over the warps per expert), then ranks its pairs. No CTA
  waits for another; the CTA of the last chunk writes the counts, and the same words into row
  ``table_row`` of every (R, n) count table of ``peers`` (the count exchange's post: Int64 addresses,
  none at R = 1). CTAs take chunks from the last one down, so the longest prefix counts start
  first.
- :class:`EpLayoutKernel` (after the exchange): ``all_counts`` (R, n) int32 of every rank, the
  counts in columns ``[0, E)`` (the exchange's (R, E + 1) table, the tickets in column E), this
  ``rank``, ``rows`` and the alignment A -> ``dst_index[i] = dest_rank * rows + padded_start[e] +
  (pairs of e on lower ranks) + position[i]`` (-1 dropped) and this rank's ``padded_start`` /
  ``padded_end`` / ``sizes`` (E_local,) int32. Every CTA computes the (E,) destination bases in
  shared memory (column sums of the counts, a scan of the padded sizes, per receiving rank); CTA 0
  writes the offsets and, by ``mode`` (:data:`LAYOUT_TRACK` / :data:`LAYOUT_CHECK` /
  :data:`LAYOUT_RESET`), a slot's ``state`` (3,) int32: ``state[1] = state[0]`` (the previous
  call's end, for this call's zero fill) and ``state[0]`` the new end; ``state[2]`` 1 when every
  rank's ticket (column E) is ``ticket``, else 0; the tickets overwritten by -1 once read (a slot a
  CUDA graph captured).
- :class:`EpZeroFillKernel` (receiver, one launch for a dispatch's buffers): writes ``word`` into
  the row buffer ``buf`` (rows, W) and ``word_a`` / ``word_b`` into the 4-byte words of ``aux_a`` /
  ``aux_b`` (rows, A) int32 (the scale rows, whose word is the bits of fp32 1.0 for fp8_rowwise,
  and the tags), in every row that no pair fills: ``[padded_start[j] + sizes[j], padded_end[j])``
  of every group and ``[end, limit)`` with ``end = padded_end[G - 1]``, ``limit = max(filled[0],
  end)`` (reused buffers) or ``rows`` (``fresh``). Its work items are those rows only (a scan of
  the groups' padding), over a grid of at most ``ctas_per_sm`` CTAs per SM (the launcher's
  ``sms``).

E <= ``EP_MAX_EXPERTS`` (``cute_utils.constants``); all sizes symbolic (P, E, R, rows, W): one
compile per (kernel, id dtype or buffer dtype and vector width, arch). Results are exactly those of
``torch_bindings.ep``'s PyTorch routing (integer arithmetic, the same formulas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Int32, Int64
from cutlass.memory import SmemAllocator

from cute_utils.blocked import ceil_div
from cute_utils.constants import EP_FILL_VARIANTS, EP_MAX_EXPERTS, LAYOUT_CHECK, LAYOUT_RESET, LAYOUT_TRACK
from cute_utils.groups import find_group, search_steps
from cute_utils.scan import cta_exclusive_scan

from .base import Kernel

_WARP = 32
_FULL_MASK = 0xFFFFFFFF
#: Expert id dtypes (torch names) the route and layout kernels read.
ID_TYPES = {"int32": Int32, "int64": Int64}
#: Row buffer dtypes (torch names) the zero fill writes (``EP_FILL_VARIANTS``: a dispatch's q; its
#: scale rows and tags go as Int32 words).
FILL_TYPES = {
    "float8_e4m3fn": Float8E4M3FN,
    "bfloat16": BFloat16,
}
#: Static shared memory a CTA may take without an opt-in.
_SMEM_LIMIT = 48 * 1024


@dataclass(frozen=True)
class EpIdVariant:
    """The route and layout kernels' one compile-time choice: ``index_dtype`` of the expert ids
    (an :data:`ID_TYPES` name)."""

    index_dtype: str


@dataclass(frozen=True)
class EpFillVariant:
    """The zero fill's compile-time choices: the row buffer's ``dtype`` (a :data:`FILL_TYPES` name)
    and the ``vector_bytes`` its rows are stored with (16: rows are whole vectors)."""

    dtype: str
    vector_bytes: int


@dataclass(frozen=True)
class EpRouteConfig:
    """``warps`` per CTA, each ranking a sub-chunk of ``steps`` 32-pair steps (a CTA's chunk:
    ``warps * 32 * steps`` pairs; its shared tables ``(warps + 1) * EP_MAX_EXPERTS`` int32 words);
    ``loads`` ids each thread loads per pass of the prefix count (the loads in flight)."""

    warps: int = 8
    steps: int = 16
    loads: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.warps <= 32 or self.steps < 1 or self.loads < 1:
            raise ValueError(f"warps={self.warps} must be in [1, 32], steps={self.steps} and loads >= 1")
        if (self.warps + 1) * EP_MAX_EXPERTS * 4 > _SMEM_LIMIT:
            raise ValueError(f"{self.warps + 1} tables of {EP_MAX_EXPERTS} words exceed {_SMEM_LIMIT} bytes")

    @property
    def threads(self) -> int:
        return self.warps * _WARP

    @property
    def chunk_pairs(self) -> int:
        """Pairs one CTA ranks."""
        return self.warps * _WARP * self.steps


@dataclass(frozen=True)
class EpLayoutConfig:
    """``threads`` per CTA and ``pairs`` each thread places (a CTA: ``threads * pairs`` pairs)."""

    threads: int = 256
    pairs: int = 8

    def __post_init__(self) -> None:
        if self.threads % _WARP or not 0 < self.threads <= 1024 or self.pairs < 1:
            raise ValueError(f"threads={self.threads} (a multiple of 32, <= 1024), pairs={self.pairs} >= 1")


@dataclass(frozen=True)
class EpZeroFillConfig:
    """``threads`` per CTA, ``vectors_per_lane`` vectors each lane stores per row chunk (a warp's
    item: ``32 * vectors_per_lane`` vectors of one row) and ``ctas_per_sm``: the grid is at most
    that many CTAs per SM (times the launcher's ``sms``), each looping over the items."""

    threads: int = 128
    vectors_per_lane: int = 4
    ctas_per_sm: int = 2

    def __post_init__(self) -> None:
        if self.threads % _WARP or not 0 < self.threads <= 1024:
            raise ValueError(f"threads={self.threads} must be a multiple of 32 in [32, 1024]")
        if self.vectors_per_lane < 1 or self.ctas_per_sm < 1:
            raise ValueError("vectors_per_lane and ctas_per_sm must be >= 1")


# --- Device helpers ------------------------------------------------------------------------------


@cute.jit
def _expert_key(ids: cute.Tensor, i: Int32, limit: Int32, experts: Int32) -> Int32:
    """Pair ``i``'s expert as an Int32 key: ``ids[i]`` when ``i < limit`` and ``0 <= ids[i] < E``,
    else ``E`` (dropped, or no pair). The test is on the full id (an int64 id above 2^31 drops)."""
    key = experts
    if i < limit:
        v = ids[i]
        if v >= 0 and v < ids.element_type(experts):
            key = Int32(v)
    return key


@cute.jit
def _group_of(key: Int32):
    """``(peers, below)``: the lanes holding this lane's key, and those of them below this lane."""
    peers = cute.arch.match_sync(_FULL_MASK, key)
    return peers, peers & cute.arch.lanemask_lt()


@cute.jit
def _count_key(row: cute.Tensor, key: Int32, experts: Int32):
    """Add the warp's pairs of each key below E to ``row[key]`` (shared Int32): the lowest lane of
    each group of equal keys adds the group's size (every lane of the warp calls it)."""
    peers, below = _group_of(key)
    if below == 0 and key < experts:
        cute.arch.atomic_add(row.iterator + key, Int32(cute.arch.popc(peers)))


@cute.jit
def _rank_key(row: cute.Tensor, key: Int32, experts: Int32) -> Int32:
    """:func:`_count_key`, returning each lane's rank: ``row[key]`` before the warp's add plus the
    lanes of its group below it (-1 for a key of E or above)."""
    peers, below = _group_of(key)
    old = Int32(0)
    if below == 0 and key < experts:
        old = cute.arch.atomic_add(row.iterator + key, Int32(cute.arch.popc(peers)))
    lowest = Int32(cute.arch.clz(cute.arch.brev(peers)))
    rank = cute.arch.shuffle_sync(old, lowest) + Int32(cute.arch.popc(below))
    if key >= experts:
        rank = Int32(-1)
    return rank


class _Chunk(NamedTuple):
    """A route CTA's work: ``ids`` (P,), ``experts`` E, the thread ``tid`` / ``warp`` / ``lane``,
    ``first`` (the chunk's first pair) and ``last`` (whether it is the last chunk)."""

    ids: cute.Tensor
    experts: Int32
    tid: Int32
    warp: Int32
    lane: Int32
    first: Int32
    last: cutlass.Boolean


def _word_view(t: cute.Tensor, vector_bytes: int) -> cute.Tensor:
    """(rows, vectors per row, words per vector) Int32 view of a row-major (rows, D) tensor whose row
    is a whole number of ``vector_bytes`` vectors (the fake tensors' divisibility, restated)."""
    count = vector_bytes // 4
    element_bytes = t.element_type.width // 8
    rows, cols = t.shape
    row_words = cute.assume(t.stride[0] * element_bytes // 4, divby=count)
    layout = cute.make_layout(
        (rows, cols * element_bytes // vector_bytes, count), stride=(row_words, count, 1)
    )
    return cute.make_tensor(cute.recast_ptr(t.iterator, dtype=Int32), layout)


# --- Route ------------------------------------------------------------------------------------------


class EpRouteKernel(Kernel):
    """Per-expert counts and stable ranks of a sender's pairs (module docstring). Launch:
    ``kernel(ids, counts, position, peers, experts, tail, table_row)``: ``ids`` (P,) int32/int64,
    ``counts`` Int32 (n,) with n >= E, ``position`` Int32 (P,), ``peers`` Int64 (R',) addresses of
    (R', n) Int32 count tables (R' = 0: none), E <= ``EP_MAX_EXPERTS``."""

    name = "ep_route"

    def __init__(self, variant: EpIdVariant, config: EpRouteConfig) -> None:
        super().__init__(variant, config)
        self.warps, self.threads = config.warps, config.threads

    @classmethod
    def variants(cls) -> list[EpIdVariant]:
        return [EpIdVariant(name) for name in ID_TYPES]

    @classmethod
    def target_name(cls, variant: EpIdVariant) -> str:
        return f"{cls.name}_{variant.index_dtype}"

    @staticmethod
    def can_implement(experts: int) -> bool:
        """E fits the shared tables."""
        return 1 <= experts <= EP_MAX_EXPERTS

    @classmethod
    def fake_arguments(cls, variant: EpIdVariant) -> tuple:
        dtype = ID_TYPES[variant.index_dtype]
        pairs = cute.sym_int()
        ids = cute.runtime.make_fake_compact_tensor(dtype, (pairs,), assumed_align=dtype.width // 8)
        counts = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
        position = cute.runtime.make_fake_compact_tensor(Int32, (pairs,), assumed_align=4)
        peers = cute.runtime.make_fake_compact_tensor(Int64, (cute.sym_int(),), assumed_align=8)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return ids, counts, position, peers, Int32(1), Int32(0), Int32(0), stream

    @cute.jit
    def __call__(
        self,
        ids: cute.Tensor,  # (P,) int32/int64 expert id of each pair, pair order
        counts: cute.Tensor,  # Int32 (n,), n >= E: counts[0:E) written, counts[E] = tail if n > E
        position: cute.Tensor,  # Int32 (P,) written: rank among its expert's pairs, -1 dropped
        peers: cute.Tensor,  # Int64 (R',) addresses of (R', n) Int32 tables: counts to row table_row
        experts: Int32,  # E
        tail: Int32,  # the value of counts[E]
        table_row: Int32,  # the peers' table row this rank writes
        stream,
    ):
        chunks = cutlass.max(ceil_div(ids.shape[0], self.config.chunk_pairs), 1)
        self.kernel(ids, counts, position, peers, experts, tail, table_row).launch(
            grid=[chunks, 1, 1], block=[self.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        ids: cute.Tensor,
        counts: cute.Tensor,
        position: cute.Tensor,
        peers: cute.Tensor,
        experts: Int32,
        tail: Int32,
        table_row: Int32,
    ):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        smem = SmemAllocator()
        hist = smem.allocate_tensor(Int32, cute.make_layout(EP_MAX_EXPERTS), 16)
        table = smem.allocate_tensor(
            Int32, cute.make_layout((self.warps, EP_MAX_EXPERTS), stride=(EP_MAX_EXPERTS, 1)), 16
        )
        chunk = ctas - 1 - cta  # the longest prefix count starts first
        work = _Chunk(
            ids,
            cutlass.min(experts, EP_MAX_EXPERTS),
            tid,
            cute.arch.make_warp_uniform(tid // _WARP),
            tid % _WARP,
            chunk * self.config.chunk_pairs,
            chunk == ctas - 1,
        )
        for e in cutlass.range(tid, work.experts, self.threads):
            hist[e] = 0
            for w in cutlass.range_constexpr(self.warps):
                table[w, e] = 0
        cute.arch.sync_threads()
        self._count_prefix(work, hist)
        keys = self._warp_keys(work)
        row = table[work.warp, None]
        for s in cutlass.range_constexpr(self.config.steps):
            _count_key(row, keys[s], work.experts)
        cute.arch.sync_threads()
        self._starts(work, hist, table, counts, tail)
        if work.last:
            _post_counts(work, counts, peers, table_row, tail, self.threads)
        cute.arch.sync_threads()
        for s in cutlass.range_constexpr(self.config.steps):
            rank = _rank_key(row, keys[s], work.experts)
            i = work.first + (work.warp * self.config.steps + s) * _WARP + work.lane
            if i < ids.shape[0]:
                position[i] = rank

    @cute.jit
    def _count_prefix(self, work: _Chunk, hist: cute.Tensor):
        """``hist[e]`` += pairs of expert e before the chunk (every thread; ``loads`` ids per thread
        loaded before any is counted)."""
        loads, threads = self.config.loads, self.threads
        keys = cute.make_rmem_tensor(cute.make_layout(loads), Int32)
        for base in cutlass.range(0, work.first, threads * loads):
            for u in cutlass.range_constexpr(loads):
                keys[u] = _expert_key(work.ids, base + u * threads + work.tid, work.first, work.experts)
            for u in cutlass.range_constexpr(loads):
                _count_key(hist, keys[u], work.experts)

    @cute.jit
    def _warp_keys(self, work: _Chunk) -> cute.Tensor:
        """The keys of this lane's pairs in its warp's sub-chunk, step by step (registers)."""
        steps = self.config.steps
        keys = cute.make_rmem_tensor(cute.make_layout(steps), Int32)
        first = work.first + work.warp * steps * _WARP + work.lane
        for s in cutlass.range_constexpr(steps):
            keys[s] = _expert_key(work.ids, first + s * _WARP, work.ids.shape[0], work.experts)
        return keys

    @cute.jit
    def _starts(self, work: _Chunk, hist: cute.Tensor, table: cute.Tensor, counts: cute.Tensor, tail: Int32):
        """Per expert: ``table[w, e]`` becomes the pairs of e before warp w's sub-chunk (the prefix
        count plus the lower warps' rows); the last chunk's CTA writes the totals (the counts) and
        ``counts[E] = tail``."""
        for e in cutlass.range(work.tid, work.experts, self.threads):
            running = hist[e]
            for w in cutlass.range_constexpr(self.warps):
                own = table[w, e]
                table[w, e] = running
                running = running + own
            if work.last and e < counts.shape[0]:
                counts[e] = running
        if work.last and work.tid == 0 and work.experts < counts.shape[0]:
            counts[work.experts] = tail


@cute.jit
def _post_counts(
    work: _Chunk, counts: cute.Tensor, peers: cute.Tensor, row: Int32, tail: Int32, threads: cutlass.Constexpr
):
    """Row ``row`` of each peer's (R', n) Int32 table (``peers``: R' addresses, n = counts' length)
    gets the words :meth:`EpRouteKernel._starts` wrote: each thread copies the counts it wrote
    itself (program order, no barrier), thread 0 the tail."""
    width = counts.shape[0]
    for p in cutlass.range(peers.shape[0]):
        ptr = cute.make_ptr(Int32, peers[p], cute.AddressSpace.gmem, assumed_align=4)
        table = cute.make_tensor(ptr, cute.make_layout((peers.shape[0], width), stride=(width, 1)))
        for e in cutlass.range(work.tid, work.experts, threads):
            if e < width:
                table[row, e] = counts[e]
        if work.tid == 0 and work.experts < width:
            table[row, work.experts] = tail


# --- Layout -----------------------------------------------------------------------------------------


class _Counts(NamedTuple):
    """The exchanged counts as a layout CTA reads them: ``all_counts`` (R, n), the counts in columns
    ``[0, E)`` (the tickets in column E when n > E), ``rank``, E (clamped to the tables), ``local``
    E_local = E / R and the alignment."""

    all_counts: cute.Tensor
    rank: Int32
    experts: Int32
    local: Int32
    alignment: Int32


@cute.jit
def _column(counts: _Counts, e: Int32):
    """``(received, before)``: pairs of expert e from every rank, and from the ranks below ``rank``."""
    received = Int32(0)
    before = Int32(0)
    for s in cutlass.range(counts.all_counts.shape[0]):
        n = counts.all_counts[s, e]
        received = received + n
        if s < counts.rank:
            before = before + n
    return received, before


@cute.jit
def _padded(n: Int32, alignment: Int32) -> Int32:
    return (n + alignment - 1) // alignment * alignment


@cute.jit
def _slot_state(counts: _Counts, starts: cute.Tensor, state: cute.Tensor, ticket: Int32, mode: Int32):
    """One thread's update of a slot's ``state`` by ``mode`` (module docstring): the end of this
    rank's last padded group from the scanned ``starts``, the tickets in column E of the counts."""
    if (mode & LAYOUT_TRACK) != 0:
        first = counts.rank * counts.local
        last = first + counts.local - 1
        received, _ = _column(counts, last)
        state[1] = state[0]
        state[0] = starts[last] - starts[first] + _padded(received, counts.alignment)
    if (mode & LAYOUT_CHECK) != 0:
        ok = Int32(1)
        for s in cutlass.range(counts.all_counts.shape[0]):
            if counts.all_counts[s, counts.experts] != ticket:
                ok = Int32(0)
            if (mode & LAYOUT_RESET) != 0:
                counts.all_counts[s, counts.experts] = Int32(-1)
        state[2] = ok


class EpLayoutKernel(Kernel):
    """Destination rows of a sender's pairs and this rank's padded groups (module docstring).
    Launch: ``kernel(ids, position, all_counts, dst_index, padded_start, padded_end, sizes, state,
    rank, rows, alignment, experts, ticket, mode)``: ``all_counts`` (R, n) with n >= E (n > E
    under :data:`LAYOUT_CHECK`: column E holds the tickets), E <= ``EP_MAX_EXPERTS``, E_local = E / R
    the length of the three offsets; ``state`` Int32 (>= 3,), untouched when ``mode`` is 0."""

    name = "ep_layout"

    def __init__(self, variant: EpIdVariant, config: EpLayoutConfig) -> None:
        super().__init__(variant, config)
        self.threads = config.threads

    @classmethod
    def variants(cls) -> list[EpIdVariant]:
        return [EpIdVariant(name) for name in ID_TYPES]

    @classmethod
    def target_name(cls, variant: EpIdVariant) -> str:
        return f"{cls.name}_{variant.index_dtype}"

    @classmethod
    def fake_arguments(cls, variant: EpIdVariant) -> tuple:
        dtype = ID_TYPES[variant.index_dtype]
        pairs, local = cute.sym_int(), cute.sym_int()
        ids = cute.runtime.make_fake_compact_tensor(dtype, (pairs,), assumed_align=dtype.width // 8)
        position = cute.runtime.make_fake_compact_tensor(Int32, (pairs,), assumed_align=4)
        all_counts = cute.runtime.make_fake_compact_tensor(
            Int32, (cute.sym_int(), cute.sym_int()), stride_order=(1, 0), assumed_align=4
        )
        dst_index = cute.runtime.make_fake_compact_tensor(Int32, (pairs,), assumed_align=4)
        offsets = [cute.runtime.make_fake_compact_tensor(Int32, (local,), assumed_align=4) for _ in range(3)]
        state = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        scalars = (Int32(0), Int32(1), Int32(32), Int32(1), Int32(0), Int32(0))
        return ids, position, all_counts, dst_index, *offsets, state, *scalars, stream

    @cute.jit
    def __call__(
        self,
        ids: cute.Tensor,  # (P,) int32/int64 expert ids (outside [0, E): dropped)
        position: cute.Tensor,  # Int32 (P,) the route kernel's ranks
        all_counts: cute.Tensor,  # Int32 (R, n) row-major, n >= E, any row stride: counts of every rank
        dst_index: cute.Tensor,  # Int32 (P,) written: dest_rank * rows + dest_row, -1 dropped
        padded_start: cute.Tensor,  # Int32 (E_local,) written: this rank's groups
        padded_end: cute.Tensor,  # Int32 (E_local,) written
        sizes: cute.Tensor,  # Int32 (E_local,) written: pairs received per local expert
        state: cute.Tensor,  # Int32 (>= 3,) a slot's fill end and ticket check (by mode)
        rank: Int32,
        rows: Int32,  # the static row count of every rank's buffer
        alignment: Int32,
        experts: Int32,  # E
        ticket: Int32,  # the value every rank's column E must hold (LAYOUT_CHECK)
        mode: Int32,  # LAYOUT_TRACK | LAYOUT_CHECK | LAYOUT_RESET bits
        stream,
    ):
        ctas = cutlass.max(ceil_div(ids.shape[0], self.threads * self.config.pairs), 1)
        tensors = (ids, position, all_counts, dst_index, padded_start, padded_end, sizes, state)
        self.kernel(*tensors, rank, rows, alignment, experts, ticket, mode).launch(
            grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        ids,
        position,
        all_counts,
        dst_index,
        padded_start,
        padded_end,
        sizes,
        state,
        rank,
        rows,
        alignment,
        experts,
        ticket,
        mode,
    ):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = SmemAllocator()
        starts = smem.allocate_tensor(Int32, cute.make_layout(EP_MAX_EXPERTS), 16)
        bases = smem.allocate_tensor(Int32, cute.make_layout(EP_MAX_EXPERTS), 16)
        warp_totals = smem.allocate_tensor(Int32, cute.make_layout(self.threads // _WARP), 16)
        experts = cutlass.min(cutlass.min(experts, all_counts.shape[1]), EP_MAX_EXPERTS)
        counts = _Counts(all_counts, rank, experts, cutlass.max(experts // all_counts.shape[0], 1), alignment)
        for e in cutlass.range(tid, experts, self.threads):
            received, before = _column(counts, e)
            starts[e] = _padded(received, alignment)
            bases[e] = before
        cta_exclusive_scan(starts, experts, tid, self.threads, warp_totals)
        for e in cutlass.range(tid, experts, self.threads):
            owner = e // counts.local
            bases[e] = bases[e] + owner * rows + starts[e] - starts[owner * counts.local]
        if cta == 0:
            first = rank * counts.local
            for j in cutlass.range(tid, cutlass.min(padded_start.shape[0], counts.local), self.threads):
                received, _ = _column(counts, first + j)
                start = starts[first + j] - starts[first]
                padded_start[j] = start
                padded_end[j] = start + _padded(received, alignment)
                sizes[j] = received
            if tid == 0 and mode != 0:
                _slot_state(counts, starts, state, ticket, mode)
        cute.arch.sync_threads()
        self._place(ids, position, dst_index, bases, experts)

    @cute.jit
    def _place(self, ids, position, dst_index, bases, experts):
        """``dst_index`` of the CTA's pairs: ``bases[e] + position`` (-1 dropped); each thread loads
        its ``pairs`` ids before it places any."""
        per_thread, threads = self.config.pairs, self.threads
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        pairs = ids.shape[0]
        first = cta * threads * per_thread + tid
        keys = cute.make_rmem_tensor(cute.make_layout(per_thread), Int32)
        for u in cutlass.range_constexpr(per_thread):
            keys[u] = _expert_key(ids, first + u * threads, pairs, experts)
        for u in cutlass.range_constexpr(per_thread):
            i = first + u * threads
            if i < pairs:
                dst = Int32(-1)
                if keys[u] < experts:
                    dst = bases[keys[u]] + position[i]
                dst_index[i] = dst


# --- Zero fill --------------------------------------------------------------------------------------


class _FillRows(NamedTuple):
    """The rows a zero fill writes, as a CTA sees them: virtual row v < ``padding`` is the padding row
    ``data_end[g] + v - prefix[g]`` of the group g found in ``prefix`` (the padding rows of the
    groups before g), v >= ``padding`` is tail row ``end + v - padding``; ``count`` rows in all."""

    prefix: cute.Tensor
    data_end: cute.Tensor
    groups: Int32
    padding: Int32
    end: Int32
    count: Int32


@cute.jit
def _fill_row(fill: _FillRows, v: Int32) -> Int32:
    """The buffer row of virtual row ``v`` (:class:`_FillRows`)."""
    row = fill.end + v - fill.padding
    if v < fill.padding:
        g = find_group(fill.prefix, fill.groups, v, search_steps(EP_MAX_EXPERTS))
        row = fill.data_end[g] + v - fill.prefix[g]
    return row


class EpZeroFillKernel(Kernel):
    """The receiver's zero fill of a dispatch's buffers (module docstring). Launch: ``kernel(buf,
    aux_a, aux_b, padded_start, padded_end, sizes, filled, fresh, word, word_a, word_b, sms)``:
    ``buf`` (rows, W) row-major of the variant's dtype, rows whole vectors; ``aux_a`` / ``aux_b``
    Int32 (rows, A) row-major (a buffer given twice is filled twice, with the same words); the
    offsets Int32 (G,) with G <= ``EP_MAX_EXPERTS``; ``filled`` Int32 (>= 1,) (read unless
    ``fresh``); ``word`` / ``word_a`` / ``word_b`` the Int32 bits every word of a filled row gets."""

    name = "ep_zero_fill"

    def __init__(self, variant: EpFillVariant, config: EpZeroFillConfig) -> None:
        super().__init__(variant, config)
        self.threads, self.warps = config.threads, config.threads // _WARP
        self.per_lane = config.vectors_per_lane

    @classmethod
    def variants(cls) -> list[EpFillVariant]:
        return [EpFillVariant(name, width) for name, width in EP_FILL_VARIANTS]

    @classmethod
    def target_name(cls, variant: EpFillVariant) -> str:
        return f"{cls.name}_{variant.dtype}_v{variant.vector_bytes}"

    @staticmethod
    def can_implement(groups: int, row_bytes: int, vector_bytes: int, data_ptr: int) -> bool:
        """G fits the shared tables, rows are whole vectors, the buffer is aligned to the vector."""
        return (
            1 <= groups <= EP_MAX_EXPERTS and row_bytes % vector_bytes == 0 and data_ptr % vector_bytes == 0
        )

    @classmethod
    def fake_arguments(cls, variant: EpFillVariant) -> tuple:
        dtype = FILL_TYPES[variant.dtype]
        cols = cute.sym_int(divisibility=max(variant.vector_bytes // (dtype.width // 8), 1))
        buf = cute.runtime.make_fake_compact_tensor(
            dtype, (cute.sym_int(), cols), stride_order=(1, 0), assumed_align=variant.vector_bytes
        )
        aux = [
            cute.runtime.make_fake_compact_tensor(
                Int32, (cute.sym_int(), cute.sym_int()), stride_order=(1, 0), assumed_align=4
            )
            for _ in range(2)
        ]
        groups = cute.sym_int()
        offsets = [cute.runtime.make_fake_compact_tensor(Int32, (groups,), assumed_align=4) for _ in range(3)]
        filled = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return buf, *aux, *offsets, filled, Int32(0), Int32(0), Int32(0), Int32(0), Int32(1), stream

    @cute.jit
    def __call__(
        self,
        buf: cute.Tensor,  # (rows, W) row-major, rows whole vectors
        aux_a: cute.Tensor,  # Int32 (rows, A) row-major
        aux_b: cute.Tensor,  # Int32 (rows, B) row-major
        padded_start: cute.Tensor,  # Int32 (G,)
        padded_end: cute.Tensor,  # Int32 (G,)
        sizes: cute.Tensor,  # Int32 (G,) data rows of each group (from its start)
        filled: cute.Tensor,  # Int32 (>= 1,): filled[0] the previous call's end (unless fresh)
        fresh: Int32,  # 1: fresh buffers, every row past the data is filled
        word: Int32,  # the bits every 4-byte word of a filled row of buf gets
        word_a: Int32,  # ... of aux_a
        word_b: Int32,  # ... of aux_b
        sms: Int32,  # the GPU's SMs: at most ctas_per_sm CTAs each, looping over the rows
        stream,
    ):
        ctas = cutlass.max(cutlass.min(ceil_div(buf.shape[0], self.warps), sms * self.config.ctas_per_sm), 1)
        offsets = (padded_start, padded_end, sizes)
        self.kernel(buf, aux_a, aux_b, *offsets, filled, fresh, word, word_a, word_b).launch(
            grid=[ctas, 1, 1], block=[self.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        buf,
        aux_a,
        aux_b,
        padded_start,
        padded_end,
        sizes,
        filled,
        fresh: Int32,
        word: Int32,
        word_a: Int32,
        word_b: Int32,
    ):
        tid, _, _ = cute.arch.thread_idx()
        smem = SmemAllocator()
        prefix = smem.allocate_tensor(Int32, cute.make_layout(EP_MAX_EXPERTS), 16)
        data_end = smem.allocate_tensor(Int32, cute.make_layout(EP_MAX_EXPERTS), 16)
        warp_totals = smem.allocate_tensor(Int32, cute.make_layout(self.warps), 16)
        rows = buf.shape[0]
        groups = cutlass.min(sizes.shape[0], EP_MAX_EXPERTS)
        for g in cutlass.range(tid, groups, self.threads):
            data = padded_start[g] + sizes[g]
            data_end[g] = data
            prefix[g] = cutlass.max(padded_end[g] - data, 0)
        padding = cta_exclusive_scan(prefix, groups, tid, self.threads, warp_totals)
        end = Int32(0)
        if groups > 0:
            end = padded_end[groups - 1]
        limit = rows
        if fresh == 0:
            limit = cutlass.min(cutlass.max(filled[0], end), rows)
        count = cutlass.min(padding + cutlass.max(limit - end, 0), rows)
        fill = _FillRows(prefix, data_end, groups, padding, end, count)
        self._fill(buf, aux_a, aux_b, fill, word, word_a, word_b, tid)

    @cute.jit
    def _fill(self, buf, aux_a, aux_b, fill: _FillRows, word: Int32, word_a: Int32, word_b: Int32, tid):
        """Store the words into the fill's rows: per row, items of ``32 * vectors_per_lane`` vectors
        of ``buf`` and one item for both aux rows; a warp's items ``warps * CTAs`` apart."""
        cta, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        vectors = _word_view(buf, self.variant.vector_bytes)
        row_chunk = _WARP * self.per_lane
        chunks = ceil_div(vectors.shape[1], row_chunk)
        lane = tid % _WARP
        frag = cute.make_rmem_tensor(cute.make_layout(vectors.shape[2]), Int32)
        for q in cutlass.range_constexpr(self.variant.vector_bytes // 4):
            frag[q] = word
        warp = cta * self.warps + cute.arch.make_warp_uniform(tid // _WARP)
        for item in cutlass.range(warp, fill.count * (chunks + 1), ctas * self.warps):
            v = item // (chunks + 1)
            chunk = item - v * (chunks + 1)
            row = _fill_row(fill, v)
            if row >= 0 and row < buf.shape[0]:
                if chunk < chunks:
                    first = chunk * row_chunk + lane
                    for u in cutlass.range_constexpr(self.per_lane):
                        col = first + u * _WARP
                        if col < vectors.shape[1]:
                            cute.autovec_copy(frag, vectors[row, col, None])
                else:
                    for col in cutlass.range(lane, aux_a.shape[1], _WARP):
                        aux_a[row, col] = word_a
                    for col in cutlass.range(lane, aux_b.shape[1], _WARP):
                        aux_b[row, col] = word_b


__all__ = [
    "FILL_TYPES",
    "ID_TYPES",
    "EpFillVariant",
    "EpIdVariant",
    "EpLayoutConfig",
    "EpLayoutKernel",
    "EpRouteConfig",
    "EpRouteKernel",
    "EpZeroFillConfig",
    "EpZeroFillKernel",
]
