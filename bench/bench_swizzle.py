"""Benchmark ``torch_bindings.swizzle_scales`` (E8M0 scales -> blocked layout, SPEC section 3).

Layouts: plain 2D ``(R, C) -> (Rp, Cp)``, M-groups ``(R, C) -> (R + 128*G, Cp)``, K-groups
``(R, C) -> (Rp, C + 4*G)`` and 3D ``(E, R, C) -> (E, Rp, Cp)``, where ``Rp = 128*ceil(R/128)`` and
``Cp = 4*ceil(C/4)``. Bytes moved = input bytes + output bytes (each once).

For every shape the script checks our output against ``torch_bindings.reference.swizzle_scales``
(bytes equal) once before timing, then times ours, torchao's Triton rearrange kernel for the
same layout (when ``torchao`` imports) and a device-to-device copy of the same number of bytes,
all with :func:`bench.common.timing.time_cuda` (CUDA-graph replays, inputs rotated beyond L2).

torchao 0.18 baselines (all take 1-byte scales; we pass ``scales.view(torch.uint8)``):

* 2D: ``torchao.prototype.mx_formats.kernels.triton_mx_block_rearrange(scale_tensor)``
  -> ``(Rp, Cp)``.
* M-groups: ``torchao.prototype.moe_training.kernels.mxfp8.quant
  .triton_mx_block_rearrange_2d_M_groups(scales_tensor, input_offsets)``; ``input_offsets`` are
  int32 group *end* rows; output ``(R + 128*G, Cp)`` zero-filled (``new_zeros``); ``G`` must be a
  power of two (``tl.arange(0, num_groups)``).
* K-groups: ``...mxfp8.quant.triton_mx_block_rearrange_2d_K_groups(scales_tensor, input_offsets)``;
  ``input_offsets`` are int32 group *end* columns of the scale matrix; output ``(Rp, C + 4*G)``
  zero-filled; same power-of-two restriction.
* 3D: ``...mxfp8.quant.triton_mx_block_rearrange_per_group_3d(scale_tensor)`` -> ``(E, Rp*Cp)``
  (we view it as ``(E, Rp, Cp)``).

Run (GPU machine, project root on PYTHONPATH)::

    python -m bench.bench_swizzle [--quick] [--out DIR] [--iters N] [--layouts 2d M K 3d]
"""

from __future__ import annotations

import inspect
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench.common.baselines import copy_suspect_note, measure_copy
from bench.common.cli import add_bench_args, make_parser, output_paths, progress, timing_kwargs
from bench.common.device import cuda_or_none
from bench.common.groups import skewed_group_sizes
from bench.common.report import report
from bench.common.rowlog import RowLog, diff_bytes, finish, progress_row, short_error
from bench.common.rows import BASELINE_COLUMNS, RATE_COLUMNS, RATE_SERIES, make_row
from bench.common.timing import make_rotating_inputs
from cute_kernels.op_specs import blocked_output_shape

# Activations: M tokens x K hidden (scales are (M, K/32)); DeepSeek-/Llama-like hidden sizes.
ACT_M: tuple[int, ...] = (16384, 65536, 131072)
ACT_K: tuple[int, ...] = (2048, 5120, 7168)
# Expert weights (E, N, K/32), after torchao's seed 001 table, plus one >= 16 MB shape.
WEIGHT_3D: tuple[tuple[int, int, int], ...] = (
    (8, 8192, 160),
    (16, 8192, 160),
    (32, 8192, 160),
    (8, 5120, 256),
    (32, 5120, 256),
    (32, 7168, 64),
    (64, 8192, 256),
)
LAYOUTS: tuple[str, ...] = ("2d", "M-groups", "K-groups", "3d")
LAYOUT_ALIASES: dict[str, str] = {"2d": "2d", "M": "M-groups", "K": "K-groups", "3d": "3d"}
#: The goal: ratio to copy >= GOAL_RATIO for scales of at least GOAL_MIN_BYTES.
GOAL_RATIO = 0.8
GOAL_MIN_BYTES = 16_000_000

COLUMNS: list[tuple[str, str]] = (
    [("layout", "layout"), ("shape", "shape"), ("G", "G")] + RATE_COLUMNS + BASELINE_COLUMNS
)


PLOT_SERIES: tuple[tuple[str, str], ...] = RATE_SERIES + (("baseline_gbps", "torchao triton"),)


@dataclass(frozen=True)
class SwizzleCase:
    """One benchmark shape.

    Attributes:
        layout: ``"2d"``, ``"M-groups"``, ``"K-groups"`` or ``"3d"``.
        shape: input scale shape, ``(R, C)`` or ``(E, R, C)``.
        groups: number of groups ``G`` (0 for the ungrouped layouts).
        seed: seed of the skewed group sizes.
    """

    layout: str
    shape: tuple[int, ...]
    groups: int = 0
    seed: int = 0

    @property
    def groups_arg(self) -> str | None:
        """The ``groups=`` argument of ``swizzle_scales`` (``None`` when ungrouped)."""
        return {"M-groups": "M", "K-groups": "K"}.get(self.layout)

    @property
    def input_bytes(self) -> int:
        """Bytes of the input scales (one byte each)."""
        return math.prod(self.shape)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Shape of the blocked output, per SPEC section 3/5."""
        grouped = self.layout in ("M-groups", "K-groups")
        return blocked_output_shape(self.shape, self.groups if grouped else None, self.layout[0])

    @property
    def output_bytes(self) -> int:
        """Bytes of the blocked output."""
        return math.prod(self.output_shape)

    @property
    def nbytes_moved(self) -> int:
        """Bytes read + written."""
        return self.input_bytes + self.output_bytes

    @property
    def group_extent(self) -> int:
        """Length of the grouped dimension: rows for M-groups, scale columns for K-groups."""
        if self.layout == "M-groups":
            return self.shape[0]
        if self.layout == "K-groups":
            return self.shape[1]
        return 0

    def group_end_offsets(self) -> list[int]:
        """Host-side end offsets of the skewed groups (empty list when ungrouped)."""
        if not self.groups:
            return []
        sizes = skewed_group_sizes(self.group_extent, self.groups, seed=self.seed)
        return [int(v) for v in np.cumsum(sizes)]

    def label(self) -> str:
        """Short human-readable name."""
        g = f" G={self.groups}" if self.groups else ""
        return f"{self.layout} {tuple(self.shape)}{g}"


def build_cases(quick: bool = False, layouts: Sequence[str] | None = None) -> list[SwizzleCase]:
    """The benchmark shapes (``quick``: four representative shapes, all with >= 16 MB scales)."""
    if quick:
        cases = [
            SwizzleCase("2d", (131072, 7168 // 32)),
            SwizzleCase("M-groups", (131072, 5120 // 32), groups=8),
            SwizzleCase("K-groups", (7168, 131072 // 32), groups=8),
            SwizzleCase("3d", (32, 8192, 160)),
        ]
    else:
        cases = []
        for m in ACT_M:
            for k in ACT_K:
                cases.append(SwizzleCase("2d", (m, k // 32)))
        cases.append(SwizzleCase("2d", (4 * 131072, 7168 // 32)))
        cases.append(SwizzleCase("2d", (131001, 226)))  # unaligned: exercises the zero padding
        for m in ACT_M:
            for k in ACT_K:
                cases.append(SwizzleCase("M-groups", (m, k // 32), groups=8))
        for m in ACT_M[1:]:
            for k in (ACT_K[0], ACT_K[-1]):
                cases.append(SwizzleCase("M-groups", (m, k // 32), groups=64, seed=1))
        cases.append(SwizzleCase("M-groups", (4 * 131072, 7168 // 32), groups=8))
        # wgrad: 32x1 scales of the (M, K) activations / grads are (K, M/32), grouped by tokens.
        for k in ACT_K:
            for m in ACT_M:
                cases.append(SwizzleCase("K-groups", (k, m // 32), groups=8))
        cases.append(SwizzleCase("K-groups", (7168, 4 * 131072 // 32), groups=8))
        for shape in WEIGHT_3D:
            cases.append(SwizzleCase("3d", shape))
    if layouts:
        wanted = {LAYOUT_ALIASES.get(x, x) for x in layouts}
        cases = [c for c in cases if c.layout in wanted]
    return cases


# --------------------------------------------------------------------------------------------
# torchao baselines
# --------------------------------------------------------------------------------------------

_TORCHAO_MX = "torchao.prototype.mx_formats.kernels"
_TORCHAO_MOE = "torchao.prototype.moe_training.kernels.mxfp8.quant"
_TORCHAO_FUNCS: dict[str, tuple[str, str]] = {
    "2d": (_TORCHAO_MX, "triton_mx_block_rearrange"),
    "M-groups": (_TORCHAO_MOE, "triton_mx_block_rearrange_2d_M_groups"),
    "K-groups": (_TORCHAO_MOE, "triton_mx_block_rearrange_2d_K_groups"),
    "3d": (_TORCHAO_MOE, "triton_mx_block_rearrange_per_group_3d"),
}


def load_torchao_baselines() -> tuple[dict[str, Callable[..., torch.Tensor]], dict[str, Any]]:
    """Import torchao's Triton rearrange kernels.

    Returns:
        ``(adapters, info)``: ``adapters[layout](scales_e8m0, offsets_or_None)`` returns the blocked
        scales as a uint8 tensor of our output shape; ``info`` records the import paths, the
        torchao version and any import errors (for the JSON metadata).
    """
    import importlib

    adapters: dict[str, Callable[..., torch.Tensor]] = {}
    info: dict[str, Any] = {"functions": {}, "errors": {}}
    try:
        import torchao

        info["version"] = getattr(torchao, "__version__", "unknown")
    except Exception as exc:  # noqa: BLE001 - any failure means: no baseline
        info["errors"]["import"] = f"{type(exc).__name__}: {exc}"
        return adapters, info

    for layout, (module_name, func_name) in _TORCHAO_FUNCS.items():
        try:
            func = getattr(importlib.import_module(module_name), func_name)
        except Exception as exc:  # noqa: BLE001
            info["errors"][layout] = f"{module_name}.{func_name}: {type(exc).__name__}: {exc}"
            continue
        info["functions"][layout] = f"{module_name}.{func_name}"
        adapters[layout] = _make_adapter(layout, func)
    return adapters, info


def _make_adapter(layout: str, func: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wrap a torchao kernel in our calling convention (e8m0 scales, int32 end offsets)."""
    if layout in ("M-groups", "K-groups"):

        def grouped(scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
            return func(scales.view(torch.uint8), offsets)

        return grouped

    def plain(scales: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        return func(scales.view(torch.uint8))

    return plain


# --------------------------------------------------------------------------------------------
# Checking and timing one case
# --------------------------------------------------------------------------------------------


def _random_scales(shape: Sequence[int], device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """Random E8M0 bytes (all 256 values, NaN included: the swizzle only moves bytes)."""
    raw = torch.randint(0, 256, tuple(shape), dtype=torch.uint8, device=device, generator=gen)
    return raw.view(torch.float8_e8m0fnu)


def _clone_scales(scales: torch.Tensor) -> torch.Tensor:
    return scales.view(torch.uint8).clone().view(torch.float8_e8m0fnu)


def _reference(
    ref_mod: Any, case: SwizzleCase, scales: torch.Tensor, offs: torch.Tensor | None
) -> torch.Tensor:
    """``torch_bindings.reference.swizzle_scales`` on the device, or on the CPU if that fails."""
    kwargs: dict[str, Any] = {}
    if case.groups_arg is not None:
        kwargs = {"group_end_offsets": offs, "groups": case.groups_arg}
    try:
        return ref_mod.swizzle_scales(scales, **kwargs)
    except Exception:  # noqa: BLE001 - retry on the CPU
        if case.groups_arg is not None:
            kwargs["group_end_offsets"] = offs.cpu() if offs is not None else None
        return ref_mod.swizzle_scales(scales.cpu(), **kwargs)


def bench_case(
    case: SwizzleCase,
    tb: Any,
    ref_mod: Any,
    baselines: dict[str, Callable[..., torch.Tensor]],
    timing: dict[str, Any],
    device: torch.device,
    check: bool = True,
    backend: str | None = "cute",
    copy_tries: int = 2,
) -> dict[str, Any]:
    """Check and time one case; return its row (never raises for kernel failures).

    ``backend`` is passed to ``swizzle_scales`` (``None``: not passed). The default ``"cute"``
    makes a missing kernel a FAIL row instead of silently timing the PyTorch reference.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(20240 + case.input_bytes % 9973)
    scales = _random_scales(case.shape, device, gen)
    offs: torch.Tensor | None = None
    if case.groups:
        offs = torch.tensor(case.group_end_offsets(), dtype=torch.int32, device=device)
    expected_shape = case.output_shape
    log = RowLog()
    extra: dict[str, Any] = {"backend": backend} if backend is not None else {}

    def ours(s: torch.Tensor, o: torch.Tensor | None = None) -> torch.Tensor:
        if case.groups_arg is None:
            return tb.swizzle_scales(s, **extra)
        return tb.swizzle_scales(s, group_end_offsets=o, groups=case.groups_arg, **extra)

    ref: torch.Tensor | None = None
    out: torch.Tensor | None = None
    try:
        out = ours(scales, offs)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        log.fail(f"raised {short_error(exc)}")
        traceback.print_exc(file=sys.stderr)
    if out is not None and check:
        try:
            ref = _reference(ref_mod, case, scales, offs)
            why = diff_bytes(out, ref, expected_shape)
        except Exception as exc:  # noqa: BLE001
            why = f"reference check raised {short_error(exc)}"
        if why is not None:
            log.fail(why)
    elif out is not None:
        log.note("not checked")
    if out is not None and out.dtype != torch.float8_e8m0fnu:
        log.note(f"output dtype {out.dtype}")
    ours_ok = out is not None and log.status == "ok"
    del out

    def make() -> tuple[Any, ...]:
        return (_clone_scales(scales), offs)

    sets = make_rotating_inputs(make, bytes_per_set=case.nbytes_moved)
    our_us = log.time("ours", ours, sets, timing, fatal=True) if ours_ok else None

    base_us: float | None = None
    base_fn = baselines.get(case.layout)
    if base_fn is not None:
        try:
            bout = base_fn(scales, offs)
            torch.cuda.synchronize()
            if ref is None and check:
                ref = _reference(ref_mod, case, scales, offs)
            if ref is not None:
                why = diff_bytes(bout.reshape(expected_shape), ref, expected_shape)
                if why is not None:
                    log.note(f"torchao output differs: {why}")
            del bout
            base_us = log.time("torchao", base_fn, sets, timing)
        except Exception as exc:  # noqa: BLE001
            log.note(f"torchao n/a: {short_error(exc)}")

    del sets, ref
    copy_us, tried = measure_copy(case.nbytes_moved, device, timing, copy_tries, log)
    row = make_row(
        layout=case.layout,
        shape=tuple(case.shape),
        G=case.groups if case.groups else "-",
        nbytes=case.nbytes_moved,
        us=our_us,
        copy_us=copy_us,
        baseline_us=base_us,
        status=log.status,
    )
    row["input_mb"] = case.input_bytes / 1e6
    row["output_shape"] = tuple(expected_shape)
    row["group_end_offsets"] = case.group_end_offsets() if case.groups else None
    row["copy_us_tries"] = tried
    suspect = copy_suspect_note(row, tried)
    if suspect:
        log.note(suspect)
    spread = log.spreads.get("ours")
    if spread is not None:
        row["our_us_min"], row["our_us_max"] = spread["min"], spread["max"]
        row["input_sets"], row["calls_per_sample"] = spread["input_sets"], spread["calls_per_sample"]
    log.fill(row)
    torch.cuda.empty_cache()
    return row


def accepts_kwarg(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes a keyword argument ``name`` (or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def goal_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How many rows with >= ``GOAL_MIN_BYTES`` of scales reach ``GOAL_RATIO`` of copy bandwidth."""
    big = [r for r in rows if r.get("input_mb", 0) * 1e6 >= GOAL_MIN_BYTES]
    met = [r for r in big if (r.get("ratio_to_copy") or 0.0) >= GOAL_RATIO]
    worst = min(big, key=lambda r: r.get("ratio_to_copy") or 0.0, default=None)
    worst_info = None
    if worst is not None:
        worst_info = {k: worst.get(k) for k in ("layout", "shape", "G", "ratio_to_copy")}
    return {
        "goal": f"ratio to copy >= {GOAL_RATIO} for scales >= {GOAL_MIN_BYTES / 1e6:.0f} MB",
        "shapes": len(big),
        "met": len(met),
        "worst": worst_info,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 1 if any shape FAILed, 2 without a GPU, else 0."""
    parser = make_parser("Benchmark torch_bindings.swizzle_scales against torchao and a device copy.")
    parser.add_argument(
        "--layouts",
        nargs="+",
        choices=sorted(set(LAYOUT_ALIASES) | set(LAYOUTS)),
        default=None,
        help="only these layouts (default: all)",
    )
    add_bench_args(parser, op="swizzle_scales")
    args = parser.parse_args(argv)
    device = cuda_or_none("bench_swizzle")
    if device is None:
        return 2
    import torch_bindings
    import torch_bindings.reference as ref_mod

    baselines: dict[str, Callable[..., torch.Tensor]] = {}
    torchao_info: dict[str, Any] = {"skipped": True}
    if not args.no_torchao:
        baselines, torchao_info = load_torchao_baselines()
        for layout, err in torchao_info.get("errors", {}).items():
            progress(f"torchao baseline for {layout} unavailable: {err}")

    backend = args.backend if accepts_kwarg(torch_bindings.swizzle_scales, "backend") else None
    if backend is None:
        progress("torch_bindings.swizzle_scales takes no backend= argument; calling it without one")

    cases = build_cases(quick=args.quick, layouts=args.layouts)
    timing = timing_kwargs(args)
    rows: list[dict[str, Any]] = []
    for i, case in enumerate(cases, 1):
        progress(
            f"[{i}/{len(cases)}] {case.label()}: {case.input_bytes / 1e6:.1f} MB scales, "
            f"{case.nbytes_moved / 1e6:.1f} MB moved ..."
        )
        row = bench_case(
            case, torch_bindings, ref_mod, baselines, timing, device,
            check=not args.no_check, backend=backend, copy_tries=args.copy_tries,
        )  # fmt: skip
        rows.append(row)
        progress_row(row)

    summary = goal_summary(rows)
    json_path, png_path = output_paths(args.out, "swizzle")
    report(
        rows,
        COLUMNS,
        "swizzle_scales: E8M0 scales -> blocked layout",
        json_path,
        png_path,
        plot_series=PLOT_SERIES,
        meta={
            "benchmark": "swizzle",
            "backend": backend,
            "torchao": torchao_info,
            "goal": summary,
            "quick": args.quick,
        },
    )
    goal = f"goal ({summary['goal']}): {summary['met']}/{summary['shapes']} shapes" + (
        f"; worst {summary['worst']}" if summary["worst"] else ""
    )
    return finish(rows, lambda r: f"{r['layout']} {r['shape']} G={r['G']}", [goal], (json_path, png_path))


if __name__ == "__main__":
    sys.exit(main())
