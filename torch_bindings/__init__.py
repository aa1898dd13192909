"""PyTorch API of cute-kernels (SPEC section 5).

Every function takes ``backend="auto" | "cute" | "reference"``. Functions whose CuTeDSL kernel is
not built yet run the reference on CPU tensors and refuse (rather than silently falling back to a
slow path) on a GPU unless ``backend="reference"`` is passed; see ``KERNEL_STATUS``.
"""

from __future__ import annotations

import functools

import torch

from . import reference
from .backend import select as _select
from .kernel_cache import STATS as compile_stats
from .kernel_cache import clear_memory_cache
from .pad import pad_token_groups, unpad_token_groups
from .pad_quantize import pad_and_quantize_mxfp8_2d
from .quantize import quantize_mxfp8_2d
from .quantize_3d import quantize_mxfp8_3d
from .reference import check_group_end_offsets
from .swizzle import swizzle_scales

#: Public op -> issue that brings its kernel (None: the kernel exists).
KERNEL_STATUS = {
    "swizzle_scales": None,
    "quantize_mxfp8_2d": None,  # block="1x32"; "32x1" comes with issue 6
    "quantize_mxfp8_3d": None,  # block="1x32"; "32x1" with the 32x1 kernel (issues 4 and 6)
    "pad_token_groups": None,
    "unpad_token_groups": None,
    "pad_and_quantize_mxfp8_2d": None,
    "quantize_mxfp8_2d_dual": None,
}


def _reference_until_kernel(name: str):
    """Public wrapper for an op whose kernel is pending: reference where allowed, clear error else."""
    implementation = getattr(reference, name)

    @functools.wraps(implementation)
    def op(first: torch.Tensor, *args, backend: str = "auto", **kwargs):
        arch = _select(name, backend, first.device) if isinstance(first, torch.Tensor) else None
        if arch is not None:
            raise NotImplementedError(
                f"{name}: the CuTeDSL kernel is not built yet (issue #{KERNEL_STATUS[name]}); "
                "pass backend='reference' to run the PyTorch reference on this device"
            )
        return implementation(first, *args, **kwargs)

    return op


from .quantize_32x1 import quantize_mxfp8_2d_dual  # noqa: E402

__all__ = [
    "KERNEL_STATUS",
    "check_group_end_offsets",
    "clear_memory_cache",
    "compile_stats",
    "pad_and_quantize_mxfp8_2d",
    "pad_token_groups",
    "quantize_mxfp8_2d",
    "quantize_mxfp8_2d_dual",
    "quantize_mxfp8_3d",
    "reference",
    "swizzle_scales",
    "unpad_token_groups",
]
