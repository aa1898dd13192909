"""The sender side of expert-parallel dispatch in one launch: every token of this rank read once,
quantized once in registers and written to each of its k destinations (SPEC sections 2, 7 and 9;
the binding is ``torch_bindings.ep_send``, the design notes/ep-quantize-send.md).

Inputs: x (T, D) bf16 row-major, this rank's tokens; ``dst_index`` (T, k) int32, item ``t k + j``
(slot j of token t) goes to row ``dst_index % P`` of buffer ``dst_index // P`` of R destination
buffers of each kind, whose base addresses are Int64 (R,) tables on the device
(``cute_utils.peers``: symmetric-memory peers across GPUs, local tensors on one). A negative index
is a dropped slot and one at or past ``R * P`` a bad one: both are skipped. Per item, by recipe:

- ``bf16``: the row as it is into the q buffers (P, D) bf16;
- ``mxfp8``: q (P, D) e4m3 and the row's D/32 E8M0 scale bytes (1x32 blocks along D, ``floor`` or
  ``rceil``, SPEC section 2) into scale-row buffers (P, D/32);
- ``fp8_rowwise``: q (P, D) e4m3 with one scale per token row (SPEC section 7) and its dequantization
  scale ``1 / q_scale`` into scale buffers (P, 1) fp32;

and in every recipe the tag ``rank * T * k + t * k + j + 1`` into tag buffers (P, 1) int32.

Work decomposition: one CTA per token. Thread ``tid`` holds ``vectors`` 16-byte vectors (8 bf16
each) of the row, vectors ``first + u * threads + tid``, so each load instruction of a warp reads
512 contiguous bytes; all of a thread's loads are issued before any is used. A CTA's vectors form a
*chunk* of ``threads * vectors * 8`` elements (8192 with the 128 x 8 config: the whole row of every
D up to 8192). The chunk is quantized in registers and stored to each of the k destinations: the
row is read once, quantized once and stored k times. mxfp8: the 4 lanes holding a 32-element block
agree on its scale with two butterfly shuffles and the block's first lane stores the scale byte.
fp8_rowwise: the warps' maxima meet in shared memory; a row longer than a chunk is read twice (an
amax pass over its chunks, then each chunk again, from L2, for the cast). The other recipes loop
over the chunks of a longer row. Threads ``j, j + threads, ...`` write slot j's tag (fp8_rowwise:
and its scale) once per token.

All sizes (T, D, k, P, R and the scale width) are symbolic: one compile per (recipe, scaling mode
or scale rounding, config, arch). D % 8 == 0 (mxfp8: D % 32 == 0); rows and buffers 16-byte aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float8E8M0FNU, Float32, Int32, Int64, Uint8, Uint32
from cutlass.memory import SmemAllocator

from cute_utils.fp8 import fp8_quant_scale, reciprocal_rn
from cute_utils.mx import (
    BLOCK_SIZE,
    SCALING_MODES,
    bf16_halves_max_bits,
    bf16_pair_max,
    bf16x2_abs_max,
    e4m3_bf16x4,
    e8m0_scale,
    inverse_scale,
    lane_group_max,
    lane_group_max_u16x2,
    max_u16x2,
)
from cute_utils.peers import buffer_view, destination
from cute_utils.rows import cta_max

from .base import Kernel, LoadsInFlight

RECIPES = ("bf16", "mxfp8", "fp8_rowwise")
VECTOR = 8  # bf16 elements per 16-byte load
LANES_PER_BLOCK = BLOCK_SIZE // VECTOR  # lanes holding one 32-element MX block
_WARP = 32
_BUFFER_ALIGN = 16  # bytes every destination buffer's base address is aligned to


@dataclass(frozen=True)
class SendConfig:
    """``threads`` per CTA (the CTA's token), ``vectors`` 16-byte vectors per thread and chunk (all
    in flight at once; ``threads * vectors * 8`` elements of the row per chunk), ``ctas_per_sm`` the
    register cap keeps room for (``65536 / (ctas_per_sm * threads)`` registers per thread)."""

    threads: int = 128
    vectors: int = 8
    ctas_per_sm: int = 7

    def __post_init__(self) -> None:
        if self.threads % _WARP or not 0 < self.threads <= 1024:
            raise ValueError(f"threads={self.threads} must be a multiple of 32 in [32, 1024]")
        if self.vectors < 1 or self.ctas_per_sm < 1 or self.ctas_per_sm * self.threads > 2048:
            raise ValueError(f"vectors={self.vectors}, ctas_per_sm={self.ctas_per_sm}: out of range")

    @property
    def chunk_elements(self) -> int:
        """Elements of a row one chunk covers (the longest row read once in ``fp8_rowwise``)."""
        return self.threads * self.vectors * VECTOR


@dataclass(frozen=True)
class SendVariant:
    """``recipe`` (a :data:`RECIPES` name), ``scaling_mode`` (mxfp8: ``"floor"`` or ``"rceil"``) and
    ``round_pow2`` (fp8_rowwise: power-of-2 scales). The option a recipe does not use keeps its
    default, so each build has one variant."""

    recipe: str
    scaling_mode: str = "rceil"
    round_pow2: bool = True

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {self.recipe!r}")
        if self.scaling_mode not in SCALING_MODES:
            raise ValueError(f"scaling_mode must be one of {SCALING_MODES}, got {self.scaling_mode!r}")
        if self.recipe != "mxfp8" and self.scaling_mode != "rceil":
            raise ValueError(f"{self.recipe} takes no scaling_mode (leave it 'rceil')")
        if self.recipe != "fp8_rowwise" and not self.round_pow2:
            raise ValueError(f"{self.recipe} takes no round_pow2 (leave it True)")

    @property
    def quantized(self) -> bool:
        return self.recipe != "bf16"


# --- The kernel's per-CTA state (DSL values, bundled to keep argument lists short) ------------------


@dataclass(frozen=True)
class _Kind:
    """One kind of destination buffer: ``ptrs`` (Int64 (R,) base addresses, each 16-byte aligned)
    and ``own`` (this process's own buffer, viewed with the element type and layout the kernel
    stores with: every buffer of the kind has that layout)."""

    ptrs: cute.Tensor
    own: cute.Tensor

    def at(self, buffer) -> cute.Tensor:
        """Buffer ``buffer`` of this kind as a tensor."""
        return buffer_view(self.ptrs, buffer, self.own.element_type, self.own.layout, _BUFFER_ALIGN)


@dataclass(frozen=True)
class _Token:
    """This CTA's work: ``token`` t, thread ``tid``, ``dst_index`` (T, k), ``rows`` P and
    ``buffers`` R of the destinations, ``row_vectors`` (D / 8) and ``scale_cols`` (mxfp8: the
    scale-row width; else 0), ``tag_base`` (``rank * T * k + t * k + 1``: slot j's tag adds j)."""

    token: Int32
    tid: Int32
    dst_index: cute.Tensor
    rows: Int32
    buffers: Int32
    row_vectors: Int32
    scale_cols: Int32
    tag_base: Int32


def _words(t: cute.Tensor) -> cute.Tensor:
    """(rows, D / 8, n) Uint32 view of a row-major (rows, D) tensor: ``[r, v, None]`` holds the 8
    elements of vector v of row r as n words (bf16: 4, e4m3: 2). The row stride is restated as a
    multiple of n (integer arithmetic on strides drops what the fake tensor said)."""
    per_word = 32 // t.element_type.width
    n = VECTOR // per_word
    rows, cols = t.shape
    stride = cute.assume(t.stride[0] // per_word, divby=n)
    layout = cute.make_layout((rows, cols // VECTOR, n), stride=(stride, n, 1))
    return cute.make_tensor(cute.recast_ptr(t.iterator, dtype=Uint32), layout)


@cute.jit
def _load_chunk(x_w: cute.Tensor, frag: cute.Tensor, st: _Token, first: Int32, threads: cutlass.Constexpr):
    """Vectors ``first + u * threads + tid`` of the token's row (4 words of bf16 pairs each) into
    ``frag[None, u]``, every load issued before any is used; zeros past the row's end."""
    frag.fill(0)
    for u in cutlass.range_constexpr(cute.size(frag, mode=[1])):
        v = first + u * threads + st.tid
        if v < st.row_vectors:
            cute.autovec_copy(x_w[st.token, v, None], frag[None, u])


@cute.jit
def _e4m3_vector(frag: cute.Tensor, q_frag: cute.Tensor, u: cutlass.Constexpr, scale: Float32):
    """Vector u's 8 bf16 times ``scale`` as E4M3 bytes, two words into ``q_frag[None, u]``."""
    for h in cutlass.range_constexpr(2):
        q_frag[h, u] = e4m3_bf16x4(frag[2 * h, u], frag[2 * h + 1, u], scale)


@cute.jit
def _quantize_mx(frag: cute.Tensor, q_frag: cute.Tensor, s_frag: cute.Tensor, mode: cutlass.Constexpr):
    """1x32 MX quantization of a chunk (SPEC section 2). Vector u is a quarter of a 32-element block
    whose 4 lanes agree on its max through butterfly shuffles (two vectors' maxima per shuffle, as
    the two halves of one word; every lane takes part); the E4M3 bytes go to ``q_frag[None, u]``
    and the scale byte to byte ``u % 4`` of ``s_frag[u // 4]``."""
    vectors = cute.size(frag, mode=[1])
    s_frag.fill(0)
    for p in cutlass.range_constexpr((vectors + 1) // 2):
        a = bf16x2_abs_max(frag[None, 2 * p])
        b = a
        if cutlass.const_expr(2 * p + 1 < vectors):
            b = bf16x2_abs_max(frag[None, 2 * p + 1])
        pair = lane_group_max_u16x2(bf16_pair_max(a, b), LANES_PER_BLOCK)
        for h in cutlass.range_constexpr(min(2, vectors - 2 * p)):
            u = 2 * p + h
            s = e8m0_scale(Int32((pair >> (16 * h)) << 16), mode)
            _e4m3_vector(frag, q_frag, u, inverse_scale(s))
            s_frag[u // 4] = s_frag[u // 4] | (Uint32(s) << (8 * (u % 4)))


@cute.jit
def _chunk_amax(frag: cute.Tensor, amax: Uint32) -> Uint32:
    """``amax`` and the chunk's bf16 magnitudes, lane-wise per half (zeros past the row: no effect)."""
    for u in cutlass.range_constexpr(cute.size(frag, mode=[1])):
        amax = max_u16x2(amax, bf16x2_abs_max(frag[None, u]))
    return amax


# --- The kernel ----------------------------------------------------------------------------------------


class QuantizeScatterKernel(Kernel):
    """Quantize-and-scatter for EP dispatch (module docstring); launch contract in :meth:`__call__`."""

    name = "ep_send"

    @classmethod
    def loads_in_flight(cls, variant: SendVariant, config: SendConfig, cols: int) -> LoadsInFlight:
        """One token per CTA: a chunk of ``threads x vectors`` 16-byte vectors of its bf16 row, all
        loads issued before any is used, or the whole row where it is shorter."""
        row_bytes = cols * 2
        chunk = config.threads * config.vectors * VECTOR * 2
        return LoadsInFlight(
            config.threads,
            min(chunk, row_bytes),
            f"min({config.threads} thr x {config.vectors} vectors x {VECTOR} bf16 x 2 B, "
            f"{row_bytes} B row at K = {cols})",
        )

    def __init__(self, variant: SendVariant, config: SendConfig) -> None:
        super().__init__(variant, config)
        self.recipe = variant.recipe
        self.threads = config.threads
        self.warps = config.threads // _WARP
        self.vectors = config.vectors

    @classmethod
    def variants(cls) -> list[SendVariant]:
        return [
            SendVariant("bf16"),
            *(SendVariant("mxfp8", scaling_mode=mode) for mode in SCALING_MODES),
            *(SendVariant("fp8_rowwise", round_pow2=r) for r in (True, False)),
        ]

    @classmethod
    def target_name(cls, variant: SendVariant) -> str:
        if variant.recipe == "mxfp8":
            return f"{cls.name}_mxfp8_{variant.scaling_mode}"
        if variant.recipe == "fp8_rowwise":
            return f"{cls.name}_fp8_rowwise_{'pow2' if variant.round_pow2 else 'exact'}"
        return f"{cls.name}_bf16"

    @staticmethod
    def can_implement(recipe: str, cols: int, *data_ptrs: int) -> bool:
        """D a multiple of 8 (mxfp8: of 32), every data pointer (x, the own buffers) 16-byte aligned."""
        multiple = BLOCK_SIZE if recipe == "mxfp8" else VECTOR
        return cols % multiple == 0 and all(p % 16 == 0 for p in data_ptrs)

    @classmethod
    def fake_arguments(cls, variant: SendVariant) -> tuple:
        """x (T, D) bf16 and q (P, D) row-major, 16-byte aligned (D a multiple of 8, of 32 for
        mxfp8); dst_index (T, k) int32; scales (P, W): mxfp8 E8M0 scale rows, fp8_rowwise (P, 1)
        fp32, bf16 the tags again (never touched); tags (P, 1) int32; three Int64 (R,) tables; the
        rank; the env stream. T, D, P and R are shared symbols: the wrapper checks they agree."""
        make = cute.runtime.make_fake_compact_tensor
        tokens, rows, buffers = cute.sym_int(), cute.sym_int(), cute.sym_int()
        cols = cute.sym_int(divisibility=BLOCK_SIZE if variant.recipe == "mxfp8" else VECTOR)
        x = make(BFloat16, (tokens, cols), stride_order=(1, 0), assumed_align=16)
        q_type = Float8E4M3FN if variant.quantized else BFloat16
        q = make(q_type, (rows, cols), stride_order=(1, 0), assumed_align=16)
        dst_index = make(Int32, (tokens, cute.sym_int()), stride_order=(1, 0), assumed_align=4)
        tags = make(Int32, (rows, 1), stride_order=(1, 0), assumed_align=16)
        if variant.recipe == "mxfp8":
            scales = make(Float8E8M0FNU, (rows, cute.sym_int()), stride_order=(1, 0), assumed_align=16)
        elif variant.recipe == "fp8_rowwise":
            scales = make(Float32, (rows, 1), stride_order=(1, 0), assumed_align=16)
        else:  # no scales: a second tag-shaped tensor (the launcher is handed the tags again)
            scales = make(Int32, (rows, 1), stride_order=(1, 0), assumed_align=16)
        ptrs = [make(Int64, (buffers,), assumed_align=8) for _ in range(3)]
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return x, dst_index, q, ptrs[0], scales, ptrs[1], tags, ptrs[2], Int32(0), stream

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # (T, D) bf16 row-major: this rank's tokens
        dst_index: cute.Tensor,  # (T, k) int32: buffer * P + row of slot j of token t (< 0 dropped)
        q: cute.Tensor,  # (P, D) e4m3 (bf16 recipe: bf16) row-major: this process's q buffer
        q_ptrs: cute.Tensor,  # Int64 (R,) base addresses of the R q buffers
        scales: cute.Tensor,  # (P, D/32) e8m0 | (P, 1) fp32 | bf16: tags again (unused)
        scale_ptrs: cute.Tensor,  # Int64 (R,) base addresses of the R scale buffers
        tags: cute.Tensor,  # (P, 1) int32
        tag_ptrs: cute.Tensor,  # Int64 (R,) base addresses of the R tag buffers
        rank: Int32,  # this rank: tags are rank * T * k + item + 1
        stream,
    ):
        self.kernel(x, dst_index, q, q_ptrs, scales, scale_ptrs, tags, tag_ptrs, rank).launch(
            grid=[cutlass.max(x.shape[0], 1), 1, 1],
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.ctas_per_sm,
            # little shared memory (fp8_rowwise's warp maxima); given, so no device is queried
            preferred_smem_carveout=0,
        )

    @cute.kernel
    def kernel(self, x, dst_index, q, q_ptrs, scales, scale_ptrs, tags, tag_ptrs, rank: Int32):
        tid, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        smem = SmemAllocator()
        warp_max = smem.allocate_tensor(Int32, cute.make_layout(self.warps), 16)
        tokens, topk = dst_index.shape
        scale_cols = scales.shape[1] if cutlass.const_expr(self.recipe == "mxfp8") else Int32(0)
        st = _Token(
            token,
            tid,
            dst_index,
            q.shape[0],
            q_ptrs.shape[0],
            x.shape[1] // VECTOR,
            scale_cols,
            rank * tokens * topk + token * topk + 1,
        )
        q_kind = _Kind(q_ptrs, _words(q))
        if cutlass.const_expr(self.recipe == "mxfp8"):  # scale bytes stored as Uint8
            scales = cute.make_tensor(cute.recast_ptr(scales.iterator, dtype=Uint8), scales.layout)
        s_kind = _Kind(scale_ptrs, scales)
        t_kind = _Kind(tag_ptrs, tags)
        if token < tokens:  # uniform over the CTA (one token per CTA): the barrier below is safe
            x_w = _words(x)
            if cutlass.const_expr(self.recipe == "fp8_rowwise"):
                scale = self._send_fp8_rowwise(x_w, st, q_kind, warp_max)
                self._send_tags(st, t_kind, s_kind, scale)
            else:
                self._send_chunks(x_w, st, q_kind, s_kind)
                self._send_tags(st, t_kind, s_kind, Float32(0.0))

    def _fragments(self):
        """Registers of one chunk, as words: the bf16 loads (4 per vector), the E4M3 bytes (2 per
        vector), the MX scale bytes (4 per word)."""
        frag = cute.make_rmem_tensor(cute.make_layout((4, self.vectors), stride=(1, 4)), Uint32)
        q_frag = cute.make_rmem_tensor(cute.make_layout((2, self.vectors), stride=(1, 2)), Uint32)
        s_frag = cute.make_rmem_tensor(cute.make_layout((self.vectors + 3) // 4), Uint32)
        return frag, q_frag, s_frag

    @cute.jit
    def _send_chunks(self, x_w: cute.Tensor, st: _Token, q_kind: _Kind, s_kind: _Kind):
        """bf16 and mxfp8: each chunk of the row loaded, quantized (mxfp8) and sent."""
        frag, q_frag, s_frag = self._fragments()
        chunk = self.threads * self.vectors
        for first in cutlass.range(0, st.row_vectors, chunk, unroll=1):
            _load_chunk(x_w, frag, st, first, self.threads)
            if cutlass.const_expr(self.recipe == "mxfp8"):
                _quantize_mx(frag, q_frag, s_frag, self.variant.scaling_mode)
                self._store_chunk(st, q_kind, s_kind, q_frag, s_frag, first)
            else:
                self._store_chunk(st, q_kind, s_kind, frag, s_frag, first)

    @cute.jit
    def _send_fp8_rowwise(self, x_w: cute.Tensor, st: _Token, q_kind: _Kind, warp_max: cute.Tensor):
        """fp8_rowwise: the row's amax (chunk 0 stays in registers; a longer row is re-read for the
        cast), then each chunk cast and sent. Returns the dequantization scale ``1 / q_scale``
        (1.0 for a row of no elements)."""
        frag, q_frag, s_frag = self._fragments()
        chunk = self.threads * self.vectors
        _load_chunk(x_w, frag, st, Int32(0), self.threads)
        halves = _chunk_amax(frag, Uint32(0))
        for first in cutlass.range(chunk, st.row_vectors, chunk, unroll=1):
            _load_chunk(x_w, frag, st, first, self.threads)
            halves = _chunk_amax(frag, halves)
        amax = cta_max(lane_group_max(bf16_halves_max_bits(halves), _WARP), warp_max, st.tid, self.warps)
        q_scale = fp8_quant_scale(amax, self.variant.round_pow2)
        for first in cutlass.range(0, st.row_vectors, chunk, unroll=1):
            if st.row_vectors > chunk:
                _load_chunk(x_w, frag, st, first, self.threads)
            for u in cutlass.range_constexpr(self.vectors):
                _e4m3_vector(frag, q_frag, u, q_scale)
            self._store_chunk(st, q_kind, None, q_frag, s_frag, first)
        scale = reciprocal_rn(q_scale)
        if st.row_vectors == 0:
            scale = Float32(1.0)
        return scale

    @cute.jit
    def _store_chunk(self, st: _Token, q_kind: _Kind, s_kind, q_frag, s_frag, first: Int32):
        """The chunk's q vectors (and mxfp8 scale bytes, from each block's first lane) to every
        valid destination of the token."""
        for j in cutlass.range(st.dst_index.shape[1], unroll=1):
            valid, buffer, row = destination(st.dst_index[st.token, j], st.rows, st.buffers)
            if valid:
                q_dst = q_kind.at(buffer)
                for u in cutlass.range_constexpr(self.vectors):
                    v = first + u * self.threads + st.tid
                    if v < st.row_vectors:
                        cute.autovec_copy(q_frag[None, u], q_dst[row, v, None])
                if cutlass.const_expr(self.recipe == "mxfp8"):
                    s_dst = s_kind.at(buffer)
                    for u in cutlass.range_constexpr(self.vectors):
                        v = first + u * self.threads + st.tid
                        col = v // LANES_PER_BLOCK
                        if st.tid % LANES_PER_BLOCK == 0 and v < st.row_vectors and col < st.scale_cols:
                            s_dst[row, col] = Uint8((s_frag[u // 4] >> (8 * (u % 4))) & 0xFF)

    @cute.jit
    def _send_tags(self, st: _Token, t_kind: _Kind, s_kind: _Kind, scale: Float32):
        """Slot j's tag (fp8_rowwise: and the row's scale) to its destination, by threads
        ``j mod threads``."""
        for j in cutlass.range(st.tid, st.dst_index.shape[1], self.threads, unroll=1):
            valid, buffer, row = destination(st.dst_index[st.token, j], st.rows, st.buffers)
            if valid:
                t_kind.at(buffer)[row, 0] = st.tag_base + j
                if cutlass.const_expr(self.recipe == "fp8_rowwise"):
                    s_kind.at(buffer)[row, 0] = scale


__all__ = ["RECIPES", "VECTOR", "QuantizeScatterKernel", "SendConfig", "SendVariant"]
