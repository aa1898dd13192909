"""TMA tile loads into a per-warp mbarrier ring (sm_90+; the same code gives ``UTMALDG`` on sm_90a and
sm_100a). Torch-free building blocks for streaming kernels in which every warp runs its own load
pipeline, with no CTA-wide barrier.

Host side (inside the ``@cute.jit`` launcher, where the TMA descriptor is encoded from the real
tensor at run time, so symbolic shapes work):

* :func:`make_row_tile_load` -> ``(atom, tma_x)``: a TMA load of ``(box_rows, box_cols)`` boxes of a
  row-major (rows, cols) tensor; pass both to the kernel.

Shared memory: the kernel's ``@cute.struct`` declares the rings of all its warps with
:func:`slots_field` (the boxes) and :func:`barriers_field` (one mbarrier per slot), so the struct's
size is the CTA's shared memory; the kernel allocates the struct once.

Kernel side, per warp (every lane calls each function; they elect the single thread they need):

* :func:`warp_ring` -> ``(slots, barriers)``: this warp's ``stages`` shared slots (one box each,
  row-major, no swizzle) and one mbarrier per slot, from the struct's two fields;
* :func:`partition_ring` -> ``(src, dst)``: the TMA views of the boxes and of the slots;
* :func:`ring_init`: initialise the barriers (arrival count 1: the issuing thread's arrive);
* :func:`ring_issue`: arm slot ``stage``'s barrier with the box's byte count and start the copy of
  box ``(box_row, box_col)`` into it;
* :func:`ring_wait`: wait until the slot's bytes have landed (phase parity of the slot's use);
* :func:`ring_release`: after the lanes have read a slot (generic proxy), make the reads complete
  before the next TMA write (async proxy) into it.

TMA stores from a per-warp staging ring (the lanes write a box with STS, one thread stores it):

* :func:`make_row_tile_store` (host) -> ``(atom, tma_y)``; :func:`warp_slots` for the slots (a
  :func:`slots_field` of the struct) and :func:`partition_ring` for the views, as for loads;
* :func:`store_slot_wait`: before the lanes overwrite a staging slot, wait until the store issued
  from it ``ahead`` stores ago has read it;
* :func:`store_issue`: after :func:`ring_release` (the lanes' STS made visible to the async proxy),
  store slot ``stage`` to box ``(box_row, box_col)`` (out-of-bounds parts are not written);
* :func:`store_drain`: before the CTA exits, wait until every store has read its slot.

Pipeline protocol (unit ``u`` = the ``u``-th box a warp loads; :func:`ring_stage` / :func:`ring_phase`)::

    ring_init(barriers, stages)
    for u in range(min(stages, units)): ring_issue(..., stage=u, box of unit u)
    for u in range(units):
        ring_wait(barriers, ring_stage(u, stages), ring_phase(u, stages))
        ... read slot ring_stage(u, stages) (LDS) ...
        ring_release()
        if u + stages < units: ring_issue(..., stage=ring_stage(u, stages), box of unit u + stages)

so ``stages - 1`` boxes are in flight while one is read. Out-of-bounds parts of a box (rows past the
tensor, columns past ``cols``) are written as zeros by the TMA unit, and the barrier still counts
the whole box's bytes, so the expected byte count is a constant.

Bank conflicts: lanes that read 16 contiguous bytes each, with 8 consecutive lanes covering a
128-byte run (a quarter-warp of ``LDS.128``), are conflict-free in the unswizzled row-major box.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass.cute.nvgpu import cpasync


def box_layout(box_rows: int, box_cols: int, stages: int | None = None) -> cute.Layout:
    """Row-major ``(box_rows, box_cols)`` shared layout of one box, or ``(box_rows, box_cols, stages)``
    for a ring of ``stages`` boxes stored one after the other."""
    if stages is None:
        return cute.make_layout((box_rows, box_cols), stride=(box_cols, 1))
    return cute.make_layout((box_rows, box_cols, stages), stride=(box_cols, 1, box_rows * box_cols))


def make_row_tile_load(x: cute.Tensor, box_rows: int, box_cols: int):
    """Host side: ``(atom, tma_x)`` for TMA loads of ``(box_rows, box_cols)`` boxes of ``x``.

    ``x``: a row-major (rows, cols) global tensor (rows and cols may be symbolic), 16-byte aligned,
    row stride a multiple of 16 bytes. ``box_cols * element bytes`` must be a multiple of 16 and each
    box dimension at most 256. A box's column coordinate (the innermost) must be a multiple of 16
    bytes too, or the load is an illegal instruction (notes/grouped-gemm-sm90.md); box-aligned
    coordinates are. ``atom`` is the copy atom and ``tma_x`` the coordinate tensor of x
    (shape (rows, cols)) that the kernel tiles with :func:`partition_ring`; both are kernel
    arguments (the descriptor is a ``__grid_constant__`` parameter)."""
    atom, tma_x = cpasync.make_tiled_tma_atom(
        cpasync.CopyBulkTensorTileG2SOp(), x, box_layout(box_rows, box_cols), (box_rows, box_cols)
    )
    return atom, tma_x


def make_row_tile_store(y: cute.Tensor, box_rows: int, box_cols: int):
    """Host side: ``(atom, tma_y)`` for TMA stores of ``(box_rows, box_cols)`` boxes into ``y``, a
    row-major (rows, cols) global tensor (same requirements as :func:`make_row_tile_load`); rows and
    columns of a box past the end of ``y`` are not written."""
    atom, tma_y = cpasync.make_tiled_tma_atom(
        cpasync.CopyBulkTensorTileS2GOp(), y, box_layout(box_rows, box_cols), (box_rows, box_cols)
    )
    return atom, tma_y


def box_bytes(dtype, box_rows: int, box_cols: int) -> int:
    """Bytes one box moves (the barrier's expected transaction count), a Python int."""
    return box_rows * box_cols * dtype.width // 8


def slots_field(dtype, box_rows: int, box_cols: int, stages: int, warps: int):
    """The ``@cute.struct`` field (128-byte aligned) of ``warps`` rings of ``stages`` boxes of
    ``(box_rows, box_cols)`` elements of ``dtype`` each, one ring after the other."""
    return cute.struct.Align[cute.struct.MemRange[dtype, box_rows * box_cols * stages * warps], 128]


def barriers_field(stages: int, warps: int):
    """The ``@cute.struct`` field (8-byte aligned) of the mbarriers of ``warps`` load rings of
    ``stages`` slots each."""
    return cute.struct.Align[cute.struct.MemRange[Int64, stages * warps], 8]


def warp_slots(memory, box_rows: int, box_cols: int, stages: int, warps: int, warp):
    """Warp ``warp``'s (box_rows, box_cols, stages) slots (:func:`box_layout`) of the allocated
    :func:`slots_field` ``memory`` (rings without barriers: TMA store staging)."""
    ring = memory.get_tensor(
        cute.make_layout(
            (box_rows, box_cols, stages, warps),
            stride=(box_cols, 1, box_rows * box_cols, stages * box_rows * box_cols),
        )
    )
    return ring[None, None, None, warp]


def warp_ring(slots, barriers, box_rows: int, box_cols: int, stages: int, warps: int, warp):
    """``(slots, barriers)`` of warp ``warp``'s load ring, from the allocated fields ``slots``
    (:func:`slots_field`) and ``barriers`` (:func:`barriers_field`).

    ``slots``: (box_rows, box_cols, stages) tensor (:func:`warp_slots`); ``barriers``: Int64 pointer
    to this warp's ``stages`` mbarriers (``barriers + s`` is slot s's)."""
    return warp_slots(slots, box_rows, box_cols, stages, warps, warp), barriers.data_ptr() + warp * stages


def partition_ring(atom, tma_x: cute.Tensor, slots: cute.Tensor, box_rows: int, box_cols: int):
    """``(boxes, stages)`` TMA views for ``atom`` (a load or a store): ``boxes[(None, box_row,
    box_col)]`` is box ``(box_row, box_col)`` of the global tensor behind ``tma_x`` (rows
    ``box_rows * box_row ...``, columns ``box_cols * box_col ...``; boxes past its end are zero-filled
    by loads and dropped by stores) and ``stages[(None, stage)]`` is slot ``stage`` of ``slots``."""
    tiles = cute.local_tile(tma_x, (box_rows, box_cols), (None, None))
    stages, boxes = cpasync.tma_partition(
        atom, 0, cute.make_layout(1), cute.group_modes(slots, 0, 2), cute.group_modes(tiles, 0, 2)
    )
    return boxes, stages


@cute.jit
def ring_init(barriers, stages: cutlass.Constexpr):
    """Initialise the warp's ``stages`` barriers (one elected lane; arrival count 1) and make the
    initialisation visible to the TMA unit and to the warp's lanes before any wait or issue."""
    with cute.arch.elect_one():
        for s in cutlass.range_constexpr(stages):
            cute.arch.mbarrier_init(barriers + s, 1)
    cute.arch.mbarrier_init_fence()
    cute.arch.sync_warp()


@cute.jit
def ring_issue(atom, src: cute.Tensor, dst: cute.Tensor, barriers, stage: Int32, box_row, box_col, nbytes):
    """Arm slot ``stage``'s barrier for ``nbytes`` (one elected lane: arrive + expect_tx) and start the
    TMA copy of box ``(box_row, box_col)`` into the slot. Called by all lanes of the warp, converged
    (the copy elects its own issuing thread). The slot must be free: never read since its last wait
    by this warp, or released with :func:`ring_release`."""
    bar = barriers + stage
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(bar, nbytes)
    cute.copy(atom, src[(None, box_row, box_col)], dst[(None, stage)], tma_bar_ptr=bar)


@cute.jit
def ring_wait(barriers, stage: Int32, phase: Int32):
    """Block until the copy into slot ``stage`` has landed; ``phase`` is the parity of the slot's
    use (:func:`ring_phase`). The completed wait makes the bytes visible to the waiting lane."""
    cute.arch.mbarrier_wait(barriers + stage, phase)


@cute.jit
def ring_release():
    """After the warp's lanes have read a slot through the generic proxy (LDS), order those reads
    before the next async-proxy (TMA) write into it: a proxy fence in every lane, then a warp sync
    so the issuing lane comes after all of them."""
    cute.arch.fence_view_async_shared()
    cute.arch.sync_warp()


@cute.jit
def ring_stage(unit: Int32, stages: cutlass.Constexpr) -> Int32:
    """Slot of pipeline unit ``unit``: ``unit % stages``."""
    return unit % stages


@cute.jit
def ring_phase(unit: Int32, stages: cutlass.Constexpr) -> Int32:
    """Barrier phase parity of unit ``unit``: ``(unit // stages) % 2`` (each use of a slot completes
    one phase of its barrier)."""
    return (unit // stages) % 2


@cute.jit
def store_slot_wait(ahead: cutlass.Constexpr):
    """Before the lanes write a staging slot: wait until at most ``ahead`` of this warp's stores are
    still reading shared memory (the store that last used the slot, ``ahead + 1`` stores ago, is
    done with it), then sync the warp. Every lane waits (only the issuing lane has groups)."""
    cute.arch.cp_async_bulk_wait_group(ahead, read=True)
    cute.arch.sync_warp()


@cute.jit
def store_issue(atom, src: cute.Tensor, dst: cute.Tensor, stage: Int32, box_row, box_col):
    """Store staging slot ``stage`` (``src[(None, stage)]``) to box ``(box_row, box_col)`` of the
    output (``dst[(None, box_row, box_col)]``) and commit it as one bulk group. Called by all lanes,
    converged, after :func:`ring_release` (the copy elects its own issuing thread)."""
    cute.copy(atom, src[(None, stage)], dst[(None, box_row, box_col)])
    cute.arch.cp_async_bulk_commit_group()


@cute.jit
def store_drain():
    """Wait until every store of this warp has read its staging slot (before the CTA exits and its
    shared memory is reused). The global writes complete on their own."""
    cute.arch.cp_async_bulk_wait_group(0, read=True)
