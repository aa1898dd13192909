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

BLOCK_SIZE = 32
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


@cute.jit
def transpose_bytes_4x4(w0: Uint32, w1: Uint32, w2: Uint32, w3: Uint32):
    """4x4 byte transpose in registers (8 ``prmt``): rows ``w0..w3`` (byte j = column j) in, the four
    column words out, column j's byte i being row i's byte j. Turns 4 rows of E4M3 bytes into
    4-byte runs along a column (row-wise quantization stored transposed)."""
    t0 = Uint32(cute.arch.prmt(w0, w1, 0x5140))  # w0.0 w1.0 w0.1 w1.1
    t1 = Uint32(cute.arch.prmt(w0, w1, 0x7362))  # w0.2 w1.2 w0.3 w1.3
    t2 = Uint32(cute.arch.prmt(w2, w3, 0x5140))
    t3 = Uint32(cute.arch.prmt(w2, w3, 0x7362))
    c0 = Uint32(cute.arch.prmt(t0, t2, 0x5410))
    c1 = Uint32(cute.arch.prmt(t0, t2, 0x7632))
    c2 = Uint32(cute.arch.prmt(t1, t3, 0x5410))
    c3 = Uint32(cute.arch.prmt(t1, t3, 0x7632))
    return c0, c1, c2, c3
