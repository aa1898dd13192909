"""transformers integration: our expert block as an experts implementation (SPEC section 8).

``register()`` adds ``"cute_fp8_rowwise"``, ``"cute_mxfp8"`` and ``"cute_bf16"`` (and
``"cute_fp8_rowwise_sm90"``: fp8_rowwise on the project's own FP8 grouped GEMM, ``gemm="cute"``,
Hopper only; ``"cute_fp8_rowwise"`` runs it too where ``gemm="auto"`` picks it:
``grouped_mm.AUTO_OWN_GEMM_DEVICES``) to
``transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS``, so that a transformers MoE model whose
experts class uses ``@use_experts_implementation`` (Qwen3-MoE, Mixtral, ...) runs on them with
``from_pretrained(..., experts_implementation="cute_fp8_rowwise")`` or
``model.set_experts_implementation("cute_fp8_rowwise")``: the model's own router and its own
``gate_up_proj`` (E, 2H, D) / ``down_proj`` (E, D, H) parameters, not copied.

A call is the MoE layer at R = 1 (``ep.LOCAL``: a data-parallel run keeps every expert on every
rank, whatever ``torch.distributed`` holds): ``ep.dispatch`` (the (token, slot) pairs sorted
expert-major into padded groups; FP8 recipes quantize each token once there), the expert block on
those aligned groups, and ``ep.combine`` (the routing-weighted sum in fp32):
``moe.routed_experts``. The block is a ``GroupedExperts`` sharing the experts module's parameters
(kept in its ``__dict__``, outside its submodules), so the weights' quantized operands are cached
while the parameters do not change.
transformers stays an optional dependency: nothing here imports it until ``register`` runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .grouped_mm import GROUP_ALIGNMENT

#: Registered name -> recipe (the GEMMs ``gemm="auto"`` picks).
IMPLEMENTATIONS = {"cute_fp8_rowwise": "fp8_rowwise", "cute_mxfp8": "mxfp8", "cute_bf16": "bf16"}
#: Registered name -> recipe, on the project's own grouped GEMM (``gemm="cute"``: sm_90 only, the
#: dispatch's groups aligned to ``moe.layer.default_alignment``'s 128 rows).
OWN_GEMM_IMPLEMENTATIONS = {"cute_fp8_rowwise_sm90": "fp8_rowwise"}
_DISPATCH_ALIGNMENT = 32  # a multiple of every recipe's GEMM alignment (GROUP_ALIGNMENT)


def hf_weights(experts: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gate_up_proj, down_proj)`` of a transformers experts module, after checking that our block
    computes what it does: gated (gate rows then up rows), SiLU, no biases, not transposed, no norm
    after the experts."""
    name = type(experts).__name__
    problems = []
    if not hasattr(experts, "gate_up_proj") or not hasattr(experts, "down_proj"):
        problems.append("no gate_up_proj / down_proj parameters")
    if getattr(experts, "has_bias", False):
        problems.append("expert biases")
    if getattr(experts, "is_transposed", False):
        problems.append("transposed weights")
    if not getattr(experts, "is_concatenated", True):
        problems.append("interleaved gate/up rows")
    if getattr(experts, "has_post_expert_norm", False):
        problems.append("a norm after the experts")
    if not _is_silu(experts):
        act = getattr(experts, "act_fn", None)
        problems.append(f"activation {type(act).__name__} (SwiGLU needs SiLU)")
    if problems:
        raise ValueError(f"cute experts: {name} is not supported: " + ", ".join(problems))
    return experts.gate_up_proj, experts.down_proj


def _is_silu(experts: torch.nn.Module) -> bool:
    """The experts' activation is SiLU: the config says so, or the module is torch's or
    transformers' SiLU."""
    hidden_act = getattr(getattr(experts, "config", None), "hidden_act", None)
    if hidden_act is not None:
        return hidden_act in ("silu", "swish")
    act = getattr(experts, "act_fn", None)
    return act is None or isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _block(experts: torch.nn.Module, recipe: str, gemm: str):
    """Our ``GroupedExperts`` on the experts module's own parameters (shared), one per recipe and
    GEMM, kept outside the module's submodules (its state_dict keys do not change)."""
    from .layer import GroupedExperts

    blocks = experts.__dict__.setdefault("_cute_blocks", {})
    block = blocks.get((recipe, gemm))
    w13, w2 = hf_weights(experts)
    if block is None or block.w13 is not w13 or block.w2 is not w2:
        block = blocks[recipe, gemm] = GroupedExperts.from_weights(w13, w2, recipe=recipe, gemm=gemm)
    return block


def make_experts_forward(recipe: str, gemm: str = "auto") -> Callable[..., torch.Tensor]:
    """An experts forward ``(self, hidden_states (T, D), top_k_index (T, k), top_k_weights (T, k))
    -> (T, D)`` running ``recipe`` on ``gemm``'s GEMMs (module docstring): R = 1 (``ep.LOCAL``),
    every expert of the module on this rank, whatever ``torch.distributed`` holds. ``gemm="cute"``
    raises ``RuntimeError`` (naming what is missing) at the first call off sm_90."""
    from .ep import LOCAL
    from .layer import routed_experts

    alignment = None if gemm == "cute" else _DISPATCH_ALIGNMENT  # None: the GEMM's own default

    def forward(
        self: torch.nn.Module,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
    ) -> torch.Tensor:
        block = _block(self, recipe, gemm)
        return routed_experts(
            hidden_states,
            top_k_index,
            top_k_weights,
            block,
            num_experts=block.w13.shape[0],
            dispatch_recipe=recipe,
            alignment=alignment,
            group=LOCAL,
        )

    forward.__name__ = f"cute_{recipe}{'_sm90' if gemm == 'cute' else ''}_experts_forward"
    return forward


def register() -> list[str]:
    """Register every implementation with transformers (``ALL_EXPERTS_FUNCTIONS``); returns the
    names."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert max(GROUP_ALIGNMENT.values()) <= _DISPATCH_ALIGNMENT
    for name, recipe in IMPLEMENTATIONS.items():
        ALL_EXPERTS_FUNCTIONS.register(name, make_experts_forward(recipe))
    for name, recipe in OWN_GEMM_IMPLEMENTATIONS.items():
        ALL_EXPERTS_FUNCTIONS.register(name, make_experts_forward(recipe, gemm="cute"))
    return [*IMPLEMENTATIONS, *OWN_GEMM_IMPLEMENTATIONS]


__all__ = ["IMPLEMENTATIONS", "OWN_GEMM_IMPLEMENTATIONS", "hf_weights", "make_experts_forward", "register"]
