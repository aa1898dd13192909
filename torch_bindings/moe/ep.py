"""Expert-parallel dispatch and combine (SPEC section 9; design in notes/ep-dispatch-combine.md).

Over a process group of R ranks with E = R * E_local experts (expert e on rank e // E_local),
``dispatch`` sends every (token, slot) pair to its expert's rank, where it lands expert-major and
padded: local expert j's rows ordered by (source rank, token, slot), each group padded with zero
rows to ``alignment``, in a tensor of the static worst-case row count
``R*T*k + E_local*alignment`` (rounded up to the alignment). ``combine`` brings expert outputs back
and sums them per token with the routing weights. Both run with no host sync:

1. *Routing* (sender, local): per-expert counts of this rank's pairs and each pair's position
   among the pairs of its expert (stable: pair order). On a GPU steps 1, 3 and 5's zero fill are
   the kernels of ``cute_kernels.ep_route`` (one launch each); on CPU (and for more than
   ``EP_MAX_EXPERTS`` experts) PyTorch ops.
2. *Exchange*: the (R, E) count matrix: each rank writes its counts (and the slot's ticket) into
   row ``rank`` of every rank's table in the slot's symmetric memory (the route kernel itself, or
   one row-scatter launch after the PyTorch routing), then waits at the barrier; the barrier also
   orders this call after every rank's previous use of the buffers. The layout kernel checks the
   tickets (a device assert on its flag) and keeps the slot's fill end.
3. *Layout* (every rank, from the counts alone): each receiver's padded group offsets, and for each
   of this rank's pairs its destination ``rank * rows + row``.
4. *Send*: the payload is written straight into the receivers' buffers by the row-scatter kernel
   (``cute_kernels.row_scatter``), through a table of the R buffers' addresses (PyTorch symmetric
   memory; NVLink multicast is never used). ``"mxfp8"`` quantizes each token once (1x32, plain
   scales) before the send and sends q and its scale rows; every pair also sends a tag
   ``s * T * k + p + 1`` naming its source rank s and pair p, which is what ``combine`` routes by.
5. *Finish* (receiver): zero the padding rows (and rows a previous call left past the new end),
   wait at the symmetric-memory barrier until every peer's rows have landed, and for ``"mxfp8"``
   turn the received scale rows into the M-groups blocked layout of the padded groups
   (``swizzle_scales``).

``combine`` writes each local row's output to its source rank's (T*k, D') buffer at the pair the
tag names, waits at the barrier, and sums the k slots per token in fp32
(``reference.weighted_slot_sum``). The backward passes are the same moves (SPEC section 9):
dispatch's gradient is a combine with unit weights, combine's is a dispatch of the per-slot
weighted output gradient plus the weights' gradient.

Groups: ``group=None`` is torch.distributed's default group (R = 1 when it is not initialized or
has one rank), :data:`LOCAL` is R = 1 whatever is initialized (what ``MoELayer`` uses without a
group). Buffers (notes/buffer-lifetime.md): R = 1 takes fresh rows from the caching allocator per
call (the same kernels on local buffers; on CPU the reference's moves); R > 1 reuses slots of
symmetric memory (:class:`SlotRing`), a slot only when no tensor views it, the ranks' choice checked
by a ticket (:func:`slot_ticket`). The autograd contexts keep the routing, never the rows.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch
from torch.autograd import forward_ad as _forward_ad

from cute_utils.constants import (
    EP_FILL_VARIANTS,
    EP_MAX_EXPERTS,
    LAYOUT_CHECK,
    LAYOUT_RESET,
    LAYOUT_TRACK,
    SCATTER_VARIANTS,
)

from .. import checks, reference, targets
from ..contract import dtype_name
from ..device_constants import ConstantCache
from ..ep_send import SendBuffers, SendOptions, buffer_specs, launch_send, quantize_and_send
from ..swizzle import swizzle_scales
from ..warn import warn_once

RECIPES = checks.EP_RECIPES
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class EpShape:
    """Static sizes of one dispatch: ``ranks`` R, ``tokens`` T per rank, ``hidden`` D, ``topk`` k,
    ``experts`` E (global), ``alignment`` A and ``recipe``; everything else follows."""

    ranks: int
    tokens: int
    hidden: int
    topk: int
    experts: int
    alignment: int
    recipe: str

    @property
    def local_experts(self) -> int:
        return self.experts // self.ranks

    @property
    def pairs(self) -> int:
        return self.tokens * self.topk

    @property
    def rows(self) -> int:
        return reference.ep_rows(self.ranks, self.tokens, self.topk, self.local_experts, self.alignment)


# --- Buffers: R destination buffers of one kind, seen from one rank ----------------------------------


@dataclass(eq=False)
class SharedRows:
    """One kind of destination buffer as a rank sees it: ``own`` (this rank's (P, W) tensor: never
    handed out itself, only views of it), ``ptrs`` (Int64 (R,) device: every rank's buffer address,
    this rank's included) and ``self_ptr`` (Int64 (1,): ``own`` alone, for writes that stay local)."""

    own: torch.Tensor
    ptrs: torch.Tensor
    self_ptr: torch.Tensor
    #: The R tensors themselves where they live in this process (``LocalPool``): the CPU moves.
    tensors: list | None = None


@dataclass(eq=False)
class Slot:
    """The buffers one call writes, by kind name: ``views[rank]`` (every rank of a ``LocalPool``,
    this rank of a ``SymmetricPool``), and ``filled`` (1,) int32 device: the end of the rows the
    previous call on these buffers filled (the rows it must zero again), ``None`` for fresh buffers
    (every row no pair fills is zeroed)."""

    views: dict[int, dict[str, SharedRows]]
    filled: torch.Tensor | None = None
    index: int = 0
    #: What the ranks exchange to check they chose the same slot (:func:`slot_ticket`), moved on by
    #: every acquire (:meth:`SlotRing.acquire`), so a row a peer wrote in an earlier use never matches.
    ticket: int = 0
    #: The count exchange's (R, E + 1) int32 table of a ``SymmetricPool`` dispatch slot (row r from
    #: rank r: its counts, then its ticket); None elsewhere.
    counts: SharedRows | None = None
    #: Storage use counts of the kinds' tensors when only the slot held them (``SymmetricPool``).
    baseline: tuple = ()
    #: Written by a CUDA graph capture: its replays write it again, so no eager call may take it.
    captured: bool = False
    #: A ``SymmetricPool`` slot's (3,) int32 device state, which the layout kernel keeps
    #: (``cute_kernels.ep_route``): the fill end (``filled`` views word 0), the previous call's end
    #: (``prev_filled``, word 1: what this call's zero fill reads) and the ticket check's result
    #: (``ticket_ok``, word 2, 0-d: 1 when every rank wrote this use's ticket). None elsewhere.
    state: torch.Tensor | None = None
    prev_filled: torch.Tensor | None = field(default=None, repr=False)
    ticket_ok: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.state is not None:
            if self.filled is not None:
                raise ValueError("Slot: give state or filled, not both (filled views the state)")
            self.filled, self.prev_filled, self.ticket_ok = self.state[0:1], self.state[1:2], self.state[2]


def _use_count(t: torch.Tensor) -> int:
    """References to ``t``'s storage (views, autograd's saved tensors, ...), measured the same way
    every time (the temporary storage object counts once)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _ptr_table(tensors: list, device: torch.device) -> torch.Tensor:
    """Int64 (R,) device table of the tensors' addresses, written by fills (no host-to-device copy:
    nothing waits, and a CUDA graph replays the same constants)."""
    table = torch.empty(len(tensors), dtype=torch.int64, device=device)
    for i, t in enumerate(tensors):
        table[i : i + 1].fill_(t.data_ptr())
    return table


#: Address tables by (device, addresses): a table's bytes are the addresses alone, so buffers the
#: caching allocator hands out again at the same addresses (every call of a steady loop) reuse it.
#: Past the limit (8 MiB of tables) new address sets get a table per call, as before the cache.
_ADDRESS_TABLES = ConstantCache(limit=16384)


def _address_table(tensors: list, device: torch.device) -> torch.Tensor:
    """:func:`_ptr_table` of ``tensors``, cached by their addresses (read only)."""
    key = (device, *(t.data_ptr() for t in tensors))
    return _ADDRESS_TABLES.get(key, device, lambda: _ptr_table(tensors, device))


class LocalPool:
    """Buffers of R ranks in one process (R = 1: the local path, ``rank`` 0; R > 1: the simulated
    multi-rank tests, whose driver runs the ranks' steps in turn and stacks their counts). Every
    call gets fresh buffers from the caching allocator: a result owns its rows, and they go back to
    the allocator when the last tensor viewing them dies (no pool to outlive)."""

    rank = 0
    owns_buffers = True  # a call's buffers are its result's own: nothing to copy out

    def __init__(self, ranks: int, device: torch.device) -> None:
        self.ranks = ranks
        self.device = device

    def acquire(self, family: str, kinds: dict[str, tuple], counts: int = 0) -> Slot:
        """Fresh buffers of every kind (``kinds``: name -> (shape, dtype)) for all R ranks; no count
        table (``counts`` is ignored: R = 1 has one row, and a simulated group's driver stacks the
        counts itself)."""
        views: dict[int, dict[str, SharedRows]] = {r: {} for r in range(self.ranks)}
        for name, (shape, dtype) in kinds.items():
            tensors = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(self.ranks)]
            ptrs = _address_table(tensors, self.device)
            for r, t in enumerate(tensors):
                views[r][name] = SharedRows(t, ptrs, ptrs if self.ranks == 1 else ptrs[r : r + 1], tensors)
        return Slot(views)

    def exchange_counts(self, routing: Routing, slot: Slot) -> torch.Tensor:
        """R = 1: this rank's (E,) counts as the (1, E) count matrix."""
        if self.ranks != 1:
            raise RuntimeError("a simulated group's driver exchanges the counts itself")
        return routing.counts[None]

    def barrier(self) -> None:
        """R = 1: one stream, stream order is the barrier. A simulated group's driver orders its
        ranks' steps itself (``simulate_combine``): the public ops refuse its results."""
        if self.ranks != 1:
            raise RuntimeError("results of a simulated group go through simulate_combine, not combine")


def _same_on_every_rank(group, key: tuple) -> None:
    """Raise unless every rank allocates the same buffer (T, D, k, E the same everywhere, the same
    slot): a rank with more rows would write past a peer's buffer. Runs with each allocation."""
    import torch.distributed as dist

    keys: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(keys, key, group=group)
    if any(k != key for k in keys):
        raise ValueError(
            "dispatch: ranks disagree on the buffers to allocate (T, D, k, E must match, and every "
            f"rank must hold the same dispatch results alive): {keys}"
        )


#: Most buffer slots a family may grow to: more results alive at once than this is a leak.
MAX_SLOTS = 256


class SlotRing:
    """Reused buffers, never while in use: a family of buffers (dispatch or combine's backward, per
    shape) is a list of slots; a call takes the first slot whose tensors nothing outside the ring
    references (views, autograd's saved tensors: their storage use counts are back at the slot's
    baseline), and allocates a new slot (:meth:`_allocate`) when every slot is in use. A slot a CUDA
    graph capture wrote is never taken again (its replays write it). ``rank``: whose views a slot
    holds."""

    rank = 0
    owns_buffers = False  # later calls write a slot again once free: results copy out what they keep

    def __init__(self) -> None:
        self._families: dict[object, list[Slot]] = {}

    def acquire(self, family, kinds: dict[str, tuple], counts: int = 0) -> Slot:
        """A free slot of ``family`` with buffers of ``kinds`` (name -> (shape, dtype)) and, when
        ``counts`` > 0, a count-exchange table of ``counts`` int32 per rank (``Slot.counts``)."""
        slots = self._families.setdefault(family, [])
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        for slot in slots:
            if not slot.captured and _slot_free(slot, self.rank):
                slot.captured = capturing
                _next_use(slot)
                return slot
        if len(slots) >= MAX_SLOTS:
            raise RuntimeError(
                f"torch_bindings.ep: {MAX_SLOTS} results of one buffer family are alive at once; drop "
                "the results (and autograd graphs) of earlier steps, or raise torch_bindings.ep.MAX_SLOTS"
            )
        slot = self._allocate(family, kinds, len(slots), counts)
        slot.ticket = slot_ticket(family, slot.index)
        _next_use(slot)
        slot.baseline = tuple(_use_count(v.own) for v in slot.views[self.rank].values())
        slot.captured = capturing
        slots.append(slot)
        return slot

    def slots(self, family) -> list[Slot]:
        """The slots of ``family`` so far (tests, memory reports)."""
        return self._families.get(family, [])

    def _allocate(self, family, kinds: dict[str, tuple], index: int, counts: int) -> Slot:
        raise NotImplementedError


def _next_use(slot: Slot) -> None:
    """Move ``slot``'s ticket to the next generation, as a call takes it: the same on every rank
    that makes the same calls (SPMD), different from the ticket of the slot's previous use."""
    slot.ticket = (slot.ticket + 1) & 0x7FFFFFFF


class SymmetricPool(SlotRing):
    """Buffers in PyTorch symmetric memory over ``group`` (multicast is never used), reused as a
    :class:`SlotRing`: a new slot is a collective allocation (syncs once). Every rank makes the same
    choice as long as every rank holds the same results alive (SPMD); the count exchange carries the
    slot's ticket (:func:`slot_ticket`: its family's shapes and its index, moved on by every acquire)
    and a device assert stops a mismatch rather than mix the ranks' rows."""

    def __init__(self, group) -> None:
        import torch.distributed as dist

        super().__init__()
        self.group = group
        self.ranks = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._handle = None
        self._slot_table: Slot | None = None

    def _allocate(self, family: object, kinds: dict[str, tuple], index: int, counts: int) -> Slot:
        """A new slot of ``family``: every kind in symmetric memory and, when ``counts`` > 0, the
        count exchange's (R, counts) int32 table. Collective: every rank calls it at the same
        point."""
        import torch.distributed._symmetric_memory as symm_mem

        if self._handle is None and hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(self.group.group_name)  # a no-op on newer torch
        spec = tuple((n, tuple(shape), str(dtype)) for n, (shape, dtype) in kinds.items())
        _same_on_every_rank(self.group, (family, index, spec, counts))
        device = torch.device("cuda", torch.cuda.current_device())
        views = {name: self._shared(name, shape, dtype, device) for name, (shape, dtype) in kinds.items()}
        table = None
        if counts:
            table = self._shared("counts", (self.ranks, counts), torch.int32, device)
            self.barrier()  # every rank's table initialized before any rank posts into it
        state = torch.zeros(3, dtype=torch.int32, device=device)
        return Slot({self.rank: views}, index=index, counts=table, state=state)

    def _shared(self, name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> SharedRows:
        """One buffer of symmetric memory (a collective call), its unfilled rows initialized."""
        import torch.distributed._symmetric_memory as symm_mem

        own = symm_mem.empty(shape, dtype=dtype, device=device)
        fill_unfilled_rows(own, name)
        handle = symm_mem.rendezvous(own, self.group)
        ptrs = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device)
        self._handle = handle
        return SharedRows(own, ptrs, ptrs[self.rank : self.rank + 1].clone())

    def barrier(self) -> None:
        """Every rank's stream reaches this point before any passes it (system-scope signals), so the
        rows peers wrote before it are visible after it."""
        self._handle.barrier(channel=0)

    def announce(self, slot: Slot) -> None:
        """Write this rank's slot ticket into every rank's (R, 1) table of tickets (row ``rank``);
        after the next barrier :meth:`verify` checks that every rank chose the same slot of the same
        family. For the sends that have no count exchange (combine's backward)."""
        if self._slot_table is None:
            self._slot_table = self._allocate("slot table", {"ids": ((self.ranks, 1), torch.int32)}, 0, 0)
        table = self._slot_table.views[self.rank]["ids"]
        src = torch.full((1, 1), slot.ticket, dtype=torch.int32, device=table.own.device)
        zero = _zeros_int(self.ranks, src.device)
        scatter_rows(src, table, zero, _row_of_every_rank(self.ranks, self.rank, src.device))

    def verify(self, slot: Slot) -> None:
        """After the barrier that follows :meth:`announce`: a device assert unless every rank chose
        ``slot`` (:func:`_check_tickets`)."""
        _check_tickets(self._slot_table.views[self.rank]["ids"].own.view(-1), slot)

    def exchange_counts(self, routing: Routing, slot: Slot) -> torch.Tensor:
        """The routing's (E,) int32 counts of every rank, (R, E), through the slot's symmetric table
        (no host sync, no NCCL): :meth:`post_counts`, the barrier, :meth:`received_counts`."""
        self.post_counts(routing, slot)
        self.barrier()
        return self.received_counts(slot, routing.counts.shape[0])

    def post_counts(self, routing: Routing, slot: Slot) -> None:
        """Write this rank's counts and the slot's ticket (``routing.message``, which the routing
        kernel wrote; the PyTorch routing's counts are copied into one) into row ``rank`` of every
        rank's table, in one row-scatter launch. The dispatch's GPU path has the route kernel post
        instead (``Routing.posted``); this is the PyTorch routing's step."""
        counts = routing.counts
        experts = counts.shape[0]
        mine = routing.message
        if mine is None:
            mine = counts.new_empty(experts + 1)
            mine[:experts].copy_(counts)
            mine[experts:].fill_(slot.ticket)
        rows = _row_of_every_rank(self.ranks, self.rank, mine.device)
        scatter_rows(mine.view(1, -1), slot.counts, _zeros_int(self.ranks, mine.device), rows)

    def received_counts(self, slot: Slot, experts: int) -> torch.Tensor:
        """After the barrier that follows every rank's :meth:`post_counts`: the (R, E) view of this
        rank's table, and a device assert unless every row carries the slot's ticket (every rank
        chose this slot, in this use: :func:`_check_tickets`)."""
        table = slot.counts.own
        _check_tickets(table[:, experts], slot)
        return table[:, :experts]


def _check_tickets(tickets: torch.Tensor, slot: Slot) -> None:
    """The device assert that every rank wrote ``slot``'s ticket into ``tickets`` (R,) (this rank's
    table, read after the barrier that follows the peers' writes). An eager call's ticket moves on
    with every acquire, so a row left by the slot's earlier use fails it. A slot a CUDA graph
    captured keeps one ticket for all its replays, so there the tickets are overwritten once
    checked (a fill the graph replays): a replay never takes the previous replay's row for a
    peer's, as peers write again only after the call's next barrier."""
    torch._assert_async((tickets == slot.ticket).all(), _SLOT_MISMATCH)
    if slot.captured:
        tickets.fill_(-1)


_SLOT_MISMATCH = (
    "torch_bindings.ep: ranks chose different buffer slots (they hold different dispatch results alive, "
    "or called with different T, D, k, E, alignment or recipe); every rank must run the same calls "
    "with the same shapes and keep the same results alive"
)


def slot_ticket(family: tuple, index: int) -> int:
    """The first ticket of slot ``index`` of ``family``, the int32 the ranks exchange (with the counts
    of a dispatch; in the slot table for combine's backward): a CRC-32 of the family's repr (purpose
    and ``EpShape``: R, T, D, k, E, alignment, recipe) and the index, as a non-negative int32; each
    acquire of the slot moves it on by one (:func:`_next_use`). The same in every process (Python's
    ``hash`` of a string is salted per process), and different, but for a 2**-31 chance, for ranks
    that chose different slots or slots of different shapes."""
    return zlib.crc32(repr((family, index)).encode()) & 0x7FFFFFFF


def _slot_free(slot: Slot, rank: int) -> bool:
    """No tensor outside the pool references the slot's buffers on this rank."""
    views = slot.views[rank]
    return all(_use_count(v.own) == base for v, base in zip(views.values(), slot.baseline, strict=True))


# --- Moving rows -------------------------------------------------------------------------------------


#: ``_row_key``'s keys, by (kernel, dtype, row width): one dict lookup per launch.
_ROW_KEYS: dict[tuple, tuple] = {}

_ROW_VARIANTS = {
    "row_scatter": (SCATTER_VARIANTS, "row-scatter"),
    "ep_zero_fill": (EP_FILL_VARIANTS, "zero-fill"),
}


def _row_key(kernel: str, dtype: torch.dtype, width: int) -> tuple:
    """The kernel key ``(kernel, dtype name, vector bytes)`` of a row kernel (``"row_scatter"`` or
    ``"ep_zero_fill"``) for rows of ``width`` elements of ``dtype``: 16-byte vectors where the row
    allows, else 4 (the kernel's variants); cached."""
    key = _ROW_KEYS.get((kernel, dtype, width))
    if key is None:
        variants, what = _ROW_VARIANTS[kernel]
        name = dtype_name(dtype)
        vec = next((v for v in (16, 4) if (name, v) in variants and width * dtype.itemsize % v == 0), None)
        if vec is None:
            raise ValueError(f"no {what} variant moves rows of {width} x {dtype}")
        key = _ROW_KEYS[kernel, dtype, width] = (kernel, name, vec)
    return key


def scatter_rows(
    src: torch.Tensor,
    dst: SharedRows,
    src_rows: torch.Tensor,
    dst_index: torch.Tensor,
    *,
    local: bool = False,
    bias: int = 0,
    by_src: bool = False,
) -> None:
    """Item i: ``src[src_rows[i]]`` (a zero row when outside src) to row ``d % P`` of buffer
    ``d // P`` of ``dst`` (``local``: of this rank's own buffer only), ``d = dst_index[i] + bias``
    (``by_src``: ``dst_index[src_rows[i]] + bias``, skipped when that source row is outside
    ``dst_index``); ``d < 0`` skips. CUDA: one row-scatter launch; CPU: the same moves in PyTorch."""
    if not by_src and dst_index.shape[0] != src_rows.shape[0]:
        raise ValueError(
            f"scatter_rows: {src_rows.shape[0]} source rows but {dst_index.shape[0]} destinations"
        )
    ptrs = dst.self_ptr if local else dst.ptrs
    target = _target(src)
    if target is None:
        index = dst_index.to(torch.int64) + bias
        if by_src:  # entry N of the extended index: a source row outside dst_index skips
            rows = src_rows.to(torch.int64)
            inside = (rows >= 0) & (rows < index.shape[0])
            index = torch.cat([index, index.new_full((1,), -1)])[torch.where(inside, rows, index.shape[0])]
        _scatter_rows_reference(src, [dst.own] if local else dst.tensors, src_rows, index)
        return
    kernel = _kernel(target, ScatterKey, _row_key("row_scatter", src.dtype, src.shape[1]))
    kernel(src, dst.own, src_rows, dst_index, ptrs, bias, int(by_src))


def _target(tensor: torch.Tensor):
    """The kernel target of ``tensor``'s device (None on CPU): the per-device table once known."""
    return targets.known(tensor) or targets.select("ep", "auto", tensor)


class ScatterKey(NamedTuple):
    """The row scatter's key: element ``dtype`` name and vector bytes ``vec``."""

    kernel: str
    dtype: str
    vec: int

    def variant(self, target) -> object:
        from cute_kernels.pad import RowGatherVariant

        return RowGatherVariant(self.dtype, self.vec)


class IdKey(NamedTuple):
    """The routing kernels' key (``ep_route``, ``ep_layout``): the ids' dtype name."""

    kernel: str
    ids: str

    def variant(self, target) -> object:
        from cute_kernels.ep_route import EpIdVariant

        return EpIdVariant(self.ids)


class FillKey(NamedTuple):
    """The zero fill's key: the buffer's dtype name and vector bytes ``vec``."""

    kernel: str
    dtype: str
    vec: int

    def variant(self, target) -> object:
        from cute_kernels.ep_route import EpFillVariant

        return EpFillVariant(self.dtype, self.vec)


class CombineSumKey(NamedTuple):
    """The combine sum's key (one variant)."""

    kernel: str

    def variant(self, target) -> object:
        from cute_kernels.combine_sum import CombineSumVariant

        return CombineSumVariant()


def _kernel(target, key_class, key: tuple) -> object:
    """The compiled kernel of ``key`` (a plain tuple of ``key_class``'s fields, equal to the key:
    the table is read without building the NamedTuple; built only to compile on a miss)."""
    return target.kernels.get(key) or target.kernel(key_class._make(key), key_class.variant)


def _scatter_rows_reference(src, buffers: list, src_rows, dst_index) -> None:
    src, buffers = reference._as_bits(src), [reference._as_bits(b) for b in buffers]
    rows = src_rows.to(torch.int64)
    valid = (rows >= 0) & (rows < src.shape[0])
    moved = torch.where(
        valid[:, None], src[rows.clamp(0, max(src.shape[0] - 1, 0))], torch.zeros_like(src[:1])
    )
    index = dst_index.to(torch.int64)
    height = buffers[0].shape[0]
    for b, buf in enumerate(buffers):
        keep = (index >= b * height) & (index < (b + 1) * height)
        buf[index[keep] - b * height] = moved[keep]


# --- Routing and layout (device tensors only, no sync) ----------------------------------------------
#
# On a GPU the routing kernels (``cute_kernels.ep_route``: notes/ep-routing-kernel.md) compute it all
# in one launch per step: ``route`` (counts and ranks), ``layout`` (destinations and this rank's
# groups) and ``zero_padding`` (one zero fill for every buffer). The PyTorch functions below them are the
# CPU path, the path for more than ``EP_MAX_EXPERTS`` experts, and what the tests compare with.


@dataclass(frozen=True)
class Routing:
    """A sender's pairs: ``expert`` (P,) the expert of each pair, dropped when outside ``[0, E)``
    (PyTorch routing: int64 with E for a dropped pair; the kernel: topk_idx's own ids, int32 or
    int64), ``counts`` (E,) int32 pairs per expert, ``position`` (P,) rank of each pair among the
    pairs of its expert (token, then slot order; PyTorch: int64; the kernel: int32, -1 for a
    dropped pair) and ``message``: the (E + 1,) int32 vector the count exchange sends, ``counts``
    then the slot's ticket (the kernel writes both; None: the exchange builds it); ``posted``: the
    route kernel also wrote the message into every rank's count table (row ``rank``)."""

    expert: torch.Tensor
    counts: torch.Tensor
    position: torch.Tensor
    message: torch.Tensor | None = None
    posted: bool = False


_ID_NAMES = {torch.int32: "int32", torch.int64: "int64"}


def _routing_target(tensor: torch.Tensor, experts: int):
    """The kernel target where the routing kernels run for ``experts`` (``tensor`` on a GPU with the
    kernels, E <= ``EP_MAX_EXPERTS``), else None (the PyTorch routing)."""
    return _target(tensor) if experts <= EP_MAX_EXPERTS else None


def route(
    topk_idx: torch.Tensor, experts: int, ticket: int = 0, post: SharedRows | None = None, rank: int = 0
) -> Routing:
    """:class:`Routing` of topk_idx (T, k) int32/int64 (any strides); on a GPU one launch of the
    route kernel, which also writes ``ticket`` (the slot's :func:`slot_ticket`) after the counts
    (``Routing.message``) and, given the count tables ``post`` ((R, E + 1) int32 per rank), the
    message into row ``rank`` of every rank's table (``Routing.posted``; the PyTorch routing leaves
    that to :meth:`SymmetricPool.post_counts`)."""
    target = _routing_target(topk_idx, experts)
    if target is None:
        return _route_torch(topk_idx, experts)
    # The kernel reads the ids with unit stride: a view when contiguous, else a contiguous copy.
    ids = topk_idx.view(-1) if topk_idx.is_contiguous() else topk_idx.contiguous().view(-1)
    message = ids.new_empty(experts + 1, dtype=torch.int32)
    position = message.new_empty(ids.shape[0])
    kernel = _kernel(target, IdKey, ("ep_route", _ID_NAMES[ids.dtype]))
    if post is not None and post.own.shape[1] != experts + 1:  # the kernel strides the tables by E + 1
        raise RuntimeError(
            f"torch_bindings.ep: count tables of {post.own.shape[1]} columns for E = {experts}"
        )
    peers = _no_addresses(ids.device) if post is None else post.ptrs
    kernel(ids, message, position, peers, experts, ticket, rank)
    return Routing(ids, message[:experts], position, message, post is not None)


#: ``warn.warn_once``'s key of the warning that a dispatch takes the PyTorch routing.
TORCH_ROUTING_WARNING = "moe.ep.torch_routing"


def _warn_torch_routing(experts: int) -> None:
    """Once per process: a GPU dispatch whose E is past the routing kernels' tables runs the
    PyTorch routing (no sync either, but about 30 more launches and their host time per call)."""
    warn_once(
        TORCH_ROUTING_WARNING,
        f"torch_bindings.ep.dispatch: num_experts={experts} is more than the routing kernels take "
        f"({EP_MAX_EXPERTS}); routing and layout run as PyTorch ops on the GPU (the same bytes and "
        "no host sync, but about 30 more launches and their host time per call)",
    )


def _route_torch(topk_idx: torch.Tensor, experts: int) -> Routing:
    """:class:`Routing` of topk_idx (T, k) in PyTorch ops (a stable sort of the expert ids)."""
    e = topk_idx.reshape(-1).to(torch.int64)
    e = torch.where((e >= 0) & (e < experts), e, experts)
    counts = torch.zeros(experts + 1, dtype=torch.int32, device=e.device)
    counts.index_add_(0, e, torch.ones_like(e, dtype=torch.int32))
    order = torch.sort(e, stable=True).indices
    first = torch.cumsum(counts, 0, dtype=torch.int64) - counts
    position = torch.empty_like(e)
    position[order] = torch.arange(e.numel(), device=e.device) - first[e[order]]
    return Routing(e, counts[:experts], position)


@dataclass(frozen=True)
class Layout:
    """Everything one rank needs after the exchange: as a sender, ``dst_index`` (P,) int32
    (``dest_rank * rows + dest_row``, -1 dropped); as a receiver, its ``padded_start`` /
    ``padded_end`` / ``sizes`` (E_local,) int32, and the zero fill's inputs: ``filled`` (the slot's
    (1,) int32 end of the rows the previous call filled; None: fresh buffers) and, where the row
    scatter zeroes (CPU, or more groups than the zero-fill kernel takes), ``zero_index`` (rows,)
    int32: the rows this call must zero (padding rows, and rows below the previous call's end that
    no pair fills), else -1; None where the zero-fill kernel runs (``zero_padding``). ``tracked``:
    the layout kernel already recorded this call's end in the slot (``Slot.state``)."""

    dst_index: torch.Tensor
    padded_start: torch.Tensor
    padded_end: torch.Tensor
    sizes: torch.Tensor
    zero_index: torch.Tensor | None
    filled: torch.Tensor | None = None
    tracked: bool = False


def layout(
    routing: Routing,
    all_counts: torch.Tensor,
    rank: int,
    shape: EpShape,
    filled: torch.Tensor | None,
    slot: Slot | None = None,
) -> Layout:
    """:class:`Layout` of ``rank`` from its routing and the (R, n) int32 counts of all ranks in
    columns ``[0, E)`` (any row stride); ``filled`` (1,) int32: the end of the rows the previous
    call on these buffers filled (``None``: fresh buffers, every row no pair fills is zeroed). On a
    GPU one launch of the layout kernel. With ``slot`` (a ``SymmetricPool`` dispatch slot,
    ``all_counts`` its whole (R, E + 1) table, the routing ``posted``), the kernel also checks
    every rank's ticket into ``slot.ticket_ok`` (the caller asserts it) and keeps the slot's fill
    end: the result's ``filled`` is the previous end, ``tracked`` True."""
    target = _routing_target(routing.position, shape.experts)
    if target is None:
        if slot is not None:
            raise RuntimeError("torch_bindings.ep: a tracked layout needs the routing kernels")
        return _layout_torch(routing, all_counts, rank, shape, filled)
    dst = routing.position.new_empty(shape.pairs)
    start, end, sizes = (dst.new_empty(shape.local_experts) for _ in range(3))
    state, ticket, mode = _no_state(dst.device), 0, 0  # mode 0: the kernel leaves state alone
    if slot is not None:
        if all_counts.shape[1] <= shape.experts:  # the tickets are column E
            raise RuntimeError("torch_bindings.ep: a tracked layout needs the (R, E + 1) count table")
        state, ticket, filled = slot.state, slot.ticket, slot.prev_filled
        mode = LAYOUT_TRACK | LAYOUT_CHECK | (LAYOUT_RESET if slot.captured else 0)
    kernel = _kernel(target, IdKey, ("ep_layout", _ID_NAMES[routing.expert.dtype]))
    kernel(
        routing.expert,
        routing.position,
        all_counts,
        dst,
        start,
        end,
        sizes,
        state,
        rank,
        shape.rows,
        shape.alignment,
        shape.experts,
        ticket,
        mode,
    )
    return Layout(dst, start, end, sizes, None, filled, slot is not None)


def _layout_torch(
    routing: Routing, all_counts: torch.Tensor, rank: int, shape: EpShape, filled: torch.Tensor | None
) -> Layout:
    """:func:`layout` in PyTorch ops (the routing of :func:`_route_torch`)."""
    ranks, local, align, rows = shape.ranks, shape.local_experts, shape.alignment, shape.rows
    counts = all_counts[:, : shape.experts].to(torch.int64)
    received = counts.sum(0).view(ranks, local)
    padded = (received + align - 1) // align * align
    padded_end = torch.cumsum(padded, 1)
    padded_start = padded_end - padded
    before = (torch.cumsum(counts, 0) - counts)[rank]  # pairs of lower ranks per expert
    e = routing.expert.clamp(max=shape.experts - 1)
    row = padded_start.view(-1)[e] + before[e] + routing.position
    dst = torch.where(routing.expert < shape.experts, (e // local) * rows + row, -1)
    own_start, own_end, own_sizes = (t[rank].to(torch.int32) for t in (padded_start, padded_end, received))
    zero = _zero_plan(own_start, own_end, own_sizes, filled, rows)
    return Layout(dst.to(torch.int32), own_start, own_end, own_sizes, zero, filled)


def _zero_plan(start, end, sizes, filled: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """``Layout.zero_index``: None where the zero-fill kernel runs (a GPU, at most
    ``EP_MAX_EXPERTS`` groups), else :func:`_zero_rows`."""
    if start.shape[0] <= EP_MAX_EXPERTS and _target(start) is not None:
        return None
    return _zero_rows(start, end, sizes, filled, rows)


def _zero_rows(start, end, sizes, filled: torch.Tensor | None, rows: int) -> torch.Tensor:
    """(rows,) int32: row r where r is no pair's row and below ``max(filled, end[-1])`` (every row
    when ``filled`` is ``None``), else -1."""
    r = _arange(rows, start.device)
    group = torch.searchsorted(end, r, right=True).clamp(max=end.numel() - 1)
    data = (r >= start[group]) & (r < start[group] + sizes[group])
    if filled is None:
        return torch.where(data, -1, r).to(torch.int32)
    limit = torch.maximum(filled.to(torch.int64), end[-1:])
    return torch.where(~data & (r < limit), r, -1).to(torch.int32)


# --- The per-rank steps (the real path runs them in order; the simulation interleaves ranks) ----------


@dataclass
class DispatchResult:
    """What ``dispatch`` returns on a rank: ``q`` (rows, D) bf16 or e4m3 (a view of buffers this
    result owns: no later call writes them while any tensor still views them), ``scales`` (None;
    mxfp8: ``float8_e8m0fnu`` (rows + 128 E_local, Cp), the M-groups blocked layout of the padded
    groups; fp8_rowwise: (rows,) fp32, one dequantization scale per row, 1.0 on padding rows),
    ``padded_group_start_offsets`` / ``padded_group_end_offsets`` (E_local,) int32 and
    ``group_sizes`` (E_local,) int32 rows received per local expert; the rest is for ``combine``."""

    q: torch.Tensor | None
    scales: torch.Tensor | None
    padded_group_start_offsets: torch.Tensor
    padded_group_end_offsets: torch.Tensor
    group_sizes: torch.Tensor
    shape: EpShape
    dst_index: torch.Tensor  # (P,) int32: where each of this rank's pairs went
    tags: torch.Tensor  # (rows,) int32: 1 + source rank * P + pair of each local row, 0 for padding
    rank: int
    pool: object = field(repr=False, default=None)
    #: mxfp8: the (rows, D/32) e8m0 scale rows before blocking (the emulated GEMM reads them).
    plain_scales: torch.Tensor | None = field(repr=False, default=None)
    #: FP8 recipes: the (rows, D) bf16 tensor without storage of its own that carries the rows'
    #: gradient back through the dispatch (``tokens`` hands it to the GEMMs).
    grad_anchor: torch.Tensor | None = field(repr=False, default=None)

    @property
    def tokens(self):
        """The FP8 recipes' rows as :class:`torch_bindings.moe.tokens.QuantizedTokens` (q, scales, the
        padded groups, the gradient anchor): what ``scaled_grouped_mm`` and ``GroupedExperts`` take
        as x without quantizing again. bf16: ``q`` itself."""
        if self.shape.recipe == "bf16":
            return self.q
        from .tokens import QuantizedTokens

        return QuantizedTokens(
            self.shape.recipe,
            self.q,
            self.scales,
            self.padded_group_end_offsets,
            self.shape.alignment,
            self.plain_scales,
            self.grad_anchor,
        )


def _dispatch_kinds(shape: EpShape) -> dict[str, tuple]:
    """The buffers a dispatch of ``shape`` writes, by name -> (shape, dtype)
    (``ep_send.buffer_specs``): ``q`` (rows, D) bf16 or e4m3, ``s`` the scale rows (mxfp8:
    (rows, D/32) e8m0; fp8_rowwise: (rows, 1) fp32) and ``tags`` (rows, 1) int32."""
    specs = buffer_specs(shape.recipe, shape.rows, shape.hidden)
    kinds = {"q": specs["q"], "tags": specs["tags"]}
    if "scales" in specs:
        kinds["s"] = specs["scales"]
    return kinds


def _family(shape: EpShape, purpose: str) -> tuple:
    """Buffers of one family share slots: the forward dispatch, or combine's backward (which must not
    overwrite a forward ``q`` an expert saved), per shape (recipe, D, ...)."""
    return (purpose, shape)


def send_dispatch(
    x: torch.Tensor, lay: Layout, bufs: dict, shape: EpShape, rank: int, scaling_mode: str
) -> None:
    """Step 4: this rank's pairs (x (T, D), or (T, k, D): one row per pair) into the receivers'
    buffers in one launch (``ep_send.launch_send`` on CUDA, ``quantize_and_send`` with its checks
    on CPU: each token read and, for mxfp8 /
    fp8_rowwise, quantized once, then written with its scale row to each of its k destinations),
    and the tags ``rank * P + pair + 1``."""
    rows2d = x.reshape(-1, x.shape[-1])
    topk = 1 if x.dim() == 3 else shape.topk
    buffers = SendBuffers(bufs["q"], bufs.get("s"), bufs["tags"])
    if rows2d.is_cuda:  # the rows are checked by dispatch, the index and buffers are this module's
        launch_send(
            rows2d, lay.dst_index, buffers, SendOptions(shape.recipe, rank, topk, scaling_mode=scaling_mode)
        )
        return
    quantize_and_send(
        rows2d, lay.dst_index, buffers, recipe=shape.recipe, rank=rank, topk=topk, scaling_mode=scaling_mode
    )


def zero_padding(lay: Layout, bufs: dict) -> None:
    """Step 5a: zero this rank's padding rows, and rows a previous call filled past the new end, in
    every row buffer (local writes to rows no pair fills: no ordering with the peers' sends). An
    fp8_rowwise scale row gets 1.0 (the bits of 1.0 read from a row of ones) rather than 0. On a GPU
    one zero-fill launch for every buffer (``Layout.zero_index`` None), else a row scatter per
    buffer."""
    if lay.zero_index is None:
        _fill_padding(lay, bufs)
        return
    none = _minus_ones(lay.zero_index.shape[0], lay.zero_index.device)
    for name, rows in bufs.items():
        if _padding_word(name, rows.own.dtype):
            ones = _ones_bits(rows.own.shape[0], rows.own.device)
            bits = _as_int32(rows)
            scatter_rows(ones, bits, _arange(ones.shape[0], ones.device), lay.zero_index, local=True)
        else:
            scatter_rows(rows.own, rows, none, lay.zero_index, local=True)


def _as_int32(rows: SharedRows) -> SharedRows:
    """fp32 scale rows seen as their int32 bits (the row scatter moves 4-byte words)."""
    tensors = None if rows.tensors is None else [t.view(torch.int32) for t in rows.tensors]
    return SharedRows(rows.own.view(torch.int32), rows.ptrs, rows.self_ptr, tensors)


#: The bits of fp32 1.0 as an int32: what the zero fill writes into fp8_rowwise scale rows.
_ONE_BITS = 0x3F800000


def _padding_word(name: str, dtype: torch.dtype) -> int:
    """The 4-byte word every word of a dispatch buffer's row holds where no pair fills it (padding,
    rows past the last group, a new slot): the bits of 1.0 in fp8_rowwise scale rows (``s``, the
    only fp32 kind), else 0 (reference.ep_dispatch)."""
    return _ONE_BITS if name == "s" and dtype == torch.float32 else 0


def fill_unfilled_rows(own: torch.Tensor, name: str) -> None:
    """Every row of a new slot's buffer ``name`` as a row no pair filled (:func:`_padding_word`), so
    that the rows past the last group read as the reference's from the first call on: the later
    calls' fill (:func:`zero_padding`) rewrites only rows a previous call filled."""
    word = _padding_word(name, own.dtype)
    if word:
        own.view(torch.int32).fill_(word)
    else:
        own.zero_()


def _fill_padding(lay: Layout, bufs: dict) -> None:
    """:func:`zero_padding` by the zero-fill kernel (``cute_kernels.ep_route``): the rows
    ``_zero_rows`` names in every buffer, one launch (q as rows of 16-byte vectors, the scale rows
    and tags as 4-byte words), reading the offsets and ``filled`` on the device."""
    q = bufs["q"].own
    target = _target(lay.padded_end)
    fresh = lay.filled is None
    filled = lay.padded_end if fresh else lay.filled  # read only when not fresh
    aux = [
        (rows.own.view(torch.int32), _padding_word(n, rows.own.dtype)) for n, rows in bufs.items() if n != "q"
    ]
    if not 1 <= len(aux) <= 2 or any(t.shape[0] != q.shape[0] for t, _ in aux):
        raise RuntimeError(
            f"torch_bindings.ep: the zero fill takes q and 1-2 buffers of its rows, got {bufs}"
        )
    (a, word_a), (b, word_b) = aux if len(aux) == 2 else aux * 2  # tags alone: filled twice
    kernel = _kernel(target, FillKey, _row_key("ep_zero_fill", q.dtype, q.shape[1]))
    offsets = (lay.padded_start, lay.padded_end, lay.sizes)
    kernel(q, a, b, *offsets, filled, int(fresh), 0, word_a, word_b, target.num_sms)


#: Read-only index vectors by (what, sizes..., device) (``torch_bindings.device_constants``).
_INDEX_TENSORS = ConstantCache()


def _cached_index(key: tuple, device: torch.device, build) -> torch.Tensor:
    """``build()``'s tensor on ``device``, cached under ``key`` (a launch less per later use). Read
    only: none is written, and only the 0-d zero leaves the module, as a zero-stride expansion
    (the gradient anchor) that autograd refuses to write. Built inside a CUDA graph capture, it is
    not cached (``ConstantCache``)."""
    return _INDEX_TENSORS.get(key, device, build)


def _minus_ones(n: int, device: torch.device) -> torch.Tensor:
    """A cached (n,) int32 tensor of -1 (source rows that read as zero rows)."""
    return _cached_index(
        ("-1", n, device), device, lambda: torch.full((n,), -1, dtype=torch.int32, device=device)
    )


def _ones_bits(n: int, device: torch.device) -> torch.Tensor:
    """A cached (n, 1) int32 tensor of the bits of fp32 1.0 (padding rows' scales)."""
    return _cached_index(
        ("1.0", n, device),
        device,
        lambda: torch.ones((n, 1), dtype=torch.float32, device=device).view(torch.int32),
    )


def _zero_bf16(device: torch.device) -> torch.Tensor:
    """A cached 0-d bf16 zero (the FP8 dispatch's gradient anchor expands it: no storage of its own)."""
    return _cached_index(
        ("0 bf16", device), device, lambda: torch.zeros((), dtype=torch.bfloat16, device=device)
    )


def _no_addresses(device: torch.device) -> torch.Tensor:
    """A cached (0,) int64 tensor: no count tables for the route kernel to post into."""
    return _cached_index(
        ("no addresses", device), device, lambda: torch.empty(0, dtype=torch.int64, device=device)
    )


def _no_state(device: torch.device) -> torch.Tensor:
    """A cached (3,) int32 tensor the layout kernel gets as its slot state in mode 0 (never written).
    Kept apart from :func:`_zeros_int`'s zeros, which the count exchange reads as row indices: a
    kernel argument that is writable in other modes never aliases another step's constants."""
    return _cached_index(
        ("no state", device), device, lambda: torch.zeros(3, dtype=torch.int32, device=device)
    )


def _zeros_int(n: int, device: torch.device) -> torch.Tensor:
    """A cached (n,) int32 tensor of 0."""
    return _cached_index(
        ("0", n, device), device, lambda: torch.zeros((n,), dtype=torch.int32, device=device)
    )


def _row_of_every_rank(ranks: int, rank: int, device: torch.device) -> torch.Tensor:
    """A cached (R,) int32 row-scatter destination: row ``rank`` of each of the R ranks' (R, W)
    tables (``r * R + rank``)."""

    def build() -> torch.Tensor:
        return torch.arange(ranks, dtype=torch.int32, device=device) * ranks + rank

    return _cached_index(("row of every rank", ranks, rank, device), device, build)


def _arange(n: int, device: torch.device) -> torch.Tensor:
    """A cached ``arange(n)`` int32 (the static row and pair numbers)."""
    return _cached_index(
        ("arange", n, device), device, lambda: torch.arange(n, dtype=torch.int32, device=device)
    )


def _send_and_land(x: torch.Tensor, lay: Layout, slot: Slot, shape: EpShape, pool, scaling_mode: str) -> None:
    """Steps 4 and 5a on this rank, then the barrier after which every peer's rows have landed;
    records the new filled end for the next call's zero fill (unless the layout kernel did:
    ``Layout.tracked``)."""
    bufs = slot.views[pool.rank]
    send_dispatch(x, lay, bufs, shape, pool.rank, scaling_mode)
    zero_padding(lay, bufs)
    pool.barrier()
    if not lay.tracked:
        _mark_filled(lay, slot)


def _mark_filled(lay: Layout, slot: Slot) -> None:
    if slot.filled is not None:
        slot.filled.copy_(lay.padded_end[-1:])


def finish_dispatch(
    lay: Layout, bufs: dict, shape: EpShape, rank: int, owned: bool = False
) -> DispatchResult:
    """Step 5b, after every rank's rows have landed (barrier): the result (q a new view of the
    buffer: the slot stays busy while it lives; the scales of the padded groups; the row tags
    copied out, fp8_rowwise's scales with them in one copy, or with ``owned`` (the buffers are this
    call's own: ``LocalPool``) viewed as they are)."""
    scales = plain = None
    tags = bufs["tags"].own.view(-1)
    if shape.recipe == "mxfp8":
        plain = bufs["s"].own
        scales = swizzle_scales(plain, group_end_offsets=lay.padded_end, groups="M")
        plain = plain.view(plain.shape)
    elif shape.recipe == "fp8_rowwise":
        scales = bufs["s"].own.view(-1)
    if not owned and shape.recipe == "fp8_rowwise":  # one launch copies both out (shared storage)
        both = torch.cat((scales.view(torch.int32), tags))
        rows = tags.shape[0]
        scales = both[:rows].view(torch.float32)
        # tags on the second half through a tensor of their own: disjoint bytes, so no shared version
        # counter (an in-place write to the scales must not fail the backward that saved the tags)
        tags = both.new_empty(0).set_(both.untyped_storage(), rows, (rows,), (1,))
    elif not owned:
        tags = tags.clone()
    q = bufs["q"].own
    return DispatchResult(
        q.view(q.shape),
        scales,
        lay.padded_start,
        lay.padded_end,
        lay.sizes,
        shape,
        lay.dst_index,
        tags,
        rank,
        plain_scales=plain,
    )


def send_combine(y: torch.Tensor, result: DispatchResult, rows_buffer: SharedRows) -> None:
    """Combine's send: local row r of y (rows, D') to its source's (T*k, D') buffer at the pair its
    tag names (padding rows skipped). With several ranks the rows go in :func:`_spread_order`: the
    received rows are expert-major and, within an expert, source-major, so in row order every rank
    would write to the same source at the same time (notes/ep-dispatch-combine.md)."""
    count = result.shape.rows
    if result.shape.ranks == 1:
        scatter_rows(y, rows_buffer, _arange(count, y.device), result.tags, bias=-1)
        return
    scatter_rows(y, rows_buffer, _spread_order(count, y.device), result.tags, bias=-1, by_src=True)


def _spread_stride(n: int) -> int:
    """The stride of :func:`_spread_order`: the first integer from ``round(n / golden ratio)`` up
    that is coprime with ``n`` (so that ``i * stride % n`` is a permutation; at most n - 1 for
    n >= 2); 0 for n <= 1."""
    if n <= 1:
        return 0
    stride = max(round(n * 0.6180339887498949), 1)
    while math.gcd(stride, n) != 1:
        stride += 1
    return stride


def _spread_order(n: int, device: torch.device) -> torch.Tensor:
    """A cached (n,) int32 permutation, ``i * stride % n`` (:func:`_spread_stride`): rows that run
    at the same time (neighbouring items) lie far apart, spread evenly over the buffer."""

    def build() -> torch.Tensor:
        order = torch.arange(n, dtype=torch.int64, device=device) * _spread_stride(n) % max(n, 1)
        return order.to(torch.int32)

    return _cached_index(("spread", n, device), device, build)


def _combine_slot(pool, shape: EpShape, width: int) -> Slot:
    """The (T*k, D') bf16 buffers one combine (or dispatch's backward) writes: consumed within the
    call (its sum writes a new tensor), so one slot serves every call on a ``SymmetricPool``."""
    family = f"combine/{width}/{shape.tokens}/{shape.topk}"
    return pool.acquire(family, {"y": ((shape.pairs, width), torch.bfloat16)})


def finish_combine(
    result: DispatchResult, topk_weights: torch.Tensor, rows_buffer: SharedRows
) -> torch.Tensor:
    """Combine's sum on the source rank, after every peer's rows landed: (T, D') bf16
    (``reference.weighted_slot_sum``: the ``combine_sum`` kernel on CUDA, PyTorch on CPU). A dropped
    pair reads as a zero row."""
    shape = result.shape
    rows = rows_buffer.own
    weights = topk_weights.to(torch.float32).contiguous()
    target = _target(rows)
    if target is None:
        return reference.weighted_slot_sum(combined_rows(result, rows_buffer), weights)
    out = rows.new_empty((shape.tokens, rows.shape[1]))
    _kernel(target, CombineSumKey, ("combine_sum",))(rows, result.dst_index, weights, out)
    return out


def combined_rows(result: DispatchResult, rows_buffer: SharedRows) -> torch.Tensor:
    """The (T, k, D') rows ``finish_combine`` sums, dropped pairs' rows zero (a new tensor)."""
    shape = result.shape
    rows = rows_buffer.own.view(shape.tokens, shape.topk, -1)
    kept = (result.dst_index >= 0).view(shape.tokens, shape.topk, 1)
    return torch.where(kept, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


# --- The public ops -----------------------------------------------------------------------------------


class _Local:
    """The type of :data:`LOCAL` (one instance; pickles and copies as that instance)."""

    def __repr__(self) -> str:
        return "torch_bindings.ep.LOCAL"

    def __reduce__(self) -> str:
        return "LOCAL"


#: ``group=LOCAL``: R = 1 whatever ``torch.distributed`` holds: every expert local, no
#: communication (``MoELayer``, ``routed_experts`` and the transformers integration use it when no
#: group is given, so data parallelism never turns into expert parallelism by itself).
LOCAL = _Local()


def resolve_group(group: Any) -> Any:
    """The process group a call with ``group`` runs over, ``None`` for R = 1: :data:`LOCAL` -> None;
    ``None`` -> torch.distributed's default group (WORLD) when it is initialized with more than one
    rank, else None; any other group as it is."""
    if group is LOCAL:
        return None
    if group is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist.group.WORLD
    return group


def group_size(group: Any) -> int:
    """R, the ranks a call with ``group`` spreads the experts over (:func:`resolve_group`)."""
    group = resolve_group(group)
    if group is None:
        return 1
    import torch.distributed as dist

    return dist.get_world_size(group)


_POOLS: dict[tuple, object] = {}


def _pool(group, device: torch.device):
    """The buffers of ``group`` (:func:`resolve_group`) on ``device``: ``LocalPool(1)`` for R = 1,
    else ``SymmetricPool``."""
    import torch.distributed as dist

    group = resolve_group(group)
    key = (group.group_name if group is not None else None, device)
    pool = _POOLS.get(key)
    if pool is None:
        if group is None or dist.get_world_size(group) == 1:
            pool = LocalPool(1, device)
        else:
            if device.type != "cuda" or device.index != torch.cuda.current_device():
                raise ValueError(
                    f"dispatch: a group of several ranks needs x on the current CUDA device "
                    f"(cuda:{torch.cuda.current_device()}), got {device}"
                )
            pool = SymmetricPool(group)
        _POOLS[key] = pool
    return pool


def run_dispatch(
    x: torch.Tensor, topk_idx: torch.Tensor, shape: EpShape, pool, scaling_mode: str
) -> DispatchResult:
    """Steps 1-5 on this rank (module docstring)."""
    rank = pool.rank
    slot = pool.acquire(_family(shape, "dispatch"), _dispatch_kinds(shape), counts=shape.experts + 1)
    routing = route(topk_idx, shape.experts, slot.ticket, slot.counts, rank)
    if routing.posted:  # a SymmetricPool on the routing kernels: the exchange is the barrier
        pool.barrier()
        lay = layout(routing, slot.counts.own, rank, shape, None, slot)
        torch._assert_async(slot.ticket_ok, _SLOT_MISMATCH)
    else:
        all_counts = pool.exchange_counts(routing, slot)
        lay = layout(routing, all_counts, rank, shape, slot.filled)
    try:
        _send_and_land(x, lay, slot, shape, pool, scaling_mode)
    except BaseException:
        if lay.tracked:  # the layout moved the fill end before the fill ran: the next fills every row
            with contextlib.suppress(RuntimeError):  # a broken device raises the original error only
                slot.filled.fill_(shape.rows)
        raise
    result = finish_dispatch(lay, slot.views[rank], shape, rank, owned=pool.owns_buffers)
    result.pool = pool
    return result


def run_combine(y: torch.Tensor, result: DispatchResult, topk_weights: torch.Tensor, keep_rows: bool = False):
    """Combine on this rank: a barrier (every rank is done reading its combine buffer), the send,
    a barrier (every row landed), the weighted sum; with ``keep_rows`` also the (T, k, D') pair rows
    (``combined_rows``: the weights' gradient needs them)."""
    pool = result.pool
    rows_buffer = _combine_slot(pool, result.shape, y.shape[1]).views[result.rank]["y"]
    pool.barrier()
    send_combine(y, result, rows_buffer)
    pool.barrier()
    out = finish_combine(result, topk_weights, rows_buffer)
    return (out, combined_rows(result, rows_buffer)) if keep_rows else out


def _grad_dispatch(rows: torch.Tensor, result: DispatchResult) -> torch.Tensor:
    """Per-pair rows (T, k, D') bf16 sent where the forward dispatch sent the pairs: (rows, D') with
    padding rows zero, a view of buffers of its own family (never the forward's). The layout is the
    forward's."""
    pool, rank = result.pool, result.rank
    shape = replace(result.shape, hidden=rows.shape[-1], recipe="bf16")
    slot = pool.acquire(_family(shape, "grad"), _dispatch_kinds(shape))
    start, end, sizes = result.padded_group_start_offsets, result.padded_group_end_offsets, result.group_sizes
    zero = _zero_plan(start, end, sizes, slot.filled, shape.rows)
    lay = Layout(result.dst_index, start, end, sizes, zero, slot.filled)
    pool.barrier()  # every rank is done with these buffers' previous contents
    if isinstance(pool, SymmetricPool):
        pool.announce(slot)
    _send_and_land(rows, lay, slot, shape, pool, "rceil")
    if isinstance(pool, SymmetricPool):
        pool.verify(slot)
    q = slot.views[rank]["q"].own
    return q.view(q.shape)


#: The routing tensors of a ``DispatchResult`` that the backward passes read.
_ROUTING_TENSORS = (
    "padded_group_start_offsets",
    "padded_group_end_offsets",
    "group_sizes",
    "dst_index",
    "tags",
)


#: Every tensor field of a ``DispatchResult`` as None: the context's copy holds none (the rows'
#: tensors never, the routing's through ``save_for_backward``).
_NO_TENSORS = dict.fromkeys((*_ROUTING_TENSORS, "q", "scales", "plain_scales", "grad_anchor"))


def _save_routing(ctx, result: DispatchResult, *extra) -> None:
    """Keep what a backward pass needs of ``result`` (its routing, never its rows) and ``extra``
    tensors (None allowed): every tensor through ``save_for_backward``, so saved-tensor hooks
    (activation checkpointing, offloading) see them and the backward frees them; the context
    holds no tensor attribute."""
    ctx.routing = replace(result, **_NO_TENSORS)
    ctx.save_for_backward(*(getattr(result, name) for name in _ROUTING_TENSORS), *extra)


def _load_routing(ctx) -> tuple[DispatchResult, tuple]:
    """``(routing, extra)`` saved by :func:`_save_routing`."""
    saved = ctx.saved_tensors
    count = len(_ROUTING_TENSORS)
    return replace(ctx.routing, **dict(zip(_ROUTING_TENSORS, saved[:count], strict=True))), saved[count:]


def _dispatch_output(result: DispatchResult) -> torch.Tensor:
    """What dispatch hands autograd: bf16 q itself; the FP8 recipes a (rows, D) bf16 zero anchor
    without storage of its own (an expansion of a cached 0-d zero)."""
    if result.shape.recipe == "bf16":
        return result.q
    return _zero_bf16(result.q.device).expand(result.q.shape)


def _needs_autograd(*tensors: torch.Tensor) -> bool:
    """Whether a call goes through its autograd Function: grad mode on and an input that requires a
    gradient, or forward-mode AD or a functorch transform active (there the Function raises, as it
    has no jvp or vmap rule, rather than drop a tangent). Otherwise the steps run without one."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return True
    return _transforms_active()


def _transforms_active() -> bool:
    """Whether forward-mode AD or a functorch transform is active. torch has no public query for
    either, so this reads torch's own state; a torch without it answers True, and every call then
    takes the autograd Function (correct, only the host time of the no-gradient path is lost)."""
    try:
        return _forward_ad._current_level >= 0 or torch._C._functorch.peek_interpreter_stack() is not None
    except AttributeError:
        return True


class _DispatchFn(torch.autograd.Function):
    """Dispatch with autograd: the gradient of x is a combine of the rows' gradient, unit weights.
    bf16 returns q itself; the FP8 recipes return a (rows, D) bf16 anchor without storage of its own
    (q is not differentiable), through which the GEMM that consumes q sends the rows' gradient. The
    context keeps the routing only (:func:`_save_routing`), never the dispatched rows."""

    @staticmethod
    def forward(ctx, x, topk_idx, shape, pool, scaling_mode, holder):
        result = run_dispatch(x, topk_idx, shape, pool, scaling_mode)
        holder.append(result)
        _save_routing(ctx, result)
        return _dispatch_output(result)

    @staticmethod
    def backward(ctx, grad_q):
        result, _ = _load_routing(ctx)
        ones = torch.ones((result.shape.tokens, result.shape.topk), dtype=torch.float32, device=grad_q.device)
        grad_x = run_combine(grad_q.to(torch.bfloat16).contiguous(), result, ones)
        return grad_x, None, None, None, None, None


class _CombineFn(torch.autograd.Function):
    """Combine with autograd: y's gradient is a dispatch of ``grad_out[t] * w[t, j]`` per slot (fp32
    product rounded to bf16), the weights' ``sum_d grad_out[t, d] y[t, j, d]`` in fp32. The context
    keeps the routing, the weights and, when the weights need a gradient, the (T, k, D') pair rows
    (a copy: never a view of a buffer slot), all through ``save_for_backward``."""

    @staticmethod
    def forward(ctx, y, topk_weights, result):
        keep = ctx.needs_input_grad[1]
        out = run_combine(y, result, topk_weights, keep_rows=keep)
        pair_rows = None
        if keep:
            out, pair_rows = out
        _save_routing(ctx, result, topk_weights, pair_rows)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        result, (w, pair_rows) = _load_routing(ctx)
        g = grad_out.to(torch.float32)
        grad_y = grad_w = None
        if ctx.needs_input_grad[0]:
            per_pair = (g[:, None, :] * w.to(torch.float32)[:, :, None]).to(torch.bfloat16)
            grad_y = _grad_dispatch(per_pair, result)
        if pair_rows is not None:
            grad_w = (g[:, None, :] * pair_rows.to(torch.float32)).sum(-1).to(w.dtype)
        return grad_y, grad_w, None


def dispatch(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    *,
    num_experts: int,
    recipe: str = "mxfp8",
    alignment: int = 32,
    group=None,
    scaling_mode: str = "rceil",
) -> DispatchResult:
    """Send every (token, slot) pair of this rank to its expert's rank (SPEC section 9).

    x (T, D) bf16 contiguous (T the same on every rank; mxfp8: D % 128 == 0, fp8_rowwise:
    D % 16 == 0), topk_idx (T, k) int32/int64 global expert ids in ``[0, num_experts)`` (others are
    dropped), ``num_experts`` E a multiple of the group size R (expert e lives on rank
    e // (E / R)). Returns a :class:`DispatchResult`: ``q`` (rows, D) with rows =
    ``R*T*k + E_local*alignment`` rounded up to ``alignment``, local expert j's rows ordered by
    (source rank, token, slot) and padded with zero rows to ``alignment``, rows past the last group
    zero; mxfp8: e4m3 and the blocked scales of the padded groups; fp8_rowwise: e4m3 and one fp32
    scale per row (power-of-2, SPEC section 7; 1.0 on padding rows). ``result.tokens`` hands the FP8
    rows to ``scaled_grouped_mm`` / ``GroupedExperts`` as quantized x, and x's gradient flows back
    through them. More experts than the routing kernels take (``EP_MAX_EXPERTS``) route through
    PyTorch ops on a GPU, with a warning once per process. No host sync (the first call on
    a group and shape allocates its buffers collectively, once, and again whenever more results are
    alive at once than ever before). The result owns its rows: they stay valid while any tensor
    views them, across any number of later calls. Differentiable in x (the gradient is a combine of
    the rows' gradient with unit weights).

    ``group``: a ``torch.distributed`` process group of R ranks, every rank calling with the same
    shapes; ``None`` is torch.distributed's default group (WORLD) as in its collectives, R = 1 when
    it is not initialized or has one rank; :data:`LOCAL` is R = 1 whatever is initialized. R = 1
    takes its rows from the caching allocator, per call, and communicates nothing.
    """
    pool = _pool(group, x.device)
    if not checks.fast_ep_dispatch_ok(x, topk_idx, num_experts, pool.ranks, recipe, alignment, scaling_mode):
        checks.check_ep_dispatch(x, topk_idx, num_experts, pool.ranks, recipe, alignment, scaling_mode)
    tokens, hidden = x.shape
    shape = EpShape(pool.ranks, tokens, hidden, topk_idx.shape[1], num_experts, alignment, recipe)
    if pool.ranks * shape.rows > _INT32_MAX:
        raise ValueError(
            f"dispatch: R * rows = {pool.ranks * shape.rows} does not fit the kernel's int32 row index"
        )
    if num_experts > EP_MAX_EXPERTS and x.is_cuda:
        _warn_torch_routing(num_experts)
    if _needs_autograd(x):
        holder: list[DispatchResult] = []
        out = _DispatchFn.apply(x, topk_idx, shape, pool, scaling_mode, holder)
        result = holder[0]
    else:  # no gradient to carry: the steps without an autograd node (host time)
        result = run_dispatch(x, topk_idx, shape, pool, scaling_mode)
        out = _dispatch_output(result)
    if recipe == "bf16":
        result.q = out
    else:
        result.grad_anchor = out
    return result


def combine(y: torch.Tensor, dispatched: DispatchResult, topk_weights: torch.Tensor) -> torch.Tensor:
    """Bring the local experts' outputs y (rows, D') bf16 (in ``dispatched``'s layout) back to their
    source ranks: ``out[t] = sum_j topk_weights[t, j] * y[row of (t, j)]`` in fp32, (T, D') bf16
    (``reference.weighted_slot_sum``; a dropped pair adds nothing). Differentiable in y and the
    weights. No host sync."""
    shape = dispatched.shape
    checks.check_ep_combine(y, shape.rows, topk_weights, shape.tokens, shape.topk)
    if _needs_autograd(y, topk_weights):
        return _CombineFn.apply(y.contiguous(), topk_weights, dispatched)
    return run_combine(y.contiguous(), dispatched, topk_weights)  # no autograd node (host time)


# --- A group of R ranks simulated in one process (tests, benches) -------------------------------------


def simulate_dispatch(
    xs: list,
    topk_idxs: list,
    num_experts: int,
    pool: LocalPool,
    *,
    recipe: str = "mxfp8",
    alignment: int = 32,
    scaling_mode: str = "rceil",
) -> list[DispatchResult]:
    """``dispatch`` on every rank of ``pool`` (R ranks in one process, one stream), step by step with
    the same kernels and buffers layout as the real path: all routings, the stacked counts, every
    rank's send, then every rank's finish."""
    ranks = pool.ranks
    tokens, topk = topk_idxs[0].shape
    shape = EpShape(ranks, tokens, xs[0].shape[-1], topk, num_experts, alignment, recipe)
    slot = pool.acquire(_family(shape, "dispatch"), _dispatch_kinds(shape))
    routings = [route(t, num_experts) for t in topk_idxs]
    all_counts = torch.stack([r.counts for r in routings])
    lays = [layout(routings[r], all_counts, r, shape, slot.filled) for r in range(ranks)]
    for r in range(ranks):
        send_dispatch(xs[r], lays[r], slot.views[r], shape, r, scaling_mode)
    for r in range(ranks):
        zero_padding(lays[r], slot.views[r])
    results = [
        finish_dispatch(lays[r], slot.views[r], shape, r, owned=pool.owns_buffers) for r in range(ranks)
    ]
    for result in results:
        result.pool = pool
    return results


def simulate_combine(ys: list, results: list[DispatchResult], topk_weights: list) -> list[torch.Tensor]:
    """``combine`` on every rank of a simulated group: every rank's send, then every rank's sum."""
    pool = results[0].pool
    slot = _combine_slot(pool, results[0].shape, ys[0].shape[1])
    for r, (y, result) in enumerate(zip(ys, results, strict=True)):
        send_combine(y, result, slot.views[r]["y"])
    return [
        finish_combine(res, w, slot.views[r]["y"])
        for r, (res, w) in enumerate(zip(results, topk_weights, strict=True))
    ]
