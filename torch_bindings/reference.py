"""Pure-PyTorch reference of the cute-kernels contract (SPEC.md): the spec in code.

Every kernel must match these functions bit for bit. They run on CPU and CUDA tensors, are
vectorized (Python loops only over large row chunks), and are allowed to synchronize the host with
the device (they read group offsets to size and validate their work); the kernel path is not.

Layout summary (see SPEC sections 2-4):

* MX numerics: blocks of 32 elements, one E8M0 scale byte ``s`` per block, data
  ``q = e4m3(x_fp32 * 2^(127 - s))`` (RNE, saturating to +-448, NaN -> 0x7F).
* ``"1x32"``: blocks along the last dim; ``"32x1"``: blocks of 32 consecutive rows.
* Blocked scale layout: 128x4 tiles of 512 bytes (``blocked_offsets``), optionally grouped along
  rows (M-groups) or along scale columns (K-groups).
* Token-group padding: each group padded to a multiple of ``alignment`` rows.

Building blocks reused by tests and other modules: ``e8m0_scale_bits``, ``inverse_scale``,
``quantize_blocks``, ``dequantize_blocks``, ``blocked_offsets``, ``to_blocked``,
``swizzle_m_groups``, ``swizzle_k_groups``, ``padded_group_offsets``, ``padded_rows``,
``check_group_end_offsets``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cute_kernels.op_specs import padded_rows  # SPEC section 4's padded row count, stated once
from cute_utils.constants import (
    BLOCK_SIZE,
    FP8_POW2_MASK,
    SILU_TABLE_FIRST,
    SILU_TABLE_SPAN,
    SWIGLU_BF16_NAN_BITS,
    SWIGLU_CLAMP,
    SWIGLU_EXP_COEFF_BITS,
    SWIGLU_LN2_HI_BITS,
    SWIGLU_LN2_LO_BITS,
    SWIGLU_LOG2E_BITS,
    TILE_COLS,
    TILE_ROWS,
    f32_of_bits,
)

from . import checks, contract

__all__ = [
    "BLOCK_SIZE",
    "E4M3_MAX",
    "E4M3_NAN_BITS",
    "E8M0_NAN",
    "INV_448_BITS",
    "TILE_BYTES",
    "TILE_COLS",
    "TILE_ROWS",
    "BF16_NAN_BITS",
    "bf16_rne",
    "blocked_offsets",
    "blocked_shape",
    "check_group_end_offsets",
    "dequantize_blocks",
    "dequantize_fp8_rows",
    "e4m3_saturated",
    "e8m0_scale_bits",
    "fp8_quant_scale",
    "grouped_gemm_fp8_rowwise_reference",
    "inverse_scale",
    "pad_and_quantize_fp8_2d_cols",
    "pad_and_quantize_fp8_2d_dual",
    "pad_and_quantize_mxfp8_2d",
    "pad_token_groups",
    "padded_group_offsets",
    "padded_rows",
    "quantize_blocks",
    "quantize_fp8_2d",
    "quantize_fp8_2d_dual",
    "quantize_fp8_3d",
    "quantize_fp8_3d_dual",
    "quantize_mxfp8_2d",
    "quantize_mxfp8_2d_dual",
    "quantize_mxfp8_3d",
    "bf16_canonical",
    "silu_backward_fp32",
    "silu_fp32",
    "silu_parts",
    "silu_table",
    "swiglu",
    "swiglu_backward",
    "swiglu_backward_quantize_fp8",
    "swiglu_quantize_fp8",
    "swizzle_k_groups",
    "swizzle_m_groups",
    "swizzle_scales",
    "to_blocked",
    "unpad_token_groups",
]

E4M3_MAX = 448.0
"""Largest finite FP8 E4M3 (fn) value; quantized data saturates to +-E4M3_MAX."""
E4M3_NAN_BITS = 0x7F
"""The one NaN byte the quantizers emit (also for -NaN inputs)."""
E8M0_NAN = 255
"""E8M0 scale byte for a block whose max |x| is NaN or Inf."""
BF16_NAN_BITS = 0x7FFF
"""The one NaN the bf16 conversions of the kernels give (``cvt.rn.bf16x2.f32``), whatever the input NaN."""
INV_448_BITS = 0x3B124925
"""Bit pattern of fp32(1/448), the constant of the rceil scale rule."""
TILE_BYTES = TILE_ROWS * TILE_COLS
"""A blocked-layout tile: 128 scale rows x 4 scale columns stored as 512 consecutive bytes."""

_CHUNK_ELEMS = 1 << 24  # elements per quantization chunk: bounds the fp32 temporaries (64 MiB each)

BITS_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _round_up(v, m: int):
    """``m * ceil(v / m)`` for a non-negative int or integer tensor ``v``."""
    return (v + (m - 1)) // m * m


def _as_bits(t: Tensor) -> Tensor:
    """View ``t`` as a same-size integer dtype (bit-exact data movement, works for fp8 dtypes)."""
    return t.view(BITS_DTYPES[t.element_size()])


def _e8m0(bits: Tensor) -> Tensor:
    return bits.view(torch.float8_e8m0fnu)


def _u8(scales: Tensor) -> Tensor:
    return scales.view(torch.uint8) if scales.dtype == torch.float8_e8m0fnu else scales


# ----------------------------------------------------------------------------------------------
# MX numerics (SPEC section 2)
# ----------------------------------------------------------------------------------------------


def _exponent_field(v: Tensor) -> Tensor:
    """Biased exponent field (bits 30..23) of fp32 ``v``, as int32."""
    return (v.view(torch.int32) >> 23) & 0xFF


def _mantissa_field(v: Tensor) -> Tensor:
    """Mantissa field (bits 22..0) of fp32 ``v``, as int32."""
    return v.view(torch.int32) & 0x7FFFFF


def e8m0_scale_bits(amax: Tensor, mode: str) -> Tensor:
    """E8M0 scale byte of each block from its fp32 max magnitude ``amax`` (any shape, >= 0 or NaN/Inf).

    * ``"floor"``: ``s = max(E(a) - 8, 0)``.
    * ``"rceil"``: ``d = fp32(a * fp32(1/448))`` (a product; subnormal ``d`` is kept), then
      ``s = Mant(d) > 0x400000`` if ``E(d) == 0`` else ``E(d) + (Mant(d) != 0)`` (255 at the top).
    * ``a`` NaN or Inf gives 255 in both modes.

    Returns a uint8 tensor of ``amax``'s shape.
    """
    if amax.dtype != torch.float32:
        raise TypeError(f"e8m0_scale_bits: amax must be torch.float32, got {amax.dtype}")
    if mode == "floor":
        s = (_exponent_field(amax) - 8).clamp_min(0)
    elif mode == "rceil":
        inv_448 = torch.tensor(INV_448_BITS, dtype=torch.int32).view(torch.float32).to(amax.device)
        d = amax * inv_448  # one IEEE fp32 multiply (CPU/CUDA torch kernels keep subnormals)
        e, m = _exponent_field(d), _mantissa_field(d)
        s = torch.where(e == 0, (m > 0x400000).to(torch.int32), e + (m != 0).to(torch.int32))
    else:
        raise ValueError(f"e8m0_scale_bits: mode must be 'floor' or 'rceil', got {mode!r}")
    s = torch.where(torch.isfinite(amax), s, E8M0_NAN)
    return s.to(torch.uint8)


def inverse_scale(s: Tensor) -> Tensor:
    """``2^(127 - s)`` as an exact fp32, built from bits, for E8M0 bytes ``s`` (uint8 or E8M0).

    s in 0..253 -> normal ``(254 - s) << 23``; s = 254 -> 2^-127 (the subnormal 0x00400000);
    s = 255 -> NaN (0x7FC00000).
    """
    s32 = _u8(s).to(torch.int32)
    special = torch.where(s32 == 254, 0x00400000, 0x7FC00000).to(torch.int32)  # 2^-127 or NaN
    bits = torch.where(s32 <= 253, (254 - s32) << 23, special)
    return bits.view(torch.float32)


def quantize_blocks(x_blocks: Tensor, s: Tensor, dim: int = -1) -> Tensor:
    """E4M3 data of fp32 ``x_blocks`` given the per-block scale bytes ``s`` (uint8 or E8M0).

    ``s`` has ``x_blocks``'s shape with dimension ``dim`` (the 32 elements of a block) removed.
    ``q = e4m3(x * 2^(127 - s))``: exact fp32 product, clamp to [-448, 448] (saturation), RNE cast;
    NaN (including -NaN, and everything in an s = 255 block) becomes byte 0x7F; -0 stays 0x80.
    Returns a ``torch.float8_e4m3fn`` tensor of ``x_blocks``'s shape.
    """
    if x_blocks.dtype != torch.float32:
        raise TypeError(f"quantize_blocks: x_blocks must be torch.float32, got {x_blocks.dtype}")
    return e4m3_saturated(x_blocks * inverse_scale(s).unsqueeze(dim))


def e4m3_saturated(y: Tensor) -> Tensor:
    """fp32 ``y`` -> ``float8_e4m3fn``: clamp to [-448, 448], round to nearest even; NaN (also -NaN)
    -> byte 0x7F; -0 stays 0x80. ``y`` is clamped in place."""
    is_nan = torch.isnan(y)
    y.clamp_(-E4M3_MAX, E4M3_MAX)
    bits = y.to(torch.float8_e4m3fn).view(torch.uint8)
    bits = torch.where(is_nan, E4M3_NAN_BITS, bits)
    return bits.view(torch.float8_e4m3fn)


def dequantize_blocks(q: Tensor, s: Tensor, dim: int = -1) -> Tensor:
    """fp32 ``q * 2^(s - 127)`` (the SPEC's dequantization); ``s`` as in ``quantize_blocks``."""
    s32 = _u8(s).to(torch.float32).unsqueeze(dim)
    return q.to(torch.float32) * torch.exp2(s32 - 127.0)


def _quantize_rows(x2: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    """1x32 blocks along the last dim of a contiguous (R, K) tensor.

    Returns q (R, K) float8_e4m3fn row-major and s (R, K/32) uint8.
    """
    r, k = x2.shape
    kb = k // BLOCK_SIZE
    q = torch.empty((r, k), dtype=torch.float8_e4m3fn, device=x2.device)
    s = torch.empty((r, kb), dtype=torch.uint8, device=x2.device)
    if r == 0 or k == 0:
        return q, s
    step = max(1, _CHUNK_ELEMS // k)
    for r0 in range(0, r, step):
        xb = x2[r0 : r0 + step].to(torch.float32).view(-1, kb, BLOCK_SIZE)
        sb = e8m0_scale_bits(xb.abs().amax(dim=-1), mode)
        q[r0 : r0 + step] = quantize_blocks(xb, sb, dim=-1).view(-1, k)
        s[r0 : r0 + step] = sb
    return q, s


def _quantize_cols(x2: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    """32x1 blocks (32 consecutive rows) of a contiguous (R, K) tensor, R % 32 == 0.

    Returns q (R, K) float8_e4m3fn **row-major** and s (R/32, K) uint8 (block-row major).
    """
    r, k = x2.shape
    rb = r // BLOCK_SIZE
    q = torch.empty((r, k), dtype=torch.float8_e4m3fn, device=x2.device)
    s = torch.empty((rb, k), dtype=torch.uint8, device=x2.device)
    if r == 0 or k == 0:
        return q, s
    x3 = x2.view(rb, BLOCK_SIZE, k)
    q3 = q.view(rb, BLOCK_SIZE, k)
    step = max(1, _CHUNK_ELEMS // (BLOCK_SIZE * k))
    for b0 in range(0, rb, step):
        xb = x3[b0 : b0 + step].to(torch.float32)
        sb = e8m0_scale_bits(xb.abs().amax(dim=1), mode)
        q3[b0 : b0 + step] = quantize_blocks(xb, sb, dim=1)
        s[b0 : b0 + step] = sb
    return q, s


# ----------------------------------------------------------------------------------------------
# Blocked scale layout (SPEC section 3)
# ----------------------------------------------------------------------------------------------


def blocked_shape(rows: int, cols: int) -> tuple[int, int]:
    """``(Rp, Cp) = (128*ceil(rows/128), 4*ceil(cols/4))``, the blocked layout's padded shape."""
    return _round_up(rows, TILE_ROWS), _round_up(cols, TILE_COLS)


def blocked_offsets(rows: int, cols: int, device: torch.device | str | None = None) -> Tensor:
    """Flat byte offset of every scale (r, c) of a (rows, cols) matrix in its blocked layout.

    ``offset(r, c) = ((r // 128) * (Cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
    + c % 4`` with ``Cp = 4 * ceil(cols / 4)``. Returns int64 (rows, cols). The kernels' description
    of the same layout is ``cute_utils.blocked.blocked_layout`` (a CuTe layout); tests hold this
    arithmetic to it at every (r, c) (tests/cute_utils/test_blocked_layout.py).
    """
    _, cp = blocked_shape(rows, cols)
    r = torch.arange(rows, dtype=torch.int64, device=device).unsqueeze(1)
    c = torch.arange(cols, dtype=torch.int64, device=device).unsqueeze(0)
    return (
        ((r // TILE_ROWS) * (cp // TILE_COLS) + c // TILE_COLS) * TILE_BYTES
        + (r % 32) * 16
        + ((r % TILE_ROWS) // 32) * 4
        + c % TILE_COLS
    )


def to_blocked(scales: Tensor) -> Tensor:
    """Plain blocked layout of a scale matrix (..., R, C) (uint8 or E8M0; leading dims = experts).

    Zero-pads to (Rp, Cp) and stores the 128x4 tiles row-block-major, each tile as 32 rows of 16
    bytes where byte ``(r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4`` holds S[r, c].
    Returns a contiguous ``torch.float8_e8m0fnu`` tensor (..., Rp, Cp) whose storage is that order.
    """
    bits = _u8(scales)
    *lead, r, c = bits.shape
    rp, cp = blocked_shape(r, c)
    padded = bits.new_zeros((*lead, rp, cp))
    padded[..., :r, :c] = bits
    n = len(lead)
    # (row block, row quarter, row % 32, col block, col % 4) -> (row block, col block, row % 32,
    # row quarter, col % 4): exactly the offset formula of ``blocked_offsets``.
    tiles = padded.view(*lead, rp // TILE_ROWS, 4, 32, cp // TILE_COLS, TILE_COLS)
    perm = (*range(n), n, n + 3, n + 2, n + 1, n + 4)
    return _e8m0(tiles.permute(perm).reshape(*lead, rp, cp))


def _starts(ends: Tensor) -> Tensor:
    return torch.cat([ends.new_zeros(1), ends[:-1]])


def _padded_prefix(ends: Tensor, unit: int) -> tuple[Tensor, Tensor]:
    """Group sizes rounded up to ``unit`` and their exclusive prefix sum: ``(padded_start, sizes)``."""
    sizes = _round_up(ends - _starts(ends), unit)
    return torch.cumsum(sizes, 0) - sizes, sizes


def _group_of(positions: Tensor, ends: Tensor) -> Tensor:
    """Index of the group owning each position (positions < ends[-1]; empty groups own nothing)."""
    return torch.searchsorted(ends, positions, right=True)


def swizzle_m_groups(scales: Tensor, ends: Tensor) -> Tensor:
    """M-groups blocked layout of S (R, C): groups of rows with (validated) end offsets ``ends``.

    Group g's rows ``[ends[g-1], ends[g])`` are laid out as their own blocked matrix starting at row
    ``P_g = sum_{i<g} 128*ceil(n_i/128)`` (flat byte ``P_g * Cp``). Returns E8M0 (R + 128*G, Cp); every
    byte not covered by a group (padding, rows past ``ends[-1]``, the tail from ``P_G * Cp``) is 0.
    """
    bits = _u8(scales)
    r, c = bits.shape
    ends = ends.to(device=bits.device, dtype=torch.int64)
    g_count = ends.numel()
    _, cp = blocked_shape(r, c)
    out_rows = r + TILE_ROWS * g_count
    starts = _starts(ends)
    p, _ = _padded_prefix(ends, TILE_ROWS)
    # Place each grouped row at its row in "group-padded" space; since every P_g is a multiple of
    # 128, the plain blocked layout of that matrix is the M-groups layout.
    last = int(ends[-1])
    rows = torch.arange(last, dtype=torch.int64, device=bits.device)
    g = _group_of(rows, ends)
    placed = bits.new_zeros((_round_up(out_rows, TILE_ROWS), c))
    placed.index_copy_(0, p[g] + rows - starts[g], bits[:last])
    flat = to_blocked(placed).view(torch.uint8).reshape(-1)[: out_rows * cp]
    return _e8m0(flat.view(out_rows, cp))


def swizzle_k_groups(scales: Tensor, kends: Tensor) -> Tensor:
    """K-groups blocked layout of S (R, C): groups of scale columns with (validated) end offsets.

    Group g's columns ``[kend[g-1], kend[g])`` are laid out as the blocked matrix S[:, group]
    (Rp x 4*ceil(k_g/4)) stored contiguously from flat byte ``Rp * Q_g``,
    ``Q_g = sum_{i<g} 4*ceil(k_i/4)``. Returns E8M0 (Rp, C + 4*G); uncovered bytes are 0.
    """
    bits = _u8(scales)
    r, c = bits.shape
    kends = kends.to(device=bits.device, dtype=torch.int64)
    g_count = kends.numel()
    rp, _ = blocked_shape(r, c)
    out_cols = c + TILE_COLS * g_count
    kstarts = _starts(kends)
    q, kp = _padded_prefix(kends, TILE_COLS)
    last = int(kends[-1])
    cols = torch.arange(last, dtype=torch.int64, device=bits.device)
    g = _group_of(cols, kends)
    cl = cols - kstarts[g]  # column inside its group
    col_part = (rp * q[g] + (cl // TILE_COLS) * TILE_BYTES + cl % TILE_COLS).unsqueeze(0)
    row_block_bytes = ((kp[g] // TILE_COLS) * TILE_BYTES).unsqueeze(0)  # one row block of group g
    rr = torch.arange(r, dtype=torch.int64, device=bits.device).unsqueeze(1)
    row_part = (rr % 32) * 16 + ((rr % TILE_ROWS) // 32) * 4
    offsets = col_part + row_part + (rr // TILE_ROWS) * row_block_bytes
    out = bits.new_zeros(rp * out_cols)
    out.index_copy_(0, offsets.reshape(-1), bits[:, :last].reshape(-1))
    return _e8m0(out.view(rp, out_cols))


def check_group_end_offsets(
    offsets: Tensor, total: int | None, *, op: str = "check_group_end_offsets"
) -> None:
    """The explicit, **syncing** validator of group end offsets (reads the values).

    Requires: a torch.int32 tensor, 1-D, non-empty, values >= 0, non-decreasing, and (unless
    ``total`` is None) last value <= ``total``. Raises ``ValueError`` naming ``op`` (the op whose
    offsets these are), the argument and what is wrong.
    """
    name = f"{op}: group_end_offsets"
    if not isinstance(offsets, torch.Tensor):
        raise ValueError(f"{name} must be a torch.int32 tensor, got {type(offsets).__name__}")
    if offsets.dtype != torch.int32:
        raise ValueError(f"{name} must have dtype torch.int32, got {offsets.dtype}")
    if offsets.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(offsets.shape)}")
    if offsets.numel() == 0:
        raise ValueError(f"{name} must hold at least one group, got length 0")
    v = offsets.detach().to("cpu", torch.int64)
    neg = torch.nonzero(v < 0)
    if neg.numel():
        i = int(neg[0])
        raise ValueError(f"{name} must be >= 0, got {int(v[i])} at index {i}")
    dec = torch.nonzero(v[1:] < v[:-1])
    if dec.numel():
        i = int(dec[0]) + 1
        raise ValueError(f"{name} must be non-decreasing, got {int(v[i - 1])} then {int(v[i])} at index {i}")
    if total is not None and int(v[-1]) > total:
        raise ValueError(f"{name} last value ({int(v[-1])}) must be <= the total size ({total})")


def _scale_ends_from_row_ends(group_end_offsets: Tensor, op: str) -> Tensor:
    """Row-group end offsets (multiples of 32) -> scale-column end offsets (``kend = end / 32``);
    ``op`` names the op in the error."""
    ends = group_end_offsets.to(torch.int64)
    bad = torch.nonzero(ends % BLOCK_SIZE)
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"{op}: group_end_offsets must be multiples of 32 for block='32x1' (row groups of whole 32x1 "
            f"blocks), got {int(ends[i])} at index {i}"
        )
    return ends // BLOCK_SIZE


def _finish_scales(s: Tensor, ends: Tensor | None, blocked: bool, groups: str) -> Tensor:
    """Unblocked (E8M0 view of ``s``), plain blocked, or M-/K-groups blocked scales."""
    if not blocked:
        return _e8m0(s)
    if ends is None:
        return to_blocked(s)
    return swizzle_m_groups(s, ends) if groups == "M" else swizzle_k_groups(s, ends)


def swizzle_scales(scales: Tensor, *, group_end_offsets: Tensor | None = None, groups: str = "M") -> Tensor:
    """Convert a logical scale matrix to the blocked layout (SPEC section 3).

    ``scales``: (R, C) or (E, R, C), ``torch.float8_e8m0fnu`` or ``torch.uint8``, contiguous.

    * 2-D, no offsets: plain blocked layout, (Rp, Cp).
    * 3-D: each expert blocked independently, (E, Rp, Cp). Offsets are not allowed.
    * ``groups="M"`` with offsets (end offsets over the R rows): M-groups layout, (R + 128*G, Cp).
    * ``groups="K"`` with offsets (end offsets over the C scale columns): K-groups layout,
      (Rp, C + 4*G).

    Returns a contiguous ``torch.float8_e8m0fnu`` tensor; all bytes not covered by a group are 0.
    """
    contract.SWIZZLE_SCALES.check(scales, group_end_offsets, groups)
    if group_end_offsets is None:
        return to_blocked(scales)
    total = scales.shape[0] if groups == "M" else scales.shape[1]
    check_group_end_offsets(group_end_offsets, total, op="swizzle_scales")
    return _finish_scales(_u8(scales), group_end_offsets, True, groups)


# ----------------------------------------------------------------------------------------------
# Quantization ops (SPEC section 5)
# ----------------------------------------------------------------------------------------------


def quantize_mxfp8_2d(
    x: Tensor,
    *,
    block: str = "1x32",
    group_end_offsets: Tensor | None = None,
    scaling_mode: str = "rceil",
    blocked_scales: bool = True,
) -> tuple[Tensor, Tensor]:
    """MXFP8-quantize a 2-D tensor x (M, K), bf16 or fp32, contiguous.

    ``block="1x32"`` (K % 32 == 0): q (M, K) float8_e4m3fn row-major; scales E8M0 of S = (M, K/32):
    unblocked (M, K/32); blocked (Rp, Cp); with offsets (end offsets over the M rows) the M-groups
    layout (M + 128*G, Cp).

    ``block="32x1"`` (M % 32 == 0): q (M, K) float8_e4m3fn with strides (1, M); scales of
    S = (K, M/32): unblocked (K, M/32); blocked (Rp, Cp); with offsets (row groups whose end offsets
    are multiples of 32) the K-groups layout with ``kend = end / 32``, shape (Rp, M/32 + 4*G).

    Offsets (int32, on x's device) require ``blocked_scales=True``.
    """
    contract.QUANTIZE_MXFP8_2D.check(x, block, group_end_offsets, scaling_mode, blocked_scales)
    m, k = x.shape
    if group_end_offsets is not None:
        check_group_end_offsets(group_end_offsets, m, op="quantize_mxfp8_2d")
    if block == "1x32":
        q, s = _quantize_rows(x, scaling_mode)
        return q, _finish_scales(s, group_end_offsets, blocked_scales, "M")
    q_rm, s_cols = _quantize_cols(x, scaling_mode)
    q = q_rm.t().contiguous().t()  # (M, K) with strides (1, M)
    s = s_cols.t().contiguous()  # S = (K, M/32)
    kends = None
    if group_end_offsets is not None:
        kends = _scale_ends_from_row_ends(group_end_offsets, "quantize_mxfp8_2d")
    return q, _finish_scales(s, kends, blocked_scales, "K")


def quantize_mxfp8_2d_dual(
    x: Tensor,
    *,
    group_end_offsets: Tensor | None = None,
    scaling_mode: str = "rceil",
    blocked_scales: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Both quantizations of x (M, K) (M and K multiples of 32): returns
    ``(q_1x32, scales_1x32, q_32x1, scales_32x1)``, by definition identical to the two single
    ``quantize_mxfp8_2d`` calls with ``block="1x32"`` and ``block="32x1"`` (same offsets: M-groups for
    1x32, K-groups with ``kend = end / 32`` for 32x1)."""
    contract.QUANTIZE_MXFP8_2D_DUAL.check(x, group_end_offsets, scaling_mode, blocked_scales)
    if group_end_offsets is not None:  # the values, before the single calls (errors name the dual)
        check_group_end_offsets(group_end_offsets, x.shape[0], op="quantize_mxfp8_2d_dual")
        _scale_ends_from_row_ends(group_end_offsets, "quantize_mxfp8_2d_dual")
    kw = dict(group_end_offsets=group_end_offsets, scaling_mode=scaling_mode, blocked_scales=blocked_scales)
    q_r, s_r = quantize_mxfp8_2d(x, block="1x32", **kw)
    q_c, s_c = quantize_mxfp8_2d(x, block="32x1", **kw)
    return q_r, s_r, q_c, s_c


def quantize_mxfp8_3d(
    w: Tensor,
    *,
    block: str = "1x32",
    scaling_mode: str = "rceil",
    blocked_scales: bool = True,
) -> tuple[Tensor, Tensor]:
    """MXFP8-quantize expert weights w (E, N, K), bf16 or fp32, contiguous, K a multiple of 32 (N
    too for ``"32x1"``; ``"1x32"`` takes any N, its scales padded to 128 rows per expert).

    ``"1x32"`` (blocks along K): q (E, N, K) row-major; per-expert S (N, K/32): unblocked
    (E, N, K/32), blocked (E, Rp, Cp) with (Rp, Cp) = blocked_shape(N, K/32).
    ``"32x1"`` (blocks along N): q (E, N, K) with strides (N*K, 1, N); per-expert S (K, N/32):
    unblocked (E, K, N/32), blocked (E, Rp, Cp) with (Rp, Cp) = blocked_shape(K, N/32).
    """
    contract.QUANTIZE_MXFP8_3D.check(w, block, scaling_mode, blocked_scales)
    e, n, k = w.shape
    flat = w.view(e * n, k)
    if block == "1x32":
        q2, s2 = _quantize_rows(flat, scaling_mode)
        q = q2.view(e, n, k)
        s = s2.view(e, n, k // BLOCK_SIZE)
    else:
        # 32-row blocks never straddle two experts because N % 32 == 0.
        q2, s2 = _quantize_cols(flat, scaling_mode)
        q = q2.view(e, n, k).transpose(1, 2).contiguous().transpose(1, 2)
        s = s2.view(e, n // BLOCK_SIZE, k).transpose(1, 2).contiguous()
    return q, (to_blocked(s) if blocked_scales else _e8m0(s))


# ----------------------------------------------------------------------------------------------
# Token-group padding (SPEC section 4)
# ----------------------------------------------------------------------------------------------


def padded_group_offsets(group_end_offsets: Tensor, alignment: int) -> tuple[Tensor, Tensor]:
    """Padded group boundaries: sizes ``A*ceil(n_g/A)`` (empty stays empty), ``padded_end`` = their
    cumsum, ``padded_start = padded_end - size``. Returns (padded_start, padded_end), int32 on the
    offsets' device. No sync."""
    padded_start, sizes = _padded_prefix(group_end_offsets.to(torch.int64), alignment)
    return padded_start.to(torch.int32), (padded_start + sizes).to(torch.int32)


def pad_token_groups(
    x: Tensor, group_end_offsets: Tensor, *, alignment: int = 32
) -> tuple[Tensor, Tensor, Tensor]:
    """Pad each token group of x (M, D) to a multiple of ``alignment`` rows.

    Group g (rows ``[end[g-1], end[g])``, n_g rows) is copied to rows
    ``[padded_start[g], padded_start[g] + n_g)`` of a zero tensor of ``padded_rows(M, G, A)`` rows;
    every other row (group padding, rows past the last group's padded end) is zero.
    Returns (padded (padded_rows, D) in x's dtype, padded_start, padded_end), the offsets int32 on
    x's device (see ``padded_group_offsets``). Bit-exact copy (NaN payloads, -0 kept).
    """
    contract.PAD_TOKEN_GROUPS.check(x, group_end_offsets, alignment)
    m, d = x.shape
    check_group_end_offsets(group_end_offsets, m, op="pad_token_groups")
    padded_start, padded_end = padded_group_offsets(group_end_offsets, alignment)
    ends = group_end_offsets.to(torch.int64)
    out = x.new_zeros((padded_rows(m, ends.numel(), alignment), d))
    last = int(ends[-1])
    rows = torch.arange(last, dtype=torch.int64, device=x.device)
    g = _group_of(rows, ends)
    dest = padded_start.to(torch.int64)[g] + rows - _starts(ends)[g]
    _as_bits(out).index_copy_(0, dest, _as_bits(x)[:last])
    return out, padded_start, padded_end


def unpad_token_groups(
    padded: Tensor, group_end_offsets: Tensor, padded_start: Tensor, *, num_tokens: int | None = None
) -> Tensor:
    """Exact inverse of ``pad_token_groups``: gathers group g's n_g rows from
    ``padded[padded_start[g] : padded_start[g] + n_g]`` back to rows ``[end[g-1], end[g])``.

    Returns (M, D) in padded's dtype with M = ``num_tokens`` when given (rows past the last group's
    end are zero; the last end must be <= num_tokens), else M = ``group_end_offsets[-1]`` (read from
    the device: the reference syncs; it must lie in ``[0, padded rows]``). Raises ``ValueError`` if a
    group's padded range is outside ``padded``, or that last end is.
    """
    contract.UNPAD_TOKEN_GROUPS.check(padded, group_end_offsets, padded_start, num_tokens)
    check_group_end_offsets(group_end_offsets, num_tokens, op="unpad_token_groups")
    ends = group_end_offsets.to(torch.int64)
    starts = _starts(ends)
    pstart = padded_start.to(torch.int64)
    nrows = padded.shape[0]
    bad = torch.nonzero((pstart < 0) | (pstart + (ends - starts) > nrows))
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"unpad_token_groups: padded_start[{i}] = {int(pstart[i])} with group size "
            f"{int(ends[i] - starts[i])} is outside padded's {nrows} rows"
        )
    m = int(ends[-1]) if num_tokens is not None else checks.unpad_row_count(int(ends[-1]), nrows)
    rows = torch.arange(m, dtype=torch.int64, device=padded.device)
    g = _group_of(rows, ends)
    src = pstart[g] + rows - starts[g]
    gathered = _as_bits(padded).index_select(0, src)
    if num_tokens is not None and num_tokens != m:
        gathered = torch.cat([gathered, gathered.new_zeros((num_tokens - m, padded.shape[1]))])
    return gathered.view(padded.dtype)


def pad_and_quantize_mxfp8_2d(
    x: Tensor, group_end_offsets: Tensor, *, alignment: int = 32, scaling_mode: str = "rceil"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused token-group padding + 1x32 MXFP8 quantization of x (M, K), bf16/fp32, K % 32 == 0.

    Exactly ``quantize_mxfp8_2d(pad_token_groups(x)[0], group_end_offsets=padded_end)``:
    q (padded_rows(M, G, A), K) float8_e4m3fn row-major (padding rows 0), scales E8M0 in the
    M-groups blocked layout of the padded groups, (padded_rows + 128*G, Cp) (padding scales 0).
    Returns (q, scales, padded_start, padded_end).
    """
    contract.PAD_AND_QUANTIZE_MXFP8_2D.check(x, group_end_offsets, alignment, scaling_mode)
    check_group_end_offsets(group_end_offsets, x.shape[0], op="pad_and_quantize_mxfp8_2d")
    padded, padded_start, padded_end = pad_token_groups(x, group_end_offsets, alignment=alignment)
    q, scales = quantize_mxfp8_2d(
        padded, block="1x32", group_end_offsets=padded_end, scaling_mode=scaling_mode, blocked_scales=True
    )
    return q, scales, padded_start, padded_end


# ----------------------------------------------------------------------------------------------
# FP8 rowwise (SPEC section 7)
# ----------------------------------------------------------------------------------------------

FP8_EPS = 1e-12
"""The amax floor of the FP8 rowwise scale (a double): ``q_scale = 448 / max(amax, 1e-12)``."""
_CLEAR_MANTISSA = FP8_POW2_MASK  # sign and exponent bits


def _amax(x: Tensor, dim: int) -> Tensor:
    """max |x| over ``dim`` in fp32, NaN if any element is NaN (keepdim)."""
    a = x.to(torch.float32).abs().amax(dim=dim, keepdim=True)
    return torch.where(torch.isnan(x).any(dim=dim, keepdim=True), float("nan"), a)


def fp8_quant_scale(amax: Tensor, round_scales_to_power_of_2: bool) -> Tensor:
    """``q_scale = fp32(448 / max(fp64(amax), 1e-12))`` (one rounding, from fp64); with rounding, its
    mantissa cleared (``2^floor(log2 q_scale)``; 0, Inf and NaN unchanged). fp32, amax's shape."""
    a = amax.to(torch.float64)
    a = torch.where(torch.isnan(a), a, a.clamp(min=FP8_EPS))
    q_scale = (E4M3_MAX / a).to(torch.float32)
    if round_scales_to_power_of_2:
        rounded = (q_scale.view(torch.int32) & _CLEAR_MANTISSA).view(torch.float32)
        q_scale = torch.where(torch.isnan(q_scale), q_scale, rounded)
    return q_scale


def _fp8_cast(x: Tensor, q_scale: Tensor) -> Tensor:
    """``e4m3(fp32(x) * q_scale)`` saturated (``q_scale`` broadcasts)."""
    return e4m3_saturated(x.to(torch.float32) * q_scale)


def _fp8_along(x: Tensor, dim: int, round_scales: bool) -> tuple[Tensor, Tensor]:
    """Scale per vector along ``dim`` of x: ``(q in x's layout, dequantization scales, keepdim)``.
    A vector of no elements (``dim`` of size 0) has the scale 1.0, like an empty group."""
    if x.shape[dim] == 0:
        ones = torch.ones_like(x.sum(dim=dim, keepdim=True), dtype=torch.float32)
        return torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device), ones
    q_scale = fp8_quant_scale(_amax(x, dim), round_scales)
    return _fp8_cast(x, q_scale), 1.0 / q_scale


def _fp8_rows(x: Tensor, round_scales: bool) -> tuple[Tensor, Tensor]:
    """Row scales of (R, K): q (R, K) row-major, scales (R,) fp32; row chunks bound the temporaries."""
    r, k = x.shape
    q = torch.empty((r, k), dtype=torch.uint8, device=x.device)  # bytes: float8 slices do not compile
    scales = torch.empty(r, dtype=torch.float32, device=x.device)
    step = max(1, _CHUNK_ELEMS // max(k, 1))
    for r0 in range(0, r, step):
        qc, sc = _fp8_along(x[r0 : r0 + step], 1, round_scales)
        q[r0 : r0 + step], scales[r0 : r0 + step] = qc.view(torch.uint8), sc.view(-1)
    return q.view(torch.float8_e4m3fn), scales


def _fp8_cols(x: Tensor, round_scales: bool) -> tuple[Tensor, Tensor]:
    """Column scales of (R, K): q (R, K) **row-major**, scales (K,) fp32; column chunks bound the
    temporaries."""
    r, k = x.shape
    q = torch.empty((r, k), dtype=torch.uint8, device=x.device)  # bytes: float8 slices do not compile
    scales = torch.empty(k, dtype=torch.float32, device=x.device)
    step = max(1, _CHUNK_ELEMS // max(r, 1))
    for c0 in range(0, k, step):
        qc, sc = _fp8_along(x[:, c0 : c0 + step], 0, round_scales)
        q[:, c0 : c0 + step], scales[c0 : c0 + step] = qc.view(torch.uint8), sc.view(-1)
    return q.view(torch.float8_e4m3fn), scales


def _fp8_group_cols(x: Tensor, ends: list[int], round_scales: bool) -> tuple[Tensor, Tensor]:
    """Column scales per row group of (M, K): q (M, K) **row-major** (rows past the last group are 0)
    and scales (G*K,) group-major; an empty group's scales are 1.0."""
    m, k = x.shape
    q = torch.zeros((m, k), dtype=torch.uint8, device=x.device)  # bytes: float8 slices do not compile
    scales = torch.ones(len(ends) * k, dtype=torch.float32, device=x.device)
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            qg, scales[g * k : (g + 1) * k] = _fp8_cols(x[start:end], round_scales)
            q[start:end] = qg.view(torch.uint8)
        start = end
    return q.view(torch.float8_e4m3fn), scales


def _last_end(group_end_offsets: Tensor, total: int, op: str) -> int:
    """The last group end after the syncing validation (offsets of ``op``, valid for ``total`` rows)."""
    check_group_end_offsets(group_end_offsets, total, op=op)
    return int(group_end_offsets[-1])


def _fp8_rows_bounded(x: Tensor, group_end_offsets: Tensor, round_scales: bool) -> tuple[Tensor, Tensor]:
    """Row scales of the rows of x (M, K) below the last group end; the rows past it q 0, scale 1.0."""
    bound = _last_end(group_end_offsets, x.shape[0], "quantize_fp8_2d")
    q = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)  # bytes: float8 slices do not compile
    scales = torch.ones(x.shape[0], dtype=torch.float32, device=x.device)
    q_rows, scales[:bound] = _fp8_rows(x[:bound], round_scales)
    q[:bound] = q_rows.view(torch.uint8)
    return q.view(torch.float8_e4m3fn), scales


def _col_major(q: Tensor) -> Tensor:
    """A row-major (M, K) tensor's values with strides (1, M)."""
    return q.t().contiguous().t()


def quantize_fp8_2d(
    x: Tensor,
    *,
    axis: str = "row",
    group_end_offsets: Tensor | None = None,
    round_scales_to_power_of_2: bool = True,
) -> tuple[Tensor, Tensor]:
    """FP8 rowwise quantization of x (M, K), bf16 or fp32, contiguous (SPEC section 7).

    ``axis="row"``: one scale per row: q (M, K) float8_e4m3fn row-major, scales (M,) fp32; with row
    group end offsets (int32 (G,), last <= M) only the rows below the last end are quantized: the
    rows past it are unspecified by contract (the kernel leaves them unwritten), here q 0 and scale
    1.0 (a dispatch's padding rows).
    ``axis="col"``: one scale per column: q (M, K) with strides (1, M), scales (K,); with row group
    end offsets (int32 (G,), any sizes, last <= M) one scale per (group, column): scales (G*K,)
    group-major (``scales[g*K + k]``), an empty group's scales 1.0, and rows past the last group's end
    quantize to 0. Scales are the dequantization multipliers ``1 / q_scale``.
    """
    contract.QUANTIZE_FP8_2D.check(x, axis, group_end_offsets, round_scales_to_power_of_2)
    if axis == "row" and group_end_offsets is not None:
        return _fp8_rows_bounded(x, group_end_offsets, round_scales_to_power_of_2)
    if axis == "row":
        return _fp8_rows(x, round_scales_to_power_of_2)
    if group_end_offsets is None:
        q, scales = _fp8_cols(x, round_scales_to_power_of_2)
        return _col_major(q), scales
    check_group_end_offsets(group_end_offsets, x.shape[0], op="quantize_fp8_2d")
    ends = group_end_offsets.tolist()
    q, scales = _fp8_group_cols(x, ends, round_scales_to_power_of_2)
    return _col_major(q), scales


def quantize_fp8_2d_dual(
    x: Tensor, *, group_end_offsets: Tensor | None = None, round_scales_to_power_of_2: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(q_row, s_row, q_col, s_col)``: :func:`quantize_fp8_2d` with ``axis="row"`` and with
    ``axis="col"``, each with the row groups if given, bit for bit (SPEC section 7): with groups the
    row outputs are those of the bounded row op (the rows past the last end unspecified; here q 0
    and scale 1.0)."""
    contract.QUANTIZE_FP8_2D_DUAL.check(x, group_end_offsets, round_scales_to_power_of_2)
    if group_end_offsets is not None:  # the values, before the single calls (errors name the dual)
        check_group_end_offsets(group_end_offsets, x.shape[0], op="quantize_fp8_2d_dual")
    rounding = round_scales_to_power_of_2
    q_row, s_row = quantize_fp8_2d(
        x, axis="row", group_end_offsets=group_end_offsets, round_scales_to_power_of_2=rounding
    )
    q_col, s_col = quantize_fp8_2d(
        x, axis="col", group_end_offsets=group_end_offsets, round_scales_to_power_of_2=rounding
    )
    return q_row, s_row, q_col, s_col


def pad_and_quantize_fp8_2d_cols(
    x: Tensor, group_end_offsets: Tensor, *, alignment: int = 16, round_scales_to_power_of_2: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Token-group padding fused into the grouped FP8 column quantization of x (M, K), bf16/fp32:
    exactly ``quantize_fp8_2d(pad_token_groups(x, offs, alignment=A)[0], axis="col",
    group_end_offsets=padded_end)``. q (padded_rows(M, G, A), K) with strides (1, rows): group g's
    rows at ``[padded_start[g], padded_start[g] + n_g)``, its padding rows quantized as the zeros
    they are (0; 0x7F in a column whose group amax is NaN), rows past the last padded group 0;
    scales (G*K,) group-major, as for the unpadded groups. Returns (q, scales, padded_start,
    padded_end)."""
    contract.PAD_AND_QUANTIZE_FP8_2D_COLS.check(x, group_end_offsets, alignment, round_scales_to_power_of_2)
    check_group_end_offsets(group_end_offsets, x.shape[0], op="pad_and_quantize_fp8_2d_cols")
    padded, padded_start, padded_end = pad_token_groups(x, group_end_offsets, alignment=alignment)
    q, scales = quantize_fp8_2d(
        padded,
        axis="col",
        group_end_offsets=padded_end,
        round_scales_to_power_of_2=round_scales_to_power_of_2,
    )
    return q, scales, padded_start, padded_end


def pad_and_quantize_fp8_2d_dual(
    x: Tensor, group_end_offsets: Tensor, *, alignment: int = 16, round_scales_to_power_of_2: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(q_row, s_row, q_col, s_col, padded_start, padded_end)``: the row operand of
    :func:`quantize_fp8_2d` with ``axis="row"`` and the row groups (rows past the last group end
    unspecified by contract: here q 0 and scale 1.0) and :func:`pad_and_quantize_fp8_2d_cols`'s
    outputs, bit for bit (SPEC sections 4 and 7)."""
    contract.PAD_AND_QUANTIZE_FP8_2D_DUAL.check(x, group_end_offsets, alignment, round_scales_to_power_of_2)
    check_group_end_offsets(group_end_offsets, x.shape[0], op="pad_and_quantize_fp8_2d_dual")
    rounding = round_scales_to_power_of_2
    q_row, s_row = quantize_fp8_2d(
        x, axis="row", group_end_offsets=group_end_offsets, round_scales_to_power_of_2=rounding
    )
    cols = pad_and_quantize_fp8_2d_cols(
        x, group_end_offsets, alignment=alignment, round_scales_to_power_of_2=rounding
    )
    return q_row, s_row, *cols


def quantize_fp8_3d(
    w: Tensor, *, axis: str = "K", round_scales_to_power_of_2: bool = True
) -> tuple[Tensor, Tensor]:
    """FP8 rowwise quantization of expert weights w (E, N, K), bf16 or fp32, contiguous (SPEC 7).

    ``axis="K"``: amax over K: q (E, N, K) row-major, scales (E, N) (the forward's right operand is
    ``q.transpose(-2, -1)``). ``axis="N"``: amax over N: q (E, N, K) with strides (N*K, 1, N),
    scales (E, K) (dgrad). Scales are the dequantization multipliers ``1 / q_scale``.
    """
    contract.QUANTIZE_FP8_3D.check(w, axis, round_scales_to_power_of_2)
    e, n, k = w.shape
    if axis == "K":
        q, scales = _fp8_rows(w.reshape(e * n, k), round_scales_to_power_of_2)
        return q.view(e, n, k), scales.view(e, n)
    q = torch.empty_strided((e, n, k), (n * k, 1, n), dtype=torch.uint8, device=w.device)  # bytes
    scales = torch.empty((e, k), dtype=torch.float32, device=w.device)
    for i in range(e):
        qi, scales[i] = _fp8_cols(w[i], round_scales_to_power_of_2)
        q[i].copy_(qi.view(torch.uint8))
    return q.view(torch.float8_e4m3fn), scales


def quantize_fp8_3d_dual(
    w: Tensor, *, round_scales_to_power_of_2: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(q_k, s_k, q_n, s_n)``: :func:`quantize_fp8_3d` with ``axis="K"`` (q_k (E, N, K) row-major,
    s_k (E, N)) and with ``axis="N"`` (q_n (E, N, K) with strides (N*K, 1, N), s_n (E, K)), bit for
    bit (SPEC section 7)."""
    contract.QUANTIZE_FP8_3D_DUAL.check(w, round_scales_to_power_of_2)
    q_k, s_k = quantize_fp8_3d(w, axis="K", round_scales_to_power_of_2=round_scales_to_power_of_2)
    q_n, s_n = quantize_fp8_3d(w, axis="N", round_scales_to_power_of_2=round_scales_to_power_of_2)
    return q_k, s_k, q_n, s_n


def _clamped_group_bounds(group_end_offsets: Tensor, total: int) -> list[tuple[int, int]]:
    """``(start, end)`` per group: each end clamped to ``[0, total]``, a group starting where the
    previous one ended and empty when its end is below that. This is how the kernels read valid
    (non-decreasing) offsets; for garbage offsets whose clamped ends fall, the kernels start a group
    at the previous clamped end (``cute_utils.groups.group_bounds``), so groups may overlap there
    (in bounds, results unspecified: bit equality holds for valid offsets only)."""
    bounds, start = [], 0
    for end in group_end_offsets.tolist():
        end = max(min(max(end, 0), total), start)
        bounds.append((start, end))
        start = end
    return bounds


def grouped_gemm_fp8_rowwise_reference(
    form: str, a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, group_end_offsets: Tensor
) -> Tensor:
    """The FP8 rowwise grouped GEMM in fp32 math, bf16 out, with the operands of the sm_90a kernel
    (``cute_kernels.grouped_gemm_sm90``; products of e4m3 values are exact in fp32, the sums'
    order is torch's). ``form="2d3d"``: a (M, K) e4m3, b (E, N, K) e4m3, scale_a (M,), scale_b
    (E, N) -> y (M, N), ``y[rows of g] = (a[rows] @ b[g].T) * scale_a[rows, None] * scale_b[g]``;
    rows past the last end are 0 here (the kernel leaves them unwritten). ``form="2d2d"``: a (N, M),
    b (K, M) e4m3, scale_a (G*N,), scale_b (G*K,) group-major -> out (G, N, K), ``out[g] = (a[:,
    rows] @ b[:, rows].T) * scale_a[g*N:(g+1)*N, None] * scale_b[g*K:(g+1)*K]``; an empty group's
    slice is 0. Scales multiply the fp32 sum in that order."""
    af, bf = a.to(torch.float32), b.to(torch.float32)
    if form == "2d3d":
        y = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
        for g, (start, end) in enumerate(_clamped_group_bounds(group_end_offsets, a.shape[0])):
            acc = af[start:end] @ bf[g].t()
            y[start:end] = acc * scale_a[start:end, None] * scale_b[g][None, :]
        return y.to(torch.bfloat16)
    if form != "2d2d":
        raise ValueError(f"form must be '2d3d' or '2d2d', got {form!r}")
    (n, m), k = a.shape, b.shape[0]
    bounds = _clamped_group_bounds(group_end_offsets, m)
    out = torch.zeros(len(bounds), n, k, dtype=torch.float32, device=a.device)
    for g, (start, end) in enumerate(bounds):
        if end > start:
            acc = af[:, start:end] @ bf[:, start:end].t()
            out[g] = acc * scale_a[g * n : (g + 1) * n, None] * scale_b[g * k : (g + 1) * k][None, :]
    return out.to(torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# SwiGLU fused with FP8 rowwise quantization (docs/contract.md, "SwiGLU with FP8 rowwise")
# ----------------------------------------------------------------------------------------------

_SWIGLU_CHUNK_ELEMS = 1 << 22  # h columns per chunk: bounds the fp32 temporaries (~20 of 16 MiB)
_CLAMP = SWIGLU_CLAMP
_LOG2E = f32_of_bits(SWIGLU_LOG2E_BITS)
_LN2_HI = f32_of_bits(SWIGLU_LN2_HI_BITS)
_LN2_LO = f32_of_bits(SWIGLU_LN2_LO_BITS)
_EXP_COEFFS = tuple(f32_of_bits(b) for b in SWIGLU_EXP_COEFF_BITS)  # c2..c6


def _pow2(k: Tensor) -> Tensor:
    """``2^k`` as fp32 from its exponent bits, for int32 ``k`` in [-126, 127]."""
    return ((k + 127) << 23).view(torch.float32)


def _scaled(v: Tensor, p1: Tensor, p2: Tensor) -> Tensor:
    """``(v * p1) * p2``: v times ``2^k`` applied as two exact powers of 2 (``k = k1 + k2``, both
    >= -81), so a subnormal result is rounded once."""
    return (v * p1) * p2


class SiluParts:
    """What :func:`silu_parts` computes for fp32 ``g`` (every op one IEEE fp32 operation, rounded to
    nearest even, no FMA; the kernels run the same sequence, ``cute_utils.swiglu_math``):

    - ``gl = g < -112 ? -112 : g`` and ``x = gl > 112 ? 112 : gl`` (NaN stays NaN);
    - ``exp(-|x|)`` by range reduction: ``y = -|x|``, ``nf = rint(y * LOG2E)`` (half to even),
      ``r = (y + nf * -LN2_HI) + nf * -LN2_LO``, ``p = 1 + r * (1 + r * (c2 + r * (c3 + r * (c4 + r *
      (c5 + r * c6)))))`` (Horner, each product and sum rounded), ``n = int(nf)`` (0 for NaN) and
      ``e = p * 2^max(n, -126)``;
    - ``pos = g >= 0`` (-0 included), ``d = 1 + e``, ``sm = (pos ? 1 : p) / d`` (one division) and
      ``k = pos ? 0 : n``, so that ``sigmoid(g) = sm * 2^k``; ``p1 = 2^(k >> 1)``, ``p2 =
      2^(k - (k >> 1))``.

    For g >= 0, ``sm = 1 / (1 + exp(-g))``; for g < 0, ``sm * 2^n = exp(g) / (1 + exp(g))`` with the
    power of 2 kept apart, so products with ``sm`` are scaled last (one rounding even where the
    result is subnormal)."""

    __slots__ = ("e", "gl", "p1", "p2", "pos", "sm", "x")

    def __init__(self, g: Tensor) -> None:
        self.gl = torch.where(g < -_CLAMP, -_CLAMP, g)
        self.x = torch.where(self.gl > _CLAMP, _CLAMP, self.gl)
        y = -self.x.abs()
        nf = torch.round(y * _LOG2E)
        r = (y + nf * -_LN2_HI) + nf * -_LN2_LO
        s = torch.full_like(r, _EXP_COEFFS[-1])
        for c in reversed(_EXP_COEFFS[:-1]):
            s = s * r + c
        p = r * (r * s + 1.0) + 1.0
        n = torch.where(torch.isnan(nf), 0.0, nf).to(torch.int32)
        self.e = p * _pow2(n.clamp(min=-126))
        self.pos = g >= 0
        self.sm = torch.where(self.pos, 1.0, p) / (self.e + 1.0)
        k = torch.where(self.pos, 0, n)
        self.p1, self.p2 = _pow2(k >> 1), _pow2(k - (k >> 1))


def silu_parts(g: Tensor) -> SiluParts:
    """The shared terms of SwiGLU's forward and backward for fp32 ``g`` (:class:`SiluParts`)."""
    return SiluParts(g)


def silu_fp32(g: Tensor) -> Tensor:
    """``silu(g) = ((gl * sm) * p1) * p2`` for fp32 ``g`` (:class:`SiluParts`): within 2.1 fp32 ulp
    of the exact value for every bf16 g (tests/torch_bindings/test_swiglu_cpu.py); silu(-Inf) = -0,
    silu(+Inf) = +Inf, NaN -> NaN."""
    parts = silu_parts(g)
    return _scaled(parts.gl * parts.sm, parts.p1, parts.p2)


def silu_backward_fp32(g: Tensor) -> tuple[Tensor, Tensor]:
    """``(silu(g), silu'(g))`` for fp32 ``g``: silu as :func:`silu_fp32`; with ``s = (sm * p1) *
    p2`` (sigmoid) and ``c = pos ? e * sm : 1 - s`` (1 - sigmoid, without cancellation for g >= 0),
    ``silu'(g) = ((sm * (1 + x * c)) * p1) * p2``."""
    parts = silu_parts(g)
    silu = _scaled(parts.gl * parts.sm, parts.p1, parts.p2)
    s = _scaled(parts.sm, parts.p1, parts.p2)
    c = torch.where(parts.pos, parts.e * parts.sm, 1.0 - s)
    return silu, _scaled(parts.sm * (parts.x * c + 1.0), parts.p1, parts.p2)


def silu_table(device: torch.device | str = "cpu") -> Tensor:
    """The SwiGLU kernels' table of this sequence's results (``constants.SILU_TABLE_*``): fp32
    ``(2, 2, SILU_TABLE_SPAN)`` flattened, ``[fn][sign][bits % SILU_TABLE_SPAN]`` = silu (fn 0) or
    silu' (fn 1) of the bf16 gate of magnitude bits ``bits`` in ``[SILU_TABLE_FIRST,
    SILU_TABLE_END)`` (a span of 4096: the low 12 bits number its gates once each) and sign
    ``sign`` (1: negative), built on ``device`` by :func:`silu_backward_fp32` (no host sync)."""
    entries = torch.arange(SILU_TABLE_SPAN, dtype=torch.int32, device=device)
    magnitudes = SILU_TABLE_FIRST + ((entries - SILU_TABLE_FIRST) & (SILU_TABLE_SPAN - 1))
    bits = torch.cat([magnitudes, magnitudes - 0x8000]).to(torch.int16)  # sign bit set: negative g
    silu, dsilu = silu_backward_fp32(bits.view(torch.bfloat16).to(torch.float32))
    return torch.cat([silu, dsilu])


def bf16_canonical(v: Tensor) -> Tensor:
    """fp32 ``v`` rounded to bf16 (nearest even; overflow to Inf), every NaN as the bf16 bits 0x7FC0
    (PyTorch's CPU and CUDA conversions write different NaNs)."""
    nan = torch.tensor(SWIGLU_BF16_NAN_BITS, dtype=torch.int16, device=v.device).view(torch.bfloat16)
    return torch.where(torch.isnan(v), nan, v.to(torch.bfloat16))


def _column_chunks(rows: int, cols: int) -> int:
    return max(1, _SWIGLU_CHUNK_ELEMS // max(cols, 1)) if rows else 1


def swiglu(h13: Tensor) -> Tensor:
    """SwiGLU of h13 (M, 2H) bf16 (columns [0, H) gate g, [H, 2H) up u): h (M, H) bf16, ``h =
    bf16(fp32(silu(g)) * fp32(u))`` with :func:`silu_fp32` (NaN -> 0x7FC0, :func:`bf16_canonical`)."""
    rows, cols = h13.shape
    half = cols // 2
    h = torch.empty((rows, half), dtype=torch.bfloat16, device=h13.device)
    step = _column_chunks(rows, half)
    for r0 in range(0, rows, step):
        chunk = h13[r0 : r0 + step].to(torch.float32)
        h[r0 : r0 + step] = bf16_canonical(silu_fp32(chunk[:, :half]) * chunk[:, half:])
    return h


def swiglu_backward(grad_h: Tensor, h13: Tensor) -> Tensor:
    """SwiGLU's gradient: grad_h (M, H) and h13 (M, 2H) bf16 -> grad_h13 (M, 2H) bf16, columns
    [0, H) ``d_gate = bf16((grad * u) * silu'(g))``, [H, 2H) ``d_up = bf16(grad * silu(g))``, every
    operand widened to fp32 exactly and every product rounded once (:func:`silu_backward_fp32`;
    NaN -> 0x7FC0)."""
    rows, cols = h13.shape
    half = cols // 2
    out = torch.empty((rows, cols), dtype=torch.bfloat16, device=h13.device)
    step = _column_chunks(rows, half)
    for r0 in range(0, rows, step):
        chunk = h13[r0 : r0 + step].to(torch.float32)
        grad = grad_h[r0 : r0 + step].to(torch.float32)
        silu, dsilu = silu_backward_fp32(chunk[:, :half])
        out[r0 : r0 + step, :half] = bf16_canonical((grad * chunk[:, half:]) * dsilu)
        out[r0 : r0 + step, half:] = bf16_canonical(grad * silu)
    return out


def _swiglu_bound(group_end_offsets: Tensor | None, rows: int, op: str) -> int:
    """The rows the SwiGLU op ``op`` computes: all ``rows``, or the last group end after the syncing
    validation (:func:`check_group_end_offsets`: last end <= ``rows``)."""
    return rows if group_end_offsets is None else _last_end(group_end_offsets, rows, op)


def _swiglu_padded(outputs: tuple[Tensor, Tensor, Tensor], rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(out, q, scales)`` of the rows below a bound grown to ``rows`` rows with padding rows: bf16
    out 0, q 0, scale 1.0 (what the bounded FP8 row reference, ``quantize_fp8_2d(axis="row",
    group_end_offsets=...)``, gives its rows past the bound)."""
    out, q, scales = outputs
    bound = out.shape[0]
    if bound == rows:
        return outputs
    out_all = out.new_zeros((rows, out.shape[1]))
    q_all = torch.zeros((rows, q.shape[1]), dtype=torch.uint8, device=q.device)  # float8: bytes
    scales_all = scales.new_ones(rows)
    out_all[:bound], q_all[:bound], scales_all[:bound] = out, q.view(torch.uint8), scales
    return out_all, q_all.view(torch.float8_e4m3fn), scales_all


def swiglu_quantize_fp8(
    h13: Tensor, *, group_end_offsets: Tensor | None = None, round_scales_to_power_of_2: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """``(h, q, scales)``: h = :func:`swiglu` of h13 (M, 2H) bf16, and its FP8 rowwise operand,
    exactly ``quantize_fp8_2d(h, axis="row")``: q (M, H) e4m3 row-major, scales (M,) fp32 (the
    dequantization multipliers; a row of no columns has the scale 1.0).

    With row group end offsets (int32 (G,), validated, syncing: last <= M) only the rows below the
    last end are computed; the rows past it are unspecified by contract (the kernel leaves them
    unwritten), here h 0, q 0 and scale 1.0 (the bounded FP8 row reference's padding rows)."""
    contract.SWIGLU_QUANTIZE_FP8.check(h13, group_end_offsets, round_scales_to_power_of_2)
    bound = _swiglu_bound(group_end_offsets, h13.shape[0], "swiglu_quantize_fp8")
    h = swiglu(h13[:bound])
    q, scales = quantize_fp8_2d(h, axis="row", round_scales_to_power_of_2=round_scales_to_power_of_2)
    return _swiglu_padded((h, q, scales), h13.shape[0])


def swiglu_backward_quantize_fp8(
    grad_h: Tensor,
    h13: Tensor,
    *,
    group_end_offsets: Tensor | None = None,
    round_scales_to_power_of_2: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(grad_h13, q, scales)``: grad_h13 = :func:`swiglu_backward` (M, 2H) bf16 and its FP8
    rowwise operand along the 2H dimension, exactly ``quantize_fp8_2d(grad_h13, axis="row")``: q (M,
    2H) e4m3, scales (M,) fp32 (the amax runs over both halves of a row). With row group end
    offsets, the rows past the last end as in :func:`swiglu_quantize_fp8` (grad_h13 0, q 0, scale
    1.0)."""
    contract.SWIGLU_BACKWARD_QUANTIZE_FP8.check(grad_h, h13, group_end_offsets, round_scales_to_power_of_2)
    bound = _swiglu_bound(group_end_offsets, h13.shape[0], "swiglu_backward_quantize_fp8")
    grad_h13 = swiglu_backward(grad_h[:bound], h13[:bound])
    q, scales = quantize_fp8_2d(grad_h13, axis="row", round_scales_to_power_of_2=round_scales_to_power_of_2)
    return _swiglu_padded((grad_h13, q, scales), h13.shape[0])


def bf16_rne(y: Tensor) -> Tensor:
    """fp32 ``y`` -> bf16, round to nearest even (subnormals kept); every NaN -> ``BF16_NAN_BITS``
    (PyTorch's CPU conversion gives 0x7FC0, the GPU's ``cvt.rn.bf16x2.f32`` 0x7FFF: fixed here so
    the result does not depend on the device)."""
    bits = y.to(torch.bfloat16).view(torch.int16)
    return torch.where(torch.isnan(y), BF16_NAN_BITS, bits).view(torch.bfloat16)


def dequantize_fp8_rows(q: Tensor, scales: Tensor, group_end_offsets: Tensor) -> Tensor:
    """FP8 rowwise dequantization of the rows below the last group end: q (M, K) float8_e4m3fn
    row-major, scales (M,) fp32 (the dequantization multipliers of section 7), row group end offsets
    int32 (G,) (last <= M) -> x (M, K) bf16 row-major with ``x[r] = bf16_rne(fp32(q[r]) * scales[r])``
    (one fp32 product, rounded once to bf16; exact for power-of-2 scales unless it leaves bf16's
    range) for r below the last end. The rows past it are unspecified by contract (the kernel leaves
    them unwritten), here 0."""
    contract.DEQUANTIZE_FP8_ROWS.check(q, scales, group_end_offsets)
    bound = _last_end(group_end_offsets, q.shape[0], "dequantize_fp8_rows")
    x = torch.zeros(q.shape, dtype=torch.bfloat16, device=q.device)
    step = max(1, _CHUNK_ELEMS // max(q.shape[1], 1))
    for r0 in range(0, bound, step):
        r1 = min(r0 + step, bound)
        x[r0:r1] = bf16_rne(q[r0:r1].to(torch.float32) * scales[r0:r1, None])
    return x


# ----------------------------------------------------------------------------------------------
# Expert-parallel dispatch and combine (SPEC section 9), simulated over R ranks in one process
# ----------------------------------------------------------------------------------------------


def ep_rows(ranks: int, tokens: int, topk: int, local_experts: int, alignment: int) -> int:
    """Static row count of a rank's dispatched tensor: ``R*T*k + E_local*A`` rounded up to A."""
    return _round_up(ranks * tokens * topk + local_experts * alignment, alignment)


def weighted_slot_sum(rows: Tensor, weights: Tensor) -> Tensor:
    """Combine's sum: rows (T, k, D) and weights (T, k) -> (T, D) bf16 of ``sum_j w[t, j] y[t, j]``
    in fp32, slots added in order 0..k-1 starting from slot 0's product (SPEC section 9). The one
    definition both the reference and ``torch_bindings.ep`` run."""
    w = weights.to(torch.float32)
    acc = w[:, 0, None] * rows[:, 0].to(torch.float32)
    for j in range(1, rows.shape[1]):
        acc = acc + w[:, j, None] * rows[:, j].to(torch.float32)
    return acc.to(torch.bfloat16)


def ep_pair_rows(topk_idxs: list[Tensor], num_experts: int, alignment: int) -> list[Tensor]:
    """Where every (token, slot) pair lands: per source rank s a (T, k) int64 tensor of
    ``dest_rank * rows + dest_row`` (``ep_rows``), -1 for an expert outside ``[0, E)`` (dropped).
    Rows of local expert j of rank r are ordered by (source rank, token, slot), each group padded
    to ``alignment``. Syncs (the reference)."""
    ranks = len(topk_idxs)
    tokens, topk = topk_idxs[0].shape
    local = num_experts // ranks
    rows = ep_rows(ranks, tokens, topk, local, alignment)
    flat = [t.reshape(-1).to(torch.int64) for t in topk_idxs]
    out = [torch.full_like(f, -1) for f in flat]
    for r in range(ranks):
        row = 0
        for j in range(local):
            e = r * local + j
            n = 0
            for s in range(ranks):
                pairs = torch.nonzero(flat[s] == e).flatten()
                out[s][pairs] = r * rows + row + n + torch.arange(pairs.numel(), device=pairs.device)
                n += pairs.numel()
            row += _round_up(n, alignment)
    return [o.view(tokens, topk) for o in out]


def ep_dispatch(
    xs: list[Tensor],
    topk_idxs: list[Tensor],
    num_experts: int,
    *,
    recipe: str = "mxfp8",
    alignment: int = 32,
    scaling_mode: str = "rceil",
) -> list[dict]:
    """``dispatch`` on every rank of a simulated group: xs[s] (T, D) bf16 (or (T, k, D): one row
    per pair) and topk_idxs[s] (T, k) of rank s. Returns per rank a dict with ``q`` (rows, D)
    (bf16, or e4m3 for ``"mxfp8"`` and ``"fp8_rowwise"``), ``scales`` (None; mxfp8: the M-groups
    blocked scales of the padded groups, (rows + 128 E_local, Cp); fp8_rowwise: (rows,) fp32, one
    per row, 1.0 on padding rows), ``padded_group_start_offsets`` / ``padded_group_end_offsets``
    (E_local,) int32 and ``pair_rows`` (``ep_pair_rows`` of the sources, shared)."""
    ranks = len(xs)
    tokens, topk = topk_idxs[0].shape
    local = num_experts // ranks
    rows = ep_rows(ranks, tokens, topk, local, alignment)
    pair_rows = ep_pair_rows(topk_idxs, num_experts, alignment)
    pairs = [x if x.dim() == 3 else x[:, None].expand(tokens, topk, x.shape[-1]) for x in xs]
    results = []
    for r in range(ranks):
        chunks, sizes = [], []
        for j in range(local):
            e = r * local + j
            n = 0
            for s in range(ranks):
                mask = (topk_idxs[s] == e).reshape(-1)
                chunks.append(pairs[s].reshape(tokens * topk, -1)[mask])
                n += chunks[-1].shape[0]
            sizes.append(n)
        data = torch.cat(chunks)
        ends = torch.tensor(sizes, device=data.device).cumsum(0).to(torch.int32)
        padded, start, end = pad_token_groups(data, ends, alignment=alignment)
        grown = padded.new_zeros((rows, padded.shape[1]))
        grown[: padded.shape[0]] = padded
        result = {"padded_group_start_offsets": start, "padded_group_end_offsets": end}
        result["pair_rows"] = pair_rows
        if recipe == "bf16":
            result.update(q=grown, scales=None)
        elif recipe == "fp8_rowwise":
            q, scales = _ep_fp8_rows(grown, start, torch.tensor(sizes))
            result.update(q=q, scales=scales)
        else:
            q, scales = quantize_mxfp8_2d(grown, group_end_offsets=end, scaling_mode=scaling_mode)
            result.update(q=q, scales=scales)
        results.append(result)
    return results


def _ep_fp8_rows(grown: Tensor, start: Tensor, sizes: Tensor) -> tuple[Tensor, Tensor]:
    """fp8_rowwise dispatch rows: every row quantized on its own (section 7, power-of-2 scales) and
    the padding rows' (and rows past the last group's) scales 1.0."""
    q, scales = quantize_fp8_2d(grown, axis="row")
    row = torch.arange(grown.shape[0], device=grown.device)
    start, sizes = start.to(grown.device, torch.int64), sizes.to(grown.device, torch.int64)
    data = ((row[:, None] >= start) & (row[:, None] < start + sizes)).any(1)
    return q, torch.where(data, scales, torch.ones_like(scales))


def ep_combine(ys: list[Tensor], pair_rows: list[Tensor], topk_weights: list[Tensor]) -> list[Tensor]:
    """``combine`` on every rank of a simulated group: ys[r] (rows, D') outputs of rank r's experts
    in the dispatched layout, ``pair_rows`` from ``ep_dispatch``. Returns per source rank (T, D')
    bf16 ``weighted_slot_sum`` of its pairs' rows (a dropped pair contributes a zero row)."""
    rows = ys[0].shape[0]
    stacked = torch.cat([y.to(torch.bfloat16) for y in ys] + [ys[0].new_zeros((1, ys[0].shape[1]))])
    outs = []
    for where, w in zip(pair_rows, topk_weights, strict=True):
        index = torch.where(where >= 0, where, len(ys) * rows)
        outs.append(weighted_slot_sum(stacked[index], w))
    return outs


def ep_send_rows(
    x: Tensor, *, recipe: str, scaling_mode: str = "rceil", round_scales_to_power_of_2: bool = True
) -> tuple[Tensor, Tensor | None]:
    """What the EP sender writes per token row of x (T, D) bf16: ``(q_rows, scale_rows)``.

    ``"mxfp8"``: q (T, D) e4m3 and the plain 1x32 scales (T, D/32) e8m0 of
    ``quantize_mxfp8_2d(x, blocked_scales=False, scaling_mode=...)``; ``"fp8_rowwise"``: q (T, D)
    e4m3 and the row scales of ``quantize_fp8_2d(x, axis="row", ...)`` as (T, 1) fp32 (the
    dequantization multipliers); ``"bf16"``: ``(x, None)``."""
    if recipe == "mxfp8":
        return quantize_mxfp8_2d(x, scaling_mode=scaling_mode, blocked_scales=False)
    if recipe == "fp8_rowwise":
        q, scales = quantize_fp8_2d(x, axis="row", round_scales_to_power_of_2=round_scales_to_power_of_2)
        return q, scales.view(-1, 1)
    if recipe == "bf16":
        return x, None
    raise ValueError(f"ep_send_rows: recipe must be 'mxfp8', 'fp8_rowwise' or 'bf16', got {recipe!r}")


def ep_send_tags(rank: int, tokens: int, topk: int, device: torch.device | str | None = None) -> Tensor:
    """(T k, 1) int32 tags of rank ``rank``'s items: ``rank * T * k + item + 1`` (item ``t k + j``:
    slot j of token t), what combine routes by."""
    pairs = tokens * topk
    tags = torch.arange(pairs, dtype=torch.int64, device=device) + (rank * pairs + 1)
    return tags.to(torch.int32).view(pairs, 1)


def ep_quantize_send(
    x: Tensor,
    dst_index: Tensor,
    q_buffers: list[Tensor],
    scale_buffers: list[Tensor] | None,
    tag_buffers: list[Tensor],
    *,
    recipe: str,
    rank: int,
    topk: int,
    scaling_mode: str = "rceil",
    round_scales_to_power_of_2: bool = True,
) -> None:
    """The sender side of EP dispatch on R buffers per kind (lists of local tensors, all (P, W)):
    token t of x (T, D) is quantized once (:func:`ep_send_rows`) and item ``i = t k + j`` writes
    its q row, its scale row (mxfp8: D/32 E8M0 bytes; fp8_rowwise: one fp32) and its tag
    (:func:`ep_send_tags`) at row ``dst_index[i] % P`` of buffer ``dst_index[i] // P``. A negative
    index (a dropped slot) and one at or past ``R * P`` write nothing; nothing else is touched.
    ``dst_index``: T k integers (int32), distinct where valid (two items writing one row leave
    either's bytes)."""
    q_rows, scale_rows = ep_send_rows(
        x, recipe=recipe, scaling_mode=scaling_mode, round_scales_to_power_of_2=round_scales_to_power_of_2
    )
    tokens = x.shape[0]
    index = dst_index.reshape(-1).to(torch.int64)
    source = torch.arange(tokens * topk, device=index.device) // topk
    moves = [(q_buffers, q_rows[source.to(q_rows.device)])]
    if scale_rows is not None:
        moves.append((scale_buffers, scale_rows[source.to(scale_rows.device)]))
    moves.append((tag_buffers, ep_send_tags(rank, tokens, topk, index.device)))
    height = q_buffers[0].shape[0]
    for b in range(len(q_buffers)):
        keep = (index >= b * height) & (index < (b + 1) * height)
        rows = index[keep] - b * height
        for buffers, items in moves:
            target = _as_bits(buffers[b])
            target[rows.to(target.device)] = _as_bits(items)[keep.to(items.device)].to(target.device)
