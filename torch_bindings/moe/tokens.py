"""Tokens that arrive already quantized for the forward GEMM (SPEC section 8): what ``ep.dispatch``
returns for the FP8 recipes, taken by ``scaled_grouped_mm`` and the expert block without quantizing
x again."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import backend as _backend
from .. import reference
from ..dequantize_fp8 import dequantize_fp8_rows


def dequant_mx(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 dequantization of q (..., C) whose 32-element blocks run along its last dim, with plain
    E8M0 scales (..., C / 32). Exact unless a value reaches 2^128 (bf16's range)."""
    blocks = q.reshape(*q.shape[:-1], q.shape[-1] // 32, 32)
    return reference.dequantize_blocks(blocks, scales, dim=-1).reshape(q.shape).to(torch.bfloat16)


@dataclass(eq=False)
class QuantizedTokens:
    """Tokens already quantized for the forward GEMM, in aligned groups (what ``ep.dispatch``
    returns for ``"fp8_rowwise"`` and ``"mxfp8"``): ``q`` (M, K) e4m3 row-major; ``scales``
    (fp8_rowwise: (M,) fp32 row scales; mxfp8: the M-groups blocked 1x32 scales of the groups);
    ``plain_scales`` (mxfp8: (M, K/32) e8m0 row-block scales, for the emulated GEMM and the column
    operand; else ``None``); ``group_end_offsets`` (G,) int32, groups starting on multiples of
    ``alignment``; ``grad_anchor`` a (M, K) bf16 tensor without storage of its own through which
    the tokens' gradient flows back (to the dispatch), or ``None``."""

    recipe: str
    q: torch.Tensor
    scales: torch.Tensor
    group_end_offsets: torch.Tensor
    alignment: int
    plain_scales: torch.Tensor | None = None
    grad_anchor: torch.Tensor | None = None

    def dequantized(self, backend: str = "auto") -> torch.Tensor:
        """(M, K) bf16 ``q * scale`` (exact: the scales are powers of 2 and q has 3 mantissa bits).
        fp8_rowwise: only the rows below the last group end, the rows any GEMM reads
        (:func:`dequantize_fp8_rows` with ``backend``: the bounded kernel on a GPU, no sync; the
        rows past the end unspecified); mxfp8: every row, in PyTorch elementwise ops on q's device
        (no sync; there is no kernel for it). ``backend`` resolves as every op's
        (``torch_bindings.backend``): ``"auto"`` raises on a CUDA device where the kernels cannot
        run, ``"cute"`` wherever they cannot (CPU included), ``"reference"`` runs anywhere."""
        if self.recipe == "fp8_rowwise":
            return dequantize_fp8_rows(self.q, self.scales, self.group_end_offsets, backend=backend)
        _backend.select("QuantizedTokens.dequantized", backend, self.q.device)
        return dequant_mx(self.q, self.plain_scales)

    def anchor(self) -> torch.Tensor:
        """The tensor the GEMM's autograd function takes as x: ``grad_anchor``, or a (M, K) bf16
        stand-in without storage when no gradient flows back."""
        if self.grad_anchor is not None:
            return self.grad_anchor
        return torch.zeros((), dtype=torch.bfloat16, device=self.q.device).expand(self.q.shape)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


__all__ = ["QuantizedTokens", "dequant_mx"]
