"""FP8 rowwise grouped GEMM for Hopper (sm_90a only: wgmma): ``GroupedGemmSm90Kernel``.

e4m3 operands, fp32 accumulation (wgmma ``QGMMA``), rowwise dequantization scales applied in fp32 in
the epilogue, bf16 out. Groups are ragged, given by int32 *end* offsets on the device (any sizes,
empty groups, no padding, no host sync; ends are clamped as in ``cute_utils.groups``). Two forms:

``"2d3d"`` (forward and dgrad), per group g with rows ``[start_g, end_g)``::

    y[m, n] = (sum_k a[m, k] * b[g, n, k]) * scale_a[m] * scale_b[g, n]

- ``a`` (M, K) e4m3 row-major (K contiguous); ``scale_a`` (M,) fp32;
- ``b`` (E, N, K) e4m3 row-major (K contiguous): the forward's ``quantize_fp8_3d(w, axis="K")`` q
  as stored (one ``nn.Linear`` weight per expert), or for the dgrad the storage of
  ``quantize_fp8_3d(w, axis="N")``'s q (strides (N K, 1, N) of (E, N, K)) viewed as (E, K, N)
  row-major, i.e. ``q.transpose(-2, -1)``; ``scale_b`` (E, N) fp32 row-major (per output column);
- ``y`` (M, N) bf16 row-major. Rows past the last end are not written.

``"2d2d"`` (wgrad, grouped along the reduction dim M)::

    out[g, n, k] = (sum_{m in group g} a[n, m] * b[k, m]) * scale_a[g N + n] * scale_b[g K + k]

- ``a`` (N, M) e4m3 row-major: grad_y's column operand (``quantize_fp8_2d(grad_y, axis="col",
  group_end_offsets=...)``'s q, (M, N) with strides (1, M)) passed as ``q.t()``; ``b`` (K, M) the
  same for x; ``scale_a`` (G N,), ``scale_b`` (G K,) fp32 group-major (SPEC section 7);
- ``out`` (E, N, K) bf16 row-major; an empty group's slice is zeros.

Design (notes/grouped-gemm-sm90.md): persistent CTAs (``ctas`` of them, a launch argument), one
producer warp (of a producer warpgroup) streams TMA boxes of A (128 rows) and B (``tile_n`` rows),
128 bytes of the reduction each, into a
``stages``-deep shared ring guarded by mbarriers (``cutlass.pipeline.PipelineTmaAsync``), and two
consumer warpgroups run wgmma on a (128, ``tile_n``) tile, 64 rows each; ``setmaxregister`` moves
registers from the producer to the consumers. With ``cluster=2`` (config) CTAs pair up: the two
tiles of a cluster share one operand's box (2d3d: A, the row block; 2d2d: B, the column block),
each CTA loads half of it and multicasts it to both, and a ring slot is refilled only once the
consumers of both CTAs released it. Ragged groups are handled by predicated tiles, with no
per-group tensor maps:

- 2d3d: each group's M-tiles start at the group's own first row (a 128-row TMA box may read rows of
  the next group, or zeros past M); they only feed output rows that the epilogue does not store
  (stores are predicated on ``row < end_g``). Tiles are numbered from a CTA-wide scan of the
  per-group tile counts (``cute_utils.groups.scan_group_sizes``, unit 128 rows) and mapped to
  (group, first row) by the group-tile scheduler (``cute_utils.group_tiles.group_tile``).
- 2d2d: a group's reduction boxes start at its first row rounded down to the config's
  ``reduction_align`` (128 by default; at least 16: a TMA box's innermost coordinate must be a
  multiple of 16 bytes, or the load is an illegal instruction); the first box then holds up to
  ``reduction_align - 1`` rows of the previous group and the last box rows of the next group.
  In those two slots only the wgmmas whose 32 reduction elements meet the group are issued, and
  the consumers zero, in the wgmmas that hold a bound, what lies outside the group (both operands,
  at the swizzled offsets of their logical coordinates, 64-bit words masked whole; then a proxy
  fence and a consumer barrier).

The epilogue scales in fp32 (``acc * scale_a * scale_b``, in that order), converts to bf16 and
writes the tile into a 128-byte swizzled staging tile (``stmatrix``). A tile whole in its rows
(every 2d2d tile; a 2d3d tile that ends at or before its group's end) goes out as (128, 64) TMA
store boxes, which the next tile's mainloop overlaps; a 2d3d tile cut by its group's end goes out
as 16-byte row vectors predicated on the row. The output's rows must be multiples of 16 bytes
(N % 8 for 2d3d, K % 8 for 2d2d).
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float8E4M3FN, Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.utils import LayoutEnum

from cute_utils.group_tiles import group_tile
from cute_utils.groups import group_bounds, scan_group_sizes, search_steps

from .base import Kernel

FORMS = ("2d3d", "2d2d")
TILE_M = 128  # rows of a CTA tile: two consumer warpgroups of 64 rows
TILE_K = 128  # reduction elements per stage: one 128-byte swizzle atom of e4m3
MMA_K = 32  # reduction elements of one e4m3 wgmma
MAX_GROUPS = 256  # groups the 2d3d tile scan holds in shared memory
WARPGROUP = 128
CONSUMER_WARPGROUPS = 2
THREADS = WARPGROUP * (1 + CONSUMER_WARPGROUPS)
CONSUMER_THREADS = WARPGROUP * CONSUMER_WARPGROUPS
_MASK_BARRIER = 1  # named barrier of the consumer threads (0 is the CTA barrier)
_CHUNK = 16  # bytes the 128-byte swizzle moves as one unit: a row's 16-byte chunks stay contiguous
_EPILOGUE_BARRIER = 2  # named barrier of the consumer threads around the epilogue's staging tile
VECTOR = 8  # bf16 outputs per 16-byte store; the output's row length must be a multiple of it
EPI_N = 64  # output columns per TMA store box: one 128-byte swizzled row of bf16
_STORE_THREADS = 32  # the consumer threads of the one warp that issues the TMA stores (the first)


@dataclass(frozen=True)
class GroupedGemmConfig:
    """``tile_n`` output columns per CTA tile (64, 128, 192 or 256: whole store boxes), ``stages``
    of the shared A/B ring, register caps of the producer and consumer warpgroups (``setmaxregister``), and
    ``reduction_align``: 2d2d boxes of group g start at its first row rounded down to this (16, 32,
    64 or 128; TMA needs 16 bytes), the rows before the group's start masked in the first box.
    ``cluster``: CTAs per cluster (1 or 2). With 2, the two CTAs of a cluster take neighbouring
    tiles that read the same box of one operand (2d2d: output row blocks 2p and 2p + 1, sharing
    B; 2d3d: column blocks 2p and 2p + 1, sharing A), and each loads half of that box and
    multicasts it to both: half of that box's bytes fewer read from L2 a slot (at tile_n = 256, a
    third of the slot's bytes for 2d2d, a sixth for 2d3d). Both CTAs derive the same work units,
    hence the same group and k-tiles: each CTA's full barrier waits for the other's half of every
    slot, so a per-tile reduction range that differed between them would hang."""

    tile_n: int = 256
    stages: int = 3
    producer_registers: int = 40
    consumer_registers: int = 232
    reduction_align: int = 128
    cluster: int = 1

    def __post_init__(self) -> None:
        if self.tile_n % EPI_N or not EPI_N <= self.tile_n <= 256:
            raise ValueError(f"tile_n={self.tile_n} must be a multiple of {EPI_N} in [{EPI_N}, 256]")
        if not 2 <= self.stages <= 12:
            raise ValueError(f"stages={self.stages} must be in [2, 12]")
        if self.reduction_align not in (16, 32, 64, 128):
            raise ValueError(f"reduction_align={self.reduction_align} must be 16, 32, 64 or 128")
        if self.cluster not in (1, 2):
            raise ValueError(f"cluster={self.cluster} must be 1 or 2")
        total = WARPGROUP * self.producer_registers + CONSUMER_THREADS * self.consumer_registers
        if total > 65536 or self.producer_registers % 8 or self.consumer_registers % 8:
            raise ValueError("register caps must be multiples of 8 and fit 65536 registers per CTA")

    def launch_registers(self) -> int:
        """Registers per thread the compiled kernel must hold at launch for the consumers'
        ``setmaxregister`` increase to be granted: it waits until the CTA's pool (THREADS x the
        compiled count) covers both caps, so a build that needs fewer registers (a narrow tile)
        would hang there. A build below this count must not be launched."""
        total = WARPGROUP * self.producer_registers + CONSUMER_THREADS * self.consumer_registers
        return -(-total // THREADS)


@dataclass(frozen=True)
class GroupedGemmVariant:
    """``form``: ``"2d3d"`` (forward / dgrad: groups of rows of A, one B per group) or ``"2d2d"``
    (wgrad: groups along the reduction dim, one output per group)."""

    form: str = "2d3d"

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"form={self.form!r} not in {FORMS}")


def _stage_bytes(config: GroupedGemmConfig) -> tuple[int, int]:
    """Bytes of one A box and one B box of the ring."""
    return TILE_M * TILE_K, config.tile_n * TILE_K


def _shared_storage(config: GroupedGemmConfig):
    """The kernel's shared memory: ring barriers (full, empty), the 2d3d tile scan's arrays, the
    tile's fp32 scales (``_fetch_scales``), then the 1024-byte aligned A and B rings (128-byte
    swizzled boxes) and the epilogue's staging tile (bf16, :func:`_staging_layouts`)."""
    a_bytes, b_bytes = _stage_bytes(config)
    stages = config.stages

    @cute.struct
    class SharedStorage:
        ring_barriers: cute.struct.MemRange[Int64, 2 * stages]
        prefix: cute.struct.MemRange[Int32, MAX_GROUPS + 1]
        ends: cute.struct.MemRange[Int32, MAX_GROUPS + 1]
        warp_totals: cute.struct.MemRange[Int32, THREADS // 32]
        tile_scales: cute.struct.MemRange[Float32, TILE_M + config.tile_n]
        ring_a: cute.struct.Align[cute.struct.MemRange[Float8E4M3FN, a_bytes * stages], 1024]
        ring_b: cute.struct.Align[cute.struct.MemRange[Float8E4M3FN, b_bytes * stages], 1024]
        staging: cute.struct.Align[cute.struct.MemRange[BFloat16, TILE_M * config.tile_n], 1024]

    return SharedStorage


def _staging_layouts(tile_n: int):
    """The epilogue's staging tile, two views of the same bytes: ``(tile, boxes)``, ``tile`` the
    (TILE_M, tile_n) output tile and ``boxes`` its (TILE_M, EPI_N, tile_n // EPI_N) TMA store boxes,
    one after the other. Rows of a box are 128 bytes, 128-byte swizzled (16-byte chunk ``c`` of row
    ``r`` at chunk ``c XOR r % 8``): the ``stmatrix`` writes hit 32 banks and TMA reads the same
    swizzle. Call inside a ``@cute.jit`` function."""
    tile = sm90_utils.make_smem_layout_epi(BFloat16, LayoutEnum.ROW_MAJOR, (TILE_M, tile_n), 1)
    boxes = sm90_utils.make_smem_layout_epi(BFloat16, LayoutEnum.ROW_MAJOR, (TILE_M, EPI_N), tile_n // EPI_N)
    return cute.slice_(tile, (None, None, 0)), boxes


@dataclass
class _Work:
    """One output tile: group ``g``; A box rows from ``a_row``, B box rows from ``b_row``, the
    reduction from ``red0`` (2d2d: a multiple of ``reduction_align``) over ``k_tiles`` boxes, whose
    valid elements start at ``head`` in the first box and end at ``tail`` in the last; output rows
    ``[row0, row_end)`` and columns from ``col0``."""

    g: Int32
    a_row: Int32
    b_row: Int32
    red0: Int32
    k_tiles: Int32
    head: Int32
    tail: Int32
    row0: Int32
    row_end: Int32
    col0: Int32


class GroupedGemmSm90Kernel(Kernel):
    """The grouped GEMM of the module docstring for one :class:`GroupedGemmVariant` and
    :class:`GroupedGemmConfig`.

    Launch: ``kernel(a, b, scale_a, scale_b, offsets, out, ctas)`` with the operands of the
    variant's form (module docstring); ``offsets`` int32 (E,) group end offsets; ``ctas`` the
    persistent grid, rounded down to whole clusters: the CTAs resident at once (the SM count, or
    with clusters ``torch_bindings.backend.resident_ctas``).
    """

    name = "grouped_gemm_sm90"
    #: wgmma exists on sm_90a only; the SASS tool and tests build these targets for it alone.
    archs = ("sm_90a",)

    def __init__(self, variant: GroupedGemmVariant, config: GroupedGemmConfig) -> None:
        super().__init__(variant, config)
        self.form = variant.form
        self.tile_n = config.tile_n
        self.stages = config.stages
        self.reduction_align = config.reduction_align

    @classmethod
    def variants(cls) -> list[GroupedGemmVariant]:
        return [GroupedGemmVariant(form) for form in FORMS]

    @classmethod
    def target_name(cls, variant: GroupedGemmVariant) -> str:
        return f"grouped_gemm_sm90_{variant.form}"

    @classmethod
    def shared_bytes(cls, variant: GroupedGemmVariant, config: GroupedGemmConfig) -> int:
        return _shared_storage(config).size_in_bytes()

    @classmethod
    def fake_arguments(cls, variant: GroupedGemmVariant) -> tuple:
        """Fakes with symbolic sizes: M (tokens) and E (groups) symbolic, shared by the tensors that
        must agree; the reduction dim of the TMA-loaded operands is a multiple of 16 (16-byte row
        strides), the output's row length a multiple of :data:`VECTOR` (16-byte stores). E is
        symbolic (not a variant field): one compile serves every expert count up to
        :data:`MAX_GROUPS`."""
        m, e = cute.sym_int(), cute.sym_int()
        n, k = cute.sym_int(divisibility=VECTOR), cute.sym_int(divisibility=16)

        def fake(dtype, shape):
            order = tuple(range(len(shape) - 1, -1, -1))
            return cute.runtime.make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=16)

        offsets = fake(Int32, (e,))
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        if variant.form == "2d3d":
            a, b = fake(Float8E4M3FN, (m, k)), fake(Float8E4M3FN, (e, n, k))
            scale_a, scale_b, out = fake(Float32, (m,)), fake(Float32, (e, n)), fake(BFloat16, (m, n))
        else:
            m = cute.sym_int(divisibility=16)
            n, k = cute.sym_int(), cute.sym_int(divisibility=VECTOR)
            a, b = fake(Float8E4M3FN, (n, m)), fake(Float8E4M3FN, (k, m))
            scale_a, scale_b = fake(Float32, (cute.sym_int(),)), fake(Float32, (cute.sym_int(),))
            out = fake(BFloat16, (e, n, k))
        return a, b, scale_a, scale_b, offsets, out, Int32(1), stream

    @staticmethod
    def can_implement(form: str, m: int, n: int, k: int, groups: int) -> bool:
        """Whether the kernel takes these sizes: 1 to :data:`MAX_GROUPS` groups; the TMA-loaded
        operands' row strides a multiple of 16 bytes (K for 2d3d, M for 2d2d); the output's rows
        a multiple of 16 bytes (N for 2d3d, K for 2d2d: 16-byte stores); 2d3d: K > 0 (an empty
        reduction has no TMA box to load). Problems with an empty output or (2d2d) M = 0 are taken
        but launch nothing (``torch_bindings.grouped_gemm_sm90``)."""
        if form not in FORMS or not 1 <= groups <= MAX_GROUPS or min(m, n, k) < 0:
            return False
        if form == "2d3d":
            return k > 0 and k % 16 == 0 and n % VECTOR == 0
        return m % 16 == 0 and k % VECTOR == 0

    # ---- host ----------------------------------------------------------------------------------

    def _layouts(self):
        """(tiled MMA, A ring layout, B ring layout): K-major e4m3 operands, 128-byte swizzle."""
        tiler = (TILE_M, self.tile_n, TILE_K)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            Float8E4M3FN,
            Float8E4M3FN,
            cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.K,
            Float32,
            (CONSUMER_WARPGROUPS, 1, 1),
            (TILE_M // CONSUMER_WARPGROUPS, self.tile_n),
        )
        ring_a = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tiler, Float8E4M3FN, self.stages)
        ring_b = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tiler, Float8E4M3FN, self.stages)
        for ring in (ring_a, ring_b):  # _zero_chunk: the swizzle keeps 16-byte chunks contiguous
            assert (1 << ring.inner.num_base) % _CHUNK == 0, ring.inner
        return tiled_mma, ring_a, ring_b

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        scale_a: cute.Tensor,
        scale_b: cute.Tensor,
        offsets: cute.Tensor,
        out: cute.Tensor,
        ctas: Int32,
        stream,
    ):
        tiled_mma, ring_a, ring_b = self._layouts()
        staging_tile, staging_boxes = _staging_layouts(self.tile_n)
        if cutlass.const_expr(self.form == "2d3d"):
            b = cute.make_tensor(b.iterator, cute.select(b.layout, mode=[1, 2, 0]))  # (N, K, E)
            out_boxes = out
        else:
            out_boxes = cute.make_tensor(out.iterator, cute.select(out.layout, mode=[1, 2, 0]))  # (N, K, E)
        box_a = cute.slice_(ring_a, (None, None, 0))
        box_b = cute.slice_(ring_b, (None, None, 0))
        split_a, split_b = self._box_splits()
        atom_a, tma_a = _load_atom(a, box_a, (TILE_M, TILE_K), split_a)
        atom_b, tma_b = _load_atom(b, box_b, (self.tile_n, TILE_K), split_b)
        box_out = cute.slice_(staging_boxes, (None, None, 0))
        store = cpasync.CopyBulkTensorTileS2GOp()
        atom_out, tma_out = cpasync.make_tiled_tma_atom(store, out_boxes, box_out, (TILE_M, EPI_N))
        args = (atom_a, tma_a, atom_b, tma_b, scale_a, scale_b, offsets, out, atom_out, tma_out, tiled_mma,
                ring_a, ring_b, staging_tile, staging_boxes)  # fmt: skip
        cluster = self.config.cluster
        launch = {"cluster": (cluster, 1, 1)} if cluster > 1 else {}
        self.kernel(*args).launch(
            grid=(ctas - ctas % cluster, 1, 1),
            block=(THREADS, 1, 1),
            smem=_shared_storage(self.config).size_in_bytes(),
            stream=stream,
            **launch,
        )

    def _box_splits(self) -> tuple[int, int]:
        """(CTAs sharing an A box, CTAs sharing a B box): with config ``cluster`` = 2, 2d3d pairs
        column blocks of one row block (the same A box), 2d2d row blocks of one group and column
        block (the same B box); each of the sharing CTAs loads its slice and multicasts it."""
        cluster = self.config.cluster
        return (cluster, 1) if self.form == "2d3d" else (1, cluster)

    # ---- device --------------------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        atom_a: cute.CopyAtom,
        tma_a: cute.Tensor,
        atom_b: cute.CopyAtom,
        tma_b: cute.Tensor,
        scale_a: cute.Tensor,
        scale_b: cute.Tensor,
        offsets: cute.Tensor,
        out: cute.Tensor,
        atom_out: cute.CopyAtom,
        tma_out: cute.Tensor,
        tiled_mma: cute.TiledMma,
        ring_a_layout: cute.ComposedLayout,
        ring_b_layout: cute.ComposedLayout,
        staging_tile: cute.ComposedLayout,
        staging_boxes: cute.ComposedLayout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(atom_a)
            cpasync.prefetch_descriptor(atom_b)
            cpasync.prefetch_descriptor(atom_out)
        storage = SmemAllocator().allocate(_shared_storage(self.config))
        ring = self._make_pipeline(storage.ring_barriers.data_ptr())
        cluster = self.config.cluster
        rank = Int32(0)
        if cutlass.const_expr(cluster > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            pipeline.pipeline_init_arrive(cluster_shape_mn=(cluster, 1), is_relaxed=True)
        ring_a = storage.ring_a.get_tensor(ring_a_layout.outer, swizzle=ring_a_layout.inner)
        ring_b = storage.ring_b.get_tensor(ring_b_layout.outer, swizzle=ring_b_layout.inner)
        prefix = storage.prefix.get_tensor(cute.make_layout(MAX_GROUPS + 1))
        ends = storage.ends.get_tensor(cute.make_layout(MAX_GROUPS + 1))
        num_groups = offsets.shape[0]
        total_units = self._scan_tiles(storage, offsets, num_groups, out, prefix, ends, tidx)
        extents = self._extents(tma_a, tma_b)
        if cutlass.const_expr(cluster > 1):
            pipeline.pipeline_init_wait(cluster_shape_mn=(cluster, 1))
        if warp < WARPGROUP // 32:
            cute.arch.setmaxregister_decrease(self.config.producer_registers)
            if warp == 0:
                self._produce(atom_a, tma_a, atom_b, tma_b, ring, ring_a, ring_b, offsets, prefix, ends,
                              total_units, extents, rank)  # fmt: skip
        else:
            cute.arch.setmaxregister_increase(self.config.consumer_registers)
            raw = _RawRings(storage, ring_a_layout, ring_b_layout, self.config)
            ctid = tidx - WARPGROUP
            epilogue = _Staging(storage, staging_tile, staging_boxes, tiled_mma, ctid, atom_out, tma_out, out)
            self._consume(tiled_mma, ring, ring_a, ring_b, raw, epilogue, scale_a, scale_b, offsets, prefix,
                          ends, total_units, extents, rank, ctid)  # fmt: skip

    def _make_pipeline(self, barriers):
        """The A/B ring's full/empty barriers: one TMA producer thread; one arrive per consumer warp
        and CTA of the cluster (a slot is refilled by both CTAs' multicasts, so each consumer warp
        releases it in both). A cluster's barriers are made visible to the other CTA by the
        caller (``pipeline_init_arrive`` / ``pipeline_init_wait``)."""
        a_bytes, b_bytes = _stage_bytes(self.config)
        cluster = self.config.cluster
        ctas = (1, cluster, 1, 1) if self.form == "2d2d" else (1, 1, cluster, 1)  # (v, m, n, l)
        return pipeline.PipelineTmaAsync.create(
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_THREADS // 32 * cluster),
            tx_count=a_bytes + b_bytes,
            barrier_storage=barriers,
            cta_layout_vmnk=cute.make_layout(ctas),
            defer_sync=cluster > 1,
        )

    @cute.jit
    def _scan_tiles(self, storage, offsets, num_groups, out, prefix, ends, tidx) -> Int32:
        """Work units of the problem, one a cluster (every thread calls it): a unit is ``cluster``
        neighbouring output tiles (:meth:`_work`). 2d3d: the CTA-wide scan of the groups' 128-row
        tile counts into ``prefix`` / ``ends`` (ends with a CTA barrier), times the N units; 2d2d:
        E x (N units) x (K tiles)."""
        total = Int32(0)
        cluster = self.config.cluster
        if cutlass.const_expr(self.form == "2d3d"):
            rows, cols = out.shape
            warp_totals = storage.warp_totals.get_tensor(cute.make_layout(THREADS // 32))
            scan_group_sizes(offsets, num_groups, rows, TILE_M, prefix, warp_totals, tidx, THREADS, ends)
            total = prefix[num_groups] * cute.ceil_div(cute.ceil_div(cols, self.tile_n), cluster)
        else:
            _, rows, cols = out.shape
            total = (
                num_groups
                * cute.ceil_div(cute.ceil_div(rows, TILE_M), cluster)
                * cute.ceil_div(cols, self.tile_n)
            )
        return total

    @cute.jit
    def _work(
        self,
        unit: Int32,
        rank: Int32,
        offsets,
        prefix,
        ends,
        reduction: Int32,
        out_rows: Int32,
        out_cols: Int32,
    ):
        """The :class:`_Work` of the output tile of CTA ``rank`` of its cluster in work unit ``unit``;
        ``reduction`` is K (2d3d) or M (2d2d). A unit's tiles are neighbours that share a box of
        the shared operand (:meth:`_box_splits`); a tile past the output (an odd count of
        blocks) still loads its half of that box, and stores nothing."""
        cluster = self.config.cluster
        n_tiles = cute.ceil_div(out_cols, self.tile_n)
        if cutlass.const_expr(self.form == "2d3d"):
            n_units = cute.ceil_div(n_tiles, cluster)
            row_block, n_block = unit // n_units, unit % n_units * cluster + rank
            steps = search_steps(MAX_GROUPS)
            g, row0, end = group_tile(prefix, ends, offsets.shape[0], row_block, TILE_M, steps)
            k_tiles = cute.ceil_div(reduction, TILE_K)
            work = _Work(g, row0, n_block * self.tile_n, Int32(0), k_tiles, Int32(0), Int32(TILE_K), row0,
                         end, n_block * self.tile_n)  # fmt: skip
        else:
            m_units = cute.ceil_div(cute.ceil_div(out_rows, TILE_M), cluster)
            g, rest = unit // (m_units * n_tiles), unit % (m_units * n_tiles)
            m_block, n_block = rest // n_tiles * cluster + rank, rest % n_tiles
            start, end = group_bounds(offsets, g, reduction)
            red0 = start - start % self.reduction_align  # TMA: a box's innermost coordinate: 16 bytes
            k_tiles = Int32(0)
            if end > start:
                k_tiles = cute.ceil_div(end - red0, TILE_K)
            tail = end - red0 - (k_tiles - 1) * TILE_K
            work = _Work(g, m_block * TILE_M, n_block * self.tile_n, red0, k_tiles, start - red0, tail,
                         m_block * TILE_M, out_rows, n_block * self.tile_n)  # fmt: skip
        return work

    def _extents(self, tma_a: cute.Tensor, tma_b: cute.Tensor):
        """(reduction length, output rows, output columns) from the operands' coordinate tensors:
        a is (rows, reduction) in both forms, b (columns, reduction[, E])."""
        return tma_a.shape[1], tma_a.shape[0], tma_b.shape[0]

    @cute.jit
    def _produce(
        self, atom_a, tma_a, atom_b, tma_b, ring, ring_a, ring_b, offsets, prefix, ends, total_units, extents,
        rank: Int32,
    ):  # fmt: skip
        """The producer warp: for each of this CTA's tiles, TMA the A and B boxes of its reduction
        into the ring (a slot is taken once the consumers released it; a shared operand's half box
        is multicast to both CTAs of the cluster)."""
        reduction, rows, cols = extents
        split_a, split_b = self._box_splits()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        unit, step = _first_unit(self.config.cluster)
        while unit < total_units:
            work = self._work(unit, rank, offsets, prefix, ends, reduction, rows, cols)
            src_a, dst_a = _tma_boxes(atom_a, tma_a, ring_a, work.a_row, work.red0, TILE_M, rank, split_a)
            coords_b = tma_b
            if cutlass.const_expr(self.form == "2d3d"):
                coords_b = tma_b[None, None, work.g]
            src_b, dst_b = _tma_boxes(
                atom_b, coords_b, ring_b, work.b_row, work.red0, self.tile_n, rank, split_b
            )
            for kt in cutlass.range(work.k_tiles, unroll=1):
                ring.producer_acquire(state)
                barrier = ring.producer_get_barrier(state)
                _load(atom_a, src_a[(None, kt)], dst_a[(None, state.index)], barrier, split_a)
                _load(atom_b, src_b[(None, kt)], dst_b[(None, state.index)], barrier, split_b)
                ring.producer_commit(state)
                state.advance()
            unit += step
        ring.producer_tail(state)

    @cute.jit
    def _consume(
        self, tiled_mma, ring, ring_a, ring_b, raw, epilogue, scale_a, scale_b, offsets, prefix, ends,
        total_units, extents, rank: Int32, ctid: Int32,
    ):  # fmt: skip
        """The consumer warpgroups (``ctid``: thread index among them): per tile, the wgmma mainloop
        over the ring, then the scaled bf16 epilogue through the shared staging tile (``epilogue``,
        a :class:`_Staging`)."""
        thr_mma = tiled_mma.get_slice(ctid)
        frag_a = tiled_mma.make_fragment_A(thr_mma.partition_A(ring_a))
        frag_b = tiled_mma.make_fragment_B(thr_mma.partition_B(ring_b))
        coords = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, self.tile_n)))
        acc = cute.make_rmem_tensor(tiled_mma.partition_shape_C((TILE_M, self.tile_n)), Float32)
        reduction, rows, cols = extents
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        unit, step = _first_unit(self.config.cluster)
        while unit < total_units:
            work = self._work(unit, rank, offsets, prefix, ends, reduction, rows, cols)
            fetched = self._fetch_scales(scale_a, scale_b, work, cols, ctid)
            read, release = self._mainloop(tiled_mma, ring, acc, frag_a, frag_b, raw, work, read, release,
                                           ctid)  # fmt: skip
            self._epilogue(acc, coords, fetched, epilogue, work, cols, ctid)
            unit += step
        if ctid < _STORE_THREADS:  # the staging tile is read by the last stores before the CTA exits
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _mainloop(self, tiled_mma, ring, acc, frag_a, frag_b, raw, work: _Work, read, release, ctid):
        """acc = the tile's reduction: per ring slot, wait for its bytes, issue its wgmmas and release
        the slot before (one wgmma group stays in flight). 2d2d: in a group's first and last slot,
        only the wgmmas whose 32 reduction elements meet the group's ``[lo, hi)`` are issued, and
        the rows of those outside it (of the previous or the next group) are zeroed first. Returns
        the advanced (read, release) pipeline states."""
        acc.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        k_blocks = cute.size(frag_a, mode=[2])
        assert k_blocks * MMA_K == TILE_K, "the edge slots' block tests assume MMA_K elements a wgmma"
        for kt in cutlass.range(work.k_tiles, unroll=1):
            ring.consumer_wait(read)
            lo, hi = Int32(0), Int32(TILE_K)
            if cutlass.const_expr(self.form == "2d2d"):
                if kt == 0:
                    lo = work.head
                if kt == work.k_tiles - 1:
                    hi = work.tail
            if lo > 0 or hi < TILE_K:  # 2d2d only: a slot cut by its group's bounds
                self._zero_outside(raw, read.index, lo, hi, ctid)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(k_blocks):
                    if kb * MMA_K < hi and kb * MMA_K + MMA_K > lo:
                        slot = (None, None, kb, read.index)
                        cute.gemm(tiled_mma, acc, frag_a[slot], frag_b[slot], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
            else:  # straight-line wgmmas (a branch around each costs a fence before it)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(k_blocks):
                    slot = (None, None, kb, read.index)
                    cute.gemm(tiled_mma, acc, frag_a[slot], frag_b[slot], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
            if kt > 0:
                ring.consumer_release(release)
                release.advance()
            read.advance()
        warpgroup.wait_group(0)
        if work.k_tiles > 0:
            ring.consumer_release(release)
            release.advance()
        return read, release

    @cute.jit
    def _zero_outside(self, raw, stage: Int32, lo: Int32, hi: Int32, ctid: Int32):
        """2d2d: zero the reduction elements outside ``[lo, hi)`` (rows of the previous or the next
        group, or TMA zeros past M) in the 32-element blocks of slot ``stage`` that ``_mainloop``
        issues and that hold ``lo`` or ``hi`` (blocks wholly outside are not issued, blocks wholly
        inside need nothing), in every row of both rings. The work is (row, 16-byte chunk) items of
        those blocks; then the writes are made visible to wgmma (async proxy) and every consumer
        thread waits for the others."""
        per_block = MMA_K // _CHUNK
        head_block, tail_block = lo // MMA_K, (hi - 1) // MMA_K
        blocks, first_block = Int32(0), tail_block
        if lo > 0:
            blocks, first_block = Int32(1), head_block
        if hi < TILE_K and not (lo > 0 and tail_block == head_block):
            blocks += 1
        per_row = per_block * blocks
        for item in cutlass.range(ctid, (TILE_M + self.tile_n) * per_row, CONSUMER_THREADS, unroll=1):
            row, j = item // per_row, item % per_row
            block = first_block
            if j >= per_block:
                block = tail_block
            chunk = block * per_block + j % per_block
            if row < TILE_M:
                _zero_chunk(raw.words_a, raw.layout_a, row, chunk, stage, lo, hi)
            else:
                _zero_chunk(raw.words_b, raw.layout_b, row - TILE_M, chunk, stage, lo, hi)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=_MASK_BARRIER, number_of_threads=CONSUMER_THREADS)

    @cute.jit
    def _epilogue(self, acc, coords, fetched, epilogue, work: _Work, cols: Int32, ctid: Int32):
        """Store ``bf16(acc * scale_a * scale_b)`` for the tile's elements inside the output: rows
        below ``work.row_end`` (2d3d: the group's end), columns below ``cols``. The consumer threads
        write the values into the staging tile (``stmatrix``); a tile whole in its rows (every 2d2d
        tile, a 2d3d tile that ends at or before its group's end) goes out as TMA store boxes issued
        by the first consumer warp, which the next tile's mainloop overlaps; a 2d3d tile cut by its
        group's end goes out as 16-byte row vectors predicated on the row. 2d2d: an empty group's
        tile is zeros whatever its scales hold. ``fetched``: this thread's share of the tile's scales
        (:meth:`_fetch_scales`), stored into ``epilogue.scales`` before the first barrier (the last
        tile's reads of it ended before the last barrier)."""
        entries, tile_scales = TILE_M + self.tile_n, epilogue.scales
        if ctid < entries:
            tile_scales[ctid] = fetched[0]
        if ctid + CONSUMER_THREADS < entries:
            tile_scales[ctid + CONSUMER_THREADS] = fetched[1]
        if ctid < _STORE_THREADS:  # the previous tile's store boxes have been read out of staging
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.barrier(barrier_id=_EPILOGUE_BARRIER, number_of_threads=CONSUMER_THREADS)
        self._scale(acc, coords, tile_scales, work)
        scaled = epilogue.acc_view(acc)
        values = cute.make_rmem_tensor(epilogue.r2s_src_shape, Float32)
        for i in cutlass.range_constexpr(cute.size(values)):
            values[i] = scaled[i]
        packed = cute.make_rmem_tensor(epilogue.r2s_src_shape, BFloat16)
        packed.store(values.load().to(BFloat16))
        cute.copy(epilogue.r2s, packed, epilogue.r2s_dst)
        cute.arch.fence_view_async_shared()  # the stmatrix writes, visible to the TMA store's reads
        cute.arch.barrier(barrier_id=_EPILOGUE_BARRIER, number_of_threads=CONSUMER_THREADS)
        whole = True
        if cutlass.const_expr(self.form == "2d3d"):
            whole = work.row0 + TILE_M <= work.row_end
        if whole:
            if ctid < _STORE_THREADS:
                self._store_boxes(epilogue, work, cols)
        else:
            self._store_vectors(epilogue, work, cols, ctid)

    @cute.jit
    def _store_boxes(self, epilogue, work: _Work, cols: Int32):
        """TMA-store the staged tile's (TILE_M, EPI_N) boxes that start inside the output (parts past
        its rows or columns are not written) and commit them as one bulk group. One warp calls it."""
        target = epilogue.tma_out
        if cutlass.const_expr(self.form == "2d2d"):
            target = epilogue.tma_out[None, None, work.g]
        corner = cute.domain_offset((work.row0, work.col0), target)
        boxes = cute.local_tile(corner, (TILE_M, EPI_N), (0, None))
        src, dst = cpasync.tma_partition(
            epilogue.atom_out, 0, cute.make_layout(1), cute.group_modes(epilogue.boxes, 0, 2),
            cute.group_modes(boxes, 0, 2),
        )  # fmt: skip
        for s in cutlass.range_constexpr(self.tile_n // EPI_N):
            if work.col0 + s * EPI_N < cols:
                cute.copy(epilogue.atom_out, src[(None, s)], dst[(None, s)])
        cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def _store_vectors(self, epilogue, work: _Work, cols: Int32, ctid: Int32):
        """2d3d, a tile cut by its group's end: each consumer thread copies 16-byte row vectors of
        the staged tile (at their swizzled offsets) to the output, eight threads per 128-byte line
        of a row, each predicated on its row (below ``work.row_end``) and its columns (below
        ``cols``, a multiple of :data:`VECTOR`)."""
        if cutlass.const_expr(self.form == "2d3d"):
            per_row = self.tile_n // VECTOR
            out_vectors = _vector_view(epilogue.out)
            for it in cutlass.range_constexpr(TILE_M * per_row // CONSUMER_THREADS):
                item = it * CONSUMER_THREADS + ctid
                r, v = item // per_row, item % per_row
                row, first = work.row0 + r, work.col0 + v * VECTOR
                if row < work.row_end and first < cols:
                    vector = cute.make_rmem_tensor(cute.make_layout(VECTOR), BFloat16)
                    chunk = staged_byte(epilogue.tile_layout, r, v * VECTOR) // _CHUNK
                    cute.autovec_copy(epilogue.chunks[chunk, None], vector)
                    cute.autovec_copy(vector, out_vectors[row, first // VECTOR, None])

    @cute.jit
    def _fetch_scales(self, scale_a, scale_b, work: _Work, cols: Int32, ctid: Int32) -> tuple:
        """This consumer thread's share of the tile's scales, loaded at the tile's start so that the
        loads complete under the mainloop: entry ``e`` of the tile's (TILE_M + tile_n) scales is
        the row scale of output row ``row0 + e`` for ``e < TILE_M``, else the column scale of
        column ``col0 + e - TILE_M`` (the group's, in both forms); this thread holds entries
        ``ctid`` and ``ctid + CONSUMER_THREADS`` (a column scale; unused past the entries). Indices
        past the output read the last row's / column's scale (those elements are never stored), so
        every load is in bounds."""
        group_scale_a, group_scale_b = scale_a, scale_b
        if cutlass.const_expr(self.form == "2d3d"):
            group_scale_b = scale_b[work.g, None]
        else:
            group_scale_a = cute.domain_offset((work.g * work.row_end,), scale_a)
            group_scale_b = cute.domain_offset((work.g * cols,), scale_b)
        last_row, last_col = work.row_end - 1, cols - 1
        first = Float32(0.0)
        if ctid < TILE_M:
            first = group_scale_a[cutlass.min(work.row0 + ctid, last_row)]
        else:
            first = group_scale_b[cutlass.min(work.col0 + ctid - TILE_M, last_col)]
        second = group_scale_b[cutlass.min(work.col0 + ctid + CONSUMER_THREADS - TILE_M, last_col)]
        return first, second

    @cute.jit
    def _scale(self, acc, coords, tile_scales: cute.Tensor, work: _Work):
        """``acc = acc * scale_a * scale_b`` per accumulator element, in fp32 and that order, the
        scales read from ``tile_scales`` (:meth:`_fetch_scales`' entries, in shared memory). A 2d2d
        tile of an empty group is left as the mainloop left it, zeros (its scales may hold anything)."""
        if work.k_tiles > 0:
            for i in cutlass.range_constexpr(cute.size(acc)):
                r, c = coords[i]
                acc[i] = acc[i] * tile_scales[r] * tile_scales[TILE_M + c]


def _load_atom(tensor: cute.Tensor, box: cute.ComposedLayout, tiler: tuple, ctas: int):
    """The TMA load atom and coordinate tensor of an operand whose (rows, TILE_K) boxes ``ctas`` CTAs
    of a cluster share (1: a plain load; more: each CTA loads a slice and multicasts it)."""
    if ctas == 1:
        return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), tensor, box, tiler)
    op = cpasync.CopyBulkTensorTileG2SMulticastOp()
    return cpasync.make_tiled_tma_atom(op, tensor, box, tiler, num_multicast=ctas)


def _tma_boxes(
    atom, coords: cute.Tensor, slots: cute.Tensor, row: Int32, red0: Int32, rows: int, rank: Int32, ctas: int
):
    """``(src, dst)`` TMA views: ``src[(None, kt)]`` is the (rows, TILE_K) box of ``coords`` at row
    ``row``, reduction ``red0 + kt * TILE_K`` (any offsets: parts past the tensor are zero-filled);
    ``dst[(None, s)]`` is ring slot ``s``. With ``ctas`` > 1 (a multicast atom), the views are CTA
    ``rank``'s slice of the box."""
    boxes = cute.local_tile(cute.domain_offset((row, red0), coords), (rows, TILE_K), (0, None))
    dst, src = cpasync.tma_partition(
        atom, rank, cute.make_layout(ctas), cute.group_modes(slots, 0, 2), cute.group_modes(boxes, 0, 2)
    )
    return src, dst


@cute.jit
def _load(atom, src: cute.Tensor, dst: cute.Tensor, barrier, ctas: cutlass.Constexpr):
    """One TMA load of a ring slot's box (or, ``ctas`` > 1, of this CTA's slice, multicast to the
    ``ctas`` CTAs of the cluster) signalling ``barrier``."""
    if cutlass.const_expr(ctas == 1):
        cute.copy(atom, src, dst, tma_bar_ptr=barrier)
    else:
        cute.copy(atom, src, dst, tma_bar_ptr=barrier, mcast_mask=cutlass.Int16((1 << ctas) - 1))


@cute.jit
def _first_unit(cluster: cutlass.Constexpr) -> tuple:
    """(first work unit, stride) of this CTA's cluster in the persistent loop: units are dealt to
    clusters round-robin (a cluster is ``cluster`` consecutive CTAs of the grid)."""
    unit = Int32(cute.arch.block_idx()[0]) // cluster
    step = Int32(cute.arch.grid_dim()[0]) // cluster
    return unit, step


class _RawRings:
    """Unswizzled 64-bit word views of the A and B rings (a ring's bytes at their physical offsets)
    with the rings' swizzled layouts: a logical (row, reduction element, slot) of a ring is byte
    ``cute.crd2idx((row, col, slot), layout)`` of the ring (e4m3 elements are bytes)."""

    def __init__(self, storage, layout_a: cute.ComposedLayout, layout_b: cute.ComposedLayout, config) -> None:
        a_bytes, b_bytes = _stage_bytes(config)
        size_a, size_b = a_bytes * config.stages, b_bytes * config.stages
        self.words_a = storage.ring_a.get_tensor(cute.make_layout(size_a // 8), dtype=cutlass.Uint64)
        self.words_b = storage.ring_b.get_tensor(cute.make_layout(size_b // 8), dtype=cutlass.Uint64)
        self.layout_a, self.layout_b = layout_a, layout_b


class _Staging:
    """The epilogue's staging tile as the consumer thread ``ctid`` uses it (:func:`_staging_layouts`):
    ``r2s`` / ``r2s_dst`` the ``stmatrix`` copy of its accumulator fragment into the tile, from a
    register tensor of shape ``r2s_src_shape`` (:meth:`acc_view`: the fragment, flat in that
    copy's element order); ``boxes`` the TMA store boxes for
    ``atom_out`` / ``tma_out`` (the output's coordinates; 2d2d (N, K, E)); ``tile_layout`` and
    ``chunks`` (the bytes as 16-byte vectors) for row-vector stores into ``out``; ``scales`` the
    tile's (TILE_M + tile_n) fp32 scales (``GroupedGemmSm90Kernel._fetch_scales``)."""

    def __init__(self, storage, tile_layout, boxes_layout, tiled_mma, ctid, atom_out, tma_out, out) -> None:
        tile = storage.staging.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        self.boxes = storage.staging.get_tensor(boxes_layout.outer, swizzle=boxes_layout.inner)
        atom = sm90_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, BFloat16, Float32)
        self.r2s = cute.make_tiled_copy_S(atom, cute.make_tiled_copy_C_atom(atom, tiled_mma))
        self.r2s_dst = self.r2s.get_slice(ctid).partition_D(tile)
        self.r2s_src_shape = cute.shape(self.r2s.get_slice(ctid).partition_S(tile))
        self.tile_layout = tile_layout
        size = cute.cosize(tile_layout.outer)
        vectors = cute.make_layout((size // VECTOR, VECTOR), stride=(VECTOR, 1))
        self.chunks = storage.staging.get_tensor(vectors)
        self.atom_out, self.tma_out, self.out = atom_out, tma_out, out
        self.scales = storage.tile_scales.get_tensor(
            cute.make_layout(TILE_M + cute.size(tile_layout.outer, mode=[1]))
        )

    def acc_view(self, acc: cute.Tensor) -> cute.Tensor:
        """The accumulator fragment (same registers) in the ``stmatrix`` copy's element order."""
        return self.r2s.retile(acc)


@cute.jit
def ring_offset(layout: cute.ComposedLayout, row: Int32, col: Int32, stage: Int32) -> Int32:
    """Physical byte offset in a ring of the logical element (``row``, reduction element ``col``,
    slot ``stage``): the swizzled layout, where TMA puts the element and wgmma reads it."""
    return cute.crd2idx((row, col, stage), layout)


@cute.jit
def staged_byte(layout: cute.ComposedLayout, row: Int32, col: Int32) -> Int32:
    """Byte offset in the staging tile (``layout``: :func:`_staging_layouts`' tile view) of output
    element (``row``, ``col``) of the tile. The swizzle of a swizzled shared tensor acts on byte
    addresses (the 1024-byte aligned tile's offsets), its outer layout gives bf16 elements."""
    linear = cute.crd2idx((row, col), layout.outer) * (BFloat16.width // 8)
    swizzle = layout.inner
    mask = (1 << swizzle.num_bits) - 1
    return linear ^ (((linear >> (swizzle.num_base + swizzle.num_shift)) & mask) << swizzle.num_base)


_ALL_BYTES = 0xFFFF_FFFF_FFFF_FFFF


@cute.jit
def _low_bytes(n: Int32) -> cutlass.Uint64:
    """A 64-bit word whose ``n`` low bytes (0 <= n <= 8) are all ones, the others zero."""
    mask = cutlass.Uint64(_ALL_BYTES)
    if n < 8:
        mask = (cutlass.Uint64(1) << cutlass.Uint64(8 * n)) - cutlass.Uint64(1)
    return mask


@cute.jit
def _zero_chunk(ring_words, layout, row: Int32, chunk: Int32, stage: Int32, lo: Int32, hi: Int32):
    """Zero the elements outside ``[lo, hi)`` among reduction elements ``[16 chunk, 16 chunk + 16)``
    of ``row`` of slot ``stage``. The chunk's 16 bytes are contiguous, in element order (see
    ``GroupedGemmSm90Kernel._layouts``): two 64-bit words, each stored as zero when wholly outside,
    else ANDed with the mask of its bytes inside (little-endian: element ``e`` is byte ``e % 8``)."""
    first = chunk * _CHUNK
    if first < lo or first + _CHUNK > hi:
        word = ring_offset(layout, row, first, stage) // 8
        for w in cutlass.range_constexpr(_CHUNK // 8):
            start = first + 8 * w
            keep_from = cutlass.min(cutlass.max(lo - start, 0), 8)
            keep_to = cutlass.min(cutlass.max(hi - start, 0), 8)
            if keep_to <= keep_from:
                ring_words[word + w] = cutlass.Uint64(0)
            elif keep_to - keep_from < 8:
                keep = _low_bytes(keep_to) & ~_low_bytes(keep_from)
                ring_words[word + w] = ring_words[word + w] & keep


def _vector_view(t: cute.Tensor) -> cute.Tensor:
    """``t`` (rows of bf16 with unit stride last, row strides multiples of :data:`VECTOR`) viewed
    with its last mode split into (length / VECTOR, VECTOR): ``[..., v, None]`` is 16-byte vector v
    of a row."""
    *outer, length = t.shape
    *strides, _ = t.stride
    layout = cute.make_layout((*outer, length // VECTOR, VECTOR), stride=(*strides, VECTOR, 1))
    return cute.make_tensor(t.iterator, layout)
