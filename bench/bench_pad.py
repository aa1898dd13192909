"""Benchmark token-group padding (SPEC section 4): pad, unpad, fused pad-and-quantize, pad-then-quantize.

Shapes: torchao's padding table (seed 000: 16384 tokens x D in {1536, 2048, 5120, 7168} x G in
{1, 4, 8, 16}, bf16, alignment 32) plus 131072 x 7168 with G = 8; group sizes are skewed and
unaligned (``bench.common.groups.skewed_group_sizes``). ``P = 32 * ceil((M + 32 G) / 32)`` is the
padded row count (the static bound). Ops, with the bytes each must move (read + written, the fewest
any implementation must move):

* ``pad``: ``pad_token_groups`` reads the M rows and the offsets and writes all P output rows
  (zero rows included) and both padded offset arrays.
* ``unpad``: ``unpad_token_groups(..., num_tokens=M)`` reads the M grouped rows and both offset
  arrays and writes M rows.
* ``fused``: ``pad_and_quantize_mxfp8_2d`` reads x (2 B/element) and the offsets and writes the
  padded E4M3 data (P x D), the M-groups blocked scales of the padded groups
  ((P + 128 G) x 4*ceil(D/128) bytes) and both padded offset arrays.
* ``pad+quant``: our two kernels, ``pad_token_groups`` then ``quantize_mxfp8_2d(padded,
  group_end_offsets=padded_end)``: the same result as ``fused``, so its row uses the fused op's
  bytes (its GB/s is an effective rate; it really moves the padded bf16 rows twice more).
  The ``fused`` row's ``fused vs pad+quant`` column is pad+quant time / fused time.

Every op is first checked against ``torch_bindings.reference`` (bytes equal); then ours,
torchao's padding (``pad``/``unpad`` only, when ``torchao`` imports: its fused CUDA kernel when
built, else its torch-native ``torch_pad_token_groups`` / ``torch_unpad_token_groups``, which sync
and so are timed eagerly, not in a CUDA graph) and a device copy of the same number of bytes
(:func:`bench.common.baselines.measure_copy`) are timed with
:func:`bench.common.timing.time_cuda_detailed` (CUDA-graph replays, inputs rotated beyond L2). An
op that raises gets a ``FAIL`` row saying so.

Goals (issue 5): pad and unpad >= 0.90 of copy; fused >= 0.85 of copy and >= 1.8x faster than
pad-then-quantize.

Run (GPU machine, project root on PYTHONPATH)::

    python -m bench.bench_pad [--quick] [--out DIR] [--ops pad unpad fused pad+quant]
        [--modes rceil floor] [--no-torchao] [--backend cute|auto|reference]
"""

from __future__ import annotations

import importlib
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bench.common.baselines import copy_suspect_note, measure_copy
from bench.common.cli import add_bench_args, make_parser, output_paths, progress, timing_kwargs
from bench.common.device import cuda_or_none
from bench.common.groups import skewed_group_ends
from bench.common.report import report
from bench.common.rowlog import RowLog, diff_bytes, finish, progress_row, short_error
from bench.common.rows import BASELINE_COLUMNS, RATE_COLUMNS, RATE_SERIES, make_row
from bench.common.timing import make_rotating_inputs

SEED_TOKENS = 16384
SEED_DIMS: tuple[int, ...] = (1536, 2048, 5120, 7168)
SEED_GROUPS: tuple[int, ...] = (1, 4, 8, 16)
BIG_SHAPE: tuple[int, int, int] = (131072, 7168, 8)
ALIGNMENT = 32
BLOCK = 32
OPS: tuple[str, ...] = ("pad", "unpad", "fused", "pad+quant")
MODES: tuple[str, ...] = ("floor", "rceil")
#: Goals of issue 5.
GOAL_RATIO = 0.9
GOAL_FUSED_RATIO = 0.85
GOAL_FUSED_SPEEDUP = 1.8

COLUMNS: list[tuple[str, str]] = (
    [("op", "op"), ("shape", "shape"), ("G", "G")]
    + RATE_COLUMNS
    + [("fused_speedup", "fused vs pad+quant")]
    + BASELINE_COLUMNS
)
PLOT_SERIES: tuple[tuple[str, str], ...] = RATE_SERIES + (("baseline_gbps", "torchao"),)


@dataclass(frozen=True)
class PadCase:
    """One row: ``op`` (one of ``OPS``) of ``tokens`` x ``dim`` bf16 in ``groups`` skewed groups.

    ``mode`` is the scaling mode of the quantizing ops (``fused``, ``pad+quant``).
    """

    op: str
    tokens: int
    dim: int
    groups: int
    alignment: int = ALIGNMENT
    mode: str = "rceil"

    @property
    def quantizes(self) -> bool:
        """Whether the op quantizes (``fused`` or ``pad+quant``)."""
        return self.op in ("fused", "pad+quant")

    @property
    def padded_rows(self) -> int:
        """P, the static padded row bound ``A * ceil((M + G A) / A)``."""
        a = self.alignment
        return a * math.ceil((self.tokens + self.groups * a) / a)

    @property
    def scale_shape(self) -> tuple[int, int]:
        """M-groups blocked scales of the padded (P, D) matrix: ``(P + 128 G, 4 ceil(D / 128))``."""
        return (self.padded_rows + 128 * self.groups, 4 * math.ceil(self.dim / BLOCK / 4))

    @property
    def nbytes_moved(self) -> int:
        """Bytes read + written (bf16 rows, int32 offsets, 1-byte q and scales); see the module doc."""
        row = 2 * self.dim
        offsets = 4 * self.groups
        if self.op == "pad":
            return self.tokens * row + self.padded_rows * row + 3 * offsets
        if self.op == "unpad":
            return 2 * self.tokens * row + 2 * offsets
        return self.tokens * row + self.padded_rows * self.dim + math.prod(self.scale_shape) + 3 * offsets

    def group_end_offsets(self) -> list[int]:
        """Host-side end offsets of the skewed, unaligned groups (last = tokens)."""
        return skewed_group_ends(self.tokens, self.groups)

    def label(self) -> str:
        """Short human-readable name."""
        mode = f" {self.mode}" if self.quantizes else ""
        return f"{self.op}{mode} ({self.tokens}, {self.dim}) G={self.groups}"


def build_cases(
    quick: bool = False, ops: Sequence[str] | None = None, modes: Sequence[str] = ("rceil",)
) -> list[PadCase]:
    """Seed 000's shapes and 131072 x 7168 G=8 (``quick``: 16384 x 7168 G=8 and the big one), for
    every op; the quantizing ops once per mode. Ordered by shape, then op (fused next to
    pad+quant)."""
    shapes = [(SEED_TOKENS, d, g) for d in SEED_DIMS for g in SEED_GROUPS] + [BIG_SHAPE]
    if quick:
        shapes = [(SEED_TOKENS, 7168, 8), BIG_SHAPE]
    cases = []
    for shape in shapes:
        for op in ops or OPS:
            for mode in modes if op in ("fused", "pad+quant") else ("rceil",):
                cases.append(PadCase(op, *shape, mode=mode))
    return cases


# --------------------------------------------------------------------------------------------
# torchao baselines (pad / unpad)
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
        info["errors"]["import"] = short_error(exc)
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
# One case: our callable, its rotating inputs, its check
# --------------------------------------------------------------------------------------------


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _diff_all(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> str | None:
    """First difference (as bytes, same shapes) between matching tensors of ``got`` and ``want``."""
    names = ("out", "padded_start", "padded_end") if len(want) == 3 else ("q", "scales", "start", "end")
    for name, g, w in zip(names, got, want, strict=True):
        why = diff_bytes(_as_bytes(g), _as_bytes(w), tuple(_as_bytes(w).shape))
        if why is not None:
            return f"{name}: {why}"
    return None


@dataclass
class Prepared:
    """What one case times: ``fn(*args)`` over ``make()``'s fresh argument tuples, the torchao
    callable (or ``None``) taking the same arguments, and ``check()`` -> ``None`` or why not equal."""

    fn: Callable[..., Any]
    make: Callable[[], tuple[Any, ...]]
    check: Callable[[], str | None]
    baseline: Callable[..., Any] | None = None


def prepare(
    case: PadCase,
    tb: Any,
    ref_mod: Any,
    x: torch.Tensor,
    ends: torch.Tensor,
    baselines: dict[str, Callable[..., Any]],
    backend: str,
) -> Prepared:
    """Our callable, inputs, check and baseline for ``case`` on ``x`` and its end offsets."""
    a, mode = case.alignment, case.mode
    if case.op == "pad":

        def pad(inp: torch.Tensor, offs: torch.Tensor) -> Any:
            return tb.pad_token_groups(inp, offs, alignment=a, backend=backend)

        return Prepared(
            fn=pad,
            make=lambda: (x.clone(), ends),
            check=lambda: _diff_all(pad(x, ends), ref_mod.pad_token_groups(x, ends, alignment=a)),
            baseline=baselines.get("pad"),
        )
    if case.op == "unpad":
        padded, start, _ = tb.pad_token_groups(x, ends, alignment=a, backend=backend)

        def unpad(p: torch.Tensor, offs: torch.Tensor, st: torch.Tensor) -> Any:
            return tb.unpad_token_groups(p, offs, st, num_tokens=case.tokens, backend=backend)

        base = baselines.get("unpad")
        return Prepared(
            fn=unpad,
            make=lambda: (padded.clone(), ends, start),
            check=lambda: diff_bytes(_as_bytes(unpad(padded, ends, start)), _as_bytes(x)),
            baseline=None if base is None else (lambda p, o, s: base(p, o, s, case.tokens)),
        )
    if case.op == "fused":

        def fused(inp: torch.Tensor, offs: torch.Tensor) -> Any:
            return tb.pad_and_quantize_mxfp8_2d(inp, offs, alignment=a, scaling_mode=mode, backend=backend)

    else:

        def fused(inp: torch.Tensor, offs: torch.Tensor) -> Any:
            padded, start, end = tb.pad_token_groups(inp, offs, alignment=a, backend=backend)
            q, s = tb.quantize_mxfp8_2d(padded, group_end_offsets=end, scaling_mode=mode, backend=backend)
            return q, s, start, end

    def check() -> str | None:
        want = ref_mod.pad_and_quantize_mxfp8_2d(x, ends, alignment=a, scaling_mode=mode)
        return _diff_all(fused(x, ends), want)

    return Prepared(fn=fused, make=lambda: (x.clone(), ends), check=check)


def _prepare_or_log(
    case: PadCase,
    tb: Any,
    ref_mod: Any,
    x: torch.Tensor,
    ends: torch.Tensor,
    baselines: dict[str, Callable[..., Any]],
    backend: str,
    log: RowLog,
) -> Prepared | None:
    """:func:`prepare`, or ``None`` with the failure in ``log`` (unpad runs our pad to prepare)."""
    try:
        return prepare(case, tb, ref_mod, x, ends, baselines, backend)
    except Exception as exc:  # noqa: BLE001
        log.fail(f"preparing raised {short_error(exc)}")
        traceback.print_exc(file=sys.stderr)
        return None


def _run_check(prep: Prepared, log: RowLog, check: bool) -> bool:
    """Run our op once against the reference; whether it ran (if it raised, the row FAILs)."""
    try:
        why = prep.check() if check else None
        if not check:
            prep.fn(*prep.make())
            log.note("not checked")
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        log.fail(f"raised {short_error(exc)}")
        traceback.print_exc(file=sys.stderr)
        return False
    if why is not None:
        log.fail(why)
    return True


def bench_case(
    case: PadCase,
    tb: Any,
    ref_mod: Any,
    baselines: dict[str, Callable[..., Any]],
    timing: dict[str, Any],
    device: torch.device,
    check: bool = True,
    backend: str = "cute",
    copy_tries: int = 2,
) -> dict[str, Any]:
    """Check and time one case; return its row (never raises for kernel failures)."""
    gen = torch.Generator(device=device).manual_seed(2024 + case.dim + case.groups)
    x = torch.randn(case.tokens, case.dim, dtype=torch.bfloat16, device=device, generator=gen)
    ends = torch.tensor(case.group_end_offsets(), dtype=torch.int32, device=device)
    log = RowLog()
    our_us: float | None = None
    base_us: float | None = None
    prep = _prepare_or_log(case, tb, ref_mod, x, ends, baselines, backend, log)
    if prep is not None and _run_check(prep, log, check):
        sets = make_rotating_inputs(prep.make, bytes_per_set=case.nbytes_moved)
        if log.status == "ok":
            our_us = log.time("ours", prep.fn, sets, timing, fatal=True)
        if prep.baseline is not None:
            base_us = log.time("torchao", prep.baseline, sets, timing)
        del sets
    del x
    copy_us, tried = measure_copy(case.nbytes_moved, device, timing, copy_tries, log)
    row = make_row(
        op=case.op,
        shape=(case.tokens, case.dim),
        G=case.groups,
        nbytes=case.nbytes_moved,
        us=our_us,
        copy_us=copy_us,
        baseline_us=base_us,
        status=log.status,
    )
    row.update(mode=case.mode if case.quantizes else None, padded_rows=case.padded_rows)
    row["group_end_offsets"] = case.group_end_offsets()
    row["copy_us_tries"] = tried
    suspect = copy_suspect_note(row, tried)
    if suspect:
        log.note(suspect)
    return log.fill(row)


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def add_fused_speedups(rows: Sequence[dict[str, Any]]) -> None:
    """Set ``fused_speedup`` = pad+quant us / fused us on each fused row (same shape, G, mode)."""
    pq = {(tuple(r["shape"]), r["G"], r.get("mode")): r for r in rows if r["op"] == "pad+quant"}
    for r in rows:
        other = pq.get((tuple(r["shape"]), r["G"], r.get("mode"))) if r["op"] == "fused" else None
        ok = other is not None and r.get("us") and other.get("us")
        r["fused_speedup"] = other["us"] / r["us"] if ok else None


def goal_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per op: rows, rows meeting the ratio goal, the worst row; for fused also the speedup goal."""
    out: dict[str, Any] = {
        "goal": (
            f"pad/unpad ratio to copy >= {GOAL_RATIO}; fused >= {GOAL_FUSED_RATIO} of copy and "
            f">= {GOAL_FUSED_SPEEDUP}x faster than pad+quant"
        )
    }
    for op in OPS:
        mine = [r for r in rows if r["op"] == op]
        goal = GOAL_FUSED_RATIO if op in ("fused", "pad+quant") else GOAL_RATIO
        met = [r for r in mine if (r.get("ratio_to_copy") or 0.0) >= goal]
        worst = min(mine, key=lambda r: r.get("ratio_to_copy") or 0.0, default=None)
        out[op] = {
            "shapes": len(mine),
            "measured": sum(r.get("us") is not None for r in mine),
            "met": len(met),
            "worst": None if worst is None else {k: worst.get(k) for k in ("shape", "G", "ratio_to_copy")},
        }
    fused = [r for r in rows if r["op"] == "fused"]
    out["fused_speedup"] = {
        "rows": sum(r.get("fused_speedup") is not None for r in fused),
        "met": sum((r.get("fused_speedup") or 0.0) >= GOAL_FUSED_SPEEDUP for r in fused),
        "min": min((r["fused_speedup"] for r in fused if r.get("fused_speedup")), default=None),
    }
    return out


def format_goal_lines(summary: dict[str, Any]) -> list[str]:
    """Human-readable lines of :func:`goal_summary`."""
    lines = [f"goal ({summary['goal']}):"]
    for op in OPS:
        s = summary[op]
        if s["shapes"]:
            lines.append(f"  {op}: {s['met']}/{s['shapes']} rows meet the ratio goal ({s['measured']} timed)")
    fs = summary["fused_speedup"]
    if fs["rows"]:
        goal = f"fused vs pad+quant >= {GOAL_FUSED_SPEEDUP}x"
        lines.append(f"  {goal}: {fs['met']}/{fs['rows']} (min {fs['min']:.2f}x)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 1 if any row FAILed, 2 without a GPU, else 0."""
    parser = make_parser("Benchmark pad / unpad / fused pad-and-quantize against a copy and torchao.")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=None, help="only these ops (default: all)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["rceil"], help="fused/pad+quant modes")
    add_bench_args(parser, op="the padding ops")
    args = parser.parse_args(argv)
    device = cuda_or_none("bench_pad")
    if device is None:
        return 2
    import torch_bindings
    import torch_bindings.reference as ref_mod

    baselines: dict[str, Callable[..., Any]] = {}
    torchao_info: dict[str, Any] = {"skipped": True}
    if not args.no_torchao:
        baselines, torchao_info = load_torchao_baselines()
        for what, err in torchao_info.get("errors", {}).items():
            progress(f"torchao baseline {what} unavailable: {err}")

    cases = build_cases(quick=args.quick, ops=args.ops, modes=args.modes)
    timing = timing_kwargs(args)
    rows: list[dict[str, Any]] = []
    for i, case in enumerate(cases, 1):
        progress(f"[{i}/{len(cases)}] {case.label()}: {case.nbytes_moved / 1e6:.1f} MB moved ...")
        row = bench_case(
            case, torch_bindings, ref_mod, baselines, timing, device,
            check=not args.no_check, backend=args.backend, copy_tries=args.copy_tries,
        )  # fmt: skip
        rows.append(row)
        progress_row(row)
        torch.cuda.empty_cache()

    add_fused_speedups(rows)
    summary = goal_summary(rows)
    json_path, png_path = output_paths(args.out, "pad")
    report(
        rows,
        COLUMNS,
        "pad / unpad / pad_and_quantize_mxfp8_2d (bf16, alignment 32)",
        json_path,
        png_path,
        label_keys=("shape", "G"),
        plot_series=PLOT_SERIES,
        panel_key="op",
        meta={
            "benchmark": "pad",
            "backend": args.backend,
            "torchao": torchao_info,
            "goal": summary,
            "quick": args.quick,
        },
    )
    lines = format_goal_lines(summary)
    return finish(rows, lambda r: f"{r['op']} {r['shape']} G={r['G']}", lines, (json_path, png_path))


if __name__ == "__main__":
    sys.exit(main())
