"""SwiGLU in registers with exact fp32 operations, bit-exact to ``torch_bindings.reference.silu_parts``.

Every floating-point step is one IEEE fp32 operation rounded to nearest even, written as explicit
PTX (``mul.rn.f32``, ``add.rn.f32``, ``div.rn.f32``, ``cvt.rni.f32.f32``) so ptxas never contracts
two of them into an FMA nor replaces the division; powers of 2 are built from exponent bits. The
reference runs the same sequence as separate PyTorch fp32 tensor ops (docs/contract.md gives it
in full):

- ``gl = g < -112 ? -112 : g``, ``x = gl > 112 ? 112 : gl`` (NaN stays NaN);
- ``y = -|x|``, ``nf = rint(y * LOG2E)``, ``r = (y + nf * -LN2_HI) + nf * -LN2_LO``,
  ``p = 1 + r (1 + r (c2 + r (c3 + r (c4 + r (c5 + r c6)))))`` (~exp(r)), ``n = int(nf)``,
  ``e = p * 2^max(n, -126)`` (~exp(-|x|));
- ``pos = g >= 0``, ``sm = (pos ? 1 : p) / (1 + e)``, ``k = pos ? 0 : n``: sigmoid(g) = sm 2^k,
  applied as ``(v * 2^(k >> 1)) * 2^(k - (k >> 1))`` after the products with ``sm``;
- silu = ``((gl * sm) * p1) * p2``; silu' = ``((sm * (1 + x * c)) * p1) * p2`` with ``c = pos ? e *
  sm : 1 - ((sm * p1) * p2)``.

bf16 results are packed two to a word by ``cvt.rn.bf16.f32`` with every NaN written as 0x7FC0
(:func:`bf16x2`), the bits the reference writes on any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .constants import (
    SWIGLU_BF16_NAN_BITS,
    SWIGLU_CLAMP,
    SWIGLU_EXP_COEFF_BITS,
    SWIGLU_LN2_HI_BITS,
    SWIGLU_LN2_LO_BITS,
    SWIGLU_LOG2E_BITS,
    f32_of_bits,
)
from .fp8 import add_rn, mul_rn
from .mx import bf16_halves_max_bits, bf16x2_magnitudes, max_u16x2

_LOG2E = f32_of_bits(SWIGLU_LOG2E_BITS)
_NEG_LN2_HI = -f32_of_bits(SWIGLU_LN2_HI_BITS)
_NEG_LN2_LO = -f32_of_bits(SWIGLU_LN2_LO_BITS)
_EXP_COEFFS = tuple(f32_of_bits(b) for b in SWIGLU_EXP_COEFF_BITS)  # c2..c6
_SIGN = -(1 << 31)  # the fp32 sign bit as an Int32


def _asm(result_type, constraints: str, text: str, *operands, loc=None, ip=None):
    return llvm.inline_asm(
        result_type, [v.ir_value(loc=loc, ip=ip) for v in operands], text, constraints, loc=loc, ip=ip
    )


@dsl_user_op
def div_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``fp32(a / b)``, correctly rounded (``div.rn.f32``)."""
    return Float32(_asm(T.f32(), "=f,f,f", "div.rn.f32 $0, $1, $2;", Float32(a), Float32(b), loc=loc, ip=ip))


@dsl_user_op
def rint(a: Float32, *, loc=None, ip=None) -> Float32:
    """``a`` rounded to the nearest integer, ties to even (``cvt.rni.f32.f32``; NaN stays NaN)."""
    return Float32(_asm(T.f32(), "=f,f", "cvt.rni.f32.f32 $0, $1;", Float32(a), loc=loc, ip=ip))


@dsl_user_op
def to_int(a: Float32, *, loc=None, ip=None) -> Int32:
    """An integer-valued ``a`` as an Int32 (``cvt.rzi.s32.f32``: NaN gives 0, as the reference)."""
    return Int32(_asm(T.i32(), "=r,f", "cvt.rzi.s32.f32 $0, $1;", Float32(a), loc=loc, ip=ip))


@dsl_user_op
def bf16x2(a: Float32, b: Float32, *, loc=None, ip=None) -> Uint32:
    """bf16 of ``a`` (low half) and ``b`` (high half), nearest even, each NaN as 0x7FC0."""
    nan = f"0x{SWIGLU_BF16_NAN_BITS:04X}"
    text = (
        "{ .reg .b16 lo, hi; .reg .pred na, nb;\n"
        "cvt.rn.bf16.f32 lo, $1;\n"
        "cvt.rn.bf16.f32 hi, $2;\n"
        "setp.nan.f32 na, $1, $1;\n"
        "setp.nan.f32 nb, $2, $2;\n"
        f"selp.b16 lo, {nan}, lo, na;\n"
        f"selp.b16 hi, {nan}, hi, nb;\n"
        "mov.b32 $0, {lo, hi}; }"
    )
    return Uint32(_asm(T.i32(), "=r,f,f", text, Float32(a), Float32(b), loc=loc, ip=ip))


@cute.jit
def pow2(k: Int32) -> Float32:
    """``2^k`` from its exponent bits, for ``k`` in [-126, 127]."""
    return ((k + 127) << 23).bitcast(Float32)


@dataclass(frozen=True)
class SiluParts:
    """The terms of one gate value ``g`` (module docstring): ``gl`` and ``x`` (g clamped below, and
    both ways), ``e`` ~ exp(-|x|), ``pos`` (g >= 0), ``sm`` and the powers of 2 ``p1``, ``p2`` of
    sigmoid(g) = (sm p1) p2."""

    gl: Float32
    x: Float32
    e: Float32
    pos: cutlass.Boolean
    sm: Float32
    p1: Float32
    p2: Float32


@cute.jit
def _exp_poly(r: Float32) -> Float32:
    """``p(r) ~ exp(r)`` on ``|r| <= ln(2) / 2``: Horner, every product and sum rounded once."""
    s = Float32(_EXP_COEFFS[-1])
    for i in cutlass.range_constexpr(len(_EXP_COEFFS) - 1):
        s = add_rn(mul_rn(s, r), _EXP_COEFFS[-2 - i])
    return add_rn(mul_rn(r, add_rn(mul_rn(r, s), 1.0)), 1.0)


@cute.jit
def silu_parts(g: Float32) -> SiluParts:
    """:class:`SiluParts` of ``g`` (fp32)."""
    gl = Float32(cutlass.select_(g < -SWIGLU_CLAMP, Float32(-SWIGLU_CLAMP), g))
    x = Float32(cutlass.select_(gl > SWIGLU_CLAMP, Float32(SWIGLU_CLAMP), gl))
    y = (x.bitcast(Int32) | Int32(_SIGN)).bitcast(Float32)  # -|x|
    nf = rint(mul_rn(y, _LOG2E))
    r = add_rn(add_rn(y, mul_rn(nf, _NEG_LN2_HI)), mul_rn(nf, _NEG_LN2_LO))
    p = _exp_poly(r)
    n = to_int(nf)
    e = mul_rn(p, pow2(cutlass.max(n, Int32(-126))))
    pos = g >= 0.0
    sm = div_rn(Float32(cutlass.select_(pos, Float32(1.0), p)), add_rn(e, 1.0))
    k = Int32(cutlass.select_(pos, Int32(0), n))
    half = k >> 1
    return SiluParts(gl, x, e, pos, sm, pow2(half), pow2(k - half))


@cute.jit
def scaled(v: Float32, parts: SiluParts) -> Float32:
    """``(v * p1) * p2``: ``v`` times the power of 2 of sigmoid(g), rounded once at the end."""
    return mul_rn(mul_rn(v, parts.p1), parts.p2)


@cute.jit
def silu(parts: SiluParts) -> Float32:
    """silu(g) = ``((gl * sm) * p1) * p2``."""
    return scaled(mul_rn(parts.gl, parts.sm), parts)


@cute.jit
def silu_grad(parts: SiluParts) -> Float32:
    """silu'(g) = ``((sm * (1 + x * c)) * p1) * p2``, ``c = pos ? e * sm : 1 - sigmoid(g)``."""
    one_minus = add_rn(1.0, -scaled(parts.sm, parts))
    c = Float32(cutlass.select_(parts.pos, mul_rn(parts.e, parts.sm), one_minus))
    return scaled(mul_rn(parts.sm, add_rn(mul_rn(parts.x, c), 1.0)), parts)


@cute.jit
def bf16_amax(amax: Uint32, word: Uint32) -> Uint32:
    """Running lane-wise max of the bf16 magnitudes of ``word`` (two bf16, sign bits cleared): an
    integer max is a NaN-propagating float max (``cute_utils.mx.max_u16x2``)."""
    return max_u16x2(amax, bf16x2_magnitudes(word))


#: fp32 bits of the larger of the two bf16 magnitudes of a :func:`bf16_amax` word.
amax_bits = bf16_halves_max_bits
