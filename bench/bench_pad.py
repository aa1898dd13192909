"""Benchmark ``torch_bindings.pad_token_groups`` / ``unpad_token_groups`` (SPEC section 4).

Shapes: torchao's padding table (seed 000: 16384 tokens x D in {1536, 2048, 5120, 7168} x G in
{1, 4, 8, 16}, bf16, alignment 32) plus 131072 x 7168 with G = 8; group sizes are skewed and
unaligned (``bench_swizzle.skewed_group_sizes``). Bytes moved = read + written, the fewest any
implementation must move: pad reads the M rows and the offsets and writes all
``P = 32 * ceil((M + 32 G) / 32)`` output rows (zero rows included) and both padded offset arrays;
unpad reads the M grouped rows and both offset arrays and writes M rows.

For every shape the script checks our outputs against ``torch_bindings.reference`` (bytes equal)
once, then times ours, torchao's padding (when ``torchao`` imports: its fused CUDA kernel when built,
else its torch-native ``torch_pad_token_groups`` / ``torch_unpad_token_groups``, which sync and so
are timed eagerly, not in a CUDA graph) and a device-to-device copy of the same number of bytes,
all with :func:`bench.common.time_cuda` (CUDA-graph replays, inputs rotated beyond L2).

Run (GPU machine, project root on PYTHONPATH)::

    python -m bench.bench_pad [--quick] [--out DIR] [--ops pad unpad] [--no-torchao]
"""

from __future__ import annotations

import importlib
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench.bench_swizzle import compare_bytes, skewed_group_sizes
from bench.common import (
    CudaUnavailableError,
    copy_baseline_detailed,
    make_parser,
    make_rotating_inputs,
    make_row,
    output_paths,
    progress,
    report,
    require_cuda,
    time_cuda_detailed,
    timing_kwargs,
)

SEED_TOKENS = 16384
SEED_DIMS: tuple[int, ...] = (1536, 2048, 5120, 7168)
SEED_GROUPS: tuple[int, ...] = (1, 4, 8, 16)
ALIGNMENT = 32
OPS: tuple[str, ...] = ("pad", "unpad")
#: The goal: ratio to copy >= GOAL_RATIO on every shape.
GOAL_RATIO = 0.9

COLUMNS: list[tuple[str, str]] = [
    ("op", "op"),
    ("shape", "shape"),
    ("G", "G"),
    ("mb_moved", "MB moved"),
    ("us", "our us"),
    ("gbps", "our GB/s"),
    ("copy_gbps", "copy GB/s"),
    ("ratio_to_copy", "ratio to copy"),
    ("baseline_us", "torchao us"),
    ("speedup", "speedup vs torchao"),
    ("status", "status"),
]
PLOT_SERIES: tuple[tuple[str, str], ...] = (
    ("gbps", "ours"),
    ("copy_gbps", "copy (same bytes)"),
    ("baseline_gbps", "torchao"),
)


@dataclass(frozen=True)
class PadCase:
    """One benchmark shape: ``op`` ("pad" or "unpad") of ``tokens`` x ``dim`` bf16 in ``groups`` groups."""

    op: str
    tokens: int
    dim: int
    groups: int
    alignment: int = ALIGNMENT

    @property
    def padded_rows(self) -> int:
        a = self.alignment
        return a * math.ceil((self.tokens + self.groups * a) / a)

    @property
    def nbytes_moved(self) -> int:
        """Bytes read + written (bf16 rows, int32 offsets)."""
        row = 2 * self.dim
        if self.op == "pad":
            return self.tokens * row + self.padded_rows * row + 4 * self.groups * 3
        return 2 * self.tokens * row + 4 * self.groups * 2

    def group_end_offsets(self) -> list[int]:
        return [int(v) for v in np.cumsum(skewed_group_sizes(self.tokens, self.groups))]

    def label(self) -> str:
        return f"{self.op} ({self.tokens}, {self.dim}) G={self.groups}"


def build_cases(quick: bool = False, ops: Sequence[str] | None = None) -> list[PadCase]:
    """Seed 000's shapes and 131072 x 7168 G=8 (``quick``: 16384 x 7168 G=8 and the big one)."""
    shapes = [(SEED_TOKENS, d, g) for d in SEED_DIMS for g in SEED_GROUPS] + [(131072, 7168, 8)]
    if quick:
        shapes = [(SEED_TOKENS, 7168, 8), (131072, 7168, 8)]
    return [PadCase(op, *shape) for op in (ops or OPS) for shape in shapes]


# --------------------------------------------------------------------------------------------
# torchao baselines
# --------------------------------------------------------------------------------------------

_TORCHAO_MODULE = "torchao.prototype.moe_training.kernels.mxfp8"


def load_torchao_baselines() -> tuple[dict[str, Callable[..., Any]], dict[str, Any]]:
    """torchao's padding in our calling convention: ``pad(x, ends)``, ``unpad(padded, ends, start)``.

    Prefers the fused CUDA kernels (``fused_*_token_groups_cuda``, when torchao's extension is
    built), else the torch-native implementations. ``info`` records what was found.
    """
    info: dict[str, Any] = {"functions": {}, "errors": {}}
    try:
        import torchao

        info["version"] = getattr(torchao, "__version__", "unknown")
        module = importlib.import_module(_TORCHAO_MODULE)
    except Exception as exc:  # noqa: BLE001 - any failure means: no baseline
        info["errors"]["import"] = f"{type(exc).__name__}: {exc}"
        return {}, info
    cuda = bool(getattr(module, "_mxfp8_cuda_kernels_available", False))
    names = {
        "pad": "fused_pad_token_groups_cuda" if cuda else "torch_pad_token_groups",
        "unpad": "fused_unpad_token_groups_cuda" if cuda else "torch_unpad_token_groups",
    }
    adapters: dict[str, Callable[..., Any]] = {}
    for op, name in names.items():
        func = getattr(module, name, None)
        if func is None:
            info["errors"][op] = f"{_TORCHAO_MODULE}.{name} not found"
            continue
        info["functions"][op] = f"{_TORCHAO_MODULE}.{name}"
        if op == "pad":
            adapters[op] = lambda x, ends, f=func: f(x, ends, ALIGNMENT)
        else:
            adapters[op] = lambda padded, ends, start, tokens, f=func: f(
                padded, ends, start, tokens, ALIGNMENT
            )
    return adapters, info


# --------------------------------------------------------------------------------------------
# Checking and timing one case
# --------------------------------------------------------------------------------------------


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:160]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _check(case: PadCase, tb: Any, ref_mod: Any, x: torch.Tensor, ends: torch.Tensor) -> str | None:
    """``None`` if our op equals the reference byte for byte, else why not."""
    padded, start, end = tb.pad_token_groups(x, ends, alignment=case.alignment, backend="cute")
    want = ref_mod.pad_token_groups(x, ends, alignment=case.alignment)
    if case.op == "pad":
        for got, expected in zip((padded, start, end), want, strict=True):
            why = compare_bytes(_bytes(got), _bytes(expected), tuple(_bytes(expected).shape))
            if why is not None:
                return why
        return None
    back = tb.unpad_token_groups(padded, ends, start, num_tokens=case.tokens, backend="cute")
    return compare_bytes(_bytes(back), _bytes(x), tuple(_bytes(x).shape))


def _baseline_note(case: PadCase, base_fn: Callable[..., Any], args: tuple, x: torch.Tensor) -> str | None:
    """A note when torchao's output differs from ours (it is timed either way)."""
    out = base_fn(*args)
    got = out[0] if isinstance(out, tuple) else out
    if case.op == "unpad":
        return None if torch.equal(_bytes(got), _bytes(x)) else "torchao unpad output differs"
    return None


def bench_case(
    case: PadCase,
    tb: Any,
    ref_mod: Any,
    baselines: dict[str, Callable[..., Any]],
    timing: dict[str, Any],
    device: torch.device,
    check: bool = True,
) -> dict[str, Any]:
    """Check and time one case; return its row (never raises for kernel failures)."""
    gen = torch.Generator(device=device).manual_seed(2024 + case.dim + case.groups)
    x = torch.randn(case.tokens, case.dim, dtype=torch.bfloat16, device=device, generator=gen)
    ends = torch.tensor(case.group_end_offsets(), dtype=torch.int32, device=device)
    notes: list[str] = []
    status = "ok"
    ours_ok = True
    if check:
        try:
            why = _check(case, tb, ref_mod, x, ends)
        except Exception as exc:  # noqa: BLE001
            why = f"raised {_short(exc)}"
            traceback.print_exc(file=sys.stderr)
        if why is not None:
            ours_ok, status = False, f"FAIL: {why}"
    else:
        notes.append("not checked")

    if case.op == "pad":

        def ours(inp: torch.Tensor, offs: torch.Tensor) -> Any:
            return tb.pad_token_groups(inp, offs, alignment=case.alignment)

        def make() -> tuple[Any, ...]:
            return (x.clone(), ends)

        base_fn = baselines.get("pad")
        base_args: tuple = (x, ends)
    else:
        padded, start, _ = tb.pad_token_groups(x, ends, alignment=case.alignment)

        def ours(inp: torch.Tensor, offs: torch.Tensor, st: torch.Tensor) -> Any:
            return tb.unpad_token_groups(inp, offs, st, num_tokens=case.tokens)

        def make() -> tuple[Any, ...]:
            return (padded.clone(), ends, start)

        unpad_fn = baselines.get("unpad")
        base_fn = None if unpad_fn is None else (lambda p, o, s: unpad_fn(p, o, s, case.tokens))
        base_args = (padded, ends, start)

    sets = make_rotating_inputs(make, bytes_per_set=case.nbytes_moved)
    methods: dict[str, str] = {}
    our_us: float | None = None
    if ours_ok:
        try:
            t = time_cuda_detailed(ours, sets, **timing)
            our_us = t.us
            methods["ours"] = t.method
            if t.fallback_reason:
                notes.append(f"ours: {t.fallback_reason}")
        except Exception as exc:  # noqa: BLE001
            status = f"FAIL: timing raised {_short(exc)}"
            traceback.print_exc(file=sys.stderr)

    base_us: float | None = None
    if base_fn is not None:
        try:
            note = _baseline_note(case, base_fn, base_args, x)
            if note:
                notes.append(note)
            t = time_cuda_detailed(base_fn, sets, **timing)
            base_us = t.us
            methods["torchao"] = t.method
        except Exception as exc:  # noqa: BLE001
            notes.append(f"torchao n/a: {_short(exc)}")

    del sets
    torch.cuda.empty_cache()
    copy = copy_baseline_detailed(case.nbytes_moved, device, **timing)
    methods["copy"] = copy.method
    row = make_row(
        op=case.op,
        shape=(case.tokens, case.dim),
        G=case.groups,
        nbytes=case.nbytes_moved,
        us=our_us,
        copy_us=copy.us,
        baseline_us=base_us,
        status=status,
    )
    row["padded_rows"] = case.padded_rows
    row["group_end_offsets"] = case.group_end_offsets()
    row["timing_methods"] = methods
    row["note"] = "; ".join(notes)
    return row


def goal_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How many rows reach ``GOAL_RATIO`` of copy bandwidth, per op, and the worst row."""
    out: dict[str, Any] = {"goal": f"ratio to copy >= {GOAL_RATIO}"}
    for op in OPS:
        mine = [r for r in rows if r["op"] == op]
        met = [r for r in mine if (r.get("ratio_to_copy") or 0.0) >= GOAL_RATIO]
        worst = min(mine, key=lambda r: r.get("ratio_to_copy") or 0.0, default=None)
        out[op] = {
            "shapes": len(mine),
            "met": len(met),
            "worst": None if worst is None else {k: worst.get(k) for k in ("shape", "G", "ratio_to_copy")},
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 1 if any shape FAILed, 2 without a GPU, else 0."""
    parser = make_parser("Benchmark pad_token_groups / unpad_token_groups against torchao and a copy.")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=None, help="only these ops (default: both)")
    parser.add_argument("--no-torchao", action="store_true", help="skip the torchao baseline")
    parser.add_argument("--no-check", action="store_true", help="skip the reference check (debugging only)")
    args = parser.parse_args(argv)
    try:
        device = require_cuda("bench_pad")
    except CudaUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch_bindings
    import torch_bindings.reference as ref_mod

    baselines: dict[str, Callable[..., Any]] = {}
    torchao_info: dict[str, Any] = {"skipped": True}
    if not args.no_torchao:
        baselines, torchao_info = load_torchao_baselines()
        for what, err in torchao_info.get("errors", {}).items():
            progress(f"torchao baseline {what} unavailable: {err}")

    cases = build_cases(quick=args.quick, ops=args.ops)
    timing = timing_kwargs(args)
    rows: list[dict[str, Any]] = []
    for i, case in enumerate(cases, 1):
        progress(f"[{i}/{len(cases)}] {case.label()}: {case.nbytes_moved / 1e6:.1f} MB moved ...")
        row = bench_case(case, torch_bindings, ref_mod, baselines, timing, device, check=not args.no_check)
        rows.append(row)

        def fmt(v: float | None, spec: str) -> str:
            return "n/a" if v is None else format(v, spec)

        progress(
            f"    {row['status']}: ours {fmt(row['us'], '.2f')} us ({fmt(row['gbps'], '.0f')} GB/s, "
            f"{fmt(row['ratio_to_copy'], '.3f')} of copy {fmt(row['copy_gbps'], '.0f')} GB/s), "
            f"torchao {fmt(row['baseline_us'], '.2f')} us" + (f"  [{row['note']}]" if row["note"] else "")
        )

    summary = goal_summary(rows)
    json_path, png_path = output_paths(args.out, "pad")
    report(
        rows,
        COLUMNS,
        "pad_token_groups / unpad_token_groups (bf16, alignment 32)",
        json_path,
        png_path,
        label_keys=("shape", "G"),
        plot_series=PLOT_SERIES,
        panel_key="op",
        meta={"benchmark": "pad", "torchao": torchao_info, "goal": summary, "quick": args.quick},
    )
    met = ", ".join(f"{op} {summary[op]['met']}/{summary[op]['shapes']}" for op in OPS)
    print(f"\ngoal ({summary['goal']}): {met}")
    fails = [r for r in rows if str(r["status"]).startswith("FAIL")]
    for r in fails:
        print(f"FAIL {r['op']} {r['shape']} G={r['G']}: {r['status']}")
    print(f"results: {json_path} {png_path}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
