"""The torch reading of an op's declared contract (``cute_kernels.op_specs.OpSpec``).

:class:`Contract` turns one spec into what the op layer needs: ``check(*args)``, the full checks
(SPEC section 5: ``TypeError`` for a wrong Python type or dtype, ``ValueError`` otherwise, each
message starting with the op's name); ``fake(*args)``, the ``torch.library`` fake's outputs; and
the sets the eager fast paths test against (``dtypes``, ``choices``, ``divisor``). The launchers
still allocate their outputs from integers on the hot path; ``tests/torch_bindings/test_contract.py``
holds the fakes to the reference's outputs and the GPU tests hold the kernels' to the reference.
Metadata only: nothing here reads tensor values.
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
        self._first_operand = next(p.name for p in spec.params if isinstance(p, Operand))
        self._steps = _check_plan(spec)

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

    def check(self, *args: Any) -> None:
        """Raise the contract's error for the first bad argument of ``args`` (the op's positional
        arguments), in the order of :func:`_check_plan`."""
        a = self.spec.named(args)
        op = self.name
        for step, param in self._steps:
            step(param, a, op)

    # ------------------------------------------------------------------------------------------
    # The fake
    # ------------------------------------------------------------------------------------------

    def fake(self, *args: Any) -> tuple[torch.Tensor, ...]:
        """Empty outputs of the op on ``args`` (fake tensors under ``torch.compile``): the spec's
        ``outputs``, allocated like the first operand; a :data:`DYNAMIC` size is a new unbacked
        size."""
        a = self.spec.named(args)
        like = a[self._first_operand]
        out = []
        for o in self.spec.outputs(a):
            shape = tuple(torch.library.get_ctx().new_dynamic_size() if s == DYNAMIC else s for s in o.shape)
            dtype = like.dtype if o.dtype is None else torch_dtype(o.dtype)
            if o.strides is None:
                out.append(like.new_empty(shape, dtype=dtype))
            else:
                out.append(like.new_empty_strided(shape, o.strides, dtype=dtype))
        return tuple(out)


def _check_plan(spec: OpSpec) -> list:
    """The checks of ``spec`` as ``(function, argument)`` steps, each called as
    ``function(argument, args by name, op)``, in the order of the op's arguments: each argument's
    own checks where it stands; an operand's size multiples right after it, or, when a multiple
    depends on an option declared later, right after that option; the cross-argument rules after
    the last operand; group offsets where they stand, or, when they need a flag declared later,
    right after that flag. ``ValueError`` for a spec naming an argument it does not have, or
    offsets declared before their operand."""
    order = {p.name: i for i, p in enumerate(spec.params)}

    def position(name: str, what: str) -> int:
        if name not in order:
            raise ValueError(f"{spec.name}: {what} names {name!r}, which is not an argument")
        return order[name]

    steps, waiting = [], {}
    last_operand = max(i for i, p in enumerate(spec.params) if isinstance(p, Operand))
    for i, p in enumerate(spec.params):
        if isinstance(p, Offsets):
            for other in (p.of, p.length_of):
                if other is not None and position(other, p.name) > i:
                    raise ValueError(f"{spec.name}: {p.name} comes before {other}, which it refers to")
            if p.requires is not None and position(p.requires, p.name) > i:
                waiting.setdefault(p.requires, []).append((_check_offsets, p))  # after its flag
            else:
                steps.append((_check_offsets, p))
        elif isinstance(p, Operand):
            dtypes = None if p.dtypes == BYTE_COPY else tuple(map(torch_dtype, p.dtypes))
            steps.append((_check_operand, (p, dtypes)))
            for m in p.multiples:
                if m.when is None or position(m.when[0], f"{p.name}'s multiple {m.label}") < i:
                    steps.append((_check_multiple, (p.name, m)))
                else:
                    waiting.setdefault(m.when[0], []).append((_check_multiple, (p.name, m)))
        else:
            steps.append((_CHECK_PARAM[type(p)], p))
        steps += waiting.pop(p.name, [])
        if i == last_operand:
            steps += [(_check_rule, rule) for rule in spec.rules]
    return steps


def _check_multiple(step: tuple, a: dict, op: str) -> None:
    name, m = step
    if m.when is None or a[m.when[0]] == m.when[1]:
        t = a[name]
        dim = m.dim % t.dim()
        if t.shape[dim] % m.divisor:  # the message is built only for the error
            checks.check_divisible(
                f"{name}.shape[{dim}] ({m.label})", t.shape[dim], m.divisor, why=m.why, op=op
            )


def _check_rule(rule, a: dict, op: str) -> None:
    message = rule(a)
    if message is not None:
        raise ValueError(f"{op}: {message}")


def _check_operand(step: tuple, a: dict, op: str) -> None:
    p, dtypes = step  # dtypes: the torch dtypes, None for a byte copy's any-dtype
    t = a[p.name]
    if dtypes is None:
        checks.check_byte_copy_tensor(p.name, t, op=op)
    else:
        checks.check_tensor(p.name, t, ndim=p.ranks, dtypes=dtypes, op=op)
    if p.device_of is not None and t.device != a[p.device_of].device:
        other = a[p.device_of].device
        where = f"got {other} and {t.device}"
        raise ValueError(f"{op}: {p.device_of} and {p.name} must be on one device, {where}")


def _check_choice(p: Choice, a: dict, op: str) -> None:
    if p.value_type is None:
        checks.check_choice(p.name, a[p.name], p.values, op=op)
    else:
        checks.check_typed_choice(p.name, a[p.name], p.values, p.value_type, op=op)


def _check_flag(p: Flag, a: dict, op: str) -> None:
    checks.check_bool(p.name, a[p.name], op=op)


def _check_count(p: Count, a: dict, op: str) -> None:
    if a[p.name] is not None:
        checks.check_num_tokens(a[p.name], op=op)


def _reason(why: str) -> str:
    return f" {why}" if why else ""


def _check_offsets(p: Offsets, a: dict, op: str) -> None:
    offsets, of = a[p.name], a[p.of]
    if offsets is None and p.optional:
        return
    if p.ranks_of is not None and of.dim() not in p.ranks_of:
        ranks = " or ".join(f"{r}-D" for r in p.ranks_of)
        reason = _reason(p.why)
        raise ValueError(
            f"{op}: {p.name} is not supported with {of.dim()}-D {p.of}{reason}; pass {ranks} {p.of} or drop "
            "the offsets"
        )
    checks.check_offsets(p.name, offsets, of.device, op=op)
    if p.length_of is not None:
        checks.check_same_length(p.name, offsets, p.length_of, a[p.length_of], op=op)
    if p.requires is not None and a[p.requires] is not True:
        flag, reason = p.requires, _reason(p.why)
        raise ValueError(
            f"{op}: {p.name} is only supported with {flag}=True{reason}; pass {flag}=True or drop the offsets"
        )


_CHECK_PARAM = {
    Choice: _check_choice,
    Flag: _check_flag,
    Count: _check_count,
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
PAD_AND_QUANTIZE_FP8_2D_COLS = Contract(op_specs.PAD_AND_QUANTIZE_FP8_2D_COLS)
PAD_AND_QUANTIZE_FP8_2D_DUAL = Contract(op_specs.PAD_AND_QUANTIZE_FP8_2D_DUAL)
QUANTIZE_FP8_3D = Contract(op_specs.QUANTIZE_FP8_3D)
QUANTIZE_FP8_3D_DUAL = Contract(op_specs.QUANTIZE_FP8_3D_DUAL)
DEQUANTIZE_FP8_ROWS = Contract(op_specs.DEQUANTIZE_FP8_ROWS)
SWIGLU_QUANTIZE_FP8 = Contract(op_specs.SWIGLU_QUANTIZE_FP8)
SWIGLU_BACKWARD_QUANTIZE_FP8 = Contract(op_specs.SWIGLU_BACKWARD_QUANTIZE_FP8)
