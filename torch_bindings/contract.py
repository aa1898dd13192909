"""The torch reading of an op's declared contract (``cute_kernels.op_specs.OpSpec``).

:class:`Contract` turns one spec into what the op layer needs: ``check(*args)``, the full checks
(SPEC section 5: ``TypeError`` for a wrong Python type or dtype, ``ValueError`` otherwise, each
message starting with the op's name); ``fake(*args)``, the ``torch.library`` fake's outputs; and
the sets the eager fast paths test against (``dtypes``, ``choices``), so no op restates its
dtypes, choices, divisors, limits or output shapes. Metadata only: nothing here reads tensor values.
"""

from __future__ import annotations

from typing import Any

import torch

from cute_kernels import op_specs
from cute_kernels.op_specs import BYTE_COPY, DYNAMIC, Choice, Count, Flag, Offsets, Operand, OpSpec

from . import checks


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``"bfloat16"`` -> ``torch.bfloat16``)."""
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    """``dtype``'s name as the specs and kernel variants spell it (``torch.bfloat16`` ->
    ``"bfloat16"``)."""
    return str(dtype).removeprefix("torch.")


class Contract:
    """``spec`` read with torch (module docstring)."""

    def __init__(self, spec: OpSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.limits = spec.limits
        self._operands = [p for p in spec.params if isinstance(p, Operand)]
        self._offsets = [p for p in spec.params if isinstance(p, Offsets)]

    def dtypes(self, operand: str) -> frozenset:
        """The torch dtypes ``operand`` takes (empty for a byte copy's any-dtype)."""
        names = self.spec.param(operand).dtypes
        return frozenset() if names == BYTE_COPY else frozenset(map(torch_dtype, names))

    def choices(self, option: str) -> frozenset:
        """The values option ``option`` takes."""
        return frozenset(self.spec.param(option).values)

    def divisor(self, operand: str, label: str) -> int:
        """The divisor of ``operand``'s size ``label`` (``OpSpec.divisor``)."""
        return self.spec.divisor(operand, label)

    # ------------------------------------------------------------------------------------------
    # The full checks
    # ------------------------------------------------------------------------------------------

    def check(self, *args: Any) -> None:
        """Raise the contract's error for the first bad argument of ``args`` (the op's positional
        arguments), in the order: each argument's own type, rank, dtype and value; the operands'
        size multiples; the cross-argument rules; the offsets."""
        op, a = self.name, self.spec.named(args)
        for p in self.spec.params:
            _CHECK_PARAM[type(p)](p, a, op)
        for operand in self._operands:
            self._check_multiples(operand, a)
        for rule in self.spec.rules:
            message = rule(a)
            if message is not None:
                raise ValueError(f"{op}: {message}")
        for offsets in self._offsets:
            _check_offsets(offsets, a, op)

    def _check_multiples(self, operand: Operand, a: dict) -> None:
        t = a[operand.name]
        for m in operand.multiples:
            if m.when is None or a[m.when[0]] == m.when[1]:
                dim = m.dim % t.dim()
                name = f"{operand.name}.shape[{dim}] ({m.label})"
                checks.check_divisible(name, t.shape[dim], m.divisor, why=m.why, op=self.name)

    # ------------------------------------------------------------------------------------------
    # The fake
    # ------------------------------------------------------------------------------------------

    def fake(self, *args: Any) -> tuple[torch.Tensor, ...]:
        """Empty outputs of the op on ``args`` (fake tensors under ``torch.compile``): the spec's
        ``outputs``, allocated like the first operand; a :data:`DYNAMIC` size is a new unbacked
        size."""
        a = self.spec.named(args)
        like = a[self._operands[0].name]
        out = []
        for o in self.spec.outputs(a):
            shape = tuple(torch.library.get_ctx().new_dynamic_size() if s == DYNAMIC else s for s in o.shape)
            dtype = like.dtype if o.dtype is None else torch_dtype(o.dtype)
            if o.strides is None:
                out.append(like.new_empty(shape, dtype=dtype))
            else:
                out.append(like.new_empty_strided(shape, o.strides, dtype=dtype))
        return tuple(out)


def _check_operand(p: Operand, a: dict, op: str) -> None:
    t = a[p.name]
    if p.dtypes == BYTE_COPY:
        checks.check_byte_copy_tensor(p.name, t, op=op)
    else:
        checks.check_tensor(
            p.name, t, ndim=p.ranks, dtypes=tuple(map(torch_dtype, p.dtypes)), op=op, contiguous=p.contiguous
        )
    if p.device_of is not None and t.device != a[p.device_of].device:
        other = a[p.device_of].device
        where = f"got {other} and {t.device}"
        raise ValueError(f"{op}: {p.device_of} and {p.name} must be on one device, {where}")


def _check_choice(p: Choice, a: dict, op: str) -> None:
    value = a[p.name]
    if p.type_name is not None and (isinstance(value, bool) or type(value).__name__ != p.type_name):
        raise TypeError(
            f"{op}: {p.name} must be an {p.type_name}, one of {', '.join(map(str, p.values))}, "
            f"got {checks.describe(value)}"
        )
    checks.check_choice(p.name, value, p.values, op=op)


def _check_flag(p: Flag, a: dict, op: str) -> None:
    checks.check_bool(p.name, a[p.name], op=op)


def _check_count(p: Count, a: dict, op: str) -> None:
    if a[p.name] is not None:
        checks.check_num_tokens(a[p.name], op=op)


def _skip(p: Offsets, a: dict, op: str) -> None:
    """Offsets are checked after every operand's own checks (:func:`_check_offsets`)."""


def _check_offsets(p: Offsets, a: dict, op: str) -> None:
    offsets, of = a[p.name], a[p.of]
    if offsets is None and p.optional:
        return
    if p.ranks_of is not None and of.dim() not in p.ranks_of:
        ranks = " or ".join(f"{r}-D" for r in p.ranks_of)
        raise ValueError(
            f"{op}: {p.name} is not supported with {of.dim()}-D {p.of} (each expert is blocked "
            f"independently); pass {ranks} {p.of} or drop the offsets"
        )
    checks.check_offsets(p.name, offsets, of.device, op=op)
    if p.length_of is not None:
        checks.check_same_length(p.name, offsets, p.length_of, a[p.length_of], op=op)
    if p.requires is not None and a[p.requires] is not True:
        raise ValueError(
            f"{op}: {p.name} is only supported with {p.requires}=True (groups only change the "
            f"blocked scale layout); pass {p.requires}=True or drop the offsets"
        )


_CHECK_PARAM = {
    Operand: _check_operand,
    Choice: _check_choice,
    Flag: _check_flag,
    Count: _check_count,
    Offsets: _skip,
}


# One contract per public op with a kernel (``cute_kernels.op_specs``), read by the op's binding and
# by ``torch_bindings.reference``.
QUANTIZE_MXFP8_2D = Contract(op_specs.QUANTIZE_MXFP8_2D)
QUANTIZE_MXFP8_2D_DUAL = Contract(op_specs.QUANTIZE_MXFP8_2D_DUAL)
QUANTIZE_MXFP8_3D = Contract(op_specs.QUANTIZE_MXFP8_3D)
PAD_AND_QUANTIZE_MXFP8_2D = Contract(op_specs.PAD_AND_QUANTIZE_MXFP8_2D)
SWIZZLE_SCALES = Contract(op_specs.SWIZZLE_SCALES)
PAD_TOKEN_GROUPS = Contract(op_specs.PAD_TOKEN_GROUPS)
UNPAD_TOKEN_GROUPS = Contract(op_specs.UNPAD_TOKEN_GROUPS)
QUANTIZE_FP8_2D = Contract(op_specs.QUANTIZE_FP8_2D)
QUANTIZE_FP8_2D_DUAL = Contract(op_specs.QUANTIZE_FP8_2D_DUAL)
QUANTIZE_FP8_3D = Contract(op_specs.QUANTIZE_FP8_3D)
QUANTIZE_FP8_3D_DUAL = Contract(op_specs.QUANTIZE_FP8_3D_DUAL)
DEQUANTIZE_FP8_ROWS = Contract(op_specs.DEQUANTIZE_FP8_ROWS)
SWIGLU_QUANTIZE_FP8 = Contract(op_specs.SWIGLU_QUANTIZE_FP8)
SWIGLU_BACKWARD_QUANTIZE_FP8 = Contract(op_specs.SWIGLU_BACKWARD_QUANTIZE_FP8)
