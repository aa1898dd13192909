"""Eager host overhead per call of the public ops (goal: <= 10 us), kernel call alone for scale.

Times back-to-back eager calls on tiny inputs with a host clock (the GPU work per call is a few
microseconds, so the host is the bottleneck) and reports the median over several rounds. The
``part:`` rows time pieces of the swizzle path alone (input checks, the output allocation, the
compiled kernel's TVM-FFI call with prebuilt arguments).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

import torch_bindings
from bench.common import make_parser, output_paths, report, require_cuda


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


def main(argv: list[str] | None = None) -> int:
    args = make_parser(__doc__.splitlines()[0]).parse_args(argv)
    device = require_cuda("bench_overhead")
    scales = torch.zeros(256, 8, dtype=torch.uint8, device=device).view(torch.float8_e8m0fnu)
    ends = torch.tensor([100, 256], dtype=torch.int32, device=device)
    empty = torch.empty(16, dtype=torch.uint8, device=device)
    from torch_bindings import checks
    from torch_bindings import swizzle as binding

    torch_bindings.swizzle_scales(scales, group_end_offsets=ends)
    kernel = binding._targets[device.index].kernel(5)  # M-groups, word loads
    out = torch_bindings.swizzle_scales(scales, group_end_offsets=ends)
    cases = {
        "swizzle_scales plain": lambda: torch_bindings.swizzle_scales(scales),
        "swizzle_scales M-groups": lambda: torch_bindings.swizzle_scales(scales, group_end_offsets=ends),
        "swizzle_scales K-groups": lambda: torch_bindings.swizzle_scales(
            scales, group_end_offsets=ends, groups="K"
        ),
        "  part: check_swizzle (M-groups)": lambda: checks.check_swizzle(scales, ends, "M"),
        "  part: output as scales.new_empty(shape)": lambda: scales.new_empty((512, 8)),
        "  part: output as torch.empty(shape, dtype, device)": lambda: torch.empty(
            (512, 8), dtype=torch.float8_e8m0fnu, device=scales.device
        ),
        "  part: kernel call alone (TVM-FFI)": lambda: kernel(scales, out, ends),
        "torch.empty (floor: one allocation)": lambda: torch.empty_like(empty),
        "custom op via torch.ops": lambda: torch.ops.cute_kernels.swizzle_scales(scales, ends, "M"),
    }
    rows = [{"call": name, "host_us": host_us_per_call(fn)} for name, fn in cases.items()]
    json_path, _ = output_paths(args, "bench_overhead")
    report(rows, ["call", "host_us"], "Eager host overhead per call (us)", json_path=json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
