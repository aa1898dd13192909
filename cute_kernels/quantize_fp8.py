"""FP8 rowwise quantization with one scale per row (SPEC section 7): ``Fp8RowKernel``.

It serves ``quantize_fp8_2d(axis="row")`` on x (M, K) and ``quantize_fp8_3d(axis="K")`` on w
(E, N, K), whose rows the launcher flattens to (E N, K) (rank-3 variant). One warp per row (a CTA
of ``threads / 32`` consecutive rows), or with ``row_per_cta`` a whole CTA per row (its warps'
maxima combined in shared memory). Two passes over the row: the amax pass loads the row and keeps
the bits of ``max |x|`` (integer max: NaN propagates); the cast pass loads it again (the row was
just read: the second read comes from L2, so DRAM sees the row once), multiplies by ``q_scale``
(``cute_utils.fp8``) and stores E4M3 bytes (``cvt.rn.satfinite.e4m3x2.f32``). Loads go in batches of
``unroll`` steps per thread, all in flight before any is used. The row's first thread stores its
dequantization scale ``1 / q_scale``; a row of no elements gets 1.0.

Variants: ``vector`` (K % 8 == 0, 16-byte aligned rows): 8 elements per step (16-byte loads of
bf16, two of fp32, 8-byte stores of q); otherwise one element per step, any K. ``bounded`` (2-D
only): the launcher also takes row-group end offsets (G,) int32 and only the rows below the last
end, ``clamp(ends[G - 1], 0, M)`` read on the device, are quantized; a CTA whose rows are all past
it exits at once, and rows past it are not written (an expert-parallel dispatch's static
worst-case row count, notes/bounded-row-passes.md). All sizes are symbolic: one compile per (dtype,
rounding, vector, rank, bounded, arch).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float32, Int32
from cutlass.memory import SmemAllocator

from cute_kernels.op_specs import QUANTIZE_FP8_2D
from cute_utils.blocked import ceil_div
from cute_utils.fp8 import fp8_quant_scale, reciprocal_rn
from cute_utils.groups import clamped_end
from cute_utils.mx import lane_group_max, max_abs_bits, scale_values
from cute_utils.rows import cta_max, row_steps

from .base import Kernel, LoadsInFlight

DTYPES = {"bfloat16": BFloat16, "float32": Float32}
VECTOR = 8
_WARP = 32


@dataclass(frozen=True)
class Fp8RowConfig:
    """``threads`` per CTA, ``row_per_cta`` (False: one row per warp; True: the whole CTA on one row,
    its warps' maxima combined in shared memory), ``unroll`` (steps in flight per thread and batch),
    ``ctas_per_sm`` the register cap keeps room for."""

    threads: int = 256
    unroll: int = 4
    ctas_per_sm: int = 4
    row_per_cta: bool = False

    def __post_init__(self) -> None:
        if self.threads % _WARP or not 0 < self.threads <= 1024:
            raise ValueError(f"threads={self.threads} must be a multiple of 32 in [32, 1024]")
        if self.unroll < 1 or self.ctas_per_sm < 1 or self.ctas_per_sm * self.threads > 2048:
            raise ValueError(f"unroll={self.unroll}, ctas_per_sm={self.ctas_per_sm}: out of range")


@dataclass(frozen=True)
class Fp8RowVariant:
    """``dtype`` (a :data:`DTYPES` name), ``round_pow2`` (power-of-2 scales), ``vector`` (8-element
    steps: K % 8 == 0 and 16-byte aligned rows), ``rank`` (2: x and q (M, K), scales (M,); 3: w and
    q (E, N, K), scales (E, N)), ``bounded`` (rank 2: only the rows below the last of the group end
    offsets the launcher also takes)."""

    dtype: str
    round_pow2: bool = True
    vector: bool = True
    rank: int = 2
    bounded: bool = False


def _rows(t: cute.Tensor) -> cute.Tensor:
    """(E, N, K) -> (E N, K) for a row-major tensor; (E, N) -> (E N,)."""
    if cutlass.const_expr(cute.rank(t.layout) == 2):
        experts, n = t.shape
        return cute.make_tensor(t.iterator, cute.make_layout(experts * n, stride=t.stride[1]))
    experts, n, k = t.shape
    return cute.make_tensor(t.iterator, cute.make_layout((experts * n, k), stride=(t.stride[1], 1)))


class Fp8RowKernel(Kernel):
    """One scale per row (module docstring). Launch: ``kernel(x, q, scales)``; a ``bounded``
    variant: ``kernel(x, q, scales, group_end_offsets)``."""

    name = "quantize_fp8_row"

    @classmethod
    def loads_in_flight(cls, variant: Fp8RowVariant, config: Fp8RowConfig, cols: int) -> LoadsInFlight:
        """One batch of ``unroll`` steps per thread of each row the CTA works on (a whole CTA per
        row, or a warp per row), capped by the row's steps."""
        elem = DTYPES[variant.dtype].width // 8
        width = VECTOR if variant.vector else 1
        row_threads = config.threads if config.row_per_cta else _WARP
        rows = 1 if config.row_per_cta else config.threads // _WARP
        steps = min(row_threads * config.unroll, -(-cols // width))
        return LoadsInFlight(
            config.threads,
            rows * steps * width * elem,
            f"{rows} row(s) x min({row_threads} thr x {config.unroll} unroll, K = {cols} / {width}) steps "
            f"x {width} elem x {elem} B (each pass; the cast pass re-reads from L2)",
        )

    def __init__(self, variant: Fp8RowVariant, config: Fp8RowConfig) -> None:
        super().__init__(variant, config)
        self.width = VECTOR if variant.vector else 1
        self.warps = config.threads // _WARP
        self.row_threads = config.threads if config.row_per_cta else _WARP  # threads sharing a row
        self.rows_per_cta = 1 if config.row_per_cta else self.warps

    @classmethod
    def variants(cls) -> list[Fp8RowVariant]:
        choices = [(d, r, v) for d in DTYPES for r in (True, False) for v in (True, False)]
        unbounded = [Fp8RowVariant(*c, rank) for c in choices for rank in (2, 3)]
        return unbounded + [Fp8RowVariant(*c, 2, bounded=True) for c in choices]

    @classmethod
    def target_name(cls, variant: Fp8RowVariant) -> str:
        rounding = "pow2" if variant.round_pow2 else "exact"
        step = "v8" if variant.vector else "v1"
        suffix = "_3d" if variant.rank == 3 else "_bounded" if variant.bounded else ""
        return f"{cls.name}_{variant.dtype}_{rounding}_{step}{suffix}"

    @classmethod
    def fake_arguments(cls, variant: Fp8RowVariant) -> tuple:
        """x and q (M, K) or (E, N, K) row-major (K a multiple of 8 and 16-byte alignment for the
        vector variant), scales fp32 (M,) or (E, N), (bounded) the end offsets int32 (G,), and the
        env stream."""
        width = VECTOR if variant.vector else 1
        cols = cute.sym_int(divisibility=width)
        lead = (cute.sym_int(), cute.sym_int()) if variant.rank == 3 else (cute.sym_int(),)
        order = (2, 1, 0) if variant.rank == 3 else (1, 0)
        align = 16 if variant.vector else DTYPES[variant.dtype].width // 8

        def fake(dtype, shape, order, align):
            make = cute.runtime.make_fake_compact_tensor
            return make(dtype, shape, stride_order=order, assumed_align=align)

        x = fake(DTYPES[variant.dtype], (*lead, cols), order, align)
        q = fake(Float8E4M3FN, (*lead, cols), order, 8 if variant.vector else 1)
        scales = fake(Float32, lead, order[1:] if variant.rank == 3 else (0,), 4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        if variant.bounded:
            return x, q, scales, fake(Int32, (cute.sym_int(),), (0,), 4), stream
        return x, q, scales, stream

    @staticmethod
    def can_implement(cols: int, vector: bool, *data_ptrs: int) -> bool:
        """Any K for the element variant; the vector one needs K % 8 == 0 and 16-byte pointers."""
        return not vector or (cols % VECTOR == 0 and QUANTIZE_FP8_2D.limits.accepts(ptrs=data_ptrs))

    def launcher(self):
        """The bounded variants' launcher is :meth:`launch_bounded` (one more argument)."""
        return self.launch_bounded if self.variant.bounded else self

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # (M, K) bf16/fp32 row-major (rank 3: (E, N, K))
        q: cute.Tensor,  # Float8E4M3FN, x's shape, row-major
        scales: cute.Tensor,  # fp32 (M,) (rank 3: (E, N))
        stream,
    ):
        if cutlass.const_expr(self.variant.rank == 3):
            x, q, scales = _rows(x), _rows(q), _rows(scales)
        self._launch(x, q, scales, None, stream)

    @cute.jit
    def launch_bounded(
        self,
        x: cute.Tensor,  # (M, K) bf16/fp32 row-major
        q: cute.Tensor,  # Float8E4M3FN (M, K) row-major: rows >= the bound left as they are
        scales: cute.Tensor,  # fp32 (M,): entries >= the bound left as they are
        ends: cute.Tensor,  # int32 (G,) row-group end offsets: the bound is clamp(ends[G-1], 0, M)
        stream,
    ):
        self._launch(x, q, scales, ends, stream)

    @cute.jit
    def _launch(self, x: cute.Tensor, q: cute.Tensor, scales: cute.Tensor, ends, stream):
        """One CTA per ``rows_per_cta`` rows of M (M static in the grid: the bound is on the device).
        The bounded variants launch their own kernel: the others' kernel (its name and arguments,
        which the SASS names) stays as it was."""
        grid = cutlass.max(ceil_div(x.shape[0], self.rows_per_cta), 1)
        launch = {
            "grid": [grid, 1, 1],
            "block": [self.config.threads, 1, 1],
            "stream": stream,
            "min_blocks_per_mp": self.config.ctas_per_sm,
            # little shared memory (row_per_cta's warp maxima); given, so no device is queried
            "preferred_smem_carveout": 0,
        }
        if cutlass.const_expr(ends is None):
            self.kernel(x, q, scales).launch(**launch)
        else:
            self.kernel_bounded(x, q, scales, ends).launch(**launch)

    @cute.kernel
    def kernel(self, x: cute.Tensor, q: cute.Tensor, scales: cute.Tensor):
        self._quantize_rows(x, q, scales, x.shape[0])

    @cute.kernel
    def kernel_bounded(self, x: cute.Tensor, q: cute.Tensor, scales: cute.Tensor, ends: cute.Tensor):
        self._quantize_rows(x, q, scales, clamped_end(ends, ends.shape[0] - 1, x.shape[0]))

    @cute.jit
    def _quantize_rows(self, x: cute.Tensor, q: cute.Tensor, scales: cute.Tensor, rows: Int32):
        """The rows of this CTA below ``rows`` (M, or the bound): amax, scale, cast."""
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        row = cta * self.rows_per_cta + tid // self.row_threads
        part = tid % self.row_threads  # this thread's place among the row's threads
        smem = SmemAllocator()
        warp_max = smem.allocate_tensor(Int32, cute.make_layout(self.warps), 16)
        cols = x.shape[1]
        if row < rows:  # uniform over a CTA that shares a row (the grid has one CTA per row)
            x_steps, q_steps = row_steps(x, self.width), row_steps(q, self.width)
            amax = self._row_amax(x_steps, row, part)
            if cutlass.const_expr(self.config.row_per_cta):
                amax = cta_max(amax, warp_max, tid, self.warps)
            q_scale = fp8_quant_scale(amax, self.variant.round_pow2)
            if part == 0:
                scale = reciprocal_rn(q_scale)
                if cols == 0:
                    scale = Float32(1.0)
                scales[row] = scale
            self._cast_row(x_steps, q_steps, row, part, q_scale)

    @cute.jit
    def _load_batch(self, x_steps: cute.Tensor, frags: cute.Tensor, row: Int32, first: Int32, part: Int32):
        """Issue the loads of steps ``first + T u + part`` (u < unroll, T the row's threads) of row
        ``row`` into ``frags[None, u]``, all before any is used (steps past the row end skipped)."""
        for u in cutlass.range_constexpr(self.config.unroll):
            v = first + u * self.row_threads + part
            if v < x_steps.shape[1]:
                cute.autovec_copy(x_steps[row, v, None], frags[None, u])

    def _batch_fragments(self, element_type):
        layout = cute.make_layout((self.width, self.config.unroll), stride=(1, self.width))
        return cute.make_rmem_tensor(layout, element_type), cute.make_rmem_tensor(self.width, Float32)

    @cute.jit
    def _row_amax(self, x_steps: cute.Tensor, row: Int32, part: Int32) -> Int32:
        """Bits of ``max |x|`` over this thread's steps of row ``row``, then over its warp. The row
        is read in batches of ``unroll`` steps per thread, every load of a batch in flight at once."""
        unroll = self.config.unroll
        frags, values = self._batch_fragments(x_steps.element_type)
        amax = Int32(0)
        for first in cutlass.range(0, x_steps.shape[1], self.row_threads * unroll, unroll=1):
            self._load_batch(x_steps, frags, row, first, part)
            for u in cutlass.range_constexpr(unroll):
                if first + u * self.row_threads + part < x_steps.shape[1]:
                    values.store(frags[None, u].load().to(Float32))
                    amax = cutlass.max(amax, max_abs_bits(values))
        return lane_group_max(amax, _WARP)

    @cute.jit
    def _cast_row(self, x_steps: cute.Tensor, q_steps: cute.Tensor, row: Int32, part: Int32, q_scale):
        """Row ``row`` times ``q_scale`` as E4M3 bytes (saturating, RNE, NaN -> 0x7F), read in the
        same batches as :meth:`_row_amax`."""
        unroll = self.config.unroll
        frags, values = self._batch_fragments(x_steps.element_type)
        q_frag = cute.make_rmem_tensor(cute.make_layout(self.width), Float8E4M3FN)
        for first in cutlass.range(0, x_steps.shape[1], self.row_threads * unroll, unroll=1):
            self._load_batch(x_steps, frags, row, first, part)
            for u in cutlass.range_constexpr(unroll):
                v = first + u * self.row_threads + part
                if v < x_steps.shape[1]:
                    values.store(frags[None, u].load().to(Float32))
                    scale_values(values, q_scale)
                    q_frag.store(values.load().to(Float8E4M3FN))
                    cute.autovec_copy(q_frag, q_steps[row, v, None])


__all__ = ["DTYPES", "Fp8RowConfig", "Fp8RowKernel", "Fp8RowVariant"]
