"""Tune the FP8 column passes' configs (``cute_kernels.quantize_fp8_col``) per shape class on the GPU
at hand, and write the per-device table the bindings read (``cute_kernels/configs/tuned.json``).

For each shape class the bindings key (``torch_bindings.quantize_fp8.col_shape_class``: dtype,
layout, K class, group-count bucket) times each pass on its own (the amax pass: x read once; the
cast pass: x read, q written) on bf16 inputs rotated past L2 (G skewed row groups), for every
config of the sweep that compiles without spilling; prints us and the ratio to a copy of the same
bytes, checks each config's output bytes against the first one's, and keeps the fastest per pass.
``--write FILE`` merges the winners into FILE under this arch and device name. ``--dual`` tunes
the dual variants' classes (every layout, experts for ``quantize_fp8_3d_dual``; ``"<layout>+dual"``
in the class) instead.

    python -m bench.tune_fp8_cols [--quick] [--dual] [--write cute_kernels/configs/tuned.json]
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import torch

from bench.common.baselines import copy_baseline_best
from bench.common.cli import make_parser, progress
from bench.common.device import cuda_or_none
from bench.common.groups import skewed_group_ends
from bench.common.timing import make_rotating_inputs, time_cuda
from bench.common.tuned import merge_tuned
from cute_kernels import registry
from cute_kernels.quantize_fp8_col import Fp8ColAmaxConfig, Fp8ColCastConfig, Fp8ColVariant
from cute_utils.constants import FP8_POW2_MASK
from cute_utils.sass import compile_options, cubin_of, resource_usage
from torch_bindings.quantize_fp8 import _col_outputs, col_shape_class

AMAX, CAST = "quantize_fp8_col_amax", "quantize_fp8_col_cast"
#: ``(layout, shape of x, scale rows)``: one case per shape class of the table.
CASES = [
    *[("plain", (65536, k), 1) for k in (2048, 7168)],
    *[("groups", (65536, k), g) for g in (1, 8, 64) for k in (2048, 7168)],
    ("experts", (8, 4096, 7168), 8),
    ("experts", (16, 4096, 7168), 16),
]
QUICK = [("groups", (16384, 7168), 8)]
CONFIGS = {
    AMAX: [Fp8ColAmaxConfig(t, 4) for t in (4096, 8192, 16384)],
    CAST: [Fp8ColCastConfig(32768, c, b) for c, b in itertools.product((2, 3, 4), (1, 2))],
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One shape to time: x's ``shape``, its ``layout``, ``groups`` scale rows, ``dual`` outputs."""

    layout: str
    shape: tuple[int, ...]
    groups: int
    dual: bool

    def make(self) -> tuple:
        """``(x, offsets, q, scales, amax words, q_rows, row_scales)`` as the bindings allocate them."""
        x = torch.randn(self.shape, device="cuda", dtype=torch.bfloat16)
        rows, cols = self.shape[-2:]
        offsets = None
        if self.layout == "groups":
            offsets = torch.tensor(skewed_group_ends(rows, self.groups), dtype=torch.int32, device="cuda")
        q, scales, _, _ = _col_outputs(x, offsets)
        row_words = x.numel() // cols if self.dual else 0  # M, or E N
        amax = torch.zeros(self.groups * cols + row_words, device="cuda", dtype=torch.int32)
        q_rows = torch.empty(self.shape, device="cuda", dtype=torch.float8_e4m3fn) if self.dual else None
        row_scales = torch.empty(self.shape[:-1], device="cuda", dtype=torch.float32) if self.dual else None
        return x, offsets, q, scales, amax, q_rows, row_scales

    def run(self, name: str, kernel, x, offsets, q, scales, amax, q_rows, row_scales) -> tuple:
        """Launch one pass; returns the tensors it writes (compared across configs)."""
        steps = self.groups.bit_length()
        if name == AMAX:
            kernel(x, amax, offsets, steps)
            return (amax,)
        kernel(x, q, amax, scales, offsets, FP8_POW2_MASK, steps, q_rows, row_scales)
        return tuple(t.view(torch.uint8) for t in (q, scales, q_rows, row_scales) if t is not None)

    def checked_run(self, name: str, kernel, *tensors) -> list:
        """:meth:`run` on outputs reset first (amax words zeroed, the rest 0xA5 bytes), so a config
        that skips work cannot pass on an earlier config's bytes; returns copies of what it wrote.
        The cast pass reads the amax words the amax sweep left (every config's maxima: the same)."""
        written = self.run(name, lambda *a: None, *tensors)  # the outputs, nothing launched
        for t in written:
            t.zero_() if name == AMAX else t.fill_(0xA5)
        return [t.clone() for t in self.run(name, kernel, *tensors)]

    def moved(self, name: str) -> int:
        """Bytes one pass moves: x read (amax), + q (and q_rows) and the scales written (cast)."""
        x_bytes = 2 * self.shape[-2] * self.shape[-1] * (self.shape[0] if len(self.shape) == 3 else 1)
        if name == AMAX:
            return x_bytes
        return x_bytes + x_bytes // 2 * (2 if self.dual else 1) + 4 * self.groups * self.shape[-1]


def _spill_free(name: str, variant: Fp8ColVariant, arch: str) -> dict:
    """``{config: kernel}`` of the sweep's configs that compile without local memory."""
    entry, kept = registry.entry(name), {}
    for config in CONFIGS[name]:
        kernel = entry.compile(variant, arch, config=config, options=compile_options(arch))
        if any(f["local_bytes"] for f in resource_usage(cubin_of(kernel)).values()):
            print(f"  {name} {config}: spills, skipped")
            continue
        kept[config] = kernel
    return kept


def _best(case: Case, name: str, kernels: dict, sets: list) -> object:
    """Time every kernel on the case's rotating input ``sets``; print them best first; return the
    best config."""
    copy_us = copy_baseline_best(case.moved(name))[0].us
    first, results = None, []
    for config, kernel in kernels.items():
        out = case.checked_run(name, kernel, *sets[0])
        first = first if first is not None else out
        us = time_cuda(lambda *a, k=kernel: case.run(name, k, *a), sets)
        results.append((copy_us / us, us, config, all(map(torch.equal, out, first))))
    results.sort(key=lambda r: -r[0])
    for ratio, us, config, same in results:
        print(f"  {name} {config} {us:8.1f} us ratio {ratio:.3f} same={same}")
    if not all(r[3] for r in results):
        raise AssertionError(f"{name}: configs wrote different bytes at {case}")
    return results[0][2]


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--dual", action="store_true", help="tune the dual variants' classes")
    parser.add_argument("--write", type=Path, default=None, help="merge the winners into this table")
    args = parser.parse_args(argv)
    if cuda_or_none("tune_fp8_cols") is None:
        return 2
    arch = {9: "sm_90a", 10: "sm_100a"}[torch.cuda.get_device_capability()[0]]
    device = torch.cuda.get_device_name()
    if args.quick and args.write:
        raise SystemExit("--quick measures at M = 16384, not the classes' M = 65536: not written")
    chosen = QUICK if args.quick else CASES
    cases = [Case(lay, shape, g, args.dual) for lay, shape, g in chosen]
    print(f"device: {device} ({arch}), {len(cases)} cases")
    kernels = {}  # (pass, layout) -> {config: kernel}
    winners: dict[str, dict] = {AMAX: {}, CAST: {}}
    for case in cases:
        variant = Fp8ColVariant("bfloat16", case.layout, dual=args.dual)
        shape_class = col_shape_class("bfloat16", case.layout, case.shape[-1], case.groups, args.dual)
        progress(f"{case.layout} {case.shape} groups {case.groups}: class {shape_class}")
        sets = make_rotating_inputs(case.make)
        for name in (AMAX, CAST):  # the amax sweep leaves every set's amax words filled for the cast
            if (name, case.layout) not in kernels:
                kernels[name, case.layout] = _spill_free(name, variant, arch)
            best = _best(case, name, kernels[name, case.layout], sets)
            winners[name][shape_class] = dataclasses.asdict(best)
        del sets
        torch.cuda.empty_cache()
    if args.write is not None:
        for name, entries in winners.items():
            merge_tuned(args.write, name, arch, device, entries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
