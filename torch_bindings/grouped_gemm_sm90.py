"""Thin launcher of the experimental sm_90a FP8 grouped GEMM (``cute_kernels.grouped_gemm_sm90``) for
its GPU tests and ``bench/bench_grouped_gemm.py``. Not a public op: ``scaled_grouped_mm`` and
``GroupedExperts`` do not call it until a GPU has verified the kernel (notes/grouped-gemm-sm90.md).

Operands as the kernel takes them (``cute_kernels.grouped_gemm_sm90`` module docstring); the
reference is ``torch_bindings.reference.grouped_gemm_fp8_rowwise_reference`` (same arguments).
"""

from __future__ import annotations

import torch

from . import backend as _backend
from .targets import compiled

_ARCH = "sm_90a"


def grouped_gemm_fp8_rowwise_sm90(
    form: str,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    group_end_offsets: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the kernel on ``a``'s CUDA device (an sm_90 GPU); returns ``out`` (allocated when None:
    (M, N) bf16 for ``"2d3d"``, (E, N, K) bf16 for ``"2d2d"``). Checks the sizes (the kernel's
    ``can_implement``, ``out``'s shape, the 2d2d scales' lengths G*N and G*K, which the compiled
    kernel cannot tie to the other sizes); the compiled kernel checks dtypes and the sizes its
    operands share. Empty problems launch nothing (a TMA descriptor cannot have a zero extent): an
    empty ``out`` is returned as it is, and a 2d2d with M = 0 (every group empty) is zeros. No host
    sync."""
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmSm90Kernel, GroupedGemmVariant

    groups = group_end_offsets.shape[0]
    if form == "2d3d":
        (m, k), n = a.shape, b.shape[1]
        shape = (m, n)
    else:
        (n, m), k = a.shape, b.shape[0]
        shape = (groups, n, k)
        if scale_a.numel() != groups * n or scale_b.numel() != groups * k:
            raise ValueError(
                f"grouped_gemm_sm90 2d2d: scale_a / scale_b must hold G*N={groups * n} / G*K={groups * k} "
                f"values, got {scale_a.numel()} / {scale_b.numel()}"
            )
    if not GroupedGemmSm90Kernel.can_implement(form, m, n, k, groups):
        raise ValueError(f"grouped_gemm_sm90 {form}: sizes M={m} N={n} K={k} E={groups} not supported")
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=a.device)
    elif tuple(out.shape) != shape:
        raise ValueError(f"grouped_gemm_sm90 {form}: out must have shape {shape}, got {tuple(out.shape)}")
    if out.numel() == 0:
        return out
    if m == 0:
        return out.zero_()
    index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    kernel = compiled(GroupedGemmSm90Kernel.name, GroupedGemmVariant(form), _ARCH)
    kernel(a, b, scale_a, scale_b, group_end_offsets, out, _backend.num_sms(index))
    return out
