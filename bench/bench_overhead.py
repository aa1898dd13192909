"""Eager host overhead per call of the public ops (goal: <= 10 us), kernel call alone for scale.

Times back-to-back eager calls on tiny inputs with a host clock (the GPU work per call is a few
microseconds, so the host is the bottleneck) and reports the median over several rounds. Ops:
``swizzle_scales`` (plain, M-groups, K-groups), ``quantize_mxfp8_2d`` 1x32 (plain scales, blocked,
M-groups), ``pad_token_groups``, ``unpad_token_groups`` (with ``num_tokens``, the no-sync form),
and, once their kernels are built (``torch_bindings.KERNEL_STATUS``), ``quantize_mxfp8_3d`` (1x32,
32x1) and ``pad_and_quantize_mxfp8_2d``; an op that is not built, or raises, gets a row saying so.
The ``part:`` rows time pieces of the swizzle path alone (input checks, the output allocation,
the compiled kernel's TVM-FFI call with prebuilt arguments).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import torch_bindings
from bench.common import (
    cuda_or_none,
    kernel_pending,
    make_parser,
    not_built_status,
    output_paths,
    report,
    short_error,
)

#: The goal of SPEC section 6.
GOAL_US = 10.0


def host_us_per_call(fn: Callable[[], object], calls: int = 2000, rounds: int = 5) -> float:
    """Median over ``rounds`` of the host wall time per call of ``calls`` back-to-back calls."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def op_cases(device: torch.device) -> dict[str, tuple[str | None, Callable[[], object]]]:
    """``{row name: (public op or None, zero-argument call)}`` on tiny inputs of ``device``."""
    tb = torch_bindings
    scales = torch.zeros(256, 8, dtype=torch.uint8, device=device).view(torch.float8_e8m0fnu)
    ends = torch.tensor([100, 256], dtype=torch.int32, device=device)
    x = torch.randn(256, 256, dtype=torch.bfloat16, device=device)
    w = torch.randn(2, 128, 256, dtype=torch.bfloat16, device=device)
    padded, start, _ = tb.pad_token_groups(x, ends)
    return {
        "swizzle_scales plain": ("swizzle_scales", lambda: tb.swizzle_scales(scales)),
        "swizzle_scales M-groups": (
            "swizzle_scales",
            lambda: tb.swizzle_scales(scales, group_end_offsets=ends),
        ),
        "swizzle_scales K-groups": (
            "swizzle_scales",
            lambda: tb.swizzle_scales(scales, group_end_offsets=ends, groups="K"),
        ),
        "quantize_mxfp8_2d 1x32 plain scales": (
            "quantize_mxfp8_2d",
            lambda: tb.quantize_mxfp8_2d(x, blocked_scales=False),
        ),
        "quantize_mxfp8_2d 1x32 blocked": ("quantize_mxfp8_2d", lambda: tb.quantize_mxfp8_2d(x)),
        "quantize_mxfp8_2d 1x32 M-groups": (
            "quantize_mxfp8_2d",
            lambda: tb.quantize_mxfp8_2d(x, group_end_offsets=ends),
        ),
        "pad_token_groups": ("pad_token_groups", lambda: tb.pad_token_groups(x, ends)),
        "unpad_token_groups (num_tokens)": (
            "unpad_token_groups",
            lambda: tb.unpad_token_groups(padded, ends, start, num_tokens=256),
        ),
        "quantize_mxfp8_3d 1x32": ("quantize_mxfp8_3d", lambda: tb.quantize_mxfp8_3d(w)),
        "quantize_mxfp8_3d 32x1": ("quantize_mxfp8_3d", lambda: tb.quantize_mxfp8_3d(w, block="32x1")),
        "pad_and_quantize_mxfp8_2d": (
            "pad_and_quantize_mxfp8_2d",
            lambda: tb.pad_and_quantize_mxfp8_2d(x, ends),
        ),
        "custom op via torch.ops (swizzle M-groups)": (
            None,
            lambda: torch.ops.cute_kernels.swizzle_scales(scales, ends, "M"),
        ),
    }


def part_cases(device: torch.device) -> dict[str, Callable[[], object]]:
    """Pieces of the swizzle M-groups path and allocation floors (internals: may move)."""
    from torch_bindings import checks, targets
    from torch_bindings import swizzle as binding

    scales = torch.zeros(256, 8, dtype=torch.uint8, device=device).view(torch.float8_e8m0fnu)
    ends = torch.tensor([100, 256], dtype=torch.int32, device=device)
    empty = torch.empty(16, dtype=torch.uint8, device=device)
    out = torch_bindings.swizzle_scales(scales, group_end_offsets=ends)
    kernel = targets.known(scales).kernel(5, binding._make_kernel)  # M-groups, word loads
    return {
        "  part: check_swizzle (M-groups)": lambda: checks.check_swizzle(scales, ends, "M"),
        "  part: output as scales.new_empty(shape)": lambda: scales.new_empty((512, 8)),
        "  part: output as torch.empty(shape, dtype, device)": lambda: torch.empty(
            (512, 8), dtype=torch.float8_e8m0fnu, device=scales.device
        ),
        "  part: kernel call alone (TVM-FFI)": lambda: kernel(scales, out, ends),
        "torch.empty (floor: one allocation)": lambda: torch.empty_like(empty),
        **_quantize_parts(device),
    }


def _quantize_parts(device: torch.device) -> dict[str, Callable[[], object]]:
    """Pieces of the quantize_mxfp8_2d 1x32 blocked path (internals: may move)."""
    from torch_bindings import backend, checks, targets
    from torch_bindings import quantize as binding

    x = torch.randn(256, 256, dtype=torch.bfloat16, device=device)
    q, s = torch_bindings.quantize_mxfp8_2d(x)
    target = targets.known(x)
    kernel = target.kernel((x.dtype, "rceil", "blocked", binding._MAX_GROUPS), binding._make_kernel)
    return {
        "  part: check_quantize_2d": lambda: checks.check_quantize_2d(x, "1x32", None, "rceil", True),
        "  part: fast_quantize_ok": lambda: checks.fast_quantize_ok(x, 2, "rceil", True),
        "  part: backend.select": lambda: backend.select("q", "auto", x.device),
        "  part: check_kernel_inputs": lambda: checks.check_kernel_inputs("q", None, x),
        "  part: torch.compiler.is_compiling": torch.compiler.is_compiling,
        "  part: quantize kernel call alone (7 args)": lambda: kernel(x, q, s, None, None, None, 0),
        "  part: quantize kernel lookup": lambda: target.kernel(
            (x.dtype, "rceil", "blocked", binding._MAX_GROUPS), None
        ),
        "  part: two new_empty outputs": lambda: (
            x.new_empty((256, 256), dtype=torch.float8_e4m3fn),
            x.new_empty((256, 8), dtype=torch.float8_e8m0fnu),
        ),
    }


def measure(name: str, op: str | None, fn: Callable[[], object]) -> dict[str, Any]:
    """One row: ``host_us`` of ``fn``, or ``None`` with the reason (kernel not built, an error)."""
    if op is not None and kernel_pending(op) is not None:
        return {"call": name, "host_us": None, "status": not_built_status(op)}
    try:
        us = host_us_per_call(fn)
    except (NotImplementedError, ImportError) as exc:
        return {"call": name, "host_us": None, "status": f"kernel not built: {short_error(exc, 100)}"}
    except Exception as exc:  # noqa: BLE001 - a row, not a crash
        return {"call": name, "host_us": None, "status": f"raised {short_error(exc, 100)}"}
    status = "" if op is None else ("ok" if us <= GOAL_US else f"over {GOAL_US:g} us")
    return {"call": name, "host_us": us, "status": status}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; 2 without a GPU, else 0."""
    args = make_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = cuda_or_none("bench_overhead")
    if device is None:
        return 2
    rows = [measure(name, op, fn) for name, (op, fn) in op_cases(device).items()]
    try:
        rows += [measure(name, None, fn) for name, fn in part_cases(device).items()]
    except Exception as exc:  # noqa: BLE001 - the internals moved: skip the parts
        rows.append({"call": "  part: (swizzle internals)", "host_us": None, "status": short_error(exc, 100)})
    json_path, _ = output_paths(args, "bench_overhead")
    report(
        rows,
        ["call", "host_us", "status"],
        f"Eager host overhead per call (us; goal <= {GOAL_US:g})",
        json_path=json_path,
        meta={"benchmark": "overhead", "goal_us": GOAL_US},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
