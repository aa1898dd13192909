"""A SwiGLU mixture-of-experts expert block on :func:`scaled_grouped_mm` (SPEC section 8).

``GroupedExperts(num_experts, dim, hidden, recipe=...)`` holds per-expert weights w1, w3 (E, H, D)
and w2 (E, D, H) (``nn.Linear`` layout) and maps tokens x (M, D), already sorted expert-major with
int32 group end offsets (E,), to ``out[rows of e] = (silu(x w1[e].T) * (x w3[e].T)) w2[e].T``.

For the low-precision recipes it pads the token groups once (to the recipe's alignment), runs the
three grouped GEMMs and the SwiGLU on the padded rows, and unpads once, instead of padding inside
every GEMM. Padding rows inside a group's aligned range are zero in x and stay zero (silu(0) * 0);
rows past the last group's padded end belong to no group: no GEMM reads them and the unpad drops
them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import checks
from .grouped_mm import GROUP_ALIGNMENT, gemm_path, grouped_mm_apply
from .pad import pad_token_groups, unpad_token_groups


class _PadGroups(torch.autograd.Function):
    """``pad_token_groups`` with its gradient (the unpad of the padded gradient)."""

    @staticmethod
    def forward(ctx, x, ends, alignment: int):
        padded, start, end = pad_token_groups(x, ends, alignment=alignment)
        ctx.save_for_backward(ends, start)
        ctx.rows = x.shape[0]
        ctx.mark_non_differentiable(start, end)
        return padded, start, end

    @staticmethod
    def backward(ctx, grad_padded, _grad_start, _grad_end):
        ends, start = ctx.saved_tensors
        grad = unpad_token_groups(grad_padded.contiguous(), ends, start, num_tokens=ctx.rows)
        return grad, None, None


class _UnpadGroups(torch.autograd.Function):
    """``unpad_token_groups`` with its gradient (the pad of the gradient: padding rows get 0)."""

    @staticmethod
    def forward(ctx, padded, ends, start, rows: int, alignment: int):
        ctx.save_for_backward(ends)
        ctx.alignment = alignment
        return unpad_token_groups(padded, ends, start, num_tokens=rows)

    @staticmethod
    def backward(ctx, grad):
        (ends,) = ctx.saved_tensors
        return pad_token_groups(grad.contiguous(), ends, alignment=ctx.alignment)[0], None, None, None, None


class GroupedExperts(torch.nn.Module):
    """E SwiGLU experts (module docstring). ``recipe``: ``"fp8_rowwise"``, ``"mxfp8"`` or ``"bf16"``;
    ``gemm``: as in :func:`scaled_grouped_mm` (``"auto"`` warns once when it must emulate)."""

    def __init__(
        self,
        num_experts: int,
        dim: int,
        hidden: int,
        *,
        recipe: str = "fp8_rowwise",
        gemm: str = "auto",
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        checks.check_choice("recipe", recipe, checks.GROUPED_MM_RECIPES, op="GroupedExperts")
        checks.check_choice("gemm", gemm, checks.GROUPED_MM_GEMMS, op="GroupedExperts")
        self.recipe, self.gemm = recipe, gemm
        factory = {"device": device, "dtype": torch.bfloat16}  # the op takes bf16 weights
        self.w1 = torch.nn.Parameter(torch.empty(num_experts, hidden, dim, **factory))
        self.w3 = torch.nn.Parameter(torch.empty(num_experts, hidden, dim, **factory))
        self.w2 = torch.nn.Parameter(torch.empty(num_experts, dim, hidden, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each expert's weights like ``nn.Linear``'s default (uniform in +-1/sqrt(fan_in))."""
        for w in (self.w1, self.w3, self.w2):
            bound = 1.0 / math.sqrt(w.shape[-1])
            torch.nn.init.uniform_(w, -bound, bound)

    def forward(self, x: torch.Tensor, group_end_offsets: torch.Tensor) -> torch.Tensor:
        """x (M, D) bf16, tokens sorted by expert; ``group_end_offsets`` (E,) int32 on x's device.
        Returns (M, D) bf16; rows past the last group's end belong to no expert and are unspecified."""
        hidden = torch.empty(0, self.w2.shape[2], dtype=torch.bfloat16, device=x.device)  # metadata only
        for a, w in ((x, self.w1), (x, self.w3), (hidden, self.w2)):
            checks.check_scaled_grouped_mm(a, w, group_end_offsets, self.recipe, torch.bfloat16, self.gemm)
        emulated = gemm_path(self.recipe, x.device, self.gemm) == "emulated"
        if self.recipe == "bf16":
            return self._experts(x, group_end_offsets, emulated, aligned=False)
        alignment = GROUP_ALIGNMENT[self.recipe]
        padded, start, end = _PadGroups.apply(x, group_end_offsets, alignment)
        out = self._experts(padded, end, emulated, aligned=True)
        return _UnpadGroups.apply(out, group_end_offsets, start, x.shape[0], alignment)

    def _experts(self, x, ends, emulated: bool, aligned: bool) -> torch.Tensor:
        gate = grouped_mm_apply(x, self.w1, ends, self.recipe, emulated, aligned)
        up = grouped_mm_apply(x, self.w3, ends, self.recipe, emulated, aligned)
        return grouped_mm_apply(F.silu(gate) * up, self.w2, ends, self.recipe, emulated, aligned)
