"""PyTorch API of cute-kernels (SPEC section 5).

Every function takes ``backend="auto" | "cute" | "reference"``: ``"auto"`` runs the CuTeDSL kernel
on a CUDA tensor of a supported GPU and the reference on CPU tensors; on a CUDA tensor where the
kernel cannot run it raises (``capabilities(device)`` says what runs where). The training layer
(grouped GEMM op, expert block, MoE layer, expert parallelism) is the subpackage
``torch_bindings.moe``; its public names are importable from here, and expert parallelism as
``torch_bindings.ep``.
"""

from __future__ import annotations

import sys

from . import reference
from .capabilities import Capabilities, capabilities
from .dequantize_fp8 import dequantize_fp8_rows
from .kernel_cache import STATS as compile_stats
from .kernel_cache import clear_memory_cache
from .moe import GroupedExperts, MoELayer, QuantizedTokens, ep, invalidate_weight_caches, scaled_grouped_mm
from .pad import pad_token_groups, unpad_token_groups
from .pad_quantize import pad_and_quantize_mxfp8_2d
from .pad_quantize_fp8 import pad_and_quantize_fp8_2d_cols, pad_and_quantize_fp8_2d_dual
from .quantize import quantize_mxfp8_2d
from .quantize_3d import quantize_mxfp8_3d
from .quantize_dual import quantize_mxfp8_2d_dual
from .quantize_fp8 import quantize_fp8_2d, quantize_fp8_2d_dual, quantize_fp8_3d, quantize_fp8_3d_dual
from .reference import check_group_end_offsets
from .swiglu import swiglu_backward_quantize_fp8, swiglu_quantize_fp8
from .swizzle import swizzle_scales

# ``import torch_bindings.ep`` and ``torch_bindings.ep`` name the one module object.
sys.modules[f"{__name__}.ep"] = ep

__all__ = [
    "Capabilities",
    "GroupedExperts",
    "MoELayer",
    "QuantizedTokens",
    "capabilities",
    "check_group_end_offsets",
    "clear_memory_cache",
    "compile_stats",
    "dequantize_fp8_rows",
    "ep",
    "invalidate_weight_caches",
    "pad_and_quantize_fp8_2d_cols",
    "pad_and_quantize_fp8_2d_dual",
    "pad_and_quantize_mxfp8_2d",
    "pad_token_groups",
    "quantize_fp8_2d",
    "quantize_fp8_2d_dual",
    "quantize_fp8_3d",
    "quantize_fp8_3d_dual",
    "quantize_mxfp8_2d",
    "quantize_mxfp8_2d_dual",
    "quantize_mxfp8_3d",
    "reference",
    "scaled_grouped_mm",
    "swiglu_backward_quantize_fp8",
    "swiglu_quantize_fp8",
    "swizzle_scales",
    "unpad_token_groups",
]
