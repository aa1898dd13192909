"""``quantize_mxfp8_3d``: PyTorch entry point of 3D expert-weight quantization.

``block="1x32"`` runs the 1x32 kernel (``cute_kernels.quantize``) on w seen as (E N, K): plain
scales are then just the (E N, K/32) matrix, and per-expert blocked scales are the ``experts``
variant, which maps each 128-row output block to its expert's rows. ``block="32x1"`` runs the
32x1 kernel (``torch_bindings.quantize_32x1``).
"""

from __future__ import annotations

import torch

from . import checks, contract, reference, targets
from .op import KernelOp
from .quantize import KERNEL, MAX_GROUPS, Quantize1x32Key
from .quantize_32x1 import launch_32x1_3d

_OP = "quantize_mxfp8_3d"
_CONTRACT = contract.QUANTIZE_MXFP8_3D
_N_MASK = _CONTRACT.divisor("w", "N") - 1  # 32x1 blocks along N


def expert_rows(w: torch.Tensor) -> torch.Tensor:
    """Contiguous w (E, N, K) as the rank-3 kernel entries read it: they flatten it to (E N, K) rows
    with ``w.stride(1)`` as the row stride. PyTorch lets a size-1 dim's stride be anything (an
    (E, 1, K) view of a (1, E, K) tensor has N K there), so that case gets stride K."""
    if w.shape[1] == 1 and w.stride(1) != w.shape[2]:
        return w.as_strided(w.shape, (w.shape[2], w.shape[2], 1))
    return w


def _launch_1x32(
    target: targets.DeviceTarget, w: torch.Tensor, shape: torch.Size, mode: str, blocked: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """1x32 quantization of w of ``shape`` (E, N, K) (all checks done): the kernel's rank-3 entry
    takes the (E, N, K) tensors as they are (it sees E N rows)."""
    experts, n, k = shape
    if n == 1:  # the one shape whose row stride PyTorch leaves free
        w = expert_rows(w)
    # Per-expert scales S = (N, K/32), blocked (Rp, Cp) per expert (scales_shape_3d inlined).
    if blocked:
        layout, scales = "experts", target.e8m0.new_empty(experts, (n + 127) & -128, ((k >> 5) + 3) & -4)
    else:
        layout, scales = "plain", target.e8m0.new_empty(experts, n, k >> 5)
    q = target.e4m3.new_empty(experts, n, k)
    if scales.numel():
        key = (KERNEL, w.dtype, mode, layout, MAX_GROUPS, 3)  # a Quantize1x32Key's fields
        kernel = target.kernels.get(key) or target.kernel(Quantize1x32Key._make(key), Quantize1x32Key.variant)
        kernel(w, q, scales, None, None, None, n)
    return q, scales


def _run_kernel(
    w: torch.Tensor, block: str, mode: str, blocked: bool, target: targets.DeviceTarget
) -> tuple[torch.Tensor, torch.Tensor]:
    checks.check_kernel_inputs(_OP, None, w)
    if block == "1x32":
        return _launch_1x32(target, w, w.shape, mode, blocked)
    return launch_32x1_3d(target, w, w.shape, mode, blocked)


@torch.library.custom_op("cute_kernels::quantize_mxfp8_3d", mutates_args=())
def _quantize_3d_op(
    w: torch.Tensor, block: str, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _QUANTIZE_3D.run_on_device(w, block, scaling_mode, blocked_scales)


@_quantize_3d_op.register_fake
def _quantize_3d_fake(
    w: torch.Tensor, block: str, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _CONTRACT.fake(w, block, scaling_mode, blocked_scales)


# The op's parts for ``KernelOp``, all on ``(w, block, scaling_mode, blocked_scales)``.


def _fast(target: targets.DeviceTarget, args: tuple):
    """``KernelOp.fast``: the contract's checks and the alignment from metadata reads."""
    w, block, scaling_mode, blocked_scales = args
    shape = checks.fast_quant_shape(w, scaling_mode, blocked_scales)
    if shape is None or len(shape) != 3 or type(block) is not str:
        return None
    if block == "1x32":
        return _launch_1x32(target, w, shape, scaling_mode, blocked_scales)
    if block == "32x1" and not shape[1] & _N_MASK:
        return launch_32x1_3d(target, w, shape, scaling_mode, blocked_scales)
    return None


def _run(target: targets.DeviceTarget, w, block, scaling_mode, blocked_scales):
    return _run_kernel(w, block, scaling_mode, blocked_scales, target)


def _reference(w, block, scaling_mode, blocked_scales):
    return reference.quantize_mxfp8_3d(
        w, block=block, scaling_mode=scaling_mode, blocked_scales=blocked_scales
    )


_QUANTIZE_3D = KernelOp(_OP, _CONTRACT.check, _run, _reference, _quantize_3d_op, fast=_fast)


def quantize_mxfp8_3d(
    w: torch.Tensor,
    *,
    block: str = "1x32",
    scaling_mode: str = "rceil",
    blocked_scales: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize expert weights w (E, N, K), bf16 or fp32, contiguous, K a multiple of 32, N
    any for ``"1x32"`` and a multiple of 32 for ``"32x1"`` (SPEC sections 2, 3 and 5).

    ``block="1x32"`` (along K): q (E, N, K) ``float8_e4m3fn`` row-major; per-expert scales
    S = (N, K/32). ``block="32x1"`` (along N): q (E, N, K) with strides (N K, 1, N); per-expert
    S = (K, N/32). Scales ``float8_e8m0fnu``: (E, *S) with ``blocked_scales=False``, else each
    expert's S in the blocked layout, (E, Rp, Cp), every padding byte 0. One launch, no host sync,
    no recompile when E, N or K change.
    """
    return _QUANTIZE_3D.dispatch(backend, w, block, scaling_mode, blocked_scales)
