"""Benchmark ``torch_bindings.quantize_mxfp8_3d`` (MXFP8 quantization of expert weights, issue 4).

Inputs are bf16 expert weights ``w`` (E, N, K), E in (1, 8, 32), (N, K) in ((8192, 5120),
(7168, 2048)) (issue 4's table); values are ``randn`` times a random power of two per 32 elements
along K. For every shape, block and scaling mode (``rceil`` by default; ``--modes floor rceil``):

* ``block="1x32"`` (along K): q (E, N, K) row-major, per-expert blocked scales of (N, K/32);
* ``block="32x1"`` (along N): q (E, N, K) with strides (N K, 1, N), per-expert blocked scales of
  (K, N/32).

Bytes moved = w read (2 B/element) + q written (1 B/element) + blocked scales written
(E x Rp x Cp). Before timing, our output is compared byte for byte with
``torch_bindings.reference.quantize_mxfp8_3d`` on the first and last experts (each expert is
quantized independently, SPEC section 3); a mismatch marks the row ``FAIL``, and so does a call
that raises (then only the copy and torchao are timed). Ours is timed with
:func:`bench.common.timing.time_cuda_detailed` (CUDA-graph replays, inputs rotated past the L2)
next to a device copy of the same number of bytes in the same run
(:func:`bench.common.baselines.measure_copy`).

torchao baseline (when it imports), the first of these that runs here, per block and mode:

* ``torchao.prototype.moe_training.kernels.mxfp8.mxfp8_quantize_cuda_3d(w, scale_block_dim1=32,
  scale_block_dim2=1, blocked_scale_output=True)`` (its CuTeDSL kernel; torchao gates it to
  SM 10.x). It scales along the middle dim: ``w`` for 32x1, ``w.transpose(-2, -1)`` for 1x32.
* torchao's emulated path, ``torch.compile(torchao.prototype.mx_formats.mx_tensor.to_mx)(v,
  float8_e4m3fn, 32, mode, is_swizzled_scales=True)``, on ``v = w`` (1x32) or ``v =
  w.transpose(-2, -1).contiguous()`` inside the compiled function (32x1), which runs anywhere.
  ``to_mx`` swizzles the (E N, C) scales as one matrix, which equals per-expert blocking for
  these shapes (N and K multiples of 128, C multiple of 4).

Goals (issue 4): ratio to copy >= 0.90 at E >= 8, >= 0.80 at E = 1.

Run (GPU machine, project root on PYTHONPATH)::

    python -m bench.bench_quantize_3d [--quick] [--out DIR] [--experts 1 8 32]
        [--blocks 1x32 32x1] [--modes floor rceil] [--no-torchao] [--backend cute|auto|reference]
"""

from __future__ import annotations

import math
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bench.common.baselines import copy_suspect_note, measure_copy, raise_recompile_limit
from bench.common.cli import add_bench_args, make_parser, output_paths, progress, timing_kwargs
from bench.common.device import cuda_or_none
from bench.common.report import report
from bench.common.rowlog import RowLog, diff_bytes, finish, progress_row, short_error
from bench.common.rows import BASELINE_COLUMNS, RATE_COLUMNS, RATE_SERIES, is_fail, make_row
from bench.common.timing import make_rotating_inputs
from cute_kernels.op_specs import scales_shape_3d

OP = "quantize_mxfp8_3d"
EXPERTS: tuple[int, ...] = (1, 8, 32)
WEIGHT_NK: tuple[tuple[int, int], ...] = ((8192, 5120), (7168, 2048))
BLOCKS: tuple[str, ...] = ("1x32", "32x1")
MODES: tuple[str, ...] = ("floor", "rceil")
QUICK_EXPERTS: tuple[int, ...] = (8,)
BLOCK = 32
#: Goals of issue 4.
GOAL_RATIO_MANY = 0.90
GOAL_RATIO_ONE = 0.80
GOAL_MANY_EXPERTS = 8

COLUMNS: list[tuple[str, str]] = (
    [("block", "block"), ("mode", "mode"), ("shape", "shape (E, N, K)")] + RATE_COLUMNS + BASELINE_COLUMNS
)
PLOT_SERIES: tuple[tuple[str, str], ...] = RATE_SERIES + (("baseline_gbps", "torchao"),)


@dataclass(frozen=True)
class Quant3dCase:
    """One row: bf16 weights (E, N, K), a block (``"1x32"``/``"32x1"``) and a scaling mode."""

    experts: int
    n: int
    k: int
    block: str = "1x32"
    mode: str = "rceil"

    @property
    def elems(self) -> int:
        """E * N * K."""
        return self.experts * self.n * self.k

    @property
    def scale_shape(self) -> tuple[int, int, int]:
        """Blocked scales (E, Rp, Cp) of the per-expert S: (N, K/32) for 1x32, (K, N/32) for 32x1."""
        return scales_shape_3d((self.experts, self.n, self.k), self.block, True)

    @property
    def nbytes_moved(self) -> int:
        """w read (bf16) + q written + blocked scales written."""
        return 2 * self.elems + self.elems + math.prod(self.scale_shape)

    def ratio_goal(self) -> float:
        """The ratio-to-copy goal of this row's expert count."""
        return GOAL_RATIO_MANY if self.experts >= GOAL_MANY_EXPERTS else GOAL_RATIO_ONE

    def label(self) -> str:
        """Short human-readable name."""
        return f"{self.block} {self.mode} ({self.experts}, {self.n}, {self.k})"


def build_cases(
    quick: bool = False,
    experts: Sequence[int] | None = None,
    blocks: Sequence[str] = BLOCKS,
    modes: Sequence[str] = ("rceil",),
) -> list[Quant3dCase]:
    """Issue 4's shapes (``quick``: E = 8 only, unless ``experts`` is given), every block and mode,
    ordered by (N, K), block, mode, then E (each compiled torchao baseline sees one (N, K) at a time)."""
    es = experts or (QUICK_EXPERTS if quick else EXPERTS)
    for e in es:
        if e <= 0:
            raise ValueError(f"expert counts must be positive, got {e}")
    return [
        Quant3dCase(e, n, k, block, mode)
        for n, k in WEIGHT_NK
        for block in blocks
        for mode in modes
        for e in es
    ]


def make_input(experts: int, n: int, k: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """bf16 (E, N, K): ``randn`` times 2^e, e uniform in [-12, 12] per 32 elements along K."""
    gen = torch.Generator(device=device)
    gen.manual_seed(4242 + 7 * seed + experts + n + 3 * k)
    w = torch.randn((experts, n, k // BLOCK, BLOCK), generator=gen, device=device, dtype=torch.bfloat16)
    e = torch.randint(-12, 13, (experts, n, k // BLOCK, 1), generator=gen, device=device, dtype=torch.int32)
    w.mul_(torch.exp2(e.to(torch.float32)).to(torch.bfloat16))
    return w.view(experts, n, k)


def checked_experts(experts: int) -> list[int]:
    """Experts compared with the reference: the first and the last."""
    return sorted({0, experts - 1})


def compare_experts(
    out: tuple[torch.Tensor, torch.Tensor],
    want: dict[int, tuple[torch.Tensor, torch.Tensor]],
    flat_scales: bool = False,
) -> str | None:
    """First difference between ``out``'s experts and the reference's per-expert ``want[e]``.

    q is compared in logical (E, N, K) order; scales as the expert's (Rp, Cp) bytes, or flat
    bytes with ``flat_scales`` (a baseline's scales of another shape but the same layout).
    """
    q, s = out
    per_expert = s.numel() // q.shape[0]
    for e, (rq, rs) in want.items():
        why = diff_bytes(q[e], rq[0], tuple(rq.shape[1:]))
        if why is None:
            got_s = s.reshape(-1)[e * per_expert : (e + 1) * per_expert] if flat_scales else s[e]
            why = diff_bytes(
                got_s, rs[0] if not flat_scales else rs.reshape(-1), None if flat_scales else rs.shape[1:]
            )
        if why is not None:
            return f"expert {e}: {why}"
    return None


# --------------------------------------------------------------------------------------------
# torchao baselines
# --------------------------------------------------------------------------------------------

_TAO_QUANT = "torchao.prototype.moe_training.kernels.mxfp8.quant"
_TAO_MX_TENSOR = "torchao.prototype.mx_formats.mx_tensor"
_TAO_MX_CONFIG = "torchao.prototype.mx_formats.config"


class Torchao3d:
    """torchao's 3D MXFP8 quantizers with blocked scales, tried in order per (block, mode).

    ``run_first(block, mode, w)`` returns ``(name, fn, output)`` with ``fn(w)`` -> ``(q, scales)``
    where q is in our logical (E, N, K) order (a view), or ``(None, None, None)``; candidates
    that raise are dropped for that (block, mode) with the reason in ``info["unavailable"]``.
    """

    def __init__(self) -> None:
        import importlib

        self.info: dict[str, Any] = {"errors": {}, "unavailable": {}, "chosen": {}}
        self.mods: dict[str, Any] = {}
        self._compiled: dict[tuple[str, str], Callable[..., Any]] = {}
        self._dead: set[tuple[str, str, str]] = set()
        try:
            import torchao

            self.info["version"] = getattr(torchao, "__version__", "unknown")
        except Exception as exc:  # noqa: BLE001 - any failure means: no baseline
            self.info["errors"]["import"] = short_error(exc)
            self.ok = False
            return
        self.ok = True
        for key, name in (("quant", _TAO_QUANT), ("mx_tensor", _TAO_MX_TENSOR), ("config", _TAO_MX_CONFIG)):
            try:
                self.mods[key] = importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001
                self.info["errors"][name] = short_error(exc)

    def _attr(self, key: str, attr: str) -> Callable[..., Any]:
        mod = self.mods.get(key)
        if mod is None or not hasattr(mod, attr):
            raise RuntimeError(f"{key}.{attr} not found in this torchao")
        return getattr(mod, attr)

    def _cutedsl(self, block: str, mode: str) -> Callable[..., Any]:
        if torch.cuda.get_device_capability()[0] != 10:
            raise RuntimeError("torchao gates mxfp8_quantize_cuda_3d (CuTeDSL, blocked scales) to SM 10.x")
        quant = self._attr("quant", "mxfp8_quantize_cuda_3d")

        def fn(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            v = w if block == "32x1" else w.transpose(-2, -1)
            q, s = quant(
                v, scale_block_dim1=32, scale_block_dim2=1, scaling_mode=mode, blocked_scale_output=True
            )
            return (q if block == "32x1" else q.transpose(-2, -1)), s

        return fn

    def _emulated(self, block: str, mode: str) -> Callable[..., Any]:
        to_mx = self._attr("mx_tensor", "to_mx")
        scm = self._attr("config", "ScaleCalculationMode")(mode)
        key = (block, mode)
        if key not in self._compiled:

            def quant(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                v = w if block == "1x32" else w.transpose(-2, -1).contiguous()
                s, q = to_mx(v, torch.float8_e4m3fn, 32, scm, is_swizzled_scales=True)
                return q, s

            self._compiled[key] = torch.compile(quant)
        compiled = self._compiled[key]

        def fn(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            q, s = compiled(w)
            return (q if block == "1x32" else q.transpose(-2, -1)), s

        return fn

    def run_first(
        self, block: str, mode: str, w: torch.Tensor
    ) -> tuple[str | None, Callable[..., Any] | None, Any]:
        """Call the candidates on ``w`` until one works: ``(name, fn, output)`` or three ``None``."""
        if not self.ok:
            return None, None, None
        candidates = (
            ("cutedsl mxfp8_quantize_cuda_3d (blocked)", self._cutedsl),
            ("emulated: torch.compile(to_mx, is_swizzled_scales=True)", self._emulated),
        )
        for name, builder in candidates:
            if (name, block, mode) in self._dead:
                continue
            try:
                fn = builder(block, mode)
                out = fn(w)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - next candidate
                self._dead.add((name, block, mode))
                self.info["unavailable"][f"{block}/{mode}: {name}"] = short_error(exc)
                progress(f"    torchao {block}/{mode} '{name}' unavailable: {short_error(exc)}")
                continue
            self.info["chosen"][f"{block}/{mode}"] = name
            return name, fn, out
        return None, None, None


# --------------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------------


def _reference_experts(
    ref_mod: Any, w: torch.Tensor, case: Quant3dCase
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Reference (q, scales) of each checked expert, as a one-expert 3D call."""
    return {
        e: ref_mod.quantize_mxfp8_3d(w[e : e + 1], block=case.block, scaling_mode=case.mode)
        for e in checked_experts(case.experts)
    }


def _run_ours(
    ours: Callable[[torch.Tensor], Any], w: torch.Tensor, want: dict[int, Any] | None, log: RowLog
) -> bool:
    """Run our op once and compare it with ``want``; whether it ran (if it raised, the row FAILs)."""
    try:
        out = ours(w)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        log.fail(f"raised {short_error(exc)}")
        traceback.print_exc(file=sys.stderr)
        return False
    if want is None:
        log.note("not checked")
    else:
        why = compare_experts(out, want)
        if why is not None:
            log.fail(why)
    return True


def _time_torchao(
    torchao: Torchao3d | None,
    case: Quant3dCase,
    w: torch.Tensor,
    sets: Sequence[tuple[Any, ...]],
    want: dict[int, Any] | None,
    timing: dict[str, Any],
    log: RowLog,
) -> tuple[float | None, str | None]:
    """torchao's microseconds and path name (``None`` where it cannot run); differences are notes."""
    if torchao is None:
        return None, None
    name, fn, out = torchao.run_first(case.block, case.mode, w)
    if fn is None:
        log.note("torchao n/a (see meta.torchao.unavailable)")
        return None, None
    if want is not None:
        why = compare_experts(out, want, flat_scales=True)
        if why is not None:
            log.note(f"torchao output differs: {why}")
    del out
    return log.time("torchao", fn, sets, timing), name


def bench_case(
    case: Quant3dCase,
    w: torch.Tensor,
    tb: Any,
    ref_mod: Any,
    torchao: Torchao3d | None,
    timing: dict[str, Any],
    device: torch.device,
    check: bool = True,
    backend: str = "cute",
    copy_tries: int = 2,
) -> dict[str, Any]:
    """Check and time one case on weights ``w``; return its row (never raises for kernel failures)."""
    log = RowLog()

    def ours(v: torch.Tensor) -> Any:
        return tb.quantize_mxfp8_3d(v, block=case.block, scaling_mode=case.mode, backend=backend)

    want = _reference_experts(ref_mod, w, case) if check else None
    ran = _run_ours(ours, w, want, log)

    first = [True]

    def make() -> tuple[torch.Tensor]:
        if first[0]:
            first[0] = False
            return (w,)
        return (w.clone(),)

    sets = make_rotating_inputs(make, bytes_per_set=case.nbytes_moved)
    our_us = log.time("ours", ours, sets, timing, fatal=True) if ran and log.status == "ok" else None
    base_us, base_name = _time_torchao(torchao, case, w, sets, want, timing, log)
    del sets, want
    copy_us, tried = measure_copy(case.nbytes_moved, device, timing, copy_tries, log)
    row = make_row(
        block=case.block,
        mode=case.mode,
        shape=(case.experts, case.n, case.k),
        nbytes=case.nbytes_moved,
        us=our_us,
        copy_us=copy_us,
        baseline_us=base_us,
        status=log.status,
    )
    row.update(experts=case.experts, scales_shape=case.scale_shape, ratio_goal=case.ratio_goal())
    row.update(torchao_path=base_name, copy_us_tries=tried)
    suspect = copy_suspect_note(row, tried)
    if suspect:
        log.note(suspect)
    return log.fill(row)


def goal_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rows timed, rows meeting their ratio goal, and the misses (FAIL rows count as missed)."""
    timed = [r for r in rows if r.get("us") is not None or is_fail(r)]
    missed = [r for r in timed if is_fail(r) or (r.get("ratio_to_copy") or 0.0) < r["ratio_goal"]]
    goal = f"ratio to copy >= {GOAL_RATIO_MANY} at E >= {GOAL_MANY_EXPERTS}, >= {GOAL_RATIO_ONE} at E = 1"
    return {
        "goal": goal,
        "rows": len(rows),
        "timed": len(timed),
        "met": len(timed) - len(missed),
        "missed": [
            {k: r.get(k) for k in ("block", "mode", "shape", "ratio_to_copy", "status")} for r in missed
        ],
    }


def format_goal_lines(summary: dict[str, Any]) -> list[str]:
    """Human-readable lines of :func:`goal_summary`."""
    line = f"goal ({summary['goal']}): {summary['met']}/{summary['timed']} timed rows of {summary['rows']}"
    misses = [
        f"{m['block']} {m['mode']} {tuple(m['shape'])}: "
        + (m["status"] if str(m["status"]).startswith("FAIL") else f"{m['ratio_to_copy'] or 0.0:.3f}")
        for m in summary["missed"]
    ]
    return [line + ("; missed: " + ", ".join(misses) if misses else "")]


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 1 if any row FAILed, 2 without a GPU, else 0."""
    parser = make_parser(
        "Benchmark torch_bindings.quantize_mxfp8_3d (expert weights, 1x32 and 32x1, blocked scales) "
        "against a device copy and torchao."
    )
    parser.add_argument("--experts", type=int, nargs="+", default=None, metavar="E", help="expert counts")
    parser.add_argument(
        "--nk",
        nargs="+",
        choices=[f"{n}x{k}" for n, k in WEIGHT_NK],
        default=None,
        help="only these (N, K) weight shapes (default: all)",
    )
    parser.add_argument(
        "--blocks", nargs="+", choices=BLOCKS, default=list(BLOCKS), help="blocks (default: both)"
    )
    parser.add_argument(
        "--modes", nargs="+", choices=MODES, default=["rceil"], help="scaling modes (default: rceil)"
    )
    add_bench_args(parser, op=OP)
    args = parser.parse_args(argv)
    cases = build_cases(args.quick, args.experts, args.blocks, args.modes)
    if args.nk:
        cases = [c for c in cases if f"{c.n}x{c.k}" in args.nk]
    device = cuda_or_none("bench_quantize_3d")
    if device is None:
        return 2
    import torch_bindings
    import torch_bindings.reference as ref_mod

    raise_recompile_limit()
    torchao = None if args.no_torchao else Torchao3d()
    if torchao is not None:
        for what, err in torchao.info["errors"].items():
            progress(f"torchao {what} unavailable: {err}")
    timing = timing_kwargs(args)
    rows: list[dict[str, Any]] = []
    w: torch.Tensor | None = None
    for i, case in enumerate(cases, 1):
        if w is None or tuple(w.shape) != (case.experts, case.n, case.k):
            w = None
            torch.cuda.empty_cache()
            w = make_input(case.experts, case.n, case.k, device)
        progress(f"[{i}/{len(cases)}] {case.label()}: {case.nbytes_moved / 1e6:.1f} MB moved ...")
        row = bench_case(
            case, w, torch_bindings, ref_mod, torchao, timing, device,
            check=not args.no_check, backend=args.backend, copy_tries=args.copy_tries,
        )  # fmt: skip
        rows.append(row)
        progress_row(row)
    del w

    summary = goal_summary(rows)
    json_path, png_path = output_paths(args.out, "quantize_3d")
    report(
        rows,
        COLUMNS,
        "quantize_mxfp8_3d: bf16 (E, N, K) -> e4m3 + per-expert blocked e8m0 scales",
        json_path,
        png_path,
        label_keys=("mode", "shape"),
        plot_series=PLOT_SERIES,
        panel_key="block",
        meta={
            "benchmark": "quantize_3d",
            "backend": args.backend,
            "torchao": None if torchao is None else torchao.info,
            "goal": summary,
            "quick": args.quick,
        },
    )
    lines = format_goal_lines(summary)
    if torchao is not None:
        lines += [f"torchao {key}: {name}" for key, name in torchao.info["chosen"].items()]
    return finish(rows, lambda r: f"{r['block']} {r['mode']} {r['shape']}", lines, (json_path, png_path))


if __name__ == "__main__":
    sys.exit(main())
