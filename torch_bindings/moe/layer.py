"""SwiGLU mixture-of-experts modules (SPEC section 8): ``GroupedExperts`` and ``MoELayer``.

``GroupedExperts(num_experts, dim, hidden, recipe=...)`` holds ``w13`` (E, 2H, D) (gate and up
fused: rows ``[0, H)`` gate, ``[H, 2H)`` up, the transformers ``gate_up_proj`` layout) and ``w2``
(E, D, H) (``down_proj``), and maps tokens x (M, D), sorted expert-major with int32 group end
offsets (E,), to ``out[rows of e] = (silu(x w13[e, :H].T) * (x w13[e, H:].T)) w2[e].T``. The block
itself is :func:`torch_bindings.moe.experts.experts_forward` (one GEMM for gate and up, x quantized
once, SwiGLU fused with the quantization around it, a weight cache, only the gradients asked for).

fp8_rowwise takes groups of any sizes with no pad pass: only its column (wgrad) operands are written
into padded groups, by their quantizer (16 rows for torch's wgrad, none for groups that start on 16
already: ``groups_aligned=True``, the output of ``pad_token_groups`` or of a dispatch; 128 rows for
``gemm="cute"``, fp8_rowwise on sm_90, what ``"auto"`` runs where ``grouped_mm.auto_runs_own_gemm``;
``gemm="cute_2d3d"`` runs the project's GEMM for the 2d x 3d GEMMs only). mxfp8 pads unaligned
groups once to its alignment around the block and unpads once; aligned groups skip both. Quantized
tokens from an FP8 dispatch (``DispatchResult.tokens``) skip x's quantization too.
"""

from __future__ import annotations

import logging
import math

import torch

from .. import checks
from ..warn import warn_once
from .experts import WeightCache, experts_forward
from .grouped_mm import GROUP_ALIGNMENT, make_step
from .tokens import QuantizedTokens

_LOG = logging.getLogger("torch_bindings")
_OP = "GroupedExperts"


class GroupedExperts(torch.nn.Module):
    """E SwiGLU experts (module docstring).

    ``recipe``: ``"fp8_rowwise"``, ``"mxfp8"`` or ``"bf16"``; ``gemm``: as in
    :func:`scaled_grouped_mm` (``"auto"`` warns once when it must emulate; ``"cute"``: fp8_rowwise
    on sm_90, the project's own grouped GEMM for all six GEMMs with no pad pass (its wgrad operands
    come in 128-row padded groups from their quantizer), what ``"auto"`` runs for fp8_rowwise where
    ``grouped_mm.auto_runs_own_gemm``; ``"cute_2d3d"``: the same for its four 2d x 3d GEMMs,
    torch's wgrads; ``RuntimeError`` at the first call elsewhere);
    ``backend``: the quantization and padding ops' (``"auto"`` raises on a CUDA device without the
    kernels);
    ``weight_cache``: keep the weights' quantized operands between calls while the parameters do not
    change (their version counters and the ``torch.optim`` step generation; after writes through
    ``param.data`` call ``torch_bindings.invalidate_weight_caches()``), for micro-batches and
    recomputation; off, the weights are quantized on every call. ``dtype``: the parameters' (bf16,
    or fp32 master weights)."""

    def __init__(
        self,
        num_experts: int,
        dim: int,
        hidden: int,
        *,
        recipe: str = "fp8_rowwise",
        gemm: str = "auto",
        backend: str = "auto",
        weight_cache: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        self._configure(recipe, gemm, backend, weight_cache)
        factory = {"device": device, "dtype": dtype}
        self.w13 = torch.nn.Parameter(torch.empty(num_experts, 2 * hidden, dim, **factory))
        self.w2 = torch.nn.Parameter(torch.empty(num_experts, dim, hidden, **factory))
        self.reset_parameters()

    def _configure(self, recipe: str, gemm: str, backend: str, weight_cache: bool) -> None:
        checks.check_grouped_mm_options(recipe, gemm, backend, op=_OP)
        self.recipe, self.gemm, self.backend = recipe, gemm, backend
        self.weight_cache = bool(weight_cache)
        self._cache = WeightCache()
        self._reported_cache = 0

    @classmethod
    def from_weights(
        cls,
        w13: torch.Tensor,
        w2: torch.Tensor,
        *,
        recipe: str = "fp8_rowwise",
        gemm: str = "auto",
        backend: str = "auto",
        weight_cache: bool = True,
    ) -> GroupedExperts:
        """The block on existing weights, no initialization: ``w13`` (E, 2H, D) and ``w2`` (E, D, H)
        become its parameters (a ``Parameter`` is kept as it is, a tensor is wrapped sharing its
        storage): training the module trains them."""
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module._configure(recipe, gemm, backend, weight_cache)
        module.w13 = w13 if isinstance(w13, torch.nn.Parameter) else torch.nn.Parameter(w13)
        module.w2 = w2 if isinstance(w2, torch.nn.Parameter) else torch.nn.Parameter(w2)
        return module

    @classmethod
    def from_hf(cls, experts: torch.nn.Module, **options) -> GroupedExperts:
        """The block on a transformers experts module's own parameters (``gate_up_proj`` (E, 2H, D),
        ``down_proj`` (E, D, H), SiLU, no biases, not transposed), shared, not copied."""
        from .hf import hf_weights

        w13, w2 = hf_weights(experts)
        return cls.from_weights(w13, w2, **options)

    def reset_parameters(self) -> None:
        """Each expert's weights like ``nn.Linear``'s default (uniform in +-1/sqrt(fan_in))."""
        for w in (self.w13, self.w2):
            bound = 1.0 / math.sqrt(w.shape[-1])
            torch.nn.init.uniform_(w, -bound, bound)

    def weight_cache_bytes(self) -> int:
        """Device memory the weight cache holds now (0 when off)."""
        return self._cache.nbytes()

    def extra_repr(self) -> str:
        e, two_h, d = self.w13.shape
        cache = f"on, {self.weight_cache_bytes() / 2**20:.1f} MiB" if self.weight_cache else "off"
        return (
            f"experts={e}, dim={d}, hidden={two_h // 2}, recipe={self.recipe!r}, gemm={self.gemm!r}, "
            f"weight_cache={cache}"
        )

    def forward(
        self,
        x: torch.Tensor | QuantizedTokens,
        group_end_offsets: torch.Tensor,
        *,
        groups_aligned: bool = False,
    ) -> torch.Tensor:
        """x (M, D) bf16/fp32 tokens sorted by expert, or quantized tokens of this recipe (a
        dispatch's ``tokens``); ``group_end_offsets`` (E,) int32 on x's device. ``groups_aligned``:
        every group starts on a multiple of the recipe's alignment (16 rows for fp8_rowwise, 32 for
        mxfp8; every end offset a multiple of it: the padded offsets of ``pad_token_groups`` or a
        dispatch), so nothing is padded (fp8_rowwise: its column operands are quantized unpadded;
        a false claim gives wrong gradients; it cannot be checked without a sync, with
        ``gemm="cute_2d3d"`` too); ``gemm="cute"`` pads its column operands to 128 rows whatever it
        says. Returns (M, D) in the
        autocast dtype under ``torch.autocast``, else x's dtype (bf16 for quantized tokens); rows
        past the last group's end belong to no expert and are unspecified."""
        checks.check_experts(x, self.w13, self.w2, group_end_offsets, self.recipe, op=_OP)
        quantized = isinstance(x, QuantizedTokens)
        step = make_step(
            self.recipe, self.gemm, group_end_offsets, groups_aligned or quantized, self.backend, op=_OP
        )
        cache = self._cache if self.weight_cache else None
        out = experts_forward(x, self.w13, self.w2, group_end_offsets, step, cache)
        if cache is not None and self._reported_cache == 0 and not torch.compiler.is_compiling():
            self._reported_cache = cache.nbytes()
            if self._reported_cache:
                _LOG.info("GroupedExperts: weight cache holds %.1f MiB", self._reported_cache / 2**20)
        return out


def routed_experts(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: GroupedExperts,
    *,
    num_experts: int,
    dispatch_recipe: str,
    alignment: int | None = None,
    group=None,
) -> torch.Tensor:
    """Tokens x (T, D) through their top-k experts: ``ep.dispatch`` (pairs sorted expert-major into
    padded groups on the experts' ranks; FP8 dispatch recipes quantize each token once, on its
    sender), ``experts`` on those aligned groups (quantized tokens go in as they are), and
    ``ep.combine`` (the routing-weighted sum in fp32). Returns (T, D) in x's dtype (bf16 under
    autocast). ``group``: as :class:`MoELayer`'s (``None``: R = 1, every expert local, whatever
    ``torch.distributed`` holds); ``experts`` holds ``num_experts / R`` experts. ``alignment``: as
    :class:`MoELayer`'s (``None``: :func:`default_alignment` of ``experts``)."""
    from . import ep

    alignment = default_alignment(experts.gemm) if alignment is None else alignment
    check_alignment(alignment, experts.recipe, op="routed_experts")
    group = _local_unless_given(group)
    local = experts.w13.shape[0]
    if local * ep.group_size(group) != num_experts:
        raise ValueError(
            f"routed_experts: experts holds {local} experts, the group of {ep.group_size(group)} "
            f"rank(s) needs num_experts / R = {num_experts} / {ep.group_size(group)}"
        )
    r = ep.dispatch(
        x.to(torch.bfloat16),
        topk_idx,
        num_experts=num_experts,
        recipe=dispatch_recipe,
        alignment=alignment,
        group=group,
    )
    tokens = r.q if dispatch_recipe == "bf16" else r.tokens
    y = experts(tokens, r.padded_group_end_offsets, groups_aligned=True)
    out = ep.combine(y.to(torch.bfloat16), r, topk_weights)
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    return out if out.dtype == dtype else out.to(dtype)


class MoELayer(torch.nn.Module):
    """A mixture-of-experts layer (SPEC section 8): router top-k -> dispatch -> ``GroupedExperts`` ->
    combine, forward and backward, over ``group`` (R ranks, ``num_experts / R`` experts each).

    ``group=None`` (the default) is R = 1: all ``num_experts`` experts on this rank, no
    communication, whether or not ``torch.distributed`` is initialized, so a model trained with
    plain data parallelism (DDP, FSDP) keeps every expert on every rank and its gradients are
    averaged over identical parameters. Expert parallelism is asked for only by passing a process
    group (``torch.distributed.group.WORLD``, or a subgroup): each rank then holds its own
    ``num_experts / R`` experts under the same parameter names, which data-parallel gradient
    averaging over that group must not touch.

    ``router``: ``nn.Linear(dim, num_experts)`` without bias; softmax in fp32, top-k, the k
    weights renormalized to sum 1 when ``norm_topk_prob``. ``recipe``: the experts' GEMM recipe;
    ``dispatch_recipe`` (default: the recipe itself) what the dispatch sends: ``"fp8_rowwise"`` /
    ``"mxfp8"`` quantize each token once on its sender and the experts take the quantized rows,
    ``"bf16"`` sends bf16 rows. ``gemm``: the experts' (:class:`GroupedExperts`; ``"auto"`` runs
    ``"cute"`` for fp8_rowwise where ``grouped_mm.auto_runs_own_gemm``, with ``"auto"``'s default
    alignment).
    ``alignment``: the dispatch's padded group alignment, one of 16, 32, 64, 128 and a multiple of
    the recipe's (16 rows for fp8_rowwise, 32 for mxfp8; ``ValueError`` otherwise); ``None`` (the
    default): :func:`default_alignment` of ``gemm``. No host sync; capturable in a CUDA graph once
    warm."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        num_experts: int,
        top_k: int,
        *,
        recipe: str = "fp8_rowwise",
        dispatch_recipe: str | None = None,
        alignment: int | None = None,
        norm_topk_prob: bool = True,
        group=None,
        gemm: str = "auto",
        backend: str = "auto",
        weight_cache: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        from . import ep

        super().__init__()
        group = _local_unless_given(group)
        ranks = ep.group_size(group)
        checks.check_divisible("num_experts", num_experts, ranks, why="(the group size)", op="MoELayer")
        self.num_experts, self.top_k, self.group = num_experts, top_k, group
        self.dispatch_recipe = dispatch_recipe or recipe
        checks.check_choice("dispatch_recipe", self.dispatch_recipe, checks.EP_RECIPES, op="MoELayer")
        if self.dispatch_recipe != "bf16" and self.dispatch_recipe != recipe:
            raise ValueError(
                f"MoELayer: dispatch_recipe {self.dispatch_recipe!r} sends tokens the {recipe!r} experts "
                "cannot take; use the recipe itself or 'bf16'"
            )
        alignment = default_alignment(gemm) if alignment is None else alignment
        check_alignment(alignment, recipe, op="MoELayer")
        self.alignment, self.norm_topk_prob = alignment, norm_topk_prob
        self.router = torch.nn.Linear(dim, num_experts, bias=False, device=device, dtype=dtype)
        self.experts = GroupedExperts(
            num_experts // ranks,
            dim,
            hidden,
            recipe=recipe,
            gemm=gemm,
            backend=backend,
            weight_cache=weight_cache,
            device=device,
            dtype=dtype,
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(topk_idx (T, k) int64, topk_weights (T, k) fp32)`` of tokens x (T, D)."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return idx, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) bf16/fp32 (T tokens, the same T on every rank) -> (..., D)."""
        flat = x.reshape(-1, x.shape[-1])
        idx, weights = self.route(flat)
        out = routed_experts(
            flat,
            idx,
            weights,
            self.experts,
            num_experts=self.num_experts,
            dispatch_recipe=self.dispatch_recipe,
            alignment=self.alignment,
            group=self.group,
        )
        return out.reshape(x.shape)


#: ``warn.warn_once``'s key of the warning that ``group=None`` keeps the experts local.
LOCAL_WARNING = "moe.layer.group_none_local"


def _local_unless_given(group):
    """``group``, or ``ep.LOCAL`` for ``None``. Where ``torch.distributed`` runs several ranks, the
    first ``None`` warns once that every expert stays local (pass ``ep.LOCAL`` to say so, or a
    process group for expert parallelism)."""
    from . import ep

    if group is not None:
        return group
    if ep.group_size(None) > 1:
        warn_once(
            LOCAL_WARNING,
            "MoELayer/routed_experts: group=None runs every expert on this rank (R = 1, data "
            "parallel) although torch.distributed has several ranks; pass a process group for expert "
            "parallelism, or group=ep.LOCAL to keep the experts local without this warning",
        )
    return ep.LOCAL


def default_alignment(gemm: str) -> int:
    """The dispatch's group alignment when the caller gives none: 128 rows for ``gemm="cute"`` (the
    block's tiles then start on group starts although every pass reads the padding rows; the
    trade is measured in notes/padded-wgrad-operands.md; with many local experts and few rows each,
    up to 127 zero rows per expert can cost more, and a smaller ``alignment`` may serve better),
    else 32 (a multiple of every recipe's ``GROUP_ALIGNMENT``)."""
    return 128 if gemm == "cute" else 32


def check_alignment(alignment: int, recipe: str, *, op: str) -> None:
    """``alignment`` (the dispatch's padded group alignment) suits experts of ``recipe``: one of
    ``checks.ALIGNMENTS`` and a multiple of the recipe's group alignment (``GROUP_ALIGNMENT``: 16
    rows for fp8_rowwise, 32 for mxfp8), else ``ValueError`` naming it. The experts take the
    dispatch's groups as aligned, so a smaller alignment would give wrong results, not an error."""
    checks.check_alignment(alignment, op=op)
    need = GROUP_ALIGNMENT[recipe]
    if alignment % need:
        raise ValueError(
            f"{op}: alignment {alignment} does not suit the {recipe!r} experts: their groups must start "
            f"on multiples of {need} rows (alignment a multiple of {need})"
        )


__all__ = ["GroupedExperts", "MoELayer", "routed_experts"]
