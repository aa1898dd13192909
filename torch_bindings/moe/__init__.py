"""The training layer of cute-kernels (SPEC sections 8 and 9), on top of the op layer
(``torch_bindings``' quantization, padding and swizzle ops):

- :mod:`.grouped_mm`: ``scaled_grouped_mm``, the low-precision grouped GEMM training op;
- :mod:`.experts`: the SwiGLU expert block (two autograd nodes), and its weight cache;
- :mod:`.layer`: the ``GroupedExperts`` and ``MoELayer`` modules;
- :mod:`.tokens`: ``QuantizedTokens``, a dispatch's quantized rows as GEMM input;
- :mod:`.ep`: expert-parallel dispatch and combine (public as ``torch_bindings.ep``);
- :mod:`.hf`: the transformers experts implementation.

Every public name is importable from ``torch_bindings`` too.
"""

from __future__ import annotations

from . import ep
from .experts import invalidate_weight_caches
from .grouped_mm import scaled_grouped_mm
from .layer import GroupedExperts, MoELayer, routed_experts
from .tokens import QuantizedTokens

__all__ = [
    "GroupedExperts",
    "MoELayer",
    "QuantizedTokens",
    "ep",
    "invalidate_weight_caches",
    "routed_experts",
    "scaled_grouped_mm",
]
