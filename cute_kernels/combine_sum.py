"""Combine's weighted sum (SPEC section 9, ``torch_bindings.ep``): the k rows each token got back
from the experts, summed with its routing weights in fp32, one pass.

``rows`` (T k, D) bf16 (row ``t k + j``: slot j of token t), ``dst_index`` (T k,) int32 (< 0: the
pair was dropped and reads as a zero row), ``weights`` (T, k) fp32 -> ``out`` (T, D) bf16 with
``out[t] = bf16(((w0 y0 + w1 y1) + w2 y2) + ...)``: each product and each sum rounded once, in slot
order (``mul.rn`` / ``add.rn``, never an FMA), exactly ``reference.weighted_slot_sum``.

A thread owns 8 columns (one 16-byte vector) of one token: it reads the token's k vectors and
writes one. Grid: (column blocks of ``threads`` vectors, T). T, k and D are symbolic (D % 8 == 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32

from cute_utils.blocked import ceil_div
from cute_utils.fp8 import add_rn, mul_rn

from .base import Kernel

VECTOR = 8  # bf16 elements per 16-byte vector


@dataclass(frozen=True)
class CombineSumConfig:
    """``threads`` per CTA (each one vector of a token's row)."""

    threads: int = 128


@dataclass(frozen=True)
class CombineSumVariant:
    """The one variant: bf16 rows, fp32 weights."""

    dtype: str = "bfloat16"


def _vectors(t: cute.Tensor) -> cute.Tensor:
    """(rows, D / 8, 8) view of a row-major (rows, D) bf16 tensor."""
    rows, cols = t.shape
    stride = cute.assume(t.stride[0], divby=VECTOR)
    return cute.make_tensor(
        t.iterator, cute.make_layout((rows, cols // VECTOR, VECTOR), stride=(stride, VECTOR, 1))
    )


class CombineSumKernel(Kernel):
    """Combine's weighted sum (module docstring). Launch: ``kernel(rows, dst_index, weights, out)``."""

    name = "combine_sum"

    @classmethod
    def variants(cls) -> list[CombineSumVariant]:
        return [CombineSumVariant()]

    @classmethod
    def target_name(cls, variant: CombineSumVariant) -> str:
        return f"{cls.name}_{variant.dtype}"

    @staticmethod
    def can_implement(cols: int, *data_ptrs: int) -> bool:
        """D a multiple of 8 and the rows 16-byte aligned."""
        return cols % VECTOR == 0 and all(p % 16 == 0 for p in data_ptrs)

    @classmethod
    def fake_arguments(cls, variant: CombineSumVariant) -> tuple:
        cols = cute.sym_int(divisibility=VECTOR)
        tokens, pairs, topk = cute.sym_int(), cute.sym_int(), cute.sym_int()
        rows = cute.runtime.make_fake_compact_tensor(
            BFloat16, (pairs, cols), stride_order=(1, 0), assumed_align=16
        )
        dst_index = cute.runtime.make_fake_compact_tensor(Int32, (pairs,), assumed_align=4)
        weights = cute.runtime.make_fake_compact_tensor(
            Float32, (tokens, topk), stride_order=(1, 0), assumed_align=4
        )
        out = cute.runtime.make_fake_compact_tensor(
            BFloat16, (tokens, cols), stride_order=(1, 0), assumed_align=16
        )
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return rows, dst_index, weights, out, stream

    @cute.jit
    def __call__(
        self,
        rows: cute.Tensor,  # (T k, D) bf16 row-major: slot j of token t at row t k + j
        dst_index: cute.Tensor,  # (T k,) int32: < 0 for a dropped pair (a zero row)
        weights: cute.Tensor,  # (T, k) fp32 row-major
        out: cute.Tensor,  # (T, D) bf16 row-major
        stream,
    ):
        threads = self.config.threads
        blocks = ceil_div(out.shape[1] // VECTOR, threads)
        self.kernel(rows, dst_index, weights, out).launch(
            grid=[blocks, cutlass.max(out.shape[0], 1), 1], block=[threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, rows: cute.Tensor, dst_index: cute.Tensor, weights: cute.Tensor, out: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        block, token, _ = cute.arch.block_idx()
        rows_v, out_v = _vectors(rows), _vectors(out)
        vec = block * self.config.threads + tid
        topk = weights.shape[1]
        if vec < out_v.shape[1] and token < out.shape[0]:
            loaded = cute.make_rmem_tensor(cute.make_layout(VECTOR), BFloat16)
            acc = cute.make_rmem_tensor(cute.make_layout(VECTOR), Float32)
            for j in cutlass.range(topk):
                pair = token * topk + j
                w = weights[token, j]
                for e in cutlass.range_constexpr(VECTOR):
                    loaded[e] = BFloat16(0.0)
                if dst_index[pair] >= 0:
                    cute.autovec_copy(rows_v[pair, vec, None], loaded)
                values = loaded.load().to(Float32)
                for e in cutlass.range_constexpr(VECTOR):
                    product = mul_rn(w, values[e])
                    if j == 0:
                        acc[e] = product
                    else:
                        acc[e] = add_rn(acc[e], product)
            result = cute.make_rmem_tensor(cute.make_layout(VECTOR), BFloat16)
            result.store(acc.load().to(BFloat16))
            cute.autovec_copy(result, out_v[token, vec, None])


__all__ = ["CombineSumConfig", "CombineSumKernel", "CombineSumVariant"]
