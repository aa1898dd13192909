"""Measure the points that calibrate the bytes-in-flight model (``python -m cute_kernels.model``).

On the GPU at hand, at x = 16384 x 7168 bf16 (``cute_kernels.inflight.BENCH_COLS`` columns), each
point is a registry kernel, its variant and config, and its ratio to a device copy of the same
bytes timed in the same run (bytes moved = every input read once + every output written once):

- every production kernel at its own config, through its public op (one launch each: MXFP8 1x32,
  32x1 and dual, pad, swizzle, FP8 rows; the two FP8 column passes launched on their own);
- config sweeps of the FP8 kernels launched directly, whose configs hold different bytes in flight:
  the row kernel (threads x unroll, a CTA per row) and the column cast pass (load blocks x CTAs-per-SM
  register cap).

Variants are ``cute_kernels.inflight.representative_variant``'s. ``--write FILE`` merges the points
under the device's name into FILE (``cute_kernels/configs/calibration.json``), else they are printed.

    python -m bench.calibrate_model [--write FILE]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import torch_bindings
from bench.common.baselines import copy_baseline_best
from bench.common.cli import make_parser, progress
from bench.common.device import cuda_or_none
from bench.common.groups import skewed_group_ends
from bench.common.timing import make_rotating_inputs, tensor_nbytes, time_cuda
from cute_kernels import configs, registry
from cute_kernels.inflight import BENCH_COLS, representative_variant
from cute_kernels.quantize_fp8 import Fp8RowConfig
from cute_kernels.quantize_fp8_col import Fp8ColCastConfig
from cute_utils.constants import FP8_POW2_MASK

ROWS, COLS = 16384, BENCH_COLS
SWIZZLE_SHAPE = (131072, 512)  # E8M0 scales: 64 MiB, so launch overhead does not count
ROW_SWEEP = [(t, u) for t in (128, 256, 512, 1024) for u in (1, 2, 4)]
CAST_SWEEP = [(b, c) for b in (1, 2) for c in (2, 3, 4)]


def _arch() -> str:
    return {9: "sm_90a", 10: "sm_100a"}[torch.cuda.get_device_capability()[0]]


def _measure(run: Callable, make: Callable[[], tuple]) -> tuple[float, float]:
    """``(ratio to copy, us)`` of ``run(*inputs)``: bytes = inputs + what ``run`` returns."""
    sets = make_rotating_inputs(make)
    moved = tensor_nbytes(sets[0]) + tensor_nbytes(run(*sets[0]))
    us = time_cuda(run, sets)
    copy_us = copy_baseline_best(moved)[0].us
    del sets
    torch.cuda.empty_cache()
    return copy_us / us, us


def _x() -> tuple[torch.Tensor]:
    return (torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16),)


def _op_points() -> dict[str, tuple[Callable, Callable]]:
    """``{kernel: (run, make)}``: each production kernel through its public op (one launch)."""
    ends = torch.tensor(skewed_group_ends(ROWS, 8), dtype=torch.int32, device="cuda")

    def scales():
        return (
            torch.randint(0, 255, SWIZZLE_SHAPE, device="cuda", dtype=torch.uint8).view(torch.float8_e8m0fnu),
        )

    return {
        "quantize_1x32": (lambda x: torch_bindings.quantize_mxfp8_2d(x), _x),
        "quantize_32x1": (lambda x: torch_bindings.quantize_mxfp8_2d(x, block="32x1"), _x),
        "quantize_dual": (lambda x: torch_bindings.quantize_mxfp8_2d_dual(x), _x),
        "pad": (lambda x: torch_bindings.pad_token_groups(x, ends)[0], _x),
        "swizzle": (lambda s: torch_bindings.swizzle_scales(s), scales),
        "quantize_fp8_row": (lambda x: torch_bindings.quantize_fp8_2d(x, axis="row"), _x),
    }


def _row_kernel_run(config: Fp8RowConfig) -> tuple[Callable, Callable]:
    """The FP8 row kernel with ``config`` launched on its own."""
    variant = representative_variant("quantize_fp8_row")
    kernel = registry.entry("quantize_fp8_row").compile(variant, _arch(), config=config)

    def run(x):
        q = torch.empty(ROWS, COLS, device="cuda", dtype=torch.float8_e4m3fn)
        scales = torch.empty(ROWS, device="cuda")
        kernel(x, q, scales)
        return q, scales

    return run, _x


def _col_run(name: str, config) -> tuple[Callable, Callable]:
    """One FP8 column pass launched on its own (plain bf16 x; the amax words zeroed once)."""
    variant = representative_variant(name)
    kernel = registry.entry(name).compile(variant, _arch(), config=config)

    def make():
        (x,) = _x()
        return x, torch.zeros(COLS, device="cuda", dtype=torch.int32)

    def amax_pass(x, amax):
        kernel(x, amax, None, 1)
        return ()

    if name == "quantize_fp8_col_amax":
        return amax_pass, make

    def run(x, amax):
        q = torch.empty_strided((ROWS, COLS), (1, ROWS), device="cuda", dtype=torch.float8_e4m3fn)
        scales = torch.empty(COLS, device="cuda")
        kernel(x, q, amax, scales, None, FP8_POW2_MASK, 1, None, None)
        return q, scales

    return run, make


def _point(kernel: str, config, source: str, run_make: tuple[Callable, Callable]) -> dict:
    progress(f"{kernel} {config}")
    ratio, us = _measure(*run_make)
    return {
        "kernel": kernel,
        "config": dataclasses.asdict(config),
        "source": source,
        "ratio": ratio,
        "us": us,
    }


def measure_points() -> list[dict]:
    """Every calibration point on the current GPU (module docstring)."""
    arch = _arch()
    points = []
    for kernel, run_make in _op_points().items():
        config = configs.pick(kernel, representative_variant(kernel), arch)
        if kernel == "quantize_fp8_row":
            shape_class = f"bfloat16/k{1 << (COLS - 1).bit_length()}"
            device = torch.cuda.get_device_name()
            config = configs.pick_for_shape(kernel, representative_variant(kernel), arch, device, shape_class)
        points.append(_point(kernel, config, "op", run_make))
    for name in ("quantize_fp8_col_amax", "quantize_fp8_col_cast"):
        config = configs.pick(name, representative_variant(name), arch)
        points.append(_point(name, config, "op", _col_run(name, config)))
    for threads, unroll in ROW_SWEEP:
        config = Fp8RowConfig(threads=threads, unroll=unroll, ctas_per_sm=1, row_per_cta=True)
        points.append(_point("quantize_fp8_row", config, "sweep", _row_kernel_run(config)))
    for blocks, ctas in CAST_SWEEP:
        config = Fp8ColCastConfig(min_ctas_per_sm=ctas, load_blocks=blocks)
        points.append(
            _point("quantize_fp8_col_cast", config, "sweep", _col_run("quantize_fp8_col_cast", config))
        )
    return points


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="merge the points into this JSON table")
    args = parser.parse_args(argv)
    if cuda_or_none("calibrate_model") is None:
        return 2
    device = torch.cuda.get_device_name()
    entry = {"arch": _arch(), "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    entry["points"] = measure_points()
    for p in entry["points"]:
        print(f"  {p['kernel']:24s} {p['source']:5s} ratio {p['ratio']:.3f} {p['us']:8.1f} us {p['config']}")
    if args.write:
        table = json.loads(args.write.read_text()) if args.write.exists() else {}
        table[device] = entry
        args.write.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(entry['points'])} points for {device} into {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
