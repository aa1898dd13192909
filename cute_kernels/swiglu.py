"""SwiGLU fused with FP8 rowwise quantization, forward and backward: ``SwigluFp8Kernel``.

Forward (``direction="fwd"``): h13 (M, 2H) bf16 (gate columns [0, H), up [H, 2H)) -> h = bf16(silu(g)
u) (M, H), and h's FP8 rowwise operand: q (M, H) e4m3, scales (M,) fp32, exactly
``quantize_fp8_2d(h, axis="row")``. Backward (``"bwd"``): grad_h (M, H) and h13 -> grad_h13 (M, 2H)
bf16 (d_gate | d_up) and its FP8 rowwise operand along 2H: q (M, 2H), scales (M,). Bit for bit
the reference's (docs/contract.md).

silu(g) (and silu'(g)) of a bf16 gate is a function of its 16 bits, so the kernel does not run the
contract's sequence of fp32 operations: it reads the results from a table in shared memory for the
gates in ``constants.SILU_TABLE_*`` (|g| in [2^-25, 2^7)) and takes closed forms outside it
(``cute_utils.swiglu_math``: ``g * 0.5`` and 0.5 below; g and 1, or -0 and -0, above; NaN for NaN),
which equal the sequence on every bf16 g (notes/swiglu-fp8-kernel.md). Only the products with u
and grad run as fp32 operations (``mul.rn.f32``). The table (fp32
``(2, 2, SILU_TABLE_SPAN)``: silu, silu'; positive, negative g) is a launch argument the bindings
build once per device from the reference; each CTA copies what its direction reads (``cp.async``)
before its first row. The grid is persistent (at most ``num_sms * ctas_per_sm`` CTAs walking the
row blocks), so the copies are paid once per CTA, not per row.

One warp per row (a CTA of ``threads / 32`` consecutive rows), or with ``row_per_cta`` a whole CTA
per row (its warps' maxima combined in shared memory, two buffers used in turn so that one row's
reads never meet the next row's writes), as ``cute_kernels.quantize_fp8``. Two passes
over a row, each in batches of ``unroll`` steps per thread (a step: 8 output columns of the vector
variant, one of the element variant), every load of a batch in flight before any is used:

- the compute pass loads the inputs of its steps (gate, up; and grad_h), computes the bf16 outputs
  (one step of h; the backward's two, columns j and H + j), stores them, and keeps the max of their
  magnitudes (bf16 pairs, ``max.u16x2``);
- after the row's max gives ``q_scale`` (``cute_utils.fp8``), the cast pass loads the thread's own
  bf16 outputs back (just written: from L2) and stores their E4M3 bytes. The SwiGLU math runs once
  per element; re-reading the bf16 outputs (2 bytes per element) costs the L2 less than re-reading
  h13 (4, or 6 with grad_h) and needs no recomputation (notes/swiglu-fp8-kernel.md).

The row's first thread stores ``1 / q_scale`` (1.0 for a row of no columns).

``bounded`` variants also take row-group end offsets (G,) int32: only the rows below the last end,
``clamp(ends[G - 1], 0, M)`` read on the device, are computed; a CTA whose rows are all past it
exits after that one load (before its table copy), and the rows past it are left unwritten (h or
grad_h13, q, scales: an expert-parallel dispatch's static worst-case row count,
notes/swiglu-fp8-kernel.md). All sizes are symbolic: one compile per (direction, rounding, vector,
bounded, arch).
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float32, Int32, Uint16, Uint32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from cute_kernels.op_specs import SWIGLU_QUANTIZE_FP8
from cute_utils.blocked import ceil_div
from cute_utils.constants import SILU_TABLE_FN
from cute_utils.fp8 import fp8_quant_scale, mul_rn, reciprocal_rn
from cute_utils.groups import clamped_end
from cute_utils.jit import compile_tvm_ffi
from cute_utils.mx import lane_group_max, scale_values
from cute_utils.occupancy import resident_ctas
from cute_utils.rows import cta_max, row_steps
from cute_utils.swiglu_math import amax_bits, bf16_amax, bf16x2, silu_table_slot, table_silu, table_silu_grad

from .base import Kernel, LoadsInFlight

VECTOR = 8  # output columns per step of the vector variant (16-byte bf16 loads and stores)
DIRECTIONS = ("fwd", "bwd")
TABLE_ENTRIES = 2 * SILU_TABLE_FN  # the table argument's fp32 entries: silu, then silu'
_WARP = 32
_TABLE_VECTOR = 4  # fp32 entries per 16-byte cp.async of the table copy


@dataclass(frozen=True)
class SwigluConfig:
    """``threads`` per CTA, ``row_per_cta`` (False: one row per warp; True: the whole CTA on one row,
    its warps' maxima combined in shared memory), ``unroll`` (steps in flight per thread and batch),
    ``ctas_per_sm`` the register cap keeps room for (also the persistent grid's CTAs per SM, unless
    the table's shared memory leaves room for fewer)."""

    threads: int = 256
    unroll: int = 4
    ctas_per_sm: int = 2
    row_per_cta: bool = True

    def __post_init__(self) -> None:
        if self.threads % _WARP or not 0 < self.threads <= 1024:
            raise ValueError(f"threads={self.threads} must be a multiple of 32 in [32, 1024]")
        if self.unroll < 1 or self.ctas_per_sm < 1 or self.ctas_per_sm * self.threads > 2048:
            raise ValueError(f"unroll={self.unroll}, ctas_per_sm={self.ctas_per_sm}: out of range")


@dataclass(frozen=True)
class SwigluVariant:
    """``direction`` ("fwd": h13 -> h; "bwd": grad_h, h13 -> grad_h13), ``round_pow2`` (power-of-2
    scales), ``vector`` (8-column steps: H % 8 == 0 and 16-byte aligned inputs), ``bounded`` (only
    the rows below the last of the group end offsets the launcher also takes)."""

    direction: str = "fwd"
    round_pow2: bool = True
    vector: bool = True
    bounded: bool = False

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")


def _table_entries(variant: SwigluVariant) -> int:
    """The table entries a CTA copies: silu (forward), silu and silu' (backward)."""
    return SILU_TABLE_FN * (2 if variant.direction == "bwd" else 1)


def _shared_storage(table_entries: int, warps: int):
    """A CTA's shared memory: the warps' row maxima (two buffers of ``warps`` words, used in turn
    by consecutive rows) and the silu table copy (fp32, 16-byte aligned for ``cp.async``)."""

    @cute.struct
    class SharedStorage:
        warp_max: cute.struct.MemRange[Int32, 2 * warps]
        table: cute.struct.Align[cute.struct.MemRange[Float32, table_entries], 16]

    return SharedStorage


@dataclass(frozen=True)
class _Views:
    """The step views ``(rows, columns / width, width)`` of a launch: ``h13`` (step v: gate, step
    ``half + v``: up), ``grad`` (backward) or None, ``out`` and ``q`` (backward: two steps per
    input step, v and ``half + v``); ``half`` = H / width, the input steps of a row."""

    h13: cute.Tensor
    grad: cute.Tensor | None
    out: cute.Tensor
    q: cute.Tensor
    half: Int32


@dataclass(frozen=True)
class _Operands:
    """A launch's tensors (``SwigluFp8Kernel.__call__``'s arguments): ``grad`` None for the
    forward; ``table`` the silu table in global memory."""

    h13: cute.Tensor
    out: cute.Tensor
    q: cute.Tensor
    scales: cute.Tensor
    grad: cute.Tensor | None
    table: cute.Tensor

    def data(self) -> tuple:
        """The data tensors in the kernels' argument order: h13, out, q, scales, grad."""
        return self.h13, self.out, self.q, self.scales, self.grad


@dataclass(frozen=True)
class _Tables:
    """A CTA's copy of the silu table: ``silu`` and (backward) ``dsilu``, fp32 (``SILU_TABLE_FN``,)
    each in shared memory, indexed by ``swiglu_math.TableSlot.index``."""

    silu: cute.Tensor
    dsilu: cute.Tensor | None


@dataclass(frozen=True)
class _Step:
    """Step ``v`` of row ``row``: where a thread's loads and stores of one step go."""

    row: Int32
    v: Int32


class SwigluFp8Kernel(Kernel):
    """SwiGLU + FP8 rowwise (module docstring). Launch: ``kernel(h13, out, q, scales, grad_h, table,
    num_sms)`` with ``grad_h`` None for the forward, ``table`` the silu table (fp32
    (``TABLE_ENTRIES``,), 16-byte aligned; module docstring) and ``num_sms`` the device's SM count
    (sizes the persistent grid); a ``bounded`` variant: ``kernel(h13, out, q, scales, grad_h,
    group_end_offsets, table, num_sms)``."""

    name = "swiglu_fp8"

    @classmethod
    def loads_in_flight(cls, variant: SwigluVariant, config: SwigluConfig, cols: int) -> LoadsInFlight:
        """One batch of ``unroll`` steps per thread of each row the CTA works on, capped by the
        row's steps (``cols`` = H, the gate / up width), each step's inputs: gate and up (and
        grad_h), bf16."""
        width = VECTOR if variant.vector else 1
        inputs = 3 if variant.direction == "bwd" else 2
        row_threads = config.threads if config.row_per_cta else _WARP
        rows = 1 if config.row_per_cta else config.threads // _WARP
        steps = min(row_threads * config.unroll, -(-cols // width))
        return LoadsInFlight(
            config.threads,
            rows * steps * inputs * width * 2,
            f"{rows} row(s) x min({row_threads} thr x {config.unroll} unroll, H = {cols} / {width}) steps x "
            f"{inputs} inputs x {width} elem x 2 B "
            "(compute pass; the cast pass re-reads bf16 outputs from L2)",
        )

    def __init__(self, variant: SwigluVariant, config: SwigluConfig) -> None:
        super().__init__(variant, config)
        self.width = VECTOR if variant.vector else 1
        self.backward = variant.direction == "bwd"
        self.inputs = 3 if self.backward else 2  # gate, up (, grad)
        self.outputs = 2 if self.backward else 1  # output steps per input step
        self.warps = config.threads // _WARP
        self.row_threads = config.threads if config.row_per_cta else _WARP  # threads sharing a row
        self.rows_per_cta = 1 if config.row_per_cta else self.warps
        self.table_entries = _table_entries(variant)  # what the CTA copies
        self.storage = _shared_storage(self.table_entries, self.warps)
        # the persistent grid's CTAs per SM: the register cap's, unless the table leaves room for fewer
        self.ctas_per_sm = resident_ctas(config.ctas_per_sm, self.shared_bytes(variant, config))

    @classmethod
    def shared_bytes(cls, variant: SwigluVariant, config: SwigluConfig) -> int:
        """The shared storage's size (:func:`_shared_storage`)."""
        return _shared_storage(_table_entries(variant), config.threads // _WARP).size_in_bytes()

    @classmethod
    def variants(cls) -> list[SwigluVariant]:
        choices = [(d, r, v) for d in DIRECTIONS for r in (True, False) for v in (True, False)]
        return [SwigluVariant(*c) for c in choices] + [SwigluVariant(*c, bounded=True) for c in choices]

    @classmethod
    def target_name(cls, variant: SwigluVariant) -> str:
        rounding = "pow2" if variant.round_pow2 else "exact"
        suffix = "_bounded" if variant.bounded else ""
        return f"{cls.name}_{variant.direction}_{rounding}_{'v8' if variant.vector else 'v1'}{suffix}"

    @classmethod
    def fake_arguments(cls, variant: SwigluVariant) -> tuple:
        """h13 (M, 2H), out (fwd: h (M, H); bwd: grad_h13 (M, 2H)) and q (out's shape) row-major,
        scales fp32 (M,), grad_h (M, H) (bwd; else None), (bounded) the end offsets int32 (G,), the
        silu table fp32 (``TABLE_ENTRIES``,), the SM count, the env stream; H a multiple of 8 and
        16-byte aligned bf16 tensors for the vector variant. M, H and G are symbolic."""
        width = VECTOR if variant.vector else 1
        rows, half, cols = (
            cute.sym_int(),
            cute.sym_int(divisibility=width),
            cute.sym_int(divisibility=2 * width),
        )
        align = 16 if variant.vector else 2

        def fake(dtype, shape, align):
            make = cute.runtime.make_fake_compact_tensor
            return make(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)), assumed_align=align)

        out_cols = cols if variant.direction == "bwd" else half
        out = fake(BFloat16, (rows, out_cols), align)
        q = fake(Float8E4M3FN, (rows, out_cols), width)
        grad = fake(BFloat16, (rows, half), align) if variant.direction == "bwd" else None
        scales = fake(Float32, (rows,), 4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        h13 = fake(BFloat16, (rows, cols), align)
        table = fake(Float32, (TABLE_ENTRIES,), 16)
        if variant.bounded:
            return h13, out, q, scales, grad, fake(Int32, (cute.sym_int(),), 4), table, Int32(1), stream
        return h13, out, q, scales, grad, table, Int32(1), stream

    @staticmethod
    def can_implement(half: int, vector: bool, *data_ptrs: int) -> bool:
        """Any H for the element variant; the vector one needs H % 8 == 0 and 16-byte pointers."""
        return not vector or (half % VECTOR == 0 and SWIGLU_QUANTIZE_FP8.limits.accepts(ptrs=data_ptrs))

    @classmethod
    def compile(cls, variant: SwigluVariant, arch: str, *, config=None, options: str = ""):
        """:meth:`Kernel.compile` of the variant's launcher (:meth:`launcher`)."""
        kernel = cls(variant, config if config is not None else cls.default_config(variant, arch))
        return compile_tvm_ffi(kernel.launcher(), cls.fake_arguments(variant), arch, options)

    def launcher(self):
        """What ``cute.compile`` traces: :meth:`launch_bounded` (one more argument) for the bounded
        variants, else the object itself (``__call__``)."""
        return self.launch_bounded if self.variant.bounded else self

    @cute.jit
    def __call__(
        self,
        h13: cute.Tensor,  # (M, 2H) bf16 row-major: gate columns [0, H), up [H, 2H)
        out: cute.Tensor,  # bf16 row-major: fwd h (M, H); bwd grad_h13 (M, 2H)
        q: cute.Tensor,  # Float8E4M3FN, out's shape, row-major
        scales: cute.Tensor,  # fp32 (M,)
        grad,  # bwd: grad_h (M, H) bf16 row-major; fwd: None
        table: cute.Tensor,  # fp32 (TABLE_ENTRIES,): silu, silu' of the table's gates
        num_sms: Int32,  # the device's SM count: sizes the persistent grid
        stream,
    ):
        self._launch(_Operands(h13, out, q, scales, grad, table), None, num_sms, stream)

    @cute.jit
    def launch_bounded(
        self,
        h13: cute.Tensor,  # (M, 2H) bf16 row-major
        out: cute.Tensor,  # as __call__'s: rows >= the bound left as they are
        q: cute.Tensor,  # as __call__'s: rows >= the bound left as they are
        scales: cute.Tensor,  # fp32 (M,): entries >= the bound left as they are
        grad,  # bwd: grad_h (M, H); fwd: None
        ends: cute.Tensor,  # int32 (G,) row-group end offsets: the bound is clamp(ends[G-1], 0, M)
        table: cute.Tensor,  # as __call__'s
        num_sms: Int32,  # as __call__'s
        stream,
    ):
        self._launch(_Operands(h13, out, q, scales, grad, table), ends, num_sms, stream)

    @cute.jit
    def _launch(self, operands: _Operands, ends, num_sms: Int32, stream):
        """A persistent grid: one CTA per ``rows_per_cta`` rows of M, at most ``num_sms`` times the
        CTAs resident per SM (M static in the grid: the bound is on the device). The bounded
        variants launch their own kernel: the others' kernel (its name and arguments, which the
        SASS names) stays as it was."""
        blocks = cutlass.max(ceil_div(operands.out.shape[0], self.rows_per_cta), 1)
        launch = {
            "grid": [cutlass.min(blocks, num_sms * self.ctas_per_sm), 1, 1],
            "block": [self.config.threads, 1, 1],
            "stream": stream,
            "min_blocks_per_mp": self.config.ctas_per_sm,
            "preferred_smem_carveout": 100,  # the silu table
        }
        if cutlass.const_expr(ends is None):
            self.kernel(*operands.data(), operands.table).launch(**launch)
        else:
            self.kernel_bounded(*operands.data(), ends, operands.table).launch(**launch)

    @cute.kernel
    def kernel(self, h13: cute.Tensor, out: cute.Tensor, q: cute.Tensor, scales: cute.Tensor, grad, table):
        self._swiglu_rows(_Operands(h13, out, q, scales, grad, table), out.shape[0])

    @cute.kernel
    def kernel_bounded(
        self,
        h13: cute.Tensor,
        out: cute.Tensor,
        q: cute.Tensor,
        scales: cute.Tensor,
        grad,
        ends: cute.Tensor,
        table,
    ):
        rows = clamped_end(ends, ends.shape[0] - 1, out.shape[0])
        self._swiglu_rows(_Operands(h13, out, q, scales, grad, table), rows)

    @cute.jit
    def _swiglu_rows(self, operands: _Operands, rows: Int32):
        """This CTA's row blocks below ``rows`` (M, or the bound), every ``grid``-th: the table copy
        once, then per row the compute pass, scale and cast pass."""
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        part = tid % self.row_threads  # this thread's place among the row's threads
        storage = SmemAllocator().allocate(self.storage)
        warp_max = storage.warp_max.get_tensor(cute.make_layout((self.warps, 2)))
        shared_table = storage.table.get_tensor(cute.make_layout(self.table_entries))
        if cta * self.rows_per_cta < rows:  # uniform over the CTA
            self._copy_table(operands.table, shared_table, tid)
            views = self._views(operands.h13, operands.out, operands.q, operands.grad)
            tables = self._tables(shared_table)
            for block in cutlass.range(cta, ceil_div(rows, self.rows_per_cta), grid, unroll=1):
                row = block * self.rows_per_cta + tid // self.row_threads
                if row < rows:  # uniform over a CTA that shares a row
                    amax = self._compute_row(views, tables, row, part)
                    if cutlass.const_expr(self.config.row_per_cta):
                        amax = cta_max(amax, warp_max[None, (block // grid) % 2], tid, self.warps)
                    q_scale = fp8_quant_scale(amax, self.variant.round_pow2)
                    if part == 0:
                        scale = reciprocal_rn(q_scale)
                        if views.half == 0:
                            scale = Float32(1.0)
                        operands.scales[row] = scale
                    self._cast_row(views, row, part, q_scale)

    @cute.jit
    def _copy_table(self, table: cute.Tensor, shared_table: cute.Tensor, tid: Int32):
        """The table's first ``table_entries`` into shared memory: 16-byte ``cp.async`` copies
        spread over the CTA's threads, waited for, then a CTA barrier."""
        vectors = self.table_entries // _TABLE_VECTOR
        src = cute.logical_divide(table, cute.make_layout(_TABLE_VECTOR))
        dst = cute.logical_divide(shared_table, cute.make_layout(_TABLE_VECTOR))
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Float32, num_bits_per_copy=128
        )
        for i in cutlass.range(tid, vectors, self.config.threads, unroll=1):
            cute.copy(atom, src[None, i], dst[None, i])
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

    def _tables(self, shared_table: cute.Tensor) -> _Tables:
        """The silu (and backward: silu') entries of the table copy, ``SILU_TABLE_FN`` each."""
        layout = cute.make_layout(SILU_TABLE_FN)
        silu = cute.make_tensor(shared_table.iterator, layout)
        dsilu = cute.make_tensor(shared_table.iterator + SILU_TABLE_FN, layout) if self.backward else None
        return _Tables(silu, dsilu)

    def _views(self, h13, out, q, grad) -> _Views:
        width = self.width
        half = out.shape[1] // (width * self.outputs)
        grad_steps = row_steps(grad, width) if self.backward else None
        return _Views(row_steps(h13, width), grad_steps, row_steps(out, width), row_steps(q, width), half)

    @cute.jit
    def _compute_row(self, views: _Views, tables: _Tables, row: Int32, part: Int32) -> Int32:
        """Compute pass over row ``row``: every output step of this thread computed and stored;
        returns the bits of the row's max |output| (NaN-propagating), reduced over the warp."""
        unroll = self.config.unroll
        layout = cute.make_layout(
            (self.width, self.inputs, unroll), stride=(1, self.width, self.width * self.inputs)
        )
        loaded = cute.make_rmem_tensor(layout, BFloat16)
        amax = Uint32(0)
        for first in cutlass.range(0, views.half, self.row_threads * unroll, unroll=1):
            for u in cutlass.range_constexpr(unroll):  # every load of the batch first
                v = first + u * self.row_threads + part
                if v < views.half:
                    self._load_inputs(views, _Step(row, v), loaded[None, None, u])
            for u in cutlass.range_constexpr(unroll):
                v = first + u * self.row_threads + part
                if v < views.half:
                    amax = self._compute_step(views, tables, _Step(row, v), loaded[None, None, u], amax)
        return lane_group_max(amax_bits(amax), _WARP)

    @cute.jit
    def _load_inputs(self, views: _Views, at: _Step, loaded: cute.Tensor):
        """Gate, up (and grad) of step ``at`` into ``loaded[None, i]``."""
        cute.autovec_copy(views.h13[at.row, at.v, None], loaded[None, 0])
        cute.autovec_copy(views.h13[at.row, views.half + at.v, None], loaded[None, 1])
        if cutlass.const_expr(self.backward):
            cute.autovec_copy(views.grad[at.row, at.v, None], loaded[None, 2])

    @cute.jit
    def _compute_step(
        self, views: _Views, tables: _Tables, at: _Step, loaded: cute.Tensor, amax: Uint32
    ) -> Uint32:
        """The bf16 outputs of one step, stored; returns ``amax`` updated with their magnitudes.
        silu and silu' come from the tables in shared memory, or their closed forms outside them
        (``cute_utils.swiglu_math``); d_gate = ``(grad * u) * silu'``, d_up = ``grad * silu``."""
        inputs = cute.make_rmem_tensor(cute.make_layout((self.width, self.inputs)), Float32)
        inputs.store(loaded.load().to(Float32))
        results = cute.make_rmem_tensor(cute.make_layout((self.width, self.outputs)), Float32)
        for i in cutlass.range_constexpr(self.width):
            g = inputs[i, 0]
            slot = silu_table_slot(g)
            silu_g = table_silu(g, slot, tables.silu)
            if cutlass.const_expr(self.backward):
                grad = inputs[i, 2]
                results[i, 0] = mul_rn(mul_rn(grad, inputs[i, 1]), table_silu_grad(g, slot, tables.dsilu))
                results[i, 1] = mul_rn(grad, silu_g)
            else:
                results[i, 0] = mul_rn(silu_g, inputs[i, 1])
        for o in cutlass.range_constexpr(self.outputs):
            amax = self._store_bf16(results[None, o], views.out[at.row, o * views.half + at.v, None], amax)
        return amax

    @cute.jit
    def _store_bf16(self, values: cute.Tensor, dst: cute.Tensor, amax: Uint32) -> Uint32:
        """``values`` (``width`` fp32) as bf16 into ``dst`` (NaN as 0x7FC0, ``swiglu_math.bf16x2``);
        returns ``amax`` updated with their magnitudes."""
        if cutlass.const_expr(self.width == 1):
            word = bf16x2(values[0], values[0])
            bits = cute.make_rmem_tensor(cute.make_layout(1), Uint16)
            bits[0] = Uint16(word)
            cute.autovec_copy(cute.recast_tensor(bits, BFloat16), dst)
            amax = bf16_amax(amax, word)
        else:
            words = cute.make_rmem_tensor(cute.make_layout(self.width // 2), Uint32)
            for i in cutlass.range_constexpr(self.width // 2):
                words[i] = bf16x2(values[2 * i], values[2 * i + 1])
                amax = bf16_amax(amax, words[i])
            cute.autovec_copy(cute.recast_tensor(words, BFloat16), dst)
        return amax

    @cute.jit
    def _cast_row(self, views: _Views, row: Int32, part: Int32, q_scale: Float32):
        """Cast pass: this thread's bf16 output steps of row ``row`` (written by the compute pass,
        read back in the same batches) times ``q_scale`` as E4M3 bytes (saturating, RNE, NaN ->
        0x7F)."""
        unroll, width = self.config.unroll, self.width
        layout = cute.make_layout((width, self.outputs, unroll), stride=(1, width, width * self.outputs))
        loaded = cute.make_rmem_tensor(layout, BFloat16)
        values = cute.make_rmem_tensor(width, Float32)
        q_frag = cute.make_rmem_tensor(cute.make_layout(width), Float8E4M3FN)
        for first in cutlass.range(0, views.half, self.row_threads * unroll, unroll=1):
            for u in cutlass.range_constexpr(unroll):
                v = first + u * self.row_threads + part
                if v < views.half:
                    for o in cutlass.range_constexpr(self.outputs):
                        cute.autovec_copy(views.out[row, o * views.half + v, None], loaded[None, o, u])
            for u in cutlass.range_constexpr(unroll):
                v = first + u * self.row_threads + part
                if v < views.half:
                    for o in cutlass.range_constexpr(self.outputs):
                        values.store(loaded[None, o, u].load().to(Float32))
                        scale_values(values, q_scale)
                        q_frag.store(values.load().to(Float8E4M3FN))
                        cute.autovec_copy(q_frag, views.q[row, o * views.half + v, None])


__all__ = ["DIRECTIONS", "TABLE_ENTRIES", "VECTOR", "SwigluConfig", "SwigluFp8Kernel", "SwigluVariant"]
