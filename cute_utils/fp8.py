"""FP8 rowwise numerics in registers (SPEC section 7): the per-vector scale from an amax, bit-exact
to ``torch_bindings.reference.fp8_quant_scale``.

``q_scale = fp32(448 / max(fp64(amax), 1e-12))``: a correctly rounded fp64 division (``div.rn.f64``)
rounded once to fp32, as the reference computes it in PyTorch; with power-of-2 rounding its
mantissa is cleared. The dequantization scale the GEMM takes is ``fp32(1 / q_scale)``
(``div.rn.f32``, correctly rounded: exact for powers of 2). The amax comes in as the bits of
``max |x|`` (``cute_utils.mx.abs_bits``): NaN sorts above Inf, so NaN propagates.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .constants import FP8_POW2_MASK

_INF_BITS = 0x7F800000
_QUIET_NAN_BITS = 0x7FC00000
_CLEAR_MANTISSA = FP8_POW2_MASK


@dsl_user_op
def _quant_scale_fp64(amax: Float32, *, loc=None, ip=None) -> Float32:
    """``fp32(448 / max(fp64(amax), 1e-12))`` for a non-NaN ``amax`` (``max.f64`` would drop a NaN)."""
    result = llvm.inline_asm(
        T.f32(),
        [Float32(amax).ir_value(loc=loc, ip=ip)],
        "{ .reg .f64 a, q;\n"
        "cvt.f64.f32 a, $1;\n"
        "max.f64 a, a, 0d3D719799812DEA11;\n"  # 1e-12
        "div.rn.f64 q, 0d407C000000000000, a;\n"  # 448.0 / a
        "cvt.rn.f32.f64 $0, q; }",
        "=f,f",
        loc=loc,
        ip=ip,
    )
    return Float32(result)


@dsl_user_op
def reciprocal_rn(value: Float32, *, loc=None, ip=None) -> Float32:
    """``fp32(1 / value)``, correctly rounded (``div.rn.f32``): 0 -> Inf, NaN -> NaN."""
    result = llvm.inline_asm(
        T.f32(),
        [Float32(value).ir_value(loc=loc, ip=ip)],
        "div.rn.f32 $0, 0f3F800000, $1;",
        "=f,f",
        loc=loc,
        ip=ip,
    )
    return Float32(result)


@cute.jit
def fp8_quant_scale(amax_bits: Int32, round_pow2: cutlass.Constexpr) -> Float32:
    """``q_scale`` of a vector whose ``max |x|`` has the bits ``amax_bits`` (SPEC section 7): the
    multiplier before the E4M3 conversion. NaN amax -> NaN; Inf -> 0."""
    return fp8_quant_scale_masked(amax_bits, Int32(_CLEAR_MANTISSA if round_pow2 else -1))


#: The ``mask`` of :func:`fp8_quant_scale_masked` for power-of-2 scales (``-1``: exact scales).
POW2_MASK = FP8_POW2_MASK


@cute.jit
def fp8_quant_scale_masked(amax_bits: Int32, mask: Int32) -> Float32:
    """:func:`fp8_quant_scale` with the rounding as a run-time ``mask`` ANDed into the scale's bits
    (:data:`POW2_MASK` rounds down to a power of 2, ``-1`` keeps the scale)."""
    q_scale = (_quant_scale_fp64(amax_bits.bitcast(Float32)).bitcast(Int32) & mask).bitcast(Float32)
    if amax_bits > _INF_BITS:
        q_scale = Int32(_QUIET_NAN_BITS).bitcast(Float32)
    return q_scale


def _rounded_once(instruction: str, a: Float32, b: Float32, loc, ip) -> Float32:
    """``instruction`` (``mul.rn.f32`` / ``add.rn.f32``) of a and b: an explicit rounding mode, so
    ptxas never contracts it with a neighbour into an FMA."""
    result = llvm.inline_asm(
        T.f32(),
        [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
        f"{instruction} $0, $1, $2;",
        "=f,f,f",
        loc=loc,
        ip=ip,
    )
    return Float32(result)


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``fp32(a * b)`` rounded once (never contracted into an FMA with a later add)."""
    return _rounded_once("mul.rn.f32", a, b, loc, ip)


@dsl_user_op
def add_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``fp32(a + b)`` rounded once (never contracted into an FMA)."""
    return _rounded_once("add.rn.f32", a, b, loc, ip)
