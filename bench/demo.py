"""``make demo``: the toolkit's job on a realistic MoE batch.

On a supported GPU: 8 experts, 16384 tokens of hidden size 7168 with skewed, unaligned expert
group sizes. The scales of the activations (M-groups), of the weight-gradient operands (K-groups)
and of the expert weights (3D) go through the blocked-scale kernel; each result is checked byte
for byte against the reference and timed next to a device copy of the same bytes.
Quantization itself still runs the PyTorch reference until its kernels land (issues 3-6).

Without a GPU: says so, runs the reference on a smaller batch, and prints the sm_100a SASS summary
of every kernel (compiled here, no GPU needed).
"""

from __future__ import annotations

import sys

import torch

import torch_bindings
from torch_bindings import reference

EXPERTS, TOKENS, HIDDEN, EXPERT_DIM = 8, 16384, 7168, 2048
SHARES = (0.31, 0.22, 0.14, 0.11, 0.09, 0.07, 0.05, 0.01)  # skewed routing


def group_ends(tokens: int, multiple: int = 1) -> torch.Tensor:
    """Skewed expert group end offsets (sizes multiples of ``multiple``, deliberately unaligned)."""
    sizes = [int(tokens * share) // multiple * multiple + (3 if multiple == 1 else 0) for share in SHARES]
    sizes[-1] = tokens - sum(sizes[:-1])
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.to(a.device).view(torch.uint8))


def gpu_demo() -> int:
    from bench.common import copy_baseline_us, gbps, report, time_cuda

    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}  batch: {TOKENS} tokens x {HIDDEN}, {EXPERTS} experts")
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device=device) * 3
    ends = group_ends(TOKENS).to(device)
    ends32 = group_ends(TOKENS, multiple=32).to(device)
    w = torch.randn(EXPERTS, EXPERT_DIM, HIDDEN, dtype=torch.bfloat16, device=device)
    _, s_act = reference.quantize_mxfp8_2d(x, blocked_scales=False)
    _, s_wgrad = reference.quantize_mxfp8_2d(x, block="32x1", blocked_scales=False)
    _, s_w = reference.quantize_mxfp8_3d(w, blocked_scales=False)
    jobs = [
        ("activations, M-groups", s_act, {"group_end_offsets": ends}),
        ("wgrad operand, K-groups", s_wgrad, {"group_end_offsets": ends32 // 32, "groups": "K"}),
        ("expert weights, 3D", s_w, {}),
    ]
    rows, failures = [], 0
    for name, scales, kwargs in jobs:
        out = torch_bindings.swizzle_scales(scales, backend="cute", **kwargs)
        ok = _same(
            out,
            reference.swizzle_scales(
                scales.cpu(), **{k: v.cpu() if torch.is_tensor(v) else v for k, v in kwargs.items()}
            ),
        )
        failures += not ok
        nbytes = scales.numel() + out.numel()
        us = time_cuda(lambda s=scales, k=kwargs: torch_bindings.swizzle_scales(s, **k))
        copy = copy_baseline_us(nbytes, device)
        rows.append(
            {
                "job": name,
                "scales": tuple(scales.shape),
                "MB": nbytes / 1e6,
                "us": us,
                "GB/s": gbps(nbytes, us),
                "copy GB/s": gbps(nbytes, copy),
                "ratio": copy / us,
                "bit-exact": "yes" if ok else "NO",
            }
        )
    report(
        rows,
        ["job", "scales", "MB", "us", "GB/s", "copy GB/s", "ratio", "bit-exact"],
        "swizzle_scales on a MoE batch (bytes moved = read + written)",
        panel_key=None,
    )
    return 1 if failures else 0


def cpu_demo() -> int:
    print("No supported CUDA GPU here: running the PyTorch reference on a smaller batch.")
    tokens = 2048
    x = torch.randn(tokens, 1024, dtype=torch.bfloat16)
    ends = group_ends(tokens)
    q, s = torch_bindings.quantize_mxfp8_2d(x, group_end_offsets=ends)
    print(f"quantize_mxfp8_2d 1x32 + M-groups: q {tuple(q.shape)} {q.dtype}, scales {tuple(s.shape)}")
    blocked = torch_bindings.swizzle_scales(
        reference.quantize_mxfp8_2d(x, blocked_scales=False)[1], group_end_offsets=ends
    )
    print(f"swizzle_scales M-groups: {tuple(blocked.shape)}, same bytes as fused: {_same(blocked, s)}")
    print("\nSASS of every kernel for sm_100a (compiled on this machine):")
    from cute_utils import sass

    return sass.main(["all", "--arch", "sm_100a"])


def main() -> int:
    from torch_bindings.backend import kernel_arch

    if torch.cuda.is_available() and kernel_arch(torch.device("cuda"))[0] is not None:
        return gpu_demo()
    return cpu_demo()


if __name__ == "__main__":
    sys.exit(main())
