"""Expert-parallel dispatch and combine (SPEC section 9; design in notes/ep-dispatch-combine.md).

Over a process group of R ranks with E = R * E_local experts (expert e on rank e // E_local),
``dispatch`` sends every (token, slot) pair to its expert's rank, where it lands expert-major and
padded: local expert j's rows ordered by (source rank, token, slot), each group padded with zero
rows to ``alignment``, in a tensor of the static worst-case row count
``R*T*k + E_local*alignment`` (rounded up to the alignment). ``combine`` brings expert outputs back
and sums them per token with the routing weights. Both run with no host sync:

1. *Routing* (sender, local): per-expert counts of this rank's pairs and each pair's position
   among the pairs of its expert (a stable sort).
2. *Exchange*: the (R, E) count matrix, all-gathered over NCCL (a few KB); it also orders this
   call after every rank's previous use of the buffers.
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

Buffers: one set per (group, shapes), allocated on first use (a collective that syncs once) and
reused: a ``DispatchResult``'s ``q`` is a view of them, valid until the next ``dispatch`` with the
same group and shapes (combine's backward dispatches into a set of its own). The R = 1 path (no
group) runs the same kernels on local buffers, and on CPU the reference's moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from cute_kernels.row_scatter import SCATTER_VARIANTS

from . import checks, reference, targets
from .quantize import quantize_mxfp8_2d
from .swizzle import swizzle_scales

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


@dataclass
class SharedRows:
    """One kind of destination buffer as a rank sees it: ``own`` (this rank's (P, W) tensor),
    ``ptrs`` (Int64 (R,) device: every rank's buffer address, this rank's included) and ``self_ptr``
    (Int64 (1,): ``own`` alone, for writes that stay local)."""

    own: torch.Tensor
    ptrs: torch.Tensor
    self_ptr: torch.Tensor
    #: The R tensors themselves where they live in this process (``LocalPool``): the CPU moves.
    tensors: list | None = None


class LocalPool:
    """Buffers of R ranks in one process (R = 1: the local path, ``rank`` 0; R > 1: the simulated
    multi-rank tests, whose driver runs the ranks' steps in turn and stacks their counts): every
    buffer kind is R zeroed local tensors, and rank r's view names them all."""

    rank = 0

    def __init__(self, ranks: int, device: torch.device) -> None:
        self.ranks = ranks
        self.device = device
        self._kinds: dict[tuple, list[SharedRows]] = {}

    def get(self, rank: int, name: str, shape: tuple, dtype: torch.dtype) -> SharedRows:
        key = (name, shape, dtype)
        views = self._kinds.get(key)
        if views is None:
            tensors = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(self.ranks)]
            ptrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=self.device)
            views = self._kinds[key] = [
                SharedRows(t, ptrs, ptrs[r : r + 1], tensors) for r, t in enumerate(tensors)
            ]
        return views[rank]

    def exchange_counts(self, counts: torch.Tensor) -> torch.Tensor:
        if self.ranks != 1:
            raise RuntimeError("a simulated group's driver exchanges the counts itself")
        return counts[None]

    def barrier(self) -> None:
        """R = 1: one stream, stream order is the barrier. A simulated group's driver orders its
        ranks' steps itself (``simulate_combine``): the public ops refuse its results."""
        if self.ranks != 1:
            raise RuntimeError("results of a simulated group go through simulate_combine, not combine")


def _same_on_every_rank(group, key: tuple) -> None:
    """Raise unless every rank allocates the same buffer (T, D, k, E the same everywhere): a rank
    with more rows would write past a peer's buffer. Runs once per buffer, with its allocation."""
    import torch.distributed as dist

    keys: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(keys, key, group=group)
    if any(k != key for k in keys):
        raise ValueError(f"dispatch: ranks disagree on the buffer shapes (T, D, k, E must match): {keys}")


class SymmetricPool:
    """Buffers in PyTorch symmetric memory over ``group`` (one allocation and rendezvous per kind,
    on first use: collective, syncs once). Multicast is never used."""

    def __init__(self, group) -> None:
        import torch.distributed as dist

        self.group = group
        self.ranks = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._kinds: dict[tuple, SharedRows] = {}
        self._handle = None

    def get(self, rank: int, name: str, shape: tuple, dtype: torch.dtype) -> SharedRows:
        key = (name, shape, dtype)
        found = self._kinds.get(key)
        if found is None:
            import torch.distributed._symmetric_memory as symm_mem

            if self._handle is None and hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(self.group.group_name)  # a no-op on newer torch
            _same_on_every_rank(self.group, (name, shape, str(dtype)))
            own = symm_mem.empty(shape, dtype=dtype, device=torch.device("cuda", torch.cuda.current_device()))
            own.zero_()
            handle = symm_mem.rendezvous(own, self.group)
            ptrs = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=own.device)
            found = self._kinds[key] = SharedRows(own, ptrs, ptrs[self.rank : self.rank + 1].clone())
            self._handle = handle
        return found

    def barrier(self) -> None:
        """Every rank's stream reaches this point before any passes it (system-scope signals), so the
        rows peers wrote before it are visible after it."""
        self._handle.barrier(channel=0)

    def exchange_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """(E,) int32 counts of every rank, (R, E), over NCCL (no host sync)."""
        import torch.distributed as dist

        out = counts.new_empty((self.ranks, counts.shape[0]))
        dist.all_gather_into_tensor(out, counts, group=self.group)
        return out


# --- Moving rows -------------------------------------------------------------------------------------


def _vector_bytes(dtype: torch.dtype, width: int) -> int:
    """The row-scatter variant's vector for rows of ``width`` elements of ``dtype``."""
    name = str(dtype).removeprefix("torch.")
    row_bytes = width * dtype.itemsize
    for vec in (16, 4):
        if (name, vec) in SCATTER_VARIANTS and row_bytes % vec == 0:
            return vec
    raise ValueError(f"no row-scatter variant moves rows of {width} x {dtype}")


def scatter_rows(
    src: torch.Tensor,
    dst: SharedRows,
    src_rows: torch.Tensor,
    dst_index: torch.Tensor,
    *,
    local: bool = False,
) -> None:
    """Item i: ``src[src_rows[i]]`` (a zero row when outside src) to row ``dst_index[i] % P`` of
    buffer ``dst_index[i] // P`` of ``dst`` (``local``: of this rank's own buffer only);
    ``dst_index < 0`` skips. CUDA: one row-scatter launch; CPU: the same moves in PyTorch."""
    ptrs = dst.self_ptr if local else dst.ptrs
    target = _target(src)
    if target is None:
        _scatter_rows_reference(src, [dst.own] if local else dst.tensors, src_rows, dst_index)
        return
    vec = _vector_bytes(src.dtype, src.shape[1])
    name = str(src.dtype).removeprefix("torch.")
    kernel = target.kernel(("row_scatter", name, vec), _scatter_variant)
    kernel(src, dst.own, src_rows, dst_index, ptrs)


def _target(tensor: torch.Tensor):
    """The kernel target of ``tensor``'s device (None on CPU): the per-device table once known."""
    return targets.known(tensor) or targets.select("ep", "auto", tensor)


def _scatter_variant(key: tuple, target) -> object:
    from cute_kernels.pad import RowGatherVariant

    return RowGatherVariant(key[1], key[2])


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


@dataclass(frozen=True)
class Routing:
    """A sender's pairs: ``expert`` (P,) int64 (E for a dropped pair: expert outside [0, E)),
    ``counts`` (E,) int32 pairs per expert, ``position`` (P,) int64 rank of each pair among the
    pairs of its expert (token, then slot order)."""

    expert: torch.Tensor
    counts: torch.Tensor
    position: torch.Tensor


def route(topk_idx: torch.Tensor, experts: int) -> Routing:
    """:class:`Routing` of topk_idx (T, k)."""
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
    ``padded_end`` / ``sizes`` (E_local,) int32 and ``zero_index`` (rows,) int32: the rows this call
    must zero (padding rows, and rows below the previous call's end that no pair fills), else -1."""

    dst_index: torch.Tensor
    padded_start: torch.Tensor
    padded_end: torch.Tensor
    sizes: torch.Tensor
    zero_index: torch.Tensor


def layout(
    routing: Routing, all_counts: torch.Tensor, rank: int, shape: EpShape, high_water: torch.Tensor
) -> Layout:
    """:class:`Layout` of ``rank`` from its routing and the (R, E) counts of all ranks;
    ``high_water`` (1,) int32: the end of the rows the previous call on these buffers filled."""
    ranks, local, align, rows = shape.ranks, shape.local_experts, shape.alignment, shape.rows
    counts = all_counts.to(torch.int64)
    received = counts.sum(0).view(ranks, local)
    padded = (received + align - 1) // align * align
    padded_end = torch.cumsum(padded, 1)
    padded_start = padded_end - padded
    before = (torch.cumsum(counts, 0) - counts)[rank]  # pairs of lower ranks per expert
    e = routing.expert.clamp(max=shape.experts - 1)
    row = padded_start.view(-1)[e] + before[e] + routing.position
    dst = torch.where(routing.expert < shape.experts, (e // local) * rows + row, -1)
    own_start, own_end, own_sizes = padded_start[rank], padded_end[rank], received[rank]
    zero = _zero_rows(own_start, own_end, own_sizes, high_water, rows)
    return Layout(
        dst.to(torch.int32),
        own_start.to(torch.int32),
        own_end.to(torch.int32),
        own_sizes.to(torch.int32),
        zero,
    )


def _zero_rows(start, end, sizes, high_water, rows: int) -> torch.Tensor:
    """(rows,) int32: row r where r is no pair's row and below ``max(high_water, end[-1])``, else -1."""
    r = _arange(rows, start.device)
    group = torch.searchsorted(end, r, right=True).clamp(max=end.numel() - 1)
    data = (r >= start[group]) & (r < start[group] + sizes[group])
    limit = torch.maximum(high_water.reshape(-1).to(torch.int64), end[-1:])
    return torch.where(~data & (r < limit), r, -1).to(torch.int32)


# --- The per-rank steps (the real path runs them in order; the simulation interleaves ranks) ----------


@dataclass
class DispatchResult:
    """What ``dispatch`` returns on a rank: ``q`` (rows, D) bf16 or e4m3 (a view of the group's
    buffer: valid until the next dispatch with the same shapes), ``scales`` (None, or
    ``float8_e8m0fnu`` (rows + 128 E_local, Cp): the M-groups blocked layout of the padded groups),
    ``padded_group_start_offsets`` / ``padded_group_end_offsets`` (E_local,) int32 and
    ``group_sizes`` (E_local,) int32 rows received per local expert; the rest is for ``combine``."""

    q: torch.Tensor
    scales: torch.Tensor | None
    padded_group_start_offsets: torch.Tensor
    padded_group_end_offsets: torch.Tensor
    group_sizes: torch.Tensor
    shape: EpShape
    dst_index: torch.Tensor  # (P,) int32: where each of this rank's pairs went
    tags: torch.Tensor  # (rows,) int32: 1 + source rank * P + pair of each local row, 0 for padding
    rank: int
    pool: object = field(repr=False, default=None)


def _buffers(pool, rank: int, shape: EpShape, purpose: str = "dispatch") -> dict[str, SharedRows]:
    """The buffers a dispatch of ``shape`` writes, by name: ``q`` (rows, D) bf16 or e4m3, ``s``
    (rows, D/32) e8m0 scale rows (mxfp8), ``tags`` (rows, 1) int32, ``high_water`` (1, 1) int32 (the
    end of the rows the last call filled). Keyed by ``purpose`` (the forward dispatch, or combine's
    backward, which must not overwrite a forward ``q`` an expert saved), recipe and D: each family
    keeps its own state."""
    rows, d = shape.rows, shape.hidden
    family = f"{purpose}/{shape.recipe}/{d}"
    kinds = {"tags": ((rows, 1), torch.int32), "high_water": ((1, 1), torch.int32)}
    if shape.recipe == "mxfp8":
        kinds.update(q=((rows, d), torch.float8_e4m3fn), s=((rows, d // 32), torch.float8_e8m0fnu))
    else:
        kinds.update(q=((rows, d), torch.bfloat16))
    return {name: pool.get(rank, f"{family}:{name}", *kind) for name, kind in kinds.items()}


def send_dispatch(
    x: torch.Tensor, lay: Layout, bufs: dict, shape: EpShape, rank: int, scaling_mode: str
) -> None:
    """Step 4: this rank's pairs (x (T, D), or (T, k, D): one row per pair) into the receivers'
    buffers: q (mxfp8: quantized once per row here, then q and its scale rows), and the tags."""
    pairs = _arange(shape.pairs, x.device)
    src_rows = pairs if x.dim() == 3 else pairs // shape.topk
    rows2d = x.reshape(-1, x.shape[-1])
    if shape.recipe == "mxfp8":
        q, s = quantize_mxfp8_2d(rows2d, scaling_mode=scaling_mode, blocked_scales=False)
        scatter_rows(q, bufs["q"], src_rows, lay.dst_index)
        scatter_rows(s, bufs["s"], src_rows, lay.dst_index)
    else:
        scatter_rows(rows2d, bufs["q"], src_rows, lay.dst_index)
    tags = (pairs + (rank * shape.pairs + 1)).view(-1, 1)
    scatter_rows(tags, bufs["tags"], pairs, lay.dst_index)


def zero_padding(lay: Layout, bufs: dict) -> None:
    """Step 5a: zero this rank's padding rows, and rows a previous call filled past the new end, in
    every row buffer (local writes to rows no pair fills: no ordering with the peers' sends)."""
    none = _minus_ones(lay.zero_index.shape[0], lay.zero_index.device)
    for name in ("q", "s", "tags"):
        if name in bufs:
            scatter_rows(bufs[name].own, bufs[name], none, lay.zero_index, local=True)


_INDEX_TENSORS: dict[tuple, torch.Tensor] = {}


def _minus_ones(n: int, device: torch.device) -> torch.Tensor:
    """A cached (n,) int32 tensor of -1 (source rows that read as zero rows)."""
    key = ("-1", n, device)
    if key not in _INDEX_TENSORS:
        _INDEX_TENSORS[key] = torch.full((n,), -1, dtype=torch.int32, device=device)
    return _INDEX_TENSORS[key]


def _arange(n: int, device: torch.device) -> torch.Tensor:
    """A cached ``arange(n)`` int32 (the static row and pair numbers: one launch less per use)."""
    key = ("arange", n, device)
    if key not in _INDEX_TENSORS:
        _INDEX_TENSORS[key] = torch.arange(n, dtype=torch.int32, device=device)
    return _INDEX_TENSORS[key]


def _send_and_land(x: torch.Tensor, lay: Layout, bufs: dict, shape: EpShape, pool, scaling_mode: str) -> None:
    """Steps 4 and 5a on this rank, then the barrier after which every peer's rows have landed;
    records the new filled end (``high_water``) for the next call's zero fill."""
    send_dispatch(x, lay, bufs, shape, pool.rank, scaling_mode)
    zero_padding(lay, bufs)
    pool.barrier()
    _mark_filled(lay, bufs)


def _mark_filled(lay: Layout, bufs: dict) -> None:
    bufs["high_water"].own.view(-1).copy_(lay.padded_end[-1:])


def finish_dispatch(lay: Layout, bufs: dict, shape: EpShape, rank: int) -> DispatchResult:
    """Step 5b, after every rank's rows have landed (barrier): the result (q a view of the buffer,
    the blocked scales for mxfp8, the row tags copied out)."""
    scales = None
    if shape.recipe == "mxfp8":
        scales = swizzle_scales(bufs["s"].own, group_end_offsets=lay.padded_end, groups="M")
    tags = bufs["tags"].own.view(-1).clone()
    return DispatchResult(
        bufs["q"].own,
        scales,
        lay.padded_start,
        lay.padded_end,
        lay.sizes,
        shape,
        lay.dst_index,
        tags,
        rank,
    )


def send_combine(y: torch.Tensor, result: DispatchResult, pool, rank: int) -> None:
    """Combine's send: local row r of y (rows, D') to its source's (T*k, D') buffer at the pair its
    tag names (padding rows skipped)."""
    shape = result.shape
    rows = _arange(shape.rows, y.device)
    scatter_rows(y, _combine_buffer(pool, rank, shape, y.shape[1]), rows, result.tags - 1)


def _combine_buffer(pool, rank: int, shape: EpShape, width: int) -> SharedRows:
    return pool.get(rank, f"combine/{width}:y", (shape.pairs, width), torch.bfloat16)


def finish_combine(
    result: DispatchResult, topk_weights: torch.Tensor, pool, rank: int, width: int
) -> torch.Tensor:
    """Combine's sum on the source rank, after every peer's rows landed: (T, D') bf16
    (``reference.weighted_slot_sum``: the ``combine_sum`` kernel on CUDA, PyTorch on CPU). A dropped
    pair reads as a zero row."""
    shape = result.shape
    rows = _combine_buffer(pool, rank, shape, width).own
    weights = topk_weights.to(torch.float32).contiguous()
    target = _target(rows)
    if target is None:
        return reference.weighted_slot_sum(combined_rows(result, pool, rank, width), weights)
    out = rows.new_empty((shape.tokens, width))
    target.kernel(("combine_sum",), _combine_sum_variant)(rows, result.dst_index, weights, out)
    return out


def _combine_sum_variant(key: tuple, target) -> object:
    from cute_kernels.combine_sum import CombineSumVariant

    return CombineSumVariant()


def combined_rows(result: DispatchResult, pool, rank: int, width: int) -> torch.Tensor:
    """The (T, k, D') rows ``finish_combine`` sums, dropped pairs' rows zero (a new tensor)."""
    shape = result.shape
    rows = _combine_buffer(pool, rank, shape, width).own.view(shape.tokens, shape.topk, width)
    kept = (result.dst_index >= 0).view(shape.tokens, shape.topk, 1)
    return torch.where(kept, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


# --- The public ops -----------------------------------------------------------------------------------

_POOLS: dict[tuple, object] = {}


def _pool(group, device: torch.device):
    """The buffers of ``group`` on ``device``: ``LocalPool(1)`` without a group (or a group of one),
    else ``SymmetricPool``."""
    import torch.distributed as dist

    if group is None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        group = dist.group.WORLD
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
    routing = route(topk_idx, shape.experts)
    all_counts = pool.exchange_counts(routing.counts)
    bufs = _buffers(pool, rank, shape)
    lay = layout(routing, all_counts, rank, shape, bufs["high_water"].own)
    _send_and_land(x, lay, bufs, shape, pool, scaling_mode)
    result = finish_dispatch(lay, bufs, shape, rank)
    result.pool = pool
    return result


def run_combine(y: torch.Tensor, result: DispatchResult, topk_weights: torch.Tensor) -> torch.Tensor:
    """Combine on this rank: a barrier (every rank is done reading its combine buffer), the send,
    a barrier (every row landed), the weighted sum."""
    pool = result.pool
    pool.barrier()
    send_combine(y, result, pool, result.rank)
    pool.barrier()
    return finish_combine(result, topk_weights, pool, result.rank, y.shape[1])


def _grad_dispatch(rows: torch.Tensor, result: DispatchResult) -> torch.Tensor:
    """Per-pair rows (T, k, D') bf16 sent where the forward dispatch sent the pairs: (rows, D') with
    padding rows zero (a copy: the buffer is reused). The layout is the forward's."""
    pool, rank = result.pool, result.rank
    shape = replace(result.shape, hidden=rows.shape[-1], recipe="bf16")
    bufs = _buffers(pool, rank, shape, purpose="grad")
    start, end, sizes = result.padded_group_start_offsets, result.padded_group_end_offsets, result.group_sizes
    zero = _zero_rows(start, end, sizes, bufs["high_water"].own, shape.rows)
    lay = Layout(result.dst_index, start, end, sizes, zero)
    pool.barrier()  # every rank is done with these buffers' previous contents
    _send_and_land(rows, lay, bufs, shape, pool, "rceil")
    return bufs["q"].own.clone()


class _DispatchFn(torch.autograd.Function):
    """bf16 dispatch with autograd: the gradient of x is a combine of q's gradient, unit weights."""

    @staticmethod
    def forward(ctx, x, topk_idx, shape, pool, scaling_mode, holder):
        result = run_dispatch(x, topk_idx, shape, pool, scaling_mode)
        holder.append(result)
        ctx.result = result
        q = result.q.view_as(result.q)  # a fresh view per call: autograd history stays off the buffer
        if result.scales is not None:
            ctx.mark_non_differentiable(q)
        return q

    @staticmethod
    def backward(ctx, grad_q):
        result = ctx.result
        ones = torch.ones((result.shape.tokens, result.shape.topk), dtype=torch.float32, device=grad_q.device)
        grad_x = run_combine(grad_q.to(torch.bfloat16).contiguous(), result, ones)
        return grad_x, None, None, None, None, None


class _CombineFn(torch.autograd.Function):
    """Combine with autograd: y's gradient is a dispatch of ``grad_out[t] * w[t, j]`` per slot (fp32
    product rounded to bf16), the weights' ``sum_d grad_out[t, d] y[t, j, d]`` in fp32."""

    @staticmethod
    def forward(ctx, y, topk_weights, result):
        out = run_combine(y, result, topk_weights)
        ctx.result = result
        ctx.save_for_backward(topk_weights)
        ctx.pair_rows = None
        if ctx.needs_input_grad[1]:
            ctx.pair_rows = combined_rows(result, result.pool, result.rank, y.shape[1])
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (w,) = ctx.saved_tensors
        result = ctx.result
        g = grad_out.to(torch.float32)
        grad_y = grad_w = None
        if ctx.needs_input_grad[0]:
            per_pair = (g[:, None, :] * w.to(torch.float32)[:, :, None]).to(torch.bfloat16)
            grad_y = _grad_dispatch(per_pair, result)
        if ctx.pair_rows is not None:
            grad_w = (g[:, None, :] * ctx.pair_rows.to(torch.float32)).sum(-1).to(w.dtype)
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

    x (T, D) bf16 contiguous (T the same on every rank; mxfp8: D % 128 == 0), topk_idx (T, k)
    int32/int64 global expert ids in ``[0, num_experts)`` (others are dropped), ``num_experts`` E
    a multiple of the group size R (expert e lives on rank e // (E / R)). Returns a
    :class:`DispatchResult`: ``q`` (rows, D) with rows = ``R*T*k + E_local*alignment`` rounded up
    to ``alignment``, local expert j's rows ordered by (source rank, token, slot) and padded with
    zero rows to ``alignment``, rows past the last group zero; mxfp8: e4m3 and the blocked scales
    of the padded groups. No host sync (the first call on a group and shape allocates its buffers
    collectively, once). With ``group=None`` and no initialized multi-rank default group: R = 1.
    bf16: differentiable in x (the gradient is a combine with unit weights).
    """
    pool = _pool(group, x.device)
    checks.check_ep_dispatch(x, topk_idx, num_experts, pool.ranks, recipe, alignment)
    tokens, hidden = x.shape
    shape = EpShape(pool.ranks, tokens, hidden, topk_idx.shape[1], num_experts, alignment, recipe)
    if pool.ranks * shape.rows > _INT32_MAX:
        raise ValueError(
            f"dispatch: R * rows = {pool.ranks * shape.rows} does not fit the kernel's int32 row index"
        )
    holder: list[DispatchResult] = []
    q = _DispatchFn.apply(x, topk_idx, shape, pool, scaling_mode, holder)
    result = holder[0]
    result.q = q
    return result


def combine(y: torch.Tensor, dispatched: DispatchResult, topk_weights: torch.Tensor) -> torch.Tensor:
    """Bring the local experts' outputs y (rows, D') bf16 (in ``dispatched``'s layout) back to their
    source ranks: ``out[t] = sum_j topk_weights[t, j] * y[row of (t, j)]`` in fp32, (T, D') bf16
    (``reference.weighted_slot_sum``; a dropped pair adds nothing). Differentiable in y and the
    weights. No host sync."""
    shape = dispatched.shape
    checks.check_ep_combine(y, shape.rows, topk_weights, shape.tokens, shape.topk)
    return _CombineFn.apply(y.contiguous(), topk_weights, dispatched)


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
    routings = [route(t, num_experts) for t in topk_idxs]
    all_counts = torch.stack([r.counts for r in routings])
    bufs = [_buffers(pool, r, shape) for r in range(ranks)]
    lays = [layout(routings[r], all_counts, r, shape, bufs[r]["high_water"].own) for r in range(ranks)]
    for r in range(ranks):
        send_dispatch(xs[r], lays[r], bufs[r], shape, r, scaling_mode)
    for r in range(ranks):
        zero_padding(lays[r], bufs[r])
        _mark_filled(lays[r], bufs[r])
    results = [finish_dispatch(lays[r], bufs[r], shape, r) for r in range(ranks)]
    for result in results:
        result.pool = pool
    return results


def simulate_combine(ys: list, results: list[DispatchResult], topk_weights: list) -> list[torch.Tensor]:
    """``combine`` on every rank of a simulated group: every rank's send, then every rank's sum."""
    pool = results[0].pool
    for r, (y, result) in enumerate(zip(ys, results, strict=True)):
        send_combine(y, result, pool, r)
    width = ys[0].shape[1]
    return [
        finish_combine(res, w, pool, r, width)
        for r, (res, w) in enumerate(zip(results, topk_weights, strict=True))
    ]
