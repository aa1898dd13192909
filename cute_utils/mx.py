"""MX numerics in registers: E8M0 scale bytes (floor / rceil) and E4M3 data, bit-exact to SPEC §2.

Everything runs on integer bit math plus plain IEEE fp32 multiplies (no flush-to-zero), so the same
code gives the same bits on sm_90a (no ``cvt.*.ue8m0x2``) and sm_100a. The E4M3 conversion is the
saturating round-to-nearest-even ``cvt.rn.satfinite.e4m3x2.f32``.

Conventions: a block's magnitude is carried as the *bits* of ``max |x|`` (an Int32 in
``[0, 0x7FFFFFFF]``): for non-negative floats the integer order is the float order and every NaN
sorts above Inf, so an integer max is a NaN-propagating float max.
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .constants import BLOCK_SIZE  # noqa: F401 - the kernels import it from here

_ABS_MASK = 0x7FFFFFFF
_INF_BITS = 0x7F800000
_INV_448_BITS = 0x3B124925  # fp32(1/448)
_MANTISSA_MASK = 0x7FFFFF
_HALF_MANTISSA = 0x400000
_E8M0_NAN = 255
_INV_SCALE_S254 = 0x00400000  # 2^-127, a subnormal
_QUIET_NAN_BITS = 0x7FC00000

SCALING_MODES = ("floor", "rceil")


@cute.jit
def abs_bits(value: Float32) -> Int32:
    """Bits of ``|value|`` as a non-negative Int32 (NaN payloads kept, so NaN > Inf > finite)."""
    return value.bitcast(Int32) & Int32(_ABS_MASK)


@cute.jit
def max_abs_bits(values: cute.Tensor) -> Int32:
    """``max |v|`` over a register fragment of Float32, as bits (NaN-propagating)."""
    amax = Int32(0)
    for i in cutlass.range_constexpr(cute.size(values)):
        amax = cutlass.max(amax, abs_bits(values[i]))
    return amax


@cute.jit
def _halve_across_lanes(values: cute.Tensor, entries: cutlass.Constexpr, packed: cutlass.Constexpr):
    """Recursive halving of ``entries`` (a power of two <= 32) values per lane: at step
    ``h = entries / 2, .., 1`` a lane keeps the half of its ``2 h`` live entries that its lane bit
    ``h`` selects and trades the other half with lane ``l ^ h`` (``entries - 1`` shuffles, against
    ``log2(entries)`` per entry for separate butterflies). ``values[0]`` ends as the max of entry
    ``l % entries`` over the lanes that agree with ``l`` in the bits above. ``packed``: Uint32 words
    of two 16-bit maxima (:func:`max_u16x2`), else Int32. Overwrites ``values``."""
    lane = cute.arch.lane_idx()
    kind = Uint32 if packed else Int32
    for step in cutlass.range_constexpr(int(math.log2(entries))):
        half = (entries // 2) >> step
        upper = (lane & half) != 0
        for i in cutlass.range_constexpr(half):
            keep = kind(cutlass.select_(upper, values[i + half], values[i]))
            send = kind(cutlass.select_(upper, values[i], values[i + half]))
            if cutlass.const_expr(packed):
                values[i] = max_u16x2(keep, Uint32(cute.arch.shuffle_sync_bfly(send, half)))
            else:
                values[i] = cutlass.max(keep, cute.arch.shuffle_sync_bfly(send, half))
    return values[0]


@cute.jit
def warp_transpose_max(values: cute.Tensor) -> Int32:
    """Lane ``l`` gets the max over the warp's 32 lanes of ``values[l]`` (``values``: 32 Int32 per
    lane, e.g. amax bits of 32 rows; :func:`_halve_across_lanes`, 31 shuffles). Overwrites
    ``values``."""
    return _halve_across_lanes(values, 32, False)


@cute.jit
def lane_group_max(value: Int32, lanes: cutlass.Constexpr) -> Int32:
    """Max of ``value`` over aligned groups of ``lanes`` consecutive lanes (a power of two <= 32);
    every lane of a group gets the result."""
    for k in cutlass.range_constexpr(int(math.log2(lanes))):
        value = cutlass.max(value, cute.arch.shuffle_sync_bfly(value, 1 << k))
    return value


@cute.jit
def _exponent(bits: Int32) -> Int32:
    return (bits >> 23) & Int32(0xFF)


@cute.jit
def e8m0_floor(amax_bits: Int32) -> Int32:
    """floor rule: ``max(E(a) - 8, 0)``; 255 when ``a`` is NaN or Inf."""
    s = cutlass.max(_exponent(amax_bits) - 8, Int32(0))
    if amax_bits >= _INF_BITS:
        s = Int32(_E8M0_NAN)
    return s


@cute.jit
def e8m0_rceil(amax_bits: Int32) -> Int32:
    """rceil rule on ``d = fp32(a * fp32(1/448))`` (subnormal ``d`` counts): ``Mant(d) > 0x400000``
    when ``E(d) == 0``, else ``E(d) + (Mant(d) != 0)``; 255 when ``a`` is NaN or Inf."""
    d = amax_bits.bitcast(Float32) * Int32(_INV_448_BITS).bitcast(Float32)
    d_bits = d.bitcast(Int32)
    e = _exponent(d_bits)
    mantissa = d_bits & Int32(_MANTISSA_MASK)
    s = e + Int32(mantissa != 0)
    if e == 0:
        s = Int32(mantissa > _HALF_MANTISSA)
    if amax_bits >= _INF_BITS:
        s = Int32(_E8M0_NAN)
    return s


@cute.jit
def e8m0_scale(amax_bits: Int32, mode: cutlass.Constexpr) -> Int32:
    """Scale byte (0..255, in an Int32) of a block with magnitude bits ``amax_bits``."""
    if cutlass.const_expr(mode == "floor"):
        s = e8m0_floor(amax_bits)
    else:
        s = e8m0_rceil(amax_bits)
    return s


@cute.jit
def inverse_scale(s: Int32) -> Float32:
    """``2^(127 - s)`` as an exact fp32: normal for s <= 253, 2^-127 (subnormal) for 254, NaN for 255."""
    bits = (Int32(254) - s) << 23
    if s == 254:
        bits = Int32(_INV_SCALE_S254)
    if s == 255:
        bits = Int32(_QUIET_NAN_BITS)
    return bits.bitcast(Float32)


@cute.jit
def scale_values(values: cute.Tensor, inv: Float32):
    """``values[i] * inv`` in place (fp32 products, denormals kept) before the E4M3 conversion."""
    for i in cutlass.range_constexpr(cute.size(values)):
        values[i] = values[i] * inv


@dsl_user_op
def e4m3x4(a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None) -> Uint32:
    """E4M3 bytes of ``a, b, c, d`` (byte 0 = a) in one word: two saturating round-to-nearest-even
    ``cvt.rn.satfinite.e4m3x2.f32`` (NaN -> 0x7F), the conversion of SPEC section 2."""
    operands = [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c, d)]
    word = llvm.inline_asm(
        T.i32(),
        operands,
        "{ .reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
        "mov.b32 $0, {lo, hi}; }",
        "=r,f,f,f,f",
        loc=loc,
        ip=ip,
    )
    return Uint32(word)


@dsl_user_op
def max_u16x2(a: Uint32, b: Uint32, *, loc=None, ip=None) -> Uint32:
    """Lane-wise unsigned max of the two 16-bit halves of ``a`` and ``b`` (``max.u16x2``, sm_90+).
    On bf16 magnitudes (sign bits cleared) it is a NaN-propagating float max, as :func:`abs_bits`."""
    word = llvm.inline_asm(
        T.i32(),
        [Uint32(a).ir_value(loc=loc, ip=ip), Uint32(b).ir_value(loc=loc, ip=ip)],
        "max.u16x2 $0, $1, $2;",
        "=r,r,r",
        loc=loc,
        ip=ip,
    )
    return Uint32(word)


@dsl_user_op
def e4m3x2_into(word: Uint32, high: bool, a: Float32, b: Float32, *, loc=None, ip=None) -> Uint32:
    """``word`` with its low (``high``: high) 16 bits replaced by the E4M3 bytes of ``a`` (the lower
    byte) and ``b`` (one ``cvt.rn.satfinite.e4m3x2.f32``, as :func:`e4m3x4`)."""
    half = "hi" if high else "lo"
    operands = [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b)] + [Uint32(word).ir_value(loc=loc, ip=ip)]
    result = llvm.inline_asm(
        T.i32(),
        operands,
        "{ .reg .b16 lo, hi;\n"
        "mov.b32 {lo, hi}, $3;\n"
        f"cvt.rn.satfinite.e4m3x2.f32 {half}, $2, $1;\n"
        "mov.b32 $0, {lo, hi}; }",
        "=r,f,f,r",
        loc=loc,
        ip=ip,
    )
    return Uint32(result)


# --- bf16 pairs in 32-bit words (element 2i in the low half of word i, 2i + 1 in the high half) ----

ABS_MASK_X2 = 0x7FFF7FFF  # both sign bits of a bf16 pair cleared
_HIGH_HALF = 0xFFFF0000


@cute.jit
def bf16x2_magnitudes(word: Uint32) -> Uint32:
    """Both bf16 of ``word`` with their sign bits cleared."""
    return word & Uint32(ABS_MASK_X2)


@cute.jit
def bf16_low_bits(m: Uint32) -> Int32:
    """fp32 bits of the bf16 magnitude in the low half of ``m`` (the convention of :func:`abs_bits`)."""
    return Int32(m << 16)


@cute.jit
def bf16_high_bits(m: Uint32) -> Int32:
    """fp32 bits of the bf16 magnitude in the high half of ``m``."""
    return Int32(m & Uint32(_HIGH_HALF))


@cute.jit
def bf16x2_abs_max(words: cute.Tensor) -> Uint32:
    """Lane-wise (per 16-bit half) max of the bf16 magnitudes in a fragment of Uint32 words, as bf16
    bits (:func:`max_u16x2`: NaN-propagating, as :func:`abs_bits`)."""
    m = Uint32(0)
    for i in cutlass.range_constexpr(cute.size(words)):
        m = max_u16x2(m, bf16x2_magnitudes(words[i]))
    return m


@cute.jit
def bf16_low(word: Uint32) -> Float32:
    """The bf16 in the low half of ``word`` as an fp32 (exact)."""
    return (word << 16).bitcast(Float32)


@cute.jit
def bf16_high(word: Uint32) -> Float32:
    """The bf16 in the high half of ``word`` as an fp32 (exact)."""
    return (word & Uint32(_HIGH_HALF)).bitcast(Float32)


@cute.jit
def bf16_halves_max_bits(m: Uint32) -> Int32:
    """fp32 bits of the larger of the two bf16 magnitudes in ``m`` (from :func:`bf16x2_abs_max`): an
    amax in the convention of :func:`abs_bits`."""
    return Int32(cutlass.max(m << 16, m & Uint32(_HIGH_HALF)))


@cute.jit
def bf16_pair_max(a: Uint32, b: Uint32) -> Uint32:
    """One word of two maxima: the low half the max of ``a``'s two bf16 magnitudes, the high half
    ``b``'s (two ``prmt`` and one :func:`max_u16x2`), so two blocks' maxima travel in one shuffle."""
    low = Uint32(cute.arch.prmt(a, b, 0x5410))
    high = Uint32(cute.arch.prmt(a, b, 0x7632))
    return max_u16x2(low, high)


@cute.jit
def warp_row_maxima_bf16(words: cute.Tensor) -> Int32:
    """Lane ``l`` gets the max over the warp's 32 lanes of row ``l``'s two bf16 magnitudes, as fp32
    bits (the convention of :func:`abs_bits`). ``words``: 32 Uint32 per lane, word ``i`` row ``i``'s
    column pair with sign bits cleared. Rows ``i`` and ``i + 16`` share a word (:func:`bf16_pair_max`),
    the 16 words are halved across lanes (:func:`_halve_across_lanes`, 15 shuffles), and one butterfly across
    lane bit 4 ends with rows ``l % 16`` and ``l % 16 + 16`` in lane ``l``, which keeps row ``l``."""
    packed = cute.make_rmem_tensor(cute.make_layout(16), Uint32)
    for i in cutlass.range_constexpr(16):
        packed[i] = bf16_pair_max(words[i], words[i + 16])
    lane = cute.arch.lane_idx()
    pair = _halve_across_lanes(packed, 16, True)
    both = max_u16x2(pair, Uint32(cute.arch.shuffle_sync_bfly(pair, 16)))
    return Int32(cutlass.select_(lane >= 16, bf16_high_bits(both), bf16_low_bits(both)))


@cute.jit
def lane_group_max_u16x2(value: Uint32, lanes: cutlass.Constexpr) -> Uint32:
    """:func:`lane_group_max` of both 16-bit halves of ``value`` (:func:`max_u16x2`)."""
    for k in cutlass.range_constexpr(int(math.log2(lanes))):
        value = max_u16x2(value, Uint32(cute.arch.shuffle_sync_bfly(value, 1 << k)))
    return value


@cute.jit
def e4m3_bf16x4(w0: Uint32, w1: Uint32, scale: Float32) -> Uint32:
    """E4M3 bytes of the 4 bf16 in ``w0``, ``w1`` (element order: ``w0`` low, high, ``w1`` low,
    high), each multiplied by ``scale`` in fp32 first (SPEC sections 2 and 7: ``e4m3(x * scale)``,
    saturating, RNE, NaN -> 0x7F)."""
    return e4m3x4(bf16_low(w0) * scale, bf16_high(w0) * scale, bf16_low(w1) * scale, bf16_high(w1) * scale)
