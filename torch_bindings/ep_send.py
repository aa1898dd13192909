"""The sender side of expert-parallel dispatch in one launch: quantize each token once and write it
to its k destinations (SPEC sections 2, 7 and 9; kernel ``cute_kernels.ep_send``, design in
notes/ep-quantize-send.md).

``quantize_and_send`` (checked; ``launch_send``, the launch alone, is what ``torch_bindings.ep``'s
send step calls on CUDA) runs once routing and layout have given every (token, slot) item its
destination ``dst_index = dest_rank * P + dest_row`` (-1: dropped). It writes, per item, into the
destination rank's buffers (this rank's own included):

- ``q``: the token's row, e4m3 (``"mxfp8"``, ``"fp8_rowwise"``) or bf16 as it is (``"bf16"``);
- ``scales``: mxfp8 the row's D/32 E8M0 bytes (1x32 blocks, ``scaling_mode``), fp8_rowwise its
  one fp32 dequantization scale (SPEC section 7, ``round_scales_to_power_of_2``), bf16 none;
- ``tags``: ``rank * T * k + item + 1`` (int32), what combine routes by.

The bytes are exactly those of ``quantize_mxfp8_2d(x, blocked_scales=False)`` /
``quantize_fp8_2d(x, axis="row")`` per row (``reference.ep_quantize_send`` is the definition). On
CUDA one kernel launch writes them through the buffers' address tables (plain global stores; peer
buffers over NVLink, never multicast), with no host sync; on CPU the reference makes the same moves
on the buffers' local tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from cute_kernels.op_specs import SCALING_MODES

from . import reference, targets
from .checks import check_bool, check_choice, check_divisible, check_tensor, describe

OP = "quantize_and_send"
RECIPES: tuple[str, ...] = ("mxfp8", "fp8_rowwise", "bf16")
_INT32_MAX = 2**31 - 1
_ALIGN = 16  # bytes: x's rows and every buffer's base address


@dataclass(frozen=True)
class PeerBuffers:
    """One kind of destination buffer as this rank sees it.

    ``own``: this rank's (P, W) row-major tensor (on CUDA only its shape and dtype are read: every
    rank's buffer of the kind has them); ``ptrs``: Int64 (R,) on x's device, the base addresses of
    the R ranks' buffers of the kind (``own``'s included; PyTorch symmetric memory's
    ``buffer_ptrs`` across GPUs, ``data_ptr()`` of R local tensors on one), each 16-byte aligned;
    ``tensors``: the R tensors where they live in this process (the CPU path writes them; None
    across GPUs). ``torch_bindings.ep.SharedRows`` has these fields and may be passed as it is."""

    own: torch.Tensor
    ptrs: torch.Tensor
    tensors: Sequence[torch.Tensor] | None = None


@dataclass(frozen=True)
class SendBuffers:
    """The destination buffers of one dispatch (P rows each, R of each kind):

    - ``q``: (P, D) ``float8_e4m3fn`` (mxfp8, fp8_rowwise) or ``bfloat16`` (bf16);
    - ``scales``: mxfp8 (P, D/32) ``float8_e8m0fnu`` (or uint8), fp8_rowwise (P, 1) ``float32``,
      bf16 None;
    - ``tags``: (P, 1) ``int32``."""

    q: PeerBuffers
    scales: PeerBuffers | None
    tags: PeerBuffers


def buffer_specs(recipe: str, rows: int, hidden: int) -> dict[str, tuple[tuple[int, int], torch.dtype]]:
    """``{kind: (shape, dtype)}`` of the buffers :class:`SendBuffers` holds for ``recipe`` with P =
    ``rows`` rows of D = ``hidden`` elements (the allocation side of ``torch_bindings.ep``)."""
    check_choice("recipe", recipe, RECIPES, op=OP)
    specs = {"tags": ((rows, 1), torch.int32)}
    if recipe == "mxfp8":
        specs.update(
            q=((rows, hidden), torch.float8_e4m3fn), scales=((rows, hidden // 32), torch.float8_e8m0fnu)
        )
    elif recipe == "fp8_rowwise":
        specs.update(q=((rows, hidden), torch.float8_e4m3fn), scales=((rows, 1), torch.float32))
    else:
        specs.update(q=((rows, hidden), torch.bfloat16))
    return specs


# --- Checks (metadata only: no host sync) ------------------------------------------------------------


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TypeError(f"{OP}: {name} must be an int >= {low}, got {describe(value)}")


def _check_kind(name: str, kind: Any, shape: tuple, dtypes: tuple, x: torch.Tensor) -> int:
    """One :class:`PeerBuffers`: ``own`` of ``shape`` (None: any rows) and one of ``dtypes``,
    contiguous and 16-byte aligned on x's device; ``ptrs`` Int64 (R,) there. Returns R."""
    own, ptrs = getattr(kind, "own", None), getattr(kind, "ptrs", None)
    check_tensor(f"{name}.own", own, ndim=2, dtypes=dtypes, op=OP)
    if own.device != x.device or tuple(own.shape[1:]) != shape[1:] or shape[0] not in (None, own.shape[0]):
        want = f"({'P' if shape[0] is None else shape[0]}, {shape[1]})"
        raise ValueError(f"{OP}: {name}.own must be {want} on {x.device}, got {describe(own)}")
    if own.data_ptr() % _ALIGN:
        raise ValueError(f"{OP}: {name}.own must be {_ALIGN}-byte aligned, got address {own.data_ptr():#x}")
    check_tensor(f"{name}.ptrs", ptrs, ndim=1, dtypes=(torch.int64,), op=OP)
    if ptrs.device != x.device or ptrs.numel() < 1:
        raise ValueError(f"{OP}: {name}.ptrs must be (R,) int64 on {x.device}, R >= 1, got {describe(ptrs)}")
    return ptrs.numel()


@dataclass(frozen=True)
class SendOptions:
    """The non-tensor arguments of :func:`quantize_and_send` (``round_scales`` is its
    ``round_scales_to_power_of_2``)."""

    recipe: str
    rank: int
    topk: int
    round_scales: bool = True
    scaling_mode: str = "rceil"


def _check(x, dst_index, buffers, options: SendOptions) -> None:
    """The arguments of :func:`quantize_and_send` (module docstring), before any launch."""
    recipe, rank, topk = options.recipe, options.rank, options.topk
    check_choice("recipe", recipe, RECIPES, op=OP)
    check_choice("scaling_mode", options.scaling_mode, SCALING_MODES, op=OP)
    check_bool("round_scales_to_power_of_2", options.round_scales, op=OP)
    _check_int("rank", rank, 0)
    _check_int("topk", topk, 1)
    check_tensor("x", x, ndim=2, dtypes=(torch.bfloat16,), op=OP)
    tokens, hidden = x.shape
    check_divisible("D", hidden, 32 if recipe == "mxfp8" else 8, why=f"for {recipe}", op=OP)
    if x.data_ptr() % _ALIGN:
        raise ValueError(f"{OP}: x must be {_ALIGN}-byte aligned, got address {x.data_ptr():#x}")
    check_tensor("dst_index", dst_index, ndim=(1, 2), dtypes=(torch.int32,), op=OP)
    if dst_index.numel() != tokens * topk or dst_index.device != x.device:
        raise ValueError(
            f"{OP}: dst_index must hold T*k = {tokens * topk} items on {x.device}, got {describe(dst_index)}"
        )
    quantized = recipe != "bf16"
    q_dtype = torch.float8_e4m3fn if quantized else torch.bfloat16
    ranks = {_check_kind("q", buffers.q, (None, hidden), (q_dtype,), x)}
    rows = buffers.q.own.shape[0]
    ranks.add(_check_kind("tags", buffers.tags, (rows, 1), (torch.int32,), x))
    if recipe == "mxfp8":
        dtypes = (torch.float8_e8m0fnu, torch.uint8)
        ranks.add(_check_kind("scales", buffers.scales, (rows, hidden // 32), dtypes, x))
    elif recipe == "fp8_rowwise":
        ranks.add(_check_kind("scales", buffers.scales, (rows, 1), (torch.float32,), x))
    elif buffers.scales is not None:
        raise ValueError(f"{OP}: recipe 'bf16' sends no scales: buffers.scales must be None")
    if len(ranks) != 1:
        raise ValueError(
            f"{OP}: every buffer kind's ptrs must name the same R buffers, got lengths {sorted(ranks)}"
        )
    if ranks.pop() * rows > _INT32_MAX or (rank + 1) * tokens * topk > _INT32_MAX:
        raise ValueError(f"{OP}: R * P and (rank + 1) * T * k must fit the kernel's int32 indices and tags")


# --- The op ------------------------------------------------------------------------------------------


class SendKey(NamedTuple):
    """The send kernel's key in a device's table: ``recipe``, the scaling ``mode`` and
    ``round_pow2`` (the FP8 rowwise scales' rounding)."""

    kernel: str
    recipe: str
    mode: str
    round_pow2: bool

    def variant(self, target) -> object:
        """The kernel's variant (imports the kernel module)."""
        from cute_kernels.ep_send import SendVariant

        return SendVariant(self.recipe, self.mode, self.round_pow2)


def quantize_and_send(
    x: torch.Tensor,
    dst_index: torch.Tensor,
    buffers: SendBuffers,
    *,
    recipe: str,
    rank: int,
    topk: int,
    round_scales_to_power_of_2: bool = True,
    scaling_mode: str = "rceil",
) -> None:
    """Quantize every token of x once and write it to each of its k destinations (module docstring).

    x (T, D) bf16 contiguous, 16-byte aligned (D % 8 == 0; mxfp8: D % 32 == 0); ``dst_index``
    int32 (T*k,) or (T, k), item ``t*k + j`` (slot j of token t) goes to row ``dst_index % P`` of
    rank ``dst_index // P``'s buffers (< 0: dropped; >= R*P: skipped), valid destinations
    distinct; ``buffers`` a :class:`SendBuffers` (shapes in :func:`buffer_specs`); ``rank`` this
    rank's index (tags ``rank * T * k + item + 1``); ``topk`` k. Rows no item names are left as
    they are. CUDA (sm_90 / sm_100): one launch on the current stream, no host sync, CUDA-graph
    capturable; CPU: ``reference.ep_quantize_send`` on ``buffers.*.tensors``. Returns nothing."""
    options = SendOptions(recipe, rank, topk, round_scales_to_power_of_2, scaling_mode)
    _check(x, dst_index, buffers, options)
    if x.device.type != "cuda":
        _send_reference(x, dst_index, buffers, options)
        return
    launch_send(x, dst_index, buffers, options)


def launch_send(x: torch.Tensor, dst_index: torch.Tensor, buffers: SendBuffers, options: SendOptions) -> None:
    """:func:`quantize_and_send`'s launch on CUDA without its Python checks, for this package's
    callers whose arguments hold the contract by construction (``torch_bindings.moe.ep``: x checked
    by ``dispatch``, or built by the module, the index and the buffers its own; its test driver
    ``simulate_dispatch`` passes the caller's rows). The compiled kernel's wrapper still refuses
    wrong dtypes, ranks, devices, alignment, non-compact layouts and sizes the arguments must share;
    the scaling mode is not checked here."""
    recipe = options.recipe
    mode = options.scaling_mode if recipe == "mxfp8" else "rceil"
    pow2 = options.round_scales if recipe == "fp8_rowwise" else True
    target = targets.known(x) or targets.select(OP, "cute", x)
    key = ("ep_send", recipe, mode, pow2)  # a plain tuple equals its SendKey: no NamedTuple per call
    kernel = target.kernels.get(key) or target.kernel(SendKey._make(key), SendKey.variant)
    scales = buffers.tags if recipe == "bf16" else buffers.scales  # bf16: a placeholder, never written
    s_own = scales.own.view(torch.float8_e8m0fnu) if scales.own.dtype == torch.uint8 else scales.own
    index = dst_index.view(x.shape[0], options.topk)
    q, tags = buffers.q, buffers.tags
    kernel(x, index, q.own, q.ptrs, s_own, scales.ptrs, tags.own, tags.ptrs, options.rank)


def _send_reference(x, dst_index, buffers, options: SendOptions) -> None:
    """The CPU path: the reference's moves on the buffers' local tensors."""
    kinds = {"q": buffers.q, "tags": buffers.tags}
    if options.recipe != "bf16":
        kinds["scales"] = buffers.scales
    tensors = {}
    for name, kind in kinds.items():
        found = getattr(kind, "tensors", None)
        if found is None or len(found) != kind.ptrs.numel():
            raise ValueError(f"{OP}: on {x.device} buffers.{name}.tensors must hold the R local buffers")
        if any(t.shape != kind.own.shape or t.dtype != kind.own.dtype or t.device != x.device for t in found):
            raise ValueError(
                f"{OP}: buffers.{name}.tensors must be shaped like buffers.{name}.own on {x.device}"
            )
        tensors[name] = list(found)
    reference.ep_quantize_send(
        x,
        dst_index,
        tensors["q"],
        tensors.get("scales"),
        tensors["tags"],
        recipe=options.recipe,
        rank=options.rank,
        topk=options.topk,
        scaling_mode=options.scaling_mode,
        round_scales_to_power_of_2=options.round_scales,
    )


__all__ = [
    "RECIPES",
    "PeerBuffers",
    "SendBuffers",
    "SendOptions",
    "buffer_specs",
    "launch_send",
    "quantize_and_send",
]
