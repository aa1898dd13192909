"""Host-side input validation shared by the op contracts (``torch_bindings.contract``, which makes
each public op's checks from its declared spec), the training layer and the kernel path.

Every function here looks only at Python arguments and at tensor *metadata* (dtype, rank, shape,
strides, device). None of them reads tensor values, so none of them synchronizes the host with
the device; they are safe to call on the fast path before any launch. Offset *values*
(monotonicity, bounds) can only be checked with a sync: see
``torch_bindings.reference.check_group_end_offsets``.

Errors follow SPEC section 5: a ``TypeError`` for a wrong Python type or tensor dtype, a
``ValueError`` for everything else (rank, shape, divisibility, contiguity, device, enum values).
Each message starts with the op name and names the argument and what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cute_kernels.op_specs import (
    ALIGNMENTS,
    BYTE_COPY_SIZES,
    MAX_EXPERTS,
    QUANT_DTYPES,
    SCALING_MODES,
    VECTOR_ALIGN,
)
from cute_utils.constants import BLOCK_SIZE, MAX_GROUPS

OFFSETS_DTYPE = torch.int32
BACKENDS: tuple[str, ...] = ("auto", "cute", "reference")


# ----------------------------------------------------------------------------------------------
# Small shared helpers
# ----------------------------------------------------------------------------------------------


def _prefix(op: str | None) -> str:
    return f"{op}: " if op else ""


def _dtypes_str(dtypes: Sequence[torch.dtype]) -> str:
    names = [str(d) for d in dtypes]
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " or " + names[-1]


def describe(value: Any) -> str:
    """A short description of ``value`` for error messages (metadata only, never tensor values)."""
    if isinstance(value, torch.Tensor):
        return (
            f"a {value.dim()}-D tensor of dtype {value.dtype}, shape {tuple(value.shape)}, "
            f"strides {tuple(value.stride())} on device {value.device}"
        )
    return f"{type(value).__name__} {value!r}"


def check_tensor(
    name: str,
    t: Any,
    *,
    ndim: int | Sequence[int],
    dtypes: Sequence[torch.dtype],
    contiguous: bool = True,
    op: str | None = None,
) -> None:
    """Check that ``t`` is a tensor of one of ``dtypes`` with rank ``ndim`` (an int or a choice).

    Raises ``TypeError`` for a non-tensor or a wrong dtype, ``ValueError`` for a wrong rank or, when
    ``contiguous`` is set, a non-contiguous tensor.
    """
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes:
        raise TypeError(f"{_prefix(op)}{name} must be a {_expected(ndims, dtypes)}, got {describe(t)}")
    if t.dim() not in ndims:
        raise ValueError(f"{_prefix(op)}{name} must be a {_expected(ndims, dtypes)}, got {describe(t)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{_prefix(op)}{name} must be contiguous (row-major), got {describe(t)}")


def _expected(ndims: Sequence[int], dtypes: Sequence[torch.dtype]) -> str:
    rank = " or ".join(f"{n}-D" for n in ndims)
    return f"{rank} tensor of dtype {_dtypes_str(dtypes)}"


def check_divisible(name: str, value: int, divisor: int, *, why: str = "", op: str | None = None) -> None:
    """Raise ``ValueError`` unless ``value % divisor == 0``; ``name`` says which size it is."""
    if value % divisor != 0:
        reason = f" {why}" if why else ""
        raise ValueError(f"{_prefix(op)}{name} ({value}) must be a multiple of {divisor}{reason}")


def check_choice(name: str, value: Any, allowed: Sequence[Any], *, op: str | None = None) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed`` (compared with its own type)."""
    if not any(type(value) is type(a) and value == a for a in allowed):
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{_prefix(op)}{name} must be one of {choices}, got {value!r}")


def check_bool(name: str, value: Any, *, op: str | None = None) -> None:
    """Raise ``TypeError`` unless ``value`` is a Python bool."""
    if not isinstance(value, bool):
        raise TypeError(f"{_prefix(op)}{name} must be a bool, got {describe(value)}")


def check_typed_choice(
    name: str, value: Any, allowed: Sequence, value_type: type, *, op: str | None = None
) -> None:
    """``value`` must be a ``value_type`` (not a bool; TypeError otherwise) among ``allowed``."""
    if isinstance(value, bool) or not isinstance(value, value_type):
        noun = value_type.__name__
        kind = f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"
        choices = ", ".join(map(str, allowed))
        raise TypeError(f"{_prefix(op)}{name} must be {kind}, one of {choices}, got {describe(value)}")
    check_choice(name, value, allowed, op=op)


def check_alignment(alignment: Any, *, op: str | None = None) -> None:
    """``alignment`` must be a Python int in ``ALIGNMENTS`` (TypeError for a non-int)."""
    check_typed_choice("alignment", alignment, ALIGNMENTS, int, op=op)


def check_backend(backend: Any, *, op: str | None = None) -> None:
    """``backend`` must be one of ``BACKENDS``."""
    check_choice("backend", backend, BACKENDS, op=op)


def check_offsets(name: str, offsets: Any, device: torch.device, *, op: str | None = None) -> None:
    """Group end offsets: an int32, 1-D, non-empty, contiguous tensor on ``device``.

    Only metadata is checked; the values are the syncing validator's business.
    """
    if not isinstance(offsets, torch.Tensor) or offsets.dtype != OFFSETS_DTYPE:
        raise TypeError(f"{_prefix(op)}{name} must be a 1-D torch.int32 tensor, got {describe(offsets)}")
    if offsets.dim() != 1:
        raise ValueError(f"{_prefix(op)}{name} must be a 1-D torch.int32 tensor, got {describe(offsets)}")
    if offsets.numel() < 1:
        raise ValueError(f"{_prefix(op)}{name} must hold at least one group (length >= 1), got length 0")
    if offsets.device != device:
        raise ValueError(
            f"{_prefix(op)}{name} must be on the same device as the data ({device}), got {offsets.device}"
        )
    if not offsets.is_contiguous():
        raise ValueError(f"{_prefix(op)}{name} must be contiguous, got {describe(offsets)}")


def check_same_length(
    name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor, *, op: str | None = None
) -> None:
    """Raise ``ValueError`` unless the 1-D tensors ``t`` and ``ref`` have the same length."""
    if t.numel() != ref.numel():
        raise ValueError(
            f"{_prefix(op)}{name} must have the same length as {ref_name} ({ref.numel()}), got {t.numel()}"
        )


# ----------------------------------------------------------------------------------------------
# Checks the contracts (``torch_bindings.contract``) and the training layer share
# ----------------------------------------------------------------------------------------------


def byte_copyable(t: torch.Tensor) -> bool:
    """Whether the padding ops copy tensors of t's dtype bit for bit: any dtype of
    ``op_specs.BYTE_COPY_SIZES`` bytes that is not quantized."""
    return not t.is_quantized and t.element_size() in BYTE_COPY_SIZES


def check_byte_copy_tensor(name: str, t: Any, *, op: str) -> None:
    """A 2-D contiguous tensor of a dtype the padding ops copy (:func:`byte_copyable`)."""
    if not isinstance(t, torch.Tensor) or not byte_copyable(t):
        raise TypeError(
            f"{_prefix(op)}{name} must be a 2-D tensor of a dtype of 1, 2, 4 or 8 bytes, got {describe(t)}"
        )
    check_tensor(name, t, ndim=2, dtypes=(t.dtype,), op=op)


def check_num_tokens(num_tokens: Any, *, op: str = "unpad_token_groups") -> None:
    """``unpad_token_groups``' row count: an int (``TypeError`` otherwise) >= 0 (``ValueError``);
    a ``torch.SymInt`` passes untested (its sign is known only when it runs)."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, torch.SymInt)):
        raise TypeError(f"{_prefix(op)}num_tokens must be None or an int >= 0, got {describe(num_tokens)}")
    if isinstance(num_tokens, int) and num_tokens < 0:
        raise ValueError(f"{_prefix(op)}num_tokens must be >= 0, got {num_tokens}")


def unpad_row_count(last_end: int, padded_rows: int, *, op: str = "unpad_token_groups") -> int:
    """The output row count of ``unpad_token_groups(..., num_tokens=None)``: the last group end, which
    the caller has read from the device. Valid offsets put it in ``[0, padded rows]`` (padding only
    adds rows); anything else is garbage and raises ``ValueError`` before it sizes an allocation."""
    if not 0 <= last_end <= padded_rows:
        raise ValueError(
            f"{_prefix(op)}group_end_offsets[-1] = {last_end} must be in [0, {padded_rows}] (the rows of "
            "padded) when num_tokens is None; pass num_tokens, or check the offsets"
        )
    return last_end


MAX_KERNEL_GROUPS = MAX_GROUPS
"""Most groups a kernel takes (its group scan lives in shared memory; ``cute_utils.constants``; the
specs' default ``Limits.max_groups``)."""

MAX_KERNEL_EXPERTS = MAX_EXPERTS
"""Most experts the kernels with one grid z index per expert take (CUDA's grid z limit): the 32x1
MXFP8 and FP8 column-scale kernels on w (E, N, K)."""


def check_kernel_experts(op: str, experts: int) -> None:
    """Kernel-path limit of the per-expert grids: at most ``MAX_KERNEL_EXPERTS`` experts."""
    if experts > MAX_KERNEL_EXPERTS:
        raise ValueError(
            f"{op}: the CuTeDSL kernel launches one grid z index per expert, at most "
            f"{MAX_KERNEL_EXPERTS}; got E = {experts} (backend='reference' has no limit)"
        )


def check_kernel_group_count(op: str, group_end_offsets: torch.Tensor | None) -> int:
    """Kernel-path limit: at most ``MAX_KERNEL_GROUPS`` groups (the reference has none). Returns G
    (0 without offsets)."""
    groups = 0 if group_end_offsets is None else group_end_offsets.shape[0]
    if groups > MAX_KERNEL_GROUPS:
        raise ValueError(
            f"{op}: the CuTeDSL kernels take at most {MAX_KERNEL_GROUPS} groups, got "
            f"{groups} (backend='reference' has no limit)"
        )
    return groups


def check_kernel_inputs(op: str, group_end_offsets: torch.Tensor | None, *tensors: torch.Tensor) -> int:
    """Kernel-path limits beyond the contract's checks: at most ``MAX_KERNEL_GROUPS`` groups, and
    16-byte aligned data pointers (the kernels use 16-byte vector accesses). Returns G (0 without
    offsets)."""
    groups = check_kernel_group_count(op, group_end_offsets)
    for t in tensors:
        if t.data_ptr() % VECTOR_ALIGN:
            past, align = t.data_ptr() % VECTOR_ALIGN, VECTOR_ALIGN
            raise ValueError(
                f"{op}: the CuTeDSL kernels need {align}-byte aligned tensors, got a data pointer at "
                f"{past} bytes past a {align}-byte boundary (pass a .clone() of it)"
            )
    return groups


# ----------------------------------------------------------------------------------------------
# Eager fast paths (host overhead, ``KernelOp.fast``): each test says yes only when the op's full
# checks (its contract, ``torch_bindings.contract``) and the kernel path's limits surely pass, from a
# few metadata reads, or, for :func:`fast_launch_groups`, when what it leaves out is checked by the
# wrapper of a kernel the caller surely launches; it hands back what it read. Any doubt says no and
# the caller runs the full checks, which raise the error.
# ----------------------------------------------------------------------------------------------

_Tensor = torch.Tensor
_ALIGNMENT_SET = frozenset(ALIGNMENTS)
_QUANT_DTYPES = frozenset(getattr(torch, name) for name in QUANT_DTYPES)
_MODES = frozenset(SCALING_MODES)
_BLOCK_MASK = BLOCK_SIZE - 1
_ALIGN_MASK = VECTOR_ALIGN - 1


def fast_quant_shape(x: torch.Tensor, scaling_mode: Any, blocked_scales: Any) -> torch.Size | None:
    """x's shape when x is a contiguous bf16/fp32 tensor with its last dim a multiple of 32 and a
    16-byte aligned data pointer (``check_kernel_inputs``), and the scaling mode and
    ``blocked_scales`` flag are valid; else None. The caller checks the rank."""
    dtype = x.dtype
    if (
        dtype in _QUANT_DTYPES
        and type(scaling_mode) is str
        and scaling_mode in _MODES
        and (blocked_scales is True or blocked_scales is False)
        and x.is_contiguous()
        and not x.data_ptr() & _ALIGN_MASK
    ):
        shape = x.shape
        if shape and not shape[-1] & _BLOCK_MASK:
            return shape
    return None


def fast_group_count(offsets: Any, device: torch.device, limit: int = MAX_KERNEL_GROUPS) -> int:
    """G when ``offsets`` are group end offsets :func:`check_offsets` accepts for data on ``device``
    and G is at most ``limit`` (the kernels' group limit); else 0: :func:`fast_launch_groups` and
    the rank, device and contiguity the wrappers would check, for paths that may skip the launch."""
    groups = fast_launch_groups(offsets, limit)
    if groups and offsets.dim() == 1 and offsets.is_contiguous() and offsets.device == device:
        return groups
    return 0


def plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """t as a plain ``torch.Tensor`` (a subclass such as ``nn.Parameter``: the same data), the form
    :func:`fast_launch_groups` accepts: full paths hand checked offsets to their launchers this way."""
    return t if type(t) is _Tensor else t.as_subclass(_Tensor)


def fast_launch_groups(offsets: Any, limit: int = MAX_KERNEL_GROUPS) -> int:
    """G = ``offsets.numel()`` (1 <= G <= ``limit``) when ``offsets`` is a ``torch.int32`` tensor,
    else 0: the part of :func:`check_offsets` the kernels' TVM-FFI wrappers do not make. The wrapper
    of a kernel taking ``offsets`` (declared (G,) with stride 1) checks, before it launches, their
    rank, device (that of every tensor argument), unit stride and alignment, and raises
    ``ValueError`` (``RuntimeError`` for a tensor it cannot take, e.g. on ``meta``);
    ``KernelOp.dispatch`` then runs the full checks, which raise the contract's error. So only a
    fast path that surely launches a kernel with ``offsets`` may use this, and an output it sizes
    with G before the launch is dropped when the wrapper refuses (notes/host-overhead.md). int32
    stays a check here: the wrappers take int32 and uint32."""
    if type(offsets) is _Tensor and offsets.dtype is OFFSETS_DTYPE:
        groups = offsets.numel()  # one call; the rank (shape, len, index: 2x) is the wrapper's
        if groups <= limit:
            return groups
    return 0


def fast_optional_groups(offsets: Any, blocked_scales: bool, shape: torch.Size) -> int:
    """The MXFP8 ops' optional row groups: 0 without offsets, G for offsets :func:`fast_launch_groups`
    accepts with ``blocked_scales`` True (groups need the blocked layouts) and x's ``shape`` free of
    zeros (the kernels launch, so their wrappers check the offsets); -1 otherwise."""
    if offsets is None:
        return 0
    return (blocked_scales and 0 not in shape and fast_launch_groups(offsets)) or -1


def fast_alignment_ok(alignment: Any) -> bool:
    """An alignment :func:`check_alignment` accepts."""
    return type(alignment) is int and alignment in _ALIGNMENT_SET


_BF16, _INT32, _INT64 = torch.bfloat16, torch.int32, torch.int64


def fast_ep_dispatch_ok(
    x: Any, topk_idx: Any, num_experts: Any, ranks: int, recipe: Any, alignment: Any, scaling_mode: Any
) -> bool:
    """Whether :func:`check_ep_dispatch` surely passes: x a contiguous 2-D bf16 tensor (on CUDA
    with a 16-byte aligned data pointer, ``check_kernel_inputs``) and D a multiple of the recipe's
    width, topk_idx a 2-D int32/int64 tensor with x's T and device, a known recipe, alignment and
    scaling mode, ``num_experts`` a positive int that ``ranks`` divides. Plain tensors only; any
    doubt says no (the caller runs the full checks).
    """
    return (
        type(x) is _Tensor
        and type(topk_idx) is _Tensor
        and x.dtype is _BF16
        and x.dim() == 2
        and x.is_contiguous()
        and (not x.is_cuda or not x.data_ptr() & _ALIGN_MASK)
        and (topk_idx.dtype is _INT32 or topk_idx.dtype is _INT64)
        and topk_idx.dim() == 2
        and topk_idx.shape[0] == x.shape[0]
        and topk_idx.device == x.device
        and type(recipe) is str
        and recipe in _EP_WIDTH
        and not x.shape[1] % _EP_WIDTH[recipe][0]
        and type(scaling_mode) is str
        and scaling_mode in _MODES
        and fast_alignment_ok(alignment)
        and type(num_experts) is int
        and num_experts >= 1
        and not num_experts % ranks
    )


# ----------------------------------------------------------------------------------------------
# The training layer (``torch_bindings.moe``)
# ----------------------------------------------------------------------------------------------

GROUPED_MM_RECIPES = ("fp8_rowwise", "mxfp8", "bf16")
#: ``gemm`` values that run the project's sm_90a kernel: for every GEMM, or for the 2d x 3d ones.
CUTE_GEMMS = ("cute", "cute_2d3d")
GROUPED_MM_GEMMS = ("auto", "native", "emulated", *CUTE_GEMMS)
#: Recipes ``gemm="cute"`` / ``"cute_2d3d"`` (the project's own grouped GEMM) run.
CUTE_GEMM_RECIPES = ("fp8_rowwise",)
# K and N must be multiples of this for the recipe's operands: 16-byte rows for the FP8 GEMMs (and
# for bf16's), whole 32-element blocks for MXFP8 (SPEC section 8).
GROUPED_MM_DIM_MULTIPLE = {"fp8_rowwise": 16, "mxfp8": 32, "bf16": 8}


#: Input dtypes of the grouped GEMM op and the expert block (activations and weights): bf16, or fp32
#: (master weights, fp32 activations), read by the quantizers directly.
GROUPED_MM_DTYPES = (torch.bfloat16, torch.float32)


def check_grouped_mm_options(recipe: Any, gemm: Any, backend: Any, *, op: str) -> None:
    """A known recipe, GEMM choice and backend; ``gemm="cute"`` / ``"cute_2d3d"`` only with a recipe
    they run."""
    check_choice("recipe", recipe, GROUPED_MM_RECIPES, op=op)
    check_choice("gemm", gemm, GROUPED_MM_GEMMS, op=op)
    if gemm in CUTE_GEMMS and recipe not in CUTE_GEMM_RECIPES:
        raise ValueError(
            f"{_prefix(op)}gemm={gemm!r} runs recipe(s) {CUTE_GEMM_RECIPES} only, the recipe is {recipe!r}"
        )
    check_choice("backend", backend, BACKENDS, op=op)


def _check_tokens(x: Any, recipe: str, *, op: str) -> tuple[int, int, torch.device]:
    """``x``: a bf16/fp32 (M, K) tensor, or quantized tokens of ``recipe`` in groups aligned at least
    to the recipe's wgrad alignment. Returns (M, K, device)."""
    from .moe.tokens import QuantizedTokens

    if not isinstance(x, QuantizedTokens):
        check_tensor("x", x, ndim=2, dtypes=GROUPED_MM_DTYPES, op=op)
        return x.shape[0], x.shape[1], x.device
    if recipe == "bf16" or x.recipe != recipe:
        raise ValueError(f"{_prefix(op)}x holds {x.recipe} tokens, the recipe is {recipe!r}")
    need = {"fp8_rowwise": 16, "mxfp8": 32}[recipe]  # grouped_mm.GROUP_ALIGNMENT
    if x.alignment % need:
        raise ValueError(
            f"{_prefix(op)}quantized tokens must come in groups aligned to {need} rows for recipe "
            f"{recipe!r}, got alignment {x.alignment}"
        )
    check_tensor("x.q", x.q, ndim=2, dtypes=(torch.float8_e4m3fn,), op=op)
    return x.q.shape[0], x.q.shape[1], x.q.device


def _check_token_offsets(x: Any, group_end_offsets: torch.Tensor, *, op: str) -> None:
    """Quantized tokens go with their own padded groups: ``group_end_offsets`` must be the very
    tensor ``x.group_end_offsets`` (the dispatch's ``padded_group_end_offsets``). Other offsets would
    group rows that the scales and the alignment do not describe, and their values cannot be
    compared without a sync."""
    from .moe.tokens import QuantizedTokens

    if isinstance(x, QuantizedTokens) and group_end_offsets is not x.group_end_offsets:
        raise ValueError(
            f"{_prefix(op)}group_end_offsets must be the quantized tokens' own (x.group_end_offsets, "
            "the dispatch's padded_group_end_offsets: the same tensor)"
        )


def check_weight(
    name: str, w: Any, experts: int | None, n: int | None, k: int, device: torch.device, unit: int, *, op: str
) -> None:
    """A weight (E, N, K) bf16/fp32 contiguous on ``device`` with the given E, N (``None``: any) and
    K, its N a multiple of the recipe's ``unit``; errors name the weight."""
    check_tensor(name, w, ndim=3, dtypes=GROUPED_MM_DTYPES, op=op)
    if w.device != device:
        raise ValueError(f"{_prefix(op)}{name} must be on x's device ({device}), got {w.device}")
    want = (experts if experts is not None else w.shape[0], n if n is not None else w.shape[1], k)
    if tuple(w.shape) != want:
        raise ValueError(f"{_prefix(op)}{name} must have shape {want} (E, N, K), got {tuple(w.shape)}")
    check_divisible(f"N ({name}.shape[1])", w.shape[1], unit, why="for the recipe", op=op)


def check_scaled_grouped_mm(
    x: Any,
    w: Any,
    group_end_offsets: Any,
    recipe: Any,
    out_dtype: Any,
    gemm: Any,
    backend: Any = "auto",
    *,
    op: str = "scaled_grouped_mm",
) -> None:
    """x (M, K) bf16/fp32 contiguous (or quantized tokens of the recipe), w (E, N, K) bf16/fp32
    contiguous on x's device, E group end offsets, a known recipe, GEMM choice and backend, bf16
    output, K and N multiples of the recipe's unit."""
    check_grouped_mm_options(recipe, gemm, backend, op=op)
    if out_dtype != torch.bfloat16:
        raise ValueError(
            f"{_prefix(op)}out_dtype must be torch.bfloat16 (the GEMMs' output), got {out_dtype!r}"
        )
    _, k, device = _check_tokens(x, recipe, op=op)
    unit = GROUPED_MM_DIM_MULTIPLE[recipe]
    check_weight("w", w, None, None, k, device, unit, op=op)
    check_offsets("group_end_offsets", group_end_offsets, device, op=op)
    _check_token_offsets(x, group_end_offsets, op=op)
    if group_end_offsets.numel() != w.shape[0]:
        raise ValueError(
            f"{_prefix(op)}group_end_offsets must have one entry per expert (E = {w.shape[0]}), "
            f"got length {group_end_offsets.numel()}"
        )
    check_divisible("K (x.shape[1])", k, unit, why=f"for recipe {recipe!r}", op=op)


def check_experts(x: Any, w13: Any, w2: Any, group_end_offsets: Any, recipe: str, *, op: str) -> None:
    """The expert block's inputs: x (M, D) bf16/fp32 (or quantized tokens), ``w13`` (E, 2H, D) and
    ``w2`` (E, D, H) bf16/fp32 on x's device, (E,) end offsets; D and H multiples of the recipe's
    unit. Errors name the weight."""
    _, dim, device = _check_tokens(x, recipe, op=op)
    unit = GROUPED_MM_DIM_MULTIPLE[recipe]
    check_tensor("w13", w13, ndim=3, dtypes=GROUPED_MM_DTYPES, op=op)
    experts, two_h = w13.shape[0], w13.shape[1]
    if two_h % 2:
        raise ValueError(
            f"{_prefix(op)}w13 (E, 2H, D) must have an even dim 1 (gate, up), got {tuple(w13.shape)}"
        )
    check_weight("w13", w13, experts, None, dim, device, unit, op=op)
    check_weight("w2", w2, experts, dim, two_h // 2, device, unit, op=op)
    check_divisible("H (w2.shape[2])", two_h // 2, unit, why=f"for recipe {recipe!r}", op=op)
    check_divisible("D (x.shape[1])", dim, unit, why=f"for recipe {recipe!r}", op=op)
    check_offsets("group_end_offsets", group_end_offsets, device, op=op)
    _check_token_offsets(x, group_end_offsets, op=op)
    if group_end_offsets.numel() != experts:
        raise ValueError(
            f"{_prefix(op)}group_end_offsets must have one entry per expert (E = {experts}), "
            f"got length {group_end_offsets.numel()}"
        )


EP_RECIPES: tuple[str, ...] = ("mxfp8", "fp8_rowwise", "bf16")
#: Row width each EP recipe needs: mxfp8 whole 4-byte scale words (D / 32 scales), fp8_rowwise
#: 16-byte vectors of e4m3 (and the FP8 GEMM's K % 16), bf16 16-byte vectors.
_EP_WIDTH = {
    "mxfp8": (128, "(whole 4-byte scale words)"),
    "fp8_rowwise": (16, "(16-byte vectors of e4m3)"),
    "bf16": (8, "(16-byte vectors)"),
}


def check_ep_dispatch(
    x: Any,
    topk_idx: Any,
    num_experts: Any,
    ranks: int,
    recipe: Any,
    alignment: Any,
    scaling_mode: Any = "rceil",
) -> None:
    """``torch_bindings.ep.dispatch``'s arguments (docs/contract.md section 9)."""
    op = "dispatch"
    check_tensor("x", x, ndim=2, dtypes=(torch.bfloat16,), op=op)
    check_tensor("topk_idx", topk_idx, ndim=2, dtypes=(torch.int32, torch.int64), contiguous=False, op=op)
    if topk_idx.shape[0] != x.shape[0] or topk_idx.device != x.device:
        raise ValueError(f"{op}: topk_idx must be (T, k) with x's T and device, got {describe(topk_idx)}")
    check_choice("recipe", recipe, EP_RECIPES, op=op)
    check_alignment(alignment, op=op)
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise TypeError(f"{op}: num_experts must be a positive int, got {describe(num_experts)}")
    check_divisible("num_experts", num_experts, ranks, why="(the group size)", op=op)
    check_choice("scaling_mode", scaling_mode, SCALING_MODES, op=op)
    divisor, why = _EP_WIDTH[recipe]
    check_divisible("D", x.shape[1], divisor, why=f"for {recipe} {why}", op=op)
    if x.is_cuda:
        check_kernel_inputs(op, None, x)  # 16-byte aligned: the send kernel reads 16-byte vectors


def check_ep_combine(y: Any, rows: int, topk_weights: Any, tokens: int, topk: int) -> None:
    """``torch_bindings.ep.combine``'s arguments: y (rows, D') bf16 with D' % 8 == 0, weights (T, k)."""
    op = "combine"
    check_tensor("y", y, ndim=2, dtypes=(torch.bfloat16,), contiguous=False, op=op)
    if y.shape[0] != rows:
        raise ValueError(f"{op}: y must have the dispatched {rows} rows, got {describe(y)}")
    check_divisible("D'", y.shape[1], 8, why="(16-byte vectors)", op=op)
    if not isinstance(topk_weights, torch.Tensor) or tuple(topk_weights.shape) != (tokens, topk):
        raise ValueError(f"{op}: topk_weights must be ({tokens}, {topk}), got {describe(topk_weights)}")
