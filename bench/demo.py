"""``make demo``: the toolkit's job on a realistic MoE batch.

On a supported GPU: 8 experts, 16384 tokens of hidden size 7168 with skewed, unaligned expert
group sizes. The batch goes through the fused ``pad_and_quantize_mxfp8_2d`` (padded E4M3 tokens and
M-groups blocked scales of the padded groups in one pass), the 8 experts' (N, K) = (2048, 7168)
weights through ``quantize_mxfp8_3d`` (1x32 and 32x1), and the scales of the activations
(M-groups), of the weight-gradient operands (K-groups) and of the expert weights (3D) through the
blocked-scale kernel. Each result is checked byte for byte against the reference and timed next
to a device copy of the same bytes; a call that raises gets a failing row instead of a timing.
Then the SwiGLU expert module (``GroupedExperts``) on the same batch: FP8 rowwise against bf16,
forward + backward time and the output's SQNR.

Without a GPU: says so, runs the reference on a smaller batch, checks it against numbers stated
outside it (SPEC section 2's scale table, PyTorch's ``to_blocked``), and prints a one-line sm_100a
SASS summary of a few kernels compiled here (``make sass`` shows every variant), and the expert
module's FP8 rowwise numerics (the explicitly named emulation: there is no FP8 GEMM on CPU).
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


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _same_all(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> bool:
    return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))


def _demo_row(name: str, what: str, op: str, run, want, inputs: tuple[torch.Tensor, ...]) -> dict:
    """Check ``run()`` against ``want()`` and time it next to a copy of its bytes (read + written).

    ``op`` is the public op whose kernel runs (the job name says it too); a call that raises
    gives a failing row.
    """
    from bench.common import copy_baseline_us, gbps, short_error, time_cuda

    row = {"job": name, "shape": what, "MB": None, "us": None, "GB/s": None, "copy GB/s": None, "ratio": None}
    try:
        out = run()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a row, not a crash; counted as a failure
        return {**row, "bit-exact": f"NO: raised {short_error(exc, 80)}"}
    ok = _same_all(out, want())
    nbytes = _nbytes(*inputs, *out)
    us = time_cuda(run)
    copy = copy_baseline_us(nbytes, torch.device("cuda"))
    row.update({"MB": nbytes / 1e6, "us": us, "GB/s": gbps(nbytes, us), "copy GB/s": gbps(nbytes, copy)})
    return {**row, "ratio": copy / us, "bit-exact": "yes" if ok else "NO"}


def gpu_demo() -> int:
    from bench.common import report

    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}  batch: {TOKENS} tokens x {HIDDEN}, {EXPERTS} experts")
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device=device) * 3
    ends = group_ends(TOKENS).to(device)
    ends32 = group_ends(TOKENS, multiple=32).to(device)
    w = torch.randn(EXPERTS, EXPERT_DIM, HIDDEN, dtype=torch.bfloat16, device=device)
    sizes = torch.diff(ends.cpu(), prepend=torch.zeros(1, dtype=torch.int32)).tolist()
    print(f"expert group sizes: {sizes}")
    rows = [
        _demo_row(
            "pad + quantize activations (fused)",
            f"({TOKENS}, {HIDDEN}) G={EXPERTS}",
            "pad_and_quantize_mxfp8_2d",
            lambda: torch_bindings.pad_and_quantize_mxfp8_2d(x, ends),
            lambda: reference.pad_and_quantize_mxfp8_2d(x, ends),
            (x, ends),
        )
    ]
    for block in ("1x32", "32x1"):
        rows.append(
            _demo_row(
                f"expert weights, 3D {block}",
                str(tuple(w.shape)),
                "quantize_mxfp8_3d",
                lambda b=block: torch_bindings.quantize_mxfp8_3d(w, block=b),
                lambda b=block: reference.quantize_mxfp8_3d(w, block=b),
                (w,),
            )
        )
    _, s_act = reference.quantize_mxfp8_2d(x, blocked_scales=False)
    _, s_wgrad = reference.quantize_mxfp8_2d(x, block="32x1", blocked_scales=False)
    _, s_w = reference.quantize_mxfp8_3d(w, blocked_scales=False)
    jobs = [
        ("swizzle activations, M-groups", s_act, {"group_end_offsets": ends}),
        ("swizzle wgrad operand, K-groups", s_wgrad, {"group_end_offsets": ends32 // 32, "groups": "K"}),
        ("swizzle expert weights, 3D", s_w, {}),
    ]
    for name, scales, kwargs in jobs:
        cpu_kwargs = {k: v.cpu() if torch.is_tensor(v) else v for k, v in kwargs.items()}
        rows.append(
            _demo_row(
                name,
                str(tuple(scales.shape)),
                "swizzle_scales",
                lambda s=scales, k=kwargs: (torch_bindings.swizzle_scales(s, **k),),
                lambda s=scales, k=cpu_kwargs: (reference.swizzle_scales(s.cpu(), **k),),
                (scales,),
            )
        )
    report(
        rows,
        ["job", "shape", "MB", "us", "GB/s", "copy GB/s", "ratio", "bit-exact"],
        "cute-kernels on a MoE batch (bytes moved = read + written; ratio = copy time / our time)",
        panel_key=None,
    )
    experts_demo(device, TOKENS, HIDDEN, EXPERT_DIM)
    return 1 if any(r["bit-exact"].startswith("NO") for r in rows) else 0


#: SPEC section 2's table: (block max, floor scale, floor q of the max, rceil scale, rceil q).
_SPEC_CASES = (
    ("max 448", 448.0, 127, 0x7E, 127, 0x7E),
    ("max bf16 max", float(torch.finfo(torch.bfloat16).max), 246, 0x7E, 247, 0x78),
    ("max 480", 480.0, 127, 0x7E, 128, 0x77),
    ("all 2^-126", 2.0**-126, 0, 0x40, 0, 0x40),
)
#: A few kernels compiled here for sm_100a: one line each (make sass shows every variant).
_SASS_SAMPLE = (
    "quantize_dual_bfloat16_rceil_groups",
    "quantize_1x32_bfloat16_rceil_m_groups_g64",
    "swizzle_m_groups_2d_words",
    "pad_int16_v16",
)


def _spec_checks() -> list[tuple[str, bool]]:
    """Checks of the reference against facts stated outside it: SPEC section 2's scale table and
    PyTorch's own blocked layout (``to_blocked``)."""
    results = []
    for name, value, floor_s, floor_q, rceil_s, rceil_q in _SPEC_CASES:
        block = torch.full((1, 32), value, dtype=torch.bfloat16)
        for mode, want_s, want_q in (("floor", floor_s, floor_q), ("rceil", rceil_s, rceil_q)):
            q, s = reference.quantize_mxfp8_2d(block, scaling_mode=mode, blocked_scales=False)
            got = (int(s.view(torch.uint8)[0, 0]), int(q.view(torch.uint8)[0, 0]))
            results.append(
                (f"SPEC table, {name}, {mode}: scale {want_s}, q 0x{want_q:02X}", got == (want_s, want_q))
            )
    try:
        from torch.testing._internal.common_quantized import to_blocked
    except ImportError:  # needs expecttest (the test extra)
        return results
    scales = torch.randint(0, 256, (300, 37), dtype=torch.uint8)
    ours = reference.swizzle_scales(scales.view(torch.float8_e8m0fnu)).view(torch.uint8).flatten()
    results.append(
        ("blocked layout equals PyTorch's to_blocked (300 x 37)", torch.equal(ours, to_blocked(scales)))
    )
    return results


def _sass_lines() -> list[str]:
    """One summary line per :data:`_SASS_SAMPLE` kernel, compiled here for sm_100a."""
    import cute_kernels
    from cute_utils import sass

    targets, lines = cute_kernels.sass_targets(), []
    for name in _SASS_SAMPLE:
        (kernel,) = [k for k in sass.summarize(sass.cubin_of(targets[name]("sm_100a"))) if k.entry]
        widths = ", ".join(f"{k} x{n}" for k, n in sorted(kernel.memory.items()) if k[:3] in ("LDG", "STG"))
        lines.append(f"  {name}: {kernel.registers} regs, {kernel.local_bytes} B local; {widths}")
    return lines


def _sqnr_db(actual: torch.Tensor, expected: torch.Tensor) -> float:
    noise = (actual.float() - expected.float()).norm()
    return float(20 * torch.log10(expected.float().norm() / noise))


def experts_demo(device: torch.device, tokens: int, dim: int, hidden: int) -> None:
    """GroupedExperts with recipe fp8_rowwise next to bf16 on one batch: output SQNR, and on a GPU
    the forward + backward time of both."""
    gemm = "native" if device.type == "cuda" else "emulated"
    fp8 = torch_bindings.GroupedExperts(EXPERTS, dim, hidden, recipe="fp8_rowwise", gemm=gemm, device=device)
    bf16 = torch_bindings.GroupedExperts(EXPERTS, dim, hidden, recipe="bf16", device=device)
    bf16.load_state_dict(fp8.state_dict())
    x = torch.randn(tokens, dim, dtype=torch.bfloat16, device=device).requires_grad_()
    ends = group_ends(tokens).to(device)
    grad = torch.randn(tokens, dim, dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        sqnr = _sqnr_db(fp8(x, ends), bf16(x, ends))
    line = f"GroupedExperts ({EXPERTS} SwiGLU experts, D={dim}, H={hidden}, {tokens} tokens), fp8_rowwise"
    print(f"\n{line} ({gemm} GEMMs): output SQNR vs bf16 {sqnr:.1f} dB")
    if device.type != "cuda":
        return
    from bench.common.timing import time_cuda

    def step(module):
        def run():
            x.grad = None
            module.zero_grad(set_to_none=True)
            module(x, ends).backward(grad)

        return run

    us = {
        name: time_cuda(step(m), warmup=3, iters=5, reps=5, use_graph=False)
        for name, m in (("bf16", bf16), ("fp8", fp8))
    }
    speedup = us["bf16"] / us["fp8"]
    print(f"  forward + backward: bf16 {us['bf16']:.0f} us, fp8_rowwise {us['fp8']:.0f} us ({speedup:.2f}x)")


def cpu_demo() -> int:
    print("No supported CUDA GPU here: the PyTorch reference on a small MoE batch, checks of it against")
    print("the contract, and a few kernels compiled for Blackwell (sm_100a).\n")
    tokens = 2048
    x = torch.randn(tokens, 1024, dtype=torch.bfloat16)
    ends = group_ends(tokens)
    q, s, start, end = torch_bindings.pad_and_quantize_mxfp8_2d(x, ends)
    print(f"pad_and_quantize_mxfp8_2d: {tokens} tokens x 1024, 8 experts -> q {tuple(q.shape)}, ", end="")
    print(f"scales {tuple(s.shape)}")
    w = torch.randn(EXPERTS, 256, 1024, dtype=torch.bfloat16)
    q, s = torch_bindings.quantize_mxfp8_3d(w, block="32x1")
    print(f"quantize_mxfp8_3d 32x1: {tuple(w.shape)} -> q strides {q.stride()}, scales {tuple(s.shape)}\n")
    checks = _spec_checks()
    for name, ok in checks:
        print(f"  {'ok ' if ok else 'FAIL'} {name}")
    print("\nSASS (sm_100a; every variant: make sass):")
    print("\n".join(_sass_lines()))
    experts_demo(torch.device("cpu"), 2048, 256, 128)
    print(
        "\nOn a supported GPU (sm_90 / sm_100), make demo runs 16384 tokens x 7168 through every kernel,"
        "\nchecks each output byte for byte against the reference and prints GB/s next to a device copy,"
        "\nthen times the expert module's forward + backward in FP8 rowwise against bf16."
    )
    return 0 if all(ok for _, ok in checks) else 1


def main() -> int:
    from torch_bindings.backend import kernel_arch

    if torch.cuda.is_available() and kernel_arch(torch.device("cuda"))[0] is not None:
        return gpu_demo()
    return cpu_demo()


if __name__ == "__main__":
    sys.exit(main())
