"""Each public op's contract, declared once: its arguments' shapes, dtypes and choices, its kernel
path's limits, its variant rule and its output shapes (pure Python: no torch, no DSL).

An :class:`OpSpec` lists the op's positional arguments in order (the tuple ``KernelOp`` passes
around), each as a :class:`Operand` (a tensor: ranks, dtype names, contiguity, size multiples), a
:class:`Choice`, a :class:`Flag`, an :class:`Offsets` (int32 group end offsets) or a
:class:`Count`; cross-argument rules that are not one of these are small functions in ``rules``.
Readers:

- ``torch_bindings.contract.Contract``: the full checks (the contract's ``TypeError`` /
  ``ValueError`` messages), the ``torch.library`` fakes (from ``outputs``) and the tables the eager
  fast paths test against (dtype sets, choice sets, divisors);
- the kernel classes' ``can_implement``: the ``limits`` and the divisors;
- the launchers: the variant rule below (the grouped 1x32 kernels' group capacity).

Sizes in ``outputs`` work on ints and SymInts alike; :data:`DYNAMIC` marks a size only the data
knows (the fake asks for an unbacked size).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cute_utils.constants import BLOCK_SIZE, MAX_GROUPS, SMALL_GROUPS, TILE_COLS, TILE_ROWS

QUANT_DTYPES = ("bfloat16", "float32")
SCALE_DTYPES = ("float8_e8m0fnu", "uint8")
#: Sentinel dtype list: any dtype of 1, 2, 4 or 8 bytes that is not quantized (a byte copy).
BYTE_COPY = ("<1, 2, 4 or 8 bytes>",)
BYTE_COPY_SIZES = (1, 2, 4, 8)
ALIGNMENTS = (16, 32, 64, 128)
SCALING_MODES = ("floor", "rceil")
BLOCKS = ("1x32", "32x1")
GROUPS = ("M", "K")
FP8_AXES_2D = ("row", "col")
FP8_AXES_3D = ("K", "N")
#: Most experts of the kernels with one grid z index per expert (CUDA's grid z limit).
MAX_EXPERTS = 65535
#: A size only the data knows (``outputs``); the fake makes an unbacked size for it.
DYNAMIC = "dynamic"
#: Data pointers the kernels take: 16-byte aligned (their vector accesses).
VECTOR_ALIGN = 16


@dataclass(frozen=True)
class Multiple:
    """``dim`` of an operand (negative: from the end), named ``label``, is a multiple of ``divisor``
    when option ``when[0]`` equals ``when[1]`` (always when ``when`` is None); ``why`` ends the
    error message."""

    dim: int
    label: str
    divisor: int
    when: tuple[str, Any] | None = None
    why: str = ""


@dataclass(frozen=True)
class Operand:
    """A tensor argument, row-major: its rank is one of ``ranks``, its dtype one of ``dtypes``
    (torch names, or :data:`BYTE_COPY`); ``multiples`` constrain its sizes; ``device_of``: another
    operand whose device it must share."""

    name: str
    ranks: tuple[int, ...]
    dtypes: tuple[str, ...]
    multiples: tuple[Multiple, ...] = ()
    device_of: str | None = None


@dataclass(frozen=True)
class Choice:
    """An option among ``values``, matched with its own type; ``value_type`` set: a value not of
    that type (a bool is not an int) is a ``TypeError`` naming it (the alignment's int)."""

    name: str
    values: tuple
    value_type: type | None = None


@dataclass(frozen=True)
class Flag:
    """A Python bool option."""

    name: str


@dataclass(frozen=True)
class Offsets:
    """Group end offsets: int32, 1-D, at least one group, contiguous, on operand ``of``'s device;
    ``optional``: None allowed; ``requires``: a :class:`Flag` that must be True when they are given;
    ``ranks_of``: the ranks of ``of`` they may come with; ``length_of``: other offsets of the same
    length; ``why``: the reason ``requires`` or ``ranks_of`` gives in its error message."""

    name: str
    of: str
    optional: bool = False
    requires: str | None = None
    ranks_of: tuple[int, ...] | None = None
    length_of: str | None = None
    why: str = ""


@dataclass(frozen=True)
class Count:
    """An optional row count: None or an int >= 0 (a SymInt passes)."""

    name: str


@dataclass(frozen=True)
class Limits:
    """The kernel path's limits beyond the contract (the reference has none): at most
    ``max_groups`` groups, ``max_experts`` experts (None: no limit), data pointers aligned to
    ``VECTOR_ALIGN`` bytes."""

    max_groups: int | None = MAX_GROUPS
    max_experts: int | None = None

    def accepts(self, groups: int | None = None, experts: int | None = None, ptrs: tuple = ()) -> bool:
        """Whether a launch of ``groups`` groups (None: ungrouped), ``experts`` experts and data
        pointers ``ptrs`` is within these limits."""
        if groups is not None and self.max_groups is not None and groups > self.max_groups:
            return False
        if experts is not None and self.max_experts is not None and experts > self.max_experts:
            return False
        return all(ptr % VECTOR_ALIGN == 0 for ptr in ptrs)


@dataclass(frozen=True)
class Out:
    """One output: ``shape`` (ints / SymInts / :data:`DYNAMIC`), ``dtype`` (a torch name; ``None``:
    the first operand's), ``strides`` (None: row-major)."""

    shape: tuple
    dtype: str | None
    strides: tuple | None = None


Param = Operand | Choice | Flag | Offsets | Count
#: A cross-argument rule: ``rule(args)`` with ``args`` the op's arguments by name; returns the
#: error message (the op's name is prefixed) or None. It reads the operands' metadata only (shapes,
#: devices, ranks): it runs after the last operand's checks, before later options are checked.
Rule = Callable[[dict], str | None]


@dataclass(frozen=True)
class OpSpec:
    """A public op's contract (module docstring). ``outputs(args)`` gives its :class:`Out` list
    from the arguments by name (metadata only)."""

    name: str
    params: tuple[Param, ...]
    outputs: Callable[[dict], tuple[Out, ...]]
    limits: Limits = Limits()
    rules: tuple[Rule, ...] = ()

    def param(self, name: str) -> Param:
        """The parameter called ``name``."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"{self.name} has no parameter {name!r}")

    def divisor(self, operand: str, label: str) -> int:
        """The divisor of ``operand``'s size called ``label``."""
        for m in self.param(operand).multiples:
            if m.label == label:
                return m.divisor
        raise KeyError(f"{self.name}: {operand} has no multiple called {label!r}")

    def named(self, args: tuple) -> dict:
        """The op's positional ``args`` by parameter name."""
        return {p.name: a for p, a in zip(self.params, args, strict=True)}


# ----------------------------------------------------------------------------------------------
# Shapes (SPEC section 3): the blocked layout pads rows to 128 and scale columns to 4.
# ----------------------------------------------------------------------------------------------


def _round_up(n, m: int):
    return (n + m - 1) // m * m


def blocked_output_shape(scales_shape: tuple, num_groups: int | None, groups: str) -> tuple:
    """Shape of blocked scales of a (..., R, C) scale matrix: (..., Rp, Cp); M-groups (R + 128 G,
    Cp); K-groups (Rp, C + 4 G)."""
    *lead, rows, cols = scales_shape
    padded_cols = _round_up(cols, TILE_COLS)
    if num_groups is None:
        return (*lead, _round_up(rows, TILE_ROWS), padded_cols)
    if groups == "M":
        return (rows + TILE_ROWS * num_groups, padded_cols)
    return (_round_up(rows, TILE_ROWS), cols + TILE_COLS * num_groups)


def scales_shape_1x32(x_shape: tuple, num_groups: int | None, blocked: bool) -> tuple:
    """1x32 scales of x (M, K): (M, K/32), blocked (Rp, Cp), M-groups (M + 128 G, Cp)."""
    rows, cols = x_shape
    if not blocked:
        return (rows, cols // BLOCK_SIZE)
    return blocked_output_shape((rows, cols // BLOCK_SIZE), num_groups, "M")


def scales_shape_32x1(rows, cols, num_groups: int | None, blocked: bool) -> tuple:
    """32x1 scales of (M, K), S = (K, M/32): plain, blocked (Rp, Cp) or K-groups (Rp, M/32 + 4 G)."""
    if not blocked:
        return (cols, rows // BLOCK_SIZE)
    return blocked_output_shape((cols, rows // BLOCK_SIZE), num_groups, "K")


def scales_shape_3d(w_shape: tuple, block: str, blocked: bool) -> tuple:
    """Scales of w (E, N, K): per expert (N, K/32) for 1x32, (K, N/32) for 32x1; plain (E, *S),
    blocked (E, Rp, Cp)."""
    experts, n, k = w_shape
    per_expert = (n, k // BLOCK_SIZE) if block == "1x32" else (k, n // BLOCK_SIZE)
    if not blocked:
        return (experts, *per_expert)
    return blocked_output_shape((experts, *per_expert), None, "M")


def padded_rows(rows, num_groups, alignment: int):
    """Rows of the padded token groups: ``A * ceil((M + G A) / A)`` (SPEC section 4)."""
    return _round_up(rows + num_groups * alignment, alignment)


def _groups(args: dict) -> int | None:
    offsets = args["group_end_offsets"]
    return None if offsets is None else offsets.shape[0]


# ----------------------------------------------------------------------------------------------
# The variant rule the launchers read
# ----------------------------------------------------------------------------------------------

#: G (0 .. MAX_GROUPS) -> the group capacity in the key of the 1x32 M-groups and padded kernels:
#: the variant with small scan arrays up to SMALL_GROUPS groups, else MAX_GROUPS.
GROUP_CAPACITY = tuple(SMALL_GROUPS if g <= SMALL_GROUPS else MAX_GROUPS for g in range(MAX_GROUPS + 1))


# ----------------------------------------------------------------------------------------------
# MXFP8 quantization (SPEC sections 2, 3, 5)
# ----------------------------------------------------------------------------------------------

_K32 = Multiple(-1, "K", BLOCK_SIZE, when=("block", "1x32"), why="for block='1x32'")
_M32 = Multiple(0, "M", BLOCK_SIZE, when=("block", "32x1"), why="for block='32x1'")
_MODE = Choice("scaling_mode", SCALING_MODES)
_BLOCK = Choice("block", BLOCKS)
_BLOCKED = Flag("blocked_scales")
_ROW_GROUPS = Offsets(
    "group_end_offsets",
    of="x",
    optional=True,
    requires="blocked_scales",
    why="(groups only change the blocked scale layout)",
)


def _mxfp8_2d_outputs(a: dict) -> tuple[Out, ...]:
    rows, cols = a["x"].shape
    groups, blocked = _groups(a), a["blocked_scales"]
    if a["block"] == "1x32":
        return Out((rows, cols), "float8_e4m3fn"), Out(
            scales_shape_1x32((rows, cols), groups, blocked), "float8_e8m0fnu"
        )
    q = Out((rows, cols), "float8_e4m3fn", (1, rows))
    return q, Out(scales_shape_32x1(rows, cols, groups, blocked), "float8_e8m0fnu")


QUANTIZE_MXFP8_2D = OpSpec(
    "quantize_mxfp8_2d",
    (Operand("x", (2,), QUANT_DTYPES, (_K32, _M32)), _BLOCK, _ROW_GROUPS, _MODE, _BLOCKED),
    _mxfp8_2d_outputs,
)


def _mxfp8_dual_outputs(a: dict) -> tuple[Out, ...]:
    rows, cols = a["x"].shape
    groups, blocked = _groups(a), a["blocked_scales"]
    return (
        Out((rows, cols), "float8_e4m3fn"),
        Out(scales_shape_1x32((rows, cols), groups, blocked), "float8_e8m0fnu"),
        Out((rows, cols), "float8_e4m3fn", (1, rows)),
        Out(scales_shape_32x1(rows, cols, groups, blocked), "float8_e8m0fnu"),
    )


QUANTIZE_MXFP8_2D_DUAL = OpSpec(
    "quantize_mxfp8_2d_dual",
    (
        Operand(
            "x",
            (2,),
            QUANT_DTYPES,
            (
                Multiple(0, "M", BLOCK_SIZE, why="(32x1 blocks)"),
                Multiple(-1, "K", BLOCK_SIZE, why="(1x32 blocks)"),
            ),
        ),
        _ROW_GROUPS,
        _MODE,
        _BLOCKED,
    ),
    _mxfp8_dual_outputs,
)


def _mxfp8_3d_outputs(a: dict) -> tuple[Out, ...]:
    experts, n, k = shape = a["w"].shape
    strides = None if a["block"] == "1x32" else (n * k, 1, n)
    return Out(shape, "float8_e4m3fn", strides), Out(
        scales_shape_3d(shape, a["block"], a["blocked_scales"]), "float8_e8m0fnu"
    )


QUANTIZE_MXFP8_3D = OpSpec(
    "quantize_mxfp8_3d",
    (
        Operand(
            "w",
            (3,),
            QUANT_DTYPES,
            (
                Multiple(1, "N", BLOCK_SIZE, when=("block", "32x1"), why="for block='32x1'"),
                Multiple(2, "K", BLOCK_SIZE),
            ),
        ),
        _BLOCK,
        _MODE,
        _BLOCKED,
    ),
    _mxfp8_3d_outputs,
    Limits(max_groups=None, max_experts=MAX_EXPERTS),
)

_ALIGNMENT = Choice("alignment", ALIGNMENTS, value_type=int)


def _pad_quantize_outputs(a: dict) -> tuple[Out, ...]:
    rows, cols = a["x"].shape
    groups = a["group_end_offsets"].shape[0]
    prows = padded_rows(rows, groups, a["alignment"])
    ends = Out((groups,), "int32")
    return (
        Out((prows, cols), "float8_e4m3fn"),
        Out(scales_shape_1x32((prows, cols), groups, True), "float8_e8m0fnu"),
        ends,
        ends,
    )


PAD_AND_QUANTIZE_MXFP8_2D = OpSpec(
    "pad_and_quantize_mxfp8_2d",
    (
        Operand("x", (2,), QUANT_DTYPES, (Multiple(-1, "K", BLOCK_SIZE, why="for block='1x32'"),)),
        Offsets("group_end_offsets", of="x"),
        _ALIGNMENT,
        _MODE,
    ),
    _pad_quantize_outputs,
)


def _swizzle_outputs(a: dict) -> tuple[Out, ...]:
    """``swizzle_scales``' output: the blocked shape of ``scales`` (:func:`blocked_output_shape`)."""
    return (Out(blocked_output_shape(tuple(a["scales"].shape), _groups(a), a["groups"]), "float8_e8m0fnu"),)


SWIZZLE_SCALES = OpSpec(
    "swizzle_scales",
    (
        Operand("scales", (2, 3), SCALE_DTYPES),
        Offsets(
            "group_end_offsets",
            of="scales",
            optional=True,
            ranks_of=(2,),
            why="(each expert is blocked independently)",
        ),
        Choice("groups", GROUPS),
    ),
    _swizzle_outputs,
)


# ----------------------------------------------------------------------------------------------
# Token-group padding (SPEC section 4): a byte copy of any dtype of 1, 2, 4 or 8 bytes
# ----------------------------------------------------------------------------------------------


def _pad_outputs(a: dict) -> tuple[Out, ...]:
    rows, cols = a["x"].shape
    groups = a["group_end_offsets"].shape[0]
    ends = Out((groups,), "int32")
    return Out((padded_rows(rows, groups, a["alignment"]), cols), None), ends, ends


PAD_TOKEN_GROUPS = OpSpec(
    "pad_token_groups",
    (Operand("x", (2,), BYTE_COPY), Offsets("group_end_offsets", of="x"), _ALIGNMENT),
    _pad_outputs,
)


def _unpad_outputs(a: dict) -> tuple[Out, ...]:
    rows = DYNAMIC if a["num_tokens"] is None else a["num_tokens"]
    return (Out((rows, a["padded"].shape[1]), None),)


UNPAD_TOKEN_GROUPS = OpSpec(
    "unpad_token_groups",
    (
        Operand("padded", (2,), BYTE_COPY),
        Offsets("group_end_offsets", of="padded"),
        Offsets("padded_start", of="padded", length_of="group_end_offsets"),
        Count("num_tokens"),
    ),
    _unpad_outputs,
)


# ----------------------------------------------------------------------------------------------
# FP8 rowwise (SPEC section 7)
# ----------------------------------------------------------------------------------------------

_POW2 = Flag("round_scales_to_power_of_2")
_BOUNDS = Offsets("group_end_offsets", of="x", optional=True)


def _fp8_row_outputs(shape: tuple) -> tuple[Out, ...]:
    return Out(shape, "float8_e4m3fn"), Out(shape[:-1], "float32")


def _fp8_col_outputs_2d(shape: tuple, groups: int | None) -> tuple[Out, ...]:
    rows, cols = shape
    return Out(shape, "float8_e4m3fn", (1, max(rows, 1))), Out(
        ((1 if groups is None else groups) * cols,), "float32"
    )


def _fp8_col_outputs_3d(shape: tuple) -> tuple[Out, ...]:
    experts, n, k = shape
    return Out(shape, "float8_e4m3fn", (n * k, 1, n)), Out((experts, k), "float32")


def _fp8_2d_outputs(a: dict) -> tuple[Out, ...]:
    shape = tuple(a["x"].shape)
    return _fp8_row_outputs(shape) if a["axis"] == "row" else _fp8_col_outputs_2d(shape, _groups(a))


QUANTIZE_FP8_2D = OpSpec(
    "quantize_fp8_2d",
    (Operand("x", (2,), QUANT_DTYPES), Choice("axis", FP8_AXES_2D), _BOUNDS, _POW2),
    _fp8_2d_outputs,
    Limits(max_groups=None),
)


def _fp8_padded_cols_outputs(a: dict) -> tuple[Out, ...]:
    rows, cols = a["x"].shape
    groups = a["group_end_offsets"].shape[0]
    prows = padded_rows(rows, groups, a["alignment"])
    ends = Out((groups,), "int32")
    return *_fp8_col_outputs_2d((prows, cols), groups), ends, ends


PAD_AND_QUANTIZE_FP8_2D_COLS = OpSpec(
    "pad_and_quantize_fp8_2d_cols",
    (Operand("x", (2,), QUANT_DTYPES), Offsets("group_end_offsets", of="x"), _ALIGNMENT, _POW2),
    _fp8_padded_cols_outputs,
)


def _fp8_padded_dual_outputs(a: dict) -> tuple[Out, ...]:
    return (*_fp8_row_outputs(tuple(a["x"].shape)), *_fp8_padded_cols_outputs(a))


PAD_AND_QUANTIZE_FP8_2D_DUAL = OpSpec(
    "pad_and_quantize_fp8_2d_dual",
    (Operand("x", (2,), QUANT_DTYPES), Offsets("group_end_offsets", of="x"), _ALIGNMENT, _POW2),
    _fp8_padded_dual_outputs,
)


def _fp8_dual_outputs(a: dict) -> tuple[Out, ...]:
    shape = tuple(a["x"].shape)
    return (*_fp8_row_outputs(shape), *_fp8_col_outputs_2d(shape, _groups(a)))


QUANTIZE_FP8_2D_DUAL = OpSpec(
    "quantize_fp8_2d_dual",
    (Operand("x", (2,), QUANT_DTYPES), _BOUNDS, _POW2),
    _fp8_dual_outputs,
    Limits(max_groups=None),
)


def _fp8_3d_outputs(a: dict) -> tuple[Out, ...]:
    shape = tuple(a["w"].shape)
    return _fp8_row_outputs(shape) if a["axis"] == "K" else _fp8_col_outputs_3d(shape)


QUANTIZE_FP8_3D = OpSpec(
    "quantize_fp8_3d",
    (Operand("w", (3,), QUANT_DTYPES), Choice("axis", FP8_AXES_3D), _POW2),
    _fp8_3d_outputs,
    Limits(max_groups=None, max_experts=MAX_EXPERTS),
)


def _fp8_dual_3d_outputs(a: dict) -> tuple[Out, ...]:
    shape = tuple(a["w"].shape)
    return (*_fp8_row_outputs(shape), *_fp8_col_outputs_3d(shape))


QUANTIZE_FP8_3D_DUAL = OpSpec(
    "quantize_fp8_3d_dual",
    (Operand("w", (3,), QUANT_DTYPES), _POW2),
    _fp8_dual_3d_outputs,
    Limits(max_groups=None, max_experts=MAX_EXPERTS),
)


def _scales_per_row(a: dict) -> str | None:
    q, scales = a["q"], a["scales"]
    if scales.shape[0] != q.shape[0]:
        return f"scales must hold one scale per row of q ({q.shape[0]}), got {scales.shape[0]}"
    return None


DEQUANTIZE_FP8_ROWS = OpSpec(
    "dequantize_fp8_rows",
    (
        Operand("q", (2,), ("float8_e4m3fn",)),
        Operand("scales", (1,), ("float32",), device_of="q"),
        Offsets("group_end_offsets", of="q"),
    ),
    lambda a: (Out(tuple(a["q"].shape), "bfloat16"),),
    Limits(max_groups=None),
    (_scales_per_row,),
)


# ----------------------------------------------------------------------------------------------
# SwiGLU fused with FP8 rowwise quantization
# ----------------------------------------------------------------------------------------------

SWIGLU_DTYPES = ("bfloat16",)


def _h13_even(a: dict) -> str | None:
    shape = tuple(a["h13"].shape)
    if shape[1] % 2:
        return f"h13's last dim must be even (gate columns [0, H), up columns [H, 2H)), got shape {shape}"
    return None


def _grad_h_of_h13(a: dict) -> str | None:
    rows, cols = a["h13"].shape
    expected = (rows, cols // 2)
    if tuple(a["grad_h"].shape) != expected:
        return (
            f"grad_h must have the shape (M, H) = {expected} of h13 (M, 2H) = {(rows, cols)}, "
            f"got {tuple(a['grad_h'].shape)}"
        )
    return None


def _swiglu_outputs(a: dict) -> tuple[Out, ...]:
    rows, cols = a["h13"].shape
    shape = (rows, cols // 2)
    return Out(shape, "bfloat16"), Out(shape, "float8_e4m3fn"), Out((rows,), "float32")


SWIGLU_QUANTIZE_FP8 = OpSpec(
    "swiglu_quantize_fp8",
    (Operand("h13", (2,), SWIGLU_DTYPES), Offsets("group_end_offsets", of="h13", optional=True), _POW2),
    _swiglu_outputs,
    Limits(max_groups=None),
    (_h13_even,),
)


def _swiglu_backward_outputs(a: dict) -> tuple[Out, ...]:
    shape = tuple(a["h13"].shape)
    return Out(shape, "bfloat16"), Out(shape, "float8_e4m3fn"), Out((shape[0],), "float32")


SWIGLU_BACKWARD_QUANTIZE_FP8 = OpSpec(
    "swiglu_backward_quantize_fp8",
    (
        Operand("grad_h", (2,), SWIGLU_DTYPES),
        Operand("h13", (2,), SWIGLU_DTYPES, device_of="grad_h"),
        Offsets("group_end_offsets", of="h13", optional=True),
        _POW2,
    ),
    _swiglu_backward_outputs,
    Limits(max_groups=None),
    (_h13_even, _grad_h_of_h13),
)
