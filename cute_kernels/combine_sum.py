"""Combine's weighted sum (SPEC section 9, ``torch_bindings.ep``): the k rows each token got back
from the experts, summed with its routing weights in fp32, one pass.

``rows`` (T k, D) bf16 (row ``t k + j``: slot j of token t), ``dst_index`` (T k,) int32 (< 0: the
pair was dropped and reads as a zero row), ``weights`` (T, k) fp32 -> ``out`` (T, D) bf16 with
``out[t] = bf16(((w0 y0 + w1 y1) + w2 y2) + ...)``: each product and each sum rounded once, in slot
order (``mul.rn`` / ``add.rn``, never an FMA), exactly ``reference.weighted_slot_sum``.

A thread owns ``vectors`` 16-byte vectors (8 columns each, ``threads`` vectors apart: each load
instruction of a warp is coalesced) of one token: per slot it loads them together, and it writes
them once. Grid: (T, column blocks of ``threads * vectors`` vectors). T, k and D are symbolic
(D % 8 == 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32

from cute_utils.blocked import ceil_div
from cute_utils.fp8 import add_rn, mul_rn

from .base import Kernel, LoadsInFlight

VECTOR = 8  # bf16 elements per 16-byte vector


@dataclass(frozen=True)
class CombineSumConfig:
    """``threads`` per CTA, ``vectors`` 16-byte vectors of a token's row per thread (loaded
    together: the bytes in flight), ``ctas_per_sm`` the residency the register cap keeps room for
    (4 vectors took 66 registers, 7 CTAs per SM, 0.9 of B200's bytes in flight on paper)."""

    threads: int = 128
    vectors: int = 4
    ctas_per_sm: int = 8


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
    def loads_in_flight(
        cls, variant: CombineSumVariant, config: CombineSumConfig, cols: int
    ) -> LoadsInFlight:
        """``vectors`` 16-byte vectors per thread: a slot's loads are used before the next slot's."""
        return LoadsInFlight(
            config.threads,
            config.threads * config.vectors * VECTOR * 2,
            f"{config.threads} thr x {config.vectors} vectors x {VECTOR} bf16 x 2 B (one slot at a time)",
        )

    def __init__(self, variant: CombineSumVariant, config: CombineSumConfig) -> None:
        super().__init__(variant, config)
        self.threads = config.threads

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
        blocks = ceil_div(out.shape[1] // VECTOR, threads * self.config.vectors)
        # Tokens along x (up to 2^31 - 1 CTAs; y stops at 65535), column blocks along y.
        self.kernel(rows, dst_index, weights, out).launch(
            grid=[cutlass.max(out.shape[0], 1), blocks, 1],
            block=[threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.ctas_per_sm,
            preferred_smem_carveout=100,
        )

    @cute.kernel
    def kernel(self, rows: cute.Tensor, dst_index: cute.Tensor, weights: cute.Tensor, out: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        token, block, _ = cute.arch.block_idx()
        threads, vectors = self.config.threads, self.config.vectors
        rows_v, out_v = _vectors(rows), _vectors(out)
        first = block * threads * vectors + tid
        topk = weights.shape[1]
        row_vectors = out_v.shape[1]
        loaded = cute.make_rmem_tensor(cute.make_layout((VECTOR, vectors)), BFloat16)
        acc = cute.make_rmem_tensor(cute.make_layout((VECTOR, vectors)), Float32)
        if token < out.shape[0]:
            for j in cutlass.range(topk):
                pair = token * topk + j
                w = weights[token, j]
                kept = dst_index[pair] >= 0
                for v in cutlass.range_constexpr(vectors):
                    for e in cutlass.range_constexpr(VECTOR):
                        loaded[e, v] = BFloat16(0.0)
                    if kept and first + v * threads < row_vectors:
                        cute.autovec_copy(rows_v[pair, first + v * threads, None], loaded[None, v])
                values = loaded.load().to(Float32)
                for i in cutlass.range_constexpr(VECTOR * vectors):
                    product = mul_rn(w, values[i])
                    if j == 0:
                        acc[i] = product
                    else:
                        acc[i] = add_rn(acc[i], product)
            result = cute.make_rmem_tensor(cute.make_layout((VECTOR, vectors)), BFloat16)
            result.store(acc.load().to(BFloat16))
            for v in cutlass.range_constexpr(vectors):
                if first + v * threads < row_vectors:
                    cute.autovec_copy(result[None, v], out_v[token, first + v * threads, None])


__all__ = ["CombineSumConfig", "CombineSumKernel", "CombineSumVariant"]
