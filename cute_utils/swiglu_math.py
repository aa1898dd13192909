"""SwiGLU's silu and silu' in registers, bit-exact to ``torch_bindings.reference.silu_fp32`` /
``silu_backward_fp32``, and the packing of its bf16 results.

silu(g) and silu'(g) of a bf16 gate g depend on its 16 bits alone, so the kernels never run the
contract's sequence of fp32 operations (docs/contract.md): they read its results.

- |g| in [2^-25, 2^7) (``constants.SILU_TABLE_FIRST`` to ``SILU_TABLE_END``, the bf16 magnitude
  bits): from a table of the reference's fp32 results (``reference.silu_table``), which a kernel
  keeps in shared memory. The range is 4096 magnitudes long, so the low 12 bits of the magnitude
  number its entries one to one (entry ``bits & 0xFFF``; no subtraction, and any gate's index is
  in bounds); the sign picks the half.
- |g| below it (zeros and subnormals included): silu = ``g * 0.5`` (one rounding) and silu' = 0.5.
- |g| from 2^7 up: silu = g and silu' = 1 for g > 0 (+Inf included), -0 and -0 for g < 0 (-Inf
  included), NaN for NaN.

Each of those equalities holds for every bf16 g in its range (tests/torch_bindings/
test_swiglu_cpu.py checks all 65536 against the reference). bf16 results are packed two to a word
by ``cvt.rn.bf16.f32`` with every NaN written as 0x7FC0 (:func:`bf16x2`), the bits the reference
writes on any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .constants import SILU_TABLE_END, SILU_TABLE_FIRST, SILU_TABLE_SPAN, SWIGLU_BF16_NAN_BITS
from .fp8 import mul_rn
from .mx import bf16_halves_max_bits, bf16x2_magnitudes, max_u16x2

#: fp32 bit patterns as Int32: +Inf (a larger magnitude is NaN) and -Inf (the largest pattern, as
#: a signed integer, of a negative number that is not NaN).
_INF_BITS = 0x7F800000
_NEG_INF_BITS = -(1 << 23)


def _asm(result_type, constraints: str, text: str, *operands, loc=None, ip=None):
    return llvm.inline_asm(
        result_type, [v.ir_value(loc=loc, ip=ip) for v in operands], text, constraints, loc=loc, ip=ip
    )


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


@dataclass(frozen=True)
class TableSlot:
    """Where a bf16 gate ``g`` (widened to fp32) finds silu(g) and silu'(g) (module docstring):
    ``index`` its entry in a function's table (in bounds for every gate), ``small`` (|g| below the
    table), ``big`` (|g| past it, Inf and NaN included), ``negative`` (g < 0 and not NaN) and
    ``nan``."""

    index: Int32
    small: cutlass.Boolean
    big: cutlass.Boolean
    negative: cutlass.Boolean
    nan: cutlass.Boolean


@cute.jit
def silu_table_slot(g: Float32) -> TableSlot:
    """:class:`TableSlot` of ``g`` from its bits (the bf16 bits in the high half)."""
    bits = g.bitcast(Int32)
    magnitude = bits & Int32(0x7FFFFFFF)
    # the magnitude's low 12 bits; the sign (bit 31, copied down by the arithmetic shift) as bit 12
    index = ((bits >> 16) & Int32(SILU_TABLE_SPAN - 1)) | ((bits >> 19) & Int32(SILU_TABLE_SPAN))
    small = magnitude < Int32(SILU_TABLE_FIRST << 16)
    big = magnitude >= Int32(SILU_TABLE_END << 16)
    return TableSlot(index, small, big, bits <= Int32(_NEG_INF_BITS), magnitude > Int32(_INF_BITS))


@cute.jit
def table_silu(g: Float32, slot: TableSlot, table: cute.Tensor) -> Float32:
    """silu(g): ``table[slot.index]`` (``table``: the silu entries, both signs), ``g * 0.5`` below
    the table, past it g (-0 for negative g)."""
    big = Float32(cutlass.select_(slot.negative, Float32(-0.0), g))
    inner = Float32(cutlass.select_(slot.big, big, table[slot.index]))
    return Float32(cutlass.select_(slot.small, mul_rn(g, 0.5), inner))


@cute.jit
def table_silu_grad(g: Float32, slot: TableSlot, table: cute.Tensor) -> Float32:
    """silu'(g): ``table[slot.index]`` (``table``: the silu' entries, both signs), 0.5 below the
    table, past it 1 (-0 for negative g, NaN for NaN)."""
    positive = Float32(cutlass.select_(slot.nan, g, Float32(1.0)))
    big = Float32(cutlass.select_(slot.negative, Float32(-0.0), positive))
    inner = Float32(cutlass.select_(slot.big, big, table[slot.index]))
    return Float32(cutlass.select_(slot.small, Float32(0.5), inner))


@cute.jit
def bf16_amax(amax: Uint32, word: Uint32) -> Uint32:
    """Running lane-wise max of the bf16 magnitudes of ``word`` (two bf16, sign bits cleared): an
    integer max is a NaN-propagating float max (``cute_utils.mx.max_u16x2``)."""
    return max_u16x2(amax, bf16x2_magnitudes(word))


#: fp32 bits of the larger of the two bf16 magnitudes of a :func:`bf16_amax` word.
amax_bits = bf16_halves_max_bits
