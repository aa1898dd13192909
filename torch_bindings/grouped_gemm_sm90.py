"""Launcher of the sm_90a FP8 rowwise grouped GEMM (``cute_kernels.grouped_gemm_sm90``): its GPU
tests, ``bench/bench_grouped_gemm.py``, and ``gemm="cute"`` / ``"cute_2d3d"`` of
``scaled_grouped_mm`` / ``GroupedExperts`` (recipe ``"fp8_rowwise"``), which ``gemm="auto"`` picks
on the devices where it was measured faster than torch's GEMM
(``torch_bindings.moe.grouped_mm.AUTO_OWN_GEMM_DEVICES``; notes/grouped-gemm-sm90.md).

Operands as the kernel takes them (``cute_kernels.grouped_gemm_sm90`` module docstring); the
reference is ``torch_bindings.reference.grouped_gemm_fp8_rowwise_reference`` (same arguments).
:func:`grouped_gemm_fp8_rowwise_sm90` checks and launches; :func:`grouped_gemm_sm90` is the same
as one ``torch.library`` custom op under ``torch.compile`` (an opaque node with a fake).
"""

from __future__ import annotations

import torch

from . import backend as _backend
from .targets import compiled

_ARCH = "sm_90a"


def check_sizes(form: str, m: int, n: int, k: int, groups: int) -> None:
    """``ValueError`` naming the size the kernel cannot take (its ``can_implement``): 1 to
    ``MAX_GROUPS`` groups; 2d3d: the reduction K a positive multiple of 16, y's row length N a
    multiple of 8; 2d2d: the reduction M a multiple of 16 (the TMA-loaded operands' row stride),
    out's row length K a multiple of 8."""
    from cute_kernels.grouped_gemm_sm90 import FORMS, MAX_GROUPS, VECTOR, GroupedGemmSm90Kernel

    if form not in FORMS:
        raise ValueError(f"grouped_gemm_sm90: form must be one of {FORMS}, got {form!r}")
    if GroupedGemmSm90Kernel.can_implement(form, m, n, k, groups):
        return
    if not 1 <= groups <= MAX_GROUPS:
        why = f"E={groups} groups (group_end_offsets' length) must be in [1, {MAX_GROUPS}]"
    elif form == "2d3d" and (k <= 0 or k % 16):
        why = f"K={k} (a.shape[1], the reduction) must be a positive multiple of 16"
    elif form == "2d3d":
        why = f"N={n} (b.shape[1], y's row length) must be a multiple of {VECTOR}"
    elif m % 16:
        why = f"M={m} (a.shape[1] and b.shape[1], the reduction) must be a multiple of 16"
    else:
        why = f"K={k} (b.shape[0], out's row length) must be a multiple of {VECTOR}"
    raise ValueError(f"grouped_gemm_sm90 {form}: sizes M={m} N={n} K={k} E={groups} not supported: {why}")


def _launch_kernel(form: str, *operands: torch.Tensor) -> None:
    """One launch of the compiled kernel of ``form`` on ``operands`` = (a, b, scale_a, scale_b,
    group_end_offsets, out), writing ``out`` (sizes checked, nothing empty); its TVM-FFI wrapper
    checks dtypes, compact row-major layouts and the sizes operands share. CPU tests replace this
    function with the reference on the same operands."""
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmSm90Kernel, GroupedGemmVariant

    device = operands[0].device
    index = _backend.cuda_index(device)
    variant = GroupedGemmVariant(form)
    kernel = compiled(GroupedGemmSm90Kernel.name, variant, _ARCH)
    kernel(*operands, _backend.resident_ctas(index, _cluster(form)))


_cluster_by_form: dict[str, int] = {}


def _cluster(form: str) -> int:
    """CTAs per cluster of ``form``'s compiled config (cached; the persistent grid is a whole
    number of co-resident clusters)."""
    cluster = _cluster_by_form.get(form)
    if cluster is None:
        from cute_kernels.grouped_gemm_sm90 import GroupedGemmSm90Kernel, GroupedGemmVariant

        variant = GroupedGemmVariant(form)
        cluster = _cluster_by_form[form] = GroupedGemmSm90Kernel.default_config(variant, _ARCH).cluster
    return cluster


def _problem(form: str, a: torch.Tensor, b: torch.Tensor, groups: int) -> tuple:
    """``(M, N, K, out shape)`` of a call: 2d3d a (M, K), b (E, N, K) -> (M, N); 2d2d a (N, M),
    b (K, M) -> (G, N, K)."""
    if form == "2d3d":
        (m, k), n = a.shape, b.shape[1]
        return m, n, k, (m, n)
    (n, m), k = a.shape, b.shape[0]
    return m, n, k, (groups, n, k)


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
    (M, N) bf16 for ``"2d3d"``, (E, N, K) bf16 for ``"2d2d"``). Checks the sizes
    (:func:`check_sizes`, ``out``'s shape, the 2d2d scales' lengths G*N and G*K, which the compiled
    kernel cannot tie to the other sizes); the compiled kernel checks dtypes and the sizes its
    operands share. Empty problems launch nothing (a TMA descriptor cannot have a zero extent): an
    empty ``out`` is returned as it is, and a 2d2d with M = 0 (every group empty) is zeros. No host
    sync."""
    groups = group_end_offsets.shape[0]
    m, n, k, shape = _problem(form, a, b, groups)
    if form == "2d2d":
        if scale_a.numel() != groups * n or scale_b.numel() != groups * k:
            raise ValueError(
                f"grouped_gemm_sm90 2d2d: scale_a / scale_b must hold G*N={groups * n} / G*K={groups * k} "
                f"values, got {scale_a.numel()} / {scale_b.numel()}"
            )
    check_sizes(form, m, n, k, groups)
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=a.device)
    elif tuple(out.shape) != shape:
        raise ValueError(f"grouped_gemm_sm90 {form}: out must have shape {shape}, got {tuple(out.shape)}")
    if out.numel() == 0:
        return out
    if m == 0:
        return out.zero_()
    _launch_kernel(form, a, b, scale_a, scale_b, group_end_offsets, out)
    return out


@torch.library.custom_op("cute_kernels::grouped_gemm_fp8_rowwise_sm90", mutates_args=())
def _gemm_op(
    form: str,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    group_end_offsets: torch.Tensor,
) -> torch.Tensor:
    return grouped_gemm_fp8_rowwise_sm90(form, a, b, scale_a, scale_b, group_end_offsets)


@_gemm_op.register_fake
def _gemm_fake(form, a, b, scale_a, scale_b, group_end_offsets):
    return a.new_empty(_problem(form, a, b, group_end_offsets.shape[0])[3], dtype=torch.bfloat16)


def grouped_gemm_sm90(form: str, *operands: torch.Tensor) -> torch.Tensor:
    """:func:`grouped_gemm_fp8_rowwise_sm90` with a new output, ``operands`` = (a, b, scale_a,
    scale_b, group_end_offsets): called directly in eager mode, through its custom op under
    ``torch.compile``."""
    if torch.compiler.is_compiling():
        return _gemm_op(form, *operands)
    return grouped_gemm_fp8_rowwise_sm90(form, *operands)
