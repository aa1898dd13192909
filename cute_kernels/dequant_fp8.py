"""FP8 rowwise dequantization bounded by row groups: ``DequantFp8RowsKernel``.

``q`` (M, K) E4M3 row-major and its row scales (M,) fp32 (SPEC section 7's dequantization
multipliers) -> ``x`` (M, K) bf16, ``x[r, k] = bf16(fp32(q[r, k]) * scales[r])``: the E4M3 value
(exact in fp32) times the scale, one ``mul.rn.f32``, rounded to bf16 to nearest even (a NaN gives
the canonical 0x7FFF; exact for power-of-2 scales unless the product leaves bf16's range). Only the
rows below the last group end, ``clamp(ends[G - 1], 0, M)`` read on the device, are written: an
expert-parallel dispatch's tokens sit in a tensor of a static worst-case row count, most of it past
the last group (notes/bounded-row-passes.md).

One warp per row, a CTA of ``threads / 32`` consecutive rows; a warp whose row is past the bound
(a CTA whose rows all are) exits at once. A lane takes the row's steps ``lane, lane + 32, ...`` in
batches of ``unroll`` steps, every load of a batch in flight before any is used. Variants:
``vector`` (K % 16 == 0, 16-byte aligned rows): 16 elements per step (one 16-byte load of q, two
16-byte stores of x); otherwise one element per step, any K. All sizes are symbolic.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float32, Int32

from cute_kernels.op_specs import DEQUANTIZE_FP8_ROWS
from cute_utils.blocked import ceil_div
from cute_utils.fp8 import mul_rn
from cute_utils.groups import clamped_end
from cute_utils.rows import row_steps

from .base import Kernel, LoadsInFlight

VECTOR = 16  # E4M3 elements per 16-byte load of q
_WARP = 32


@dataclass(frozen=True)
class DequantFp8RowsConfig:
    """``threads`` per CTA (one row per warp), ``unroll`` steps per lane in flight at once,
    ``ctas_per_sm`` the residency the register cap keeps room for."""

    threads: int = 256
    unroll: int = 8
    ctas_per_sm: int = 4

    def __post_init__(self) -> None:
        if self.threads % _WARP or not 0 < self.threads <= 1024:
            raise ValueError(f"threads={self.threads} must be a multiple of 32 in [32, 1024]")
        if self.unroll < 1 or self.ctas_per_sm < 1 or self.ctas_per_sm * self.threads > 2048:
            raise ValueError(f"unroll={self.unroll}, ctas_per_sm={self.ctas_per_sm}: out of range")


@dataclass(frozen=True)
class DequantFp8RowsVariant:
    """``vector``: 16-element steps (K % 16 == 0, q's and x's rows 16-byte aligned); else one
    element per step."""

    vector: bool = True


class DequantFp8RowsKernel(Kernel):
    """Bounded row dequantization (module docstring). Launch: ``kernel(q, scales, ends, x)``."""

    name = "dequantize_fp8_rows"

    @classmethod
    def loads_in_flight(
        cls, variant: DequantFp8RowsVariant, config: DequantFp8RowsConfig, cols: int
    ) -> LoadsInFlight:
        """One batch of ``unroll`` steps per lane of each warp's row (1-byte E4M3 elements), capped
        by the row's steps."""
        width = VECTOR if variant.vector else 1
        rows = config.threads // _WARP
        steps = min(_WARP * config.unroll, -(-cols // width))
        return LoadsInFlight(
            config.threads,
            rows * steps * width,
            f"{rows} rows x min({_WARP} lanes x {config.unroll} unroll, K = {cols} / {width}) steps "
            f"x {width} E4M3 x 1 B",
        )

    def __init__(self, variant: DequantFp8RowsVariant, config: DequantFp8RowsConfig) -> None:
        super().__init__(variant, config)
        self.width = VECTOR if variant.vector else 1
        self.warps = config.threads // _WARP

    @classmethod
    def variants(cls) -> list[DequantFp8RowsVariant]:
        return [DequantFp8RowsVariant(True), DequantFp8RowsVariant(False)]

    @classmethod
    def target_name(cls, variant: DequantFp8RowsVariant) -> str:
        return f"{cls.name}_{'v16' if variant.vector else 'v1'}"

    @staticmethod
    def can_implement(cols: int, vector: bool, *data_ptrs: int) -> bool:
        """Any K for the element variant; the vector one needs K % 16 == 0 and 16-byte pointers."""
        return not vector or (cols % VECTOR == 0 and DEQUANTIZE_FP8_ROWS.limits.accepts(ptrs=data_ptrs))

    @classmethod
    def fake_arguments(cls, variant: DequantFp8RowsVariant) -> tuple:
        """q (M, K) E4M3 and x (M, K) bf16 row-major (vector: K % 16 == 0, 16-byte aligned), scales
        fp32 (M,), ends int32 (G,), the env stream."""
        make = cute.runtime.make_fake_compact_tensor
        rows, cols = cute.sym_int(), cute.sym_int(divisibility=VECTOR if variant.vector else 1)
        q = make(Float8E4M3FN, (rows, cols), stride_order=(1, 0), assumed_align=16 if variant.vector else 1)
        scales = make(Float32, (rows,), assumed_align=4)
        ends = make(Int32, (cute.sym_int(),), assumed_align=4)
        x = make(BFloat16, (rows, cols), stride_order=(1, 0), assumed_align=16 if variant.vector else 2)
        return q, scales, ends, x, cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)

    @cute.jit
    def __call__(
        self,
        q: cute.Tensor,  # (M, K) Float8E4M3FN row-major
        scales: cute.Tensor,  # (M,) fp32: the rows' dequantization multipliers
        ends: cute.Tensor,  # (G,) int32 row-group end offsets: rows < clamp(ends[G-1], 0, M) written
        x: cute.Tensor,  # (M, K) bf16 row-major: rows past the bound left as they are
        stream,
    ):
        self.kernel(q, scales, ends, x).launch(
            grid=[cutlass.max(ceil_div(q.shape[0], self.warps), 1), 1, 1],
            block=[self.config.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.ctas_per_sm,
            preferred_smem_carveout=0,  # no shared memory; given, so no device is queried
        )

    @cute.kernel
    def kernel(self, q: cute.Tensor, scales: cute.Tensor, ends: cute.Tensor, x: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        row = cta * self.warps + tid // _WARP
        lane = tid % _WARP
        if row < clamped_end(ends, ends.shape[0] - 1, q.shape[0]):
            self._row(row_steps(q, self.width), scales[row], row_steps(x, self.width), row, lane)

    @cute.jit
    def _row(self, q_steps: cute.Tensor, scale: Float32, x_steps: cute.Tensor, row: Int32, lane: Int32):
        """Row ``row`` of q times ``scale`` into x, in batches of ``unroll`` steps per lane."""
        unroll, width = self.config.unroll, self.width
        steps = q_steps.shape[1]
        frags = cute.make_rmem_tensor(cute.make_layout((width, unroll), stride=(1, width)), Float8E4M3FN)
        values = cute.make_rmem_tensor(width, Float32)
        out = cute.make_rmem_tensor(width, BFloat16)
        for first in cutlass.range(0, steps, _WARP * unroll, unroll=1):
            for u in cutlass.range_constexpr(unroll):  # every load of the batch before any use
                if first + u * _WARP + lane < steps:
                    cute.autovec_copy(q_steps[row, first + u * _WARP + lane, None], frags[None, u])
            for u in cutlass.range_constexpr(unroll):
                v = first + u * _WARP + lane
                if v < steps:
                    values.store(frags[None, u].load().to(Float32))
                    for i in cutlass.range_constexpr(width):
                        values[i] = mul_rn(values[i], scale)
                    out.store(values.load().to(BFloat16))
                    cute.autovec_copy(out, x_steps[row, v, None])


__all__ = ["VECTOR", "DequantFp8RowsConfig", "DequantFp8RowsKernel", "DequantFp8RowsVariant"]
