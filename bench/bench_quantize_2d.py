"""Benchmark ``torch_bindings.quantize_mxfp8_2d`` (1x32 MXFP8 quantization with blocked scales, issue 3).

Inputs are bf16 activations ``x`` (M, K) for M in (8192, 32768, 131072) and K in (2048, 5120, 7168);
values are ``randn`` times a random power of two per 32-element block (so the scales vary). For
every shape and scaling mode (``rceil`` by default; ``--modes floor rceil``) two variants run:

* **ungrouped**: ``quantize_mxfp8_2d(x)`` -> q (M, K) ``float8_e4m3fn`` and blocked scales
  (Rp, Cp) = (128*ceil(M/128), 4*ceil(K/128));
* **grouped** (``G`` = ``--groups``, 8 by default): ``group_end_offsets`` of skewed, unaligned group
  sizes (``bench.common.groups.skewed_group_sizes``; the last end is M) -> scales in the M-groups
  layout (M + 128*G, Cp).

Bytes moved = x bytes read + q bytes written + scale bytes written. Before timing, our output is
compared byte for byte with ``torch_bindings.reference.quantize_mxfp8_2d`` (same arguments); a
mismatch marks the row ``FAIL`` (the row is still timed). Everything is timed with
:func:`bench.common.timing.time_cuda_detailed` (CUDA-graph replays, inputs rotated past the L2)
next to a device copy of the same number of bytes, in the same run. The copy is
:func:`bench.common.baselines.copy_baseline_best`: the fastest of ``--copy-tries`` copies of that
size and of a size 112 KiB larger (scaled back), because on an H200 the 1358 MiB-each-way copy of the
(131072, 7168) ungrouped row ran at 2.77 TB/s run after run, and 112 KiB more at 4.3 TB/s.

Baselines
---------
* **torch.compile(reference)**: the reference's own building blocks compiled by Inductor
  (default mode, M marked dynamic, one compile per K and variant): ``reference.e8m0_scale_bits``
  and ``reference.quantize_blocks`` on the whole tensor (the reference's ``_quantize_rows`` without
  its 16M-element chunk loop, which Dynamo would unroll), then the blocked layout exactly as in
  ``reference.to_blocked`` and, for groups, as in ``reference.swizzle_m_groups`` (its helpers
  ``_starts``, ``_padded_prefix``, ``_group_of``), with two changes that keep it one graph: the
  last group end is taken as M (true for this benchmark's offsets) instead of being read from the
  device (``int(ends[-1])`` syncs, as does ``check_group_end_offsets``), and the scales stay uint8
  inside the graph (Inductor cannot generate code for ``float8_e8m0fnu``, so ``to_blocked``'s final
  view is done outside). Its output is checked against the reference too (a note if it differs).
* **torchao** (when it imports), the first of these that runs on the device, per mode:

  - ungrouped: ``torchao.prototype.moe_training.kernels.mxfp8.mxfp8_quantize_2d_1x32_cutedsl(x,
    scaling_mode=mode)`` (fused CuTeDSL kernel writing blocked scales; torchao gates it to SM 10.x);
    then ``torchao.prototype.mx_formats.kernels.triton_to_mxfp8_dim0`` +
    ``triton_mx_block_rearrange`` (Triton, SM 10.x only); then torchao's EMULATED path,
    ``torch.compile(torchao.prototype.mx_formats.mx_tensor.to_mx)(x, float8_e4m3fn, 32, mode,
    is_swizzled_scales=True)``, which runs anywhere.
  - grouped: the CuTeDSL kernel with plain scales + ``triton_mx_block_rearrange_2d_M_groups``
    (SM 10.x only); ``triton_to_mxfp8_dim0`` + ``triton_mx_block_rearrange_2d_M_groups``;
    ``torch.compile(to_mx)`` + ``triton_mx_block_rearrange_2d_M_groups``.

  Which path ran (and why the others did not) is in each row's ``torchao_path``/``note`` and in
  the JSON metadata. torchao's numerics are not the SPEC's in every case: a byte mismatch with
  the reference is a note, not a failure.

Goals (printed at the end): ratio to copy >= 0.90 for M*K >= 32768*2048 and >= 0.75 below; grouped
within 5% of ungrouped (grouped/ungrouped time <= 1.05); >= 4x faster than torch.compile of the
reference.

Run (GPU machine, project root on PYTHONPATH)::

    python -m bench.bench_quantize_2d [--quick] [--out DIR] [--iters N] [--modes floor rceil]
        [--m 8192 ...] [--k 2048 ...] [--groups 8] [--no-compile] [--no-torchao] [--no-check]
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench.common.baselines import copy_baseline_best, copy_suspect_note, raise_recompile_limit
from bench.common.cli import add_bench_args, make_parser, output_paths, progress, timing_kwargs
from bench.common.device import cuda_or_none
from bench.common.groups import skewed_group_sizes
from bench.common.report import report
from bench.common.rowlog import diff_bytes, finish, progress_row, short_error
from bench.common.rows import BASELINE_COLUMNS, RATE_COLUMNS, RATE_SERIES, is_fail, make_row
from bench.common.timing import make_rotating_inputs, time_cuda_detailed
from cute_kernels.op_specs import scales_shape_1x32

ACT_M: tuple[int, ...] = (8192, 32768, 131072)
ACT_K: tuple[int, ...] = (2048, 5120, 7168)
#: ``--quick``: one K (one compile per baseline), both goal tiers.
QUICK_SHAPES: tuple[tuple[int, int], ...] = ((8192, 7168), (32768, 7168), (131072, 7168))
MODES: tuple[str, ...] = ("floor", "rceil")
DEFAULT_MODES: tuple[str, ...] = ("rceil",)
DEFAULT_GROUPS = 8
BLOCK = 32

#: Goals of issue 3.
GOAL_RATIO_BIG = 0.90
GOAL_RATIO_SMALL = 0.75
GOAL_BIG_ELEMS = 32768 * 2048
GOAL_GROUPED_SLOWDOWN = 1.05
GOAL_COMPILE_SPEEDUP = 4.0

COLUMNS: list[tuple[str, str]] = (
    [("mode", "mode"), ("shape", "shape"), ("G", "G")]
    + RATE_COLUMNS
    + [
        ("grouped_time_ratio", "grouped/ungrouped"),
        ("compile_us", "compile(ref) us"),
        ("compile_speedup", "speedup vs compile"),
    ]
    + BASELINE_COLUMNS
)

PLOT_SERIES: tuple[tuple[str, str], ...] = RATE_SERIES + (
    ("compile_gbps", "torch.compile(reference)"),
    ("baseline_gbps", "torchao"),
)


@dataclass(frozen=True)
class QuantCase:
    """One benchmark row: a shape, a scaling mode and a grouping.

    Attributes:
        m, k: input shape (M, K), bf16.
        mode: ``"floor"`` or ``"rceil"``.
        groups: number of M-groups ``G`` (0: ungrouped, blocked scales).
        seed: seed of the skewed group sizes.
    """

    m: int
    k: int
    mode: str = "rceil"
    groups: int = 0
    seed: int = 0

    @property
    def elems(self) -> int:
        """M * K."""
        return self.m * self.k

    @property
    def x_bytes(self) -> int:
        """Bytes of the bf16 input."""
        return 2 * self.elems

    @property
    def q_bytes(self) -> int:
        """Bytes of the E4M3 data."""
        return self.elems

    @property
    def scale_shape(self) -> tuple[int, int]:
        """Blocked (Rp, Cp), or the M-groups layout (M + 128*G, Cp) (SPEC sections 3 and 5)."""
        return scales_shape_1x32((self.m, self.k), self.groups or None, True)

    @property
    def scale_bytes(self) -> int:
        """Bytes of the scales (one each)."""
        return math.prod(self.scale_shape)

    @property
    def nbytes_moved(self) -> int:
        """x read + q written + scales written."""
        return self.x_bytes + self.q_bytes + self.scale_bytes

    def group_end_offsets(self) -> list[int]:
        """Host-side end offsets of the skewed, unaligned groups (empty list when ungrouped)."""
        if not self.groups:
            return []
        sizes = skewed_group_sizes(self.m, self.groups, seed=self.seed)
        return [int(v) for v in np.cumsum(sizes)]

    def label(self) -> str:
        """Short human-readable name."""
        g = f" G={self.groups}" if self.groups else ""
        return f"{self.mode} ({self.m}, {self.k}){g}"


def build_shapes(
    quick: bool = False, ms: Sequence[int] | None = None, ks: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """The (M, K) shapes, ordered by K then M (so each K's compiled baselines are built once).

    ``ms``/``ks`` replace the default M/K lists (with ``quick``, they filter ``QUICK_SHAPES``
    when given alone, or replace it when both are given).
    """
    if quick and not (ms and ks):
        shapes = [s for s in QUICK_SHAPES if (not ms or s[0] in ms) and (not ks or s[1] in ks)]
    else:
        shapes = [(m, k) for m in (ms or ACT_M) for k in (ks or ACT_K)]
    for m, k in shapes:
        if m <= 0 or k <= 0 or k % BLOCK:
            raise ValueError(f"bad shape ({m}, {k}): M must be positive and K a positive multiple of 32")
    return sorted(set(shapes), key=lambda s: (s[1], s[0]))


def ratio_goal(elems: int) -> float:
    """The ratio-to-copy goal for an input of ``elems`` = M*K elements."""
    return GOAL_RATIO_BIG if elems >= GOAL_BIG_ELEMS else GOAL_RATIO_SMALL


def add_grouped_ratios(rows: Sequence[dict[str, Any]]) -> None:
    """Set ``grouped_time_ratio`` = grouped us / ungrouped us on every grouped row (same shape, mode)."""
    ungrouped = {(r["mode"], tuple(r["shape"])): r for r in rows if not r.get("groups")}
    for r in rows:
        if not r.get("groups"):
            r["grouped_time_ratio"] = None
            continue
        base = ungrouped.get((r["mode"], tuple(r["shape"])))
        ok = base is not None and base.get("us") and r.get("us")
        r["grouped_time_ratio"] = r["us"] / base["us"] if ok else None


def goal_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Check the three issue-3 goals over ``rows`` (FAIL rows count as missed)."""

    def brief(r: dict[str, Any], key: str) -> dict[str, Any]:
        value = r.get(key)
        return {"mode": r.get("mode"), "shape": r.get("shape"), "G": r.get("G"), "value": value,
                "status": r.get("status")}  # fmt: skip

    ratio_rows = [r for r in rows if r.get("us") is not None or is_fail(r)]
    ratio_miss = [
        r
        for r in ratio_rows
        if is_fail(r) or (r.get("ratio_to_copy") or 0.0) < ratio_goal(int(r.get("elems", 0)))
    ]
    grouped_rows = [r for r in rows if r.get("groups")]
    grouped_miss = [
        r
        for r in grouped_rows
        if is_fail(r)
        or r.get("grouped_time_ratio") is None
        or r["grouped_time_ratio"] > GOAL_GROUPED_SLOWDOWN
    ]
    compile_rows = [r for r in rows if r.get("compile_us") is not None]
    compile_miss = [
        r for r in compile_rows if is_fail(r) or (r.get("compile_speedup") or 0.0) < GOAL_COMPILE_SPEEDUP
    ]
    return {
        "ratio": {
            "goal": (
                f"ratio to copy >= {GOAL_RATIO_BIG} for M*K >= {GOAL_BIG_ELEMS}, >= {GOAL_RATIO_SMALL} below"
            ),
            "rows": len(ratio_rows),
            "met": len(ratio_rows) - len(ratio_miss),
            "missed": [brief(r, "ratio_to_copy") for r in ratio_miss],
        },
        "grouped": {
            "goal": f"grouped / ungrouped time <= {GOAL_GROUPED_SLOWDOWN}",
            "rows": len(grouped_rows),
            "met": len(grouped_rows) - len(grouped_miss),
            "missed": [brief(r, "grouped_time_ratio") for r in grouped_miss],
        },
        "compile": {
            "goal": f">= {GOAL_COMPILE_SPEEDUP:g}x faster than torch.compile(reference)",
            "rows": len(compile_rows),
            "met": len(compile_rows) - len(compile_miss),
            "missed": [brief(r, "compile_speedup") for r in compile_miss],
        },
    }


def format_goal_lines(summary: dict[str, Any]) -> list[str]:
    """Human-readable lines of :func:`goal_summary`."""
    lines = []
    for name in ("ratio", "grouped", "compile"):
        g = summary[name]
        text = f"goal {name} ({g['goal']}): {g['met']}/{g['rows']} rows"
        if not g["rows"]:
            text += " (nothing measured)"
        if g["missed"]:
            text += "; missed: " + ", ".join(
                f"{m['mode']} {tuple(m['shape'])} G={m['G']}: "
                + ("FAIL" if str(m["status"]).startswith("FAIL") else _fmt_any(m["value"]))
                for m in g["missed"]
            )
        lines.append(text)
    return lines


def _fmt_any(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else ("n/a" if v is None else str(v))


# --------------------------------------------------------------------------------------------
# torch.compile of the reference (see the module docstring for what is compiled)
# --------------------------------------------------------------------------------------------


def _blocked_u8(ref_mod: Any, bits: torch.Tensor) -> torch.Tensor:
    """``reference.to_blocked`` of a 2D uint8 matrix, without its final e8m0 view (stays uint8)."""
    r, c = bits.shape
    rp, cp = ref_mod.blocked_shape(r, c)
    padded = bits.new_zeros((rp, cp))
    padded[:r, :c] = bits
    tiles = padded.view(rp // ref_mod.TILE_ROWS, 4, 32, cp // ref_mod.TILE_COLS, ref_mod.TILE_COLS)
    return tiles.permute(0, 3, 2, 1, 4).reshape(rp, cp)


def _ref_rows_core(ref_mod: Any, x: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference._quantize_rows`` in one piece: q (M, K) e4m3 and scales (M, K/32) uint8."""
    m, k = x.shape
    xb = x.to(torch.float32).view(m, k // BLOCK, BLOCK)
    s = ref_mod.e8m0_scale_bits(xb.abs().amax(dim=-1), mode)
    q = ref_mod.quantize_blocks(xb, s, dim=-1).view(m, k)
    return q, s


def _ref_ungrouped(ref_mod: Any, x: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    q, s = _ref_rows_core(ref_mod, x, mode)
    return q, _blocked_u8(ref_mod, s)


def _ref_grouped(
    ref_mod: Any, x: torch.Tensor, ends: torch.Tensor, mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.swizzle_m_groups`` of the scales with ``ends[-1] == M`` assumed (no sync)."""
    q, s = _ref_rows_core(ref_mod, x, mode)
    m, c = s.shape
    ends64 = ends.to(torch.int64)
    starts = ref_mod._starts(ends64)
    p, _ = ref_mod._padded_prefix(ends64, ref_mod.TILE_ROWS)
    rows = torch.arange(m, dtype=torch.int64, device=x.device)
    g = ref_mod._group_of(rows, ends64)
    out_rows = m + ref_mod.TILE_ROWS * ends.shape[0]
    _, cp = ref_mod.blocked_shape(m, c)
    placed = s.new_zeros((ref_mod.blocked_shape(out_rows, c)[0], c))
    placed.index_copy_(0, p[g] + rows - starts[g], s)
    flat = _blocked_u8(ref_mod, placed).reshape(-1)[: out_rows * cp]
    return q, flat.view(out_rows, cp)


def make_compiled_reference(ref_mod: Any) -> dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]]:
    """``{"ungrouped": f(x, mode), "grouped": f(x, ends, mode)}`` compiled with ``torch.compile``.

    Both return ``(q e4m3, scales e8m0)``; the e8m0 view happens outside the compiled graph.
    """
    c_ung = torch.compile(lambda x, mode: _ref_ungrouped(ref_mod, x, mode))
    c_grp = torch.compile(lambda x, ends, mode: _ref_grouped(ref_mod, x, ends, mode))

    def ungrouped(x: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
        q, s = c_ung(x, mode)
        return q, s.view(torch.float8_e8m0fnu)

    def grouped(x: torch.Tensor, ends: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
        q, s = c_grp(x, ends, mode)
        return q, s.view(torch.float8_e8m0fnu)

    return {"ungrouped": ungrouped, "grouped": grouped}


# --------------------------------------------------------------------------------------------
# torchao baselines
# --------------------------------------------------------------------------------------------

_TAO_QUANT = "torchao.prototype.moe_training.kernels.mxfp8.quant"
_TAO_CUTEDSL = "torchao.prototype.moe_training.kernels.mxfp8.cutedsl_quantize_2d_1x32"
_TAO_MX_KERNELS = "torchao.prototype.mx_formats.kernels"
_TAO_MX_TENSOR = "torchao.prototype.mx_formats.mx_tensor"
_TAO_MX_CONFIG = "torchao.prototype.mx_formats.config"


class TorchaoBaselines:
    """torchao's MXFP8 1x32 quantizers that produce blocked scales, tried in order per variant and mode.

    ``get(grouped, mode)`` returns ``(name, fn)`` with ``fn(x, offs)`` -> ``(q, scales)``, or
    ``(None, None)``; a candidate that raises is dropped for that (variant, mode) and the reason
    is kept in ``info["unavailable"]``.
    """

    def __init__(self) -> None:
        import importlib

        self.info: dict[str, Any] = {"errors": {}, "unavailable": {}, "chosen": {}, "flags": {}}
        self.mods: dict[str, Any] = {}
        self.ok = False
        try:
            import torchao

            self.info["version"] = getattr(torchao, "__version__", "unknown")
        except Exception as exc:  # noqa: BLE001 - any failure means: no baseline
            self.info["errors"]["import"] = short_error(exc)
            return
        self.ok = True
        for key, name in (
            ("quant", _TAO_QUANT),
            ("kernels", _TAO_MX_KERNELS),
            ("mx_tensor", _TAO_MX_TENSOR),
            ("config", _TAO_MX_CONFIG),
        ):
            try:
                self.mods[key] = importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001
                self.info["errors"][name] = short_error(exc)
        for key, flag in (
            ("quant", "_mxfp8_cutedsl_kernels_available"),
            ("quant", "_mxfp8_cuda_kernels_available"),
            ("kernels", "_triton_kernels_available"),
            ("kernels", "_mxfp8_cuda_kernels_available"),
        ):
            mod = self.mods.get(key)
            if mod is not None and hasattr(mod, flag):
                self.info["flags"][f"{mod.__name__}.{flag}"] = bool(getattr(mod, flag))
        self.info["signatures"] = self._signatures()
        self._compiled: dict[tuple[str, bool], Callable[..., Any]] = {}
        self._dead: set[tuple[str, bool, str]] = set()

    def _signatures(self) -> dict[str, str]:
        import inspect

        out: dict[str, str] = {}
        for key, attr in (
            ("quant", "mxfp8_quantize_2d_1x32_cutedsl"),
            ("quant", "triton_mx_block_rearrange_2d_M_groups"),
            ("kernels", "triton_to_mxfp8_dim0"),
            ("kernels", "triton_mx_block_rearrange"),
            ("mx_tensor", "to_mx"),
        ):
            fn = getattr(self.mods.get(key), attr, None)
            if fn is None:
                continue
            try:
                out[f"{self.mods[key].__name__}.{attr}"] = str(inspect.signature(fn))
            except (TypeError, ValueError):
                out[f"{self.mods[key].__name__}.{attr}"] = "(signature unavailable)"
        return out

    def reset_compiled(self) -> None:
        """Forget compiled functions (after ``torch._dynamo.reset()``)."""
        self._compiled.clear()

    # --- candidates -------------------------------------------------------------------------

    def _attr(self, key: str, attr: str) -> Callable[..., Any]:
        mod = self.mods.get(key)
        if mod is None or not hasattr(mod, attr):
            raise RuntimeError(f"{key}.{attr} not found in this torchao")
        return getattr(mod, attr)

    def _candidates(self, grouped: bool, mode: str) -> list[tuple[str, Callable[[], Callable[..., Any]]]]:
        """``(name, builder)`` pairs; ``builder()`` returns ``fn(x, offs)`` or raises why it cannot."""
        sm10x = torch.cuda.get_device_capability()[0] == 10

        def cutedsl_fused() -> Callable[..., Any]:
            fn = self._attr("quant", "mxfp8_quantize_2d_1x32_cutedsl")
            return lambda x, offs: fn(x, scaling_mode=mode)

        def cutedsl_plain_m_groups() -> Callable[..., Any]:
            if not sm10x:
                raise RuntimeError(
                    "torchao gates its CuTeDSL quantize kernels to SM 10.x "
                    "(Blackwell TMA cta_group loads, cvt.rp.satfinite.ue8m0x2)"
                )
            import importlib

            quant2d = importlib.import_module(_TAO_CUTEDSL).mxfp8_quantize_cutedsl_2d_1x32
            rearrange = self._attr("quant", "triton_mx_block_rearrange_2d_M_groups")

            def fn(x: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                q, s = quant2d(x, scaling_mode=mode, blocked_scale_output=False)
                return q, rearrange(s.view(torch.uint8), offs)

            return fn

        def triton_dim0() -> Callable[..., Any]:
            quant = self._attr("kernels", "triton_to_mxfp8_dim0")
            if grouped:
                rearrange = self._attr("quant", "triton_mx_block_rearrange_2d_M_groups")
            else:
                rearrange = self._attr("kernels", "triton_mx_block_rearrange")

            def fn(x: torch.Tensor, offs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
                q, s = quant(x, 32, mode)
                s8 = s.view(torch.uint8)
                return q, (rearrange(s8, offs) if grouped else rearrange(s8))

            return fn

        def emulated() -> Callable[..., Any]:
            to_mx = self._attr("mx_tensor", "to_mx")
            scm = self._attr("config", "ScaleCalculationMode")(mode)
            key = (mode, grouped)
            if key not in self._compiled:

                def quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                    s, q = to_mx(x, torch.float8_e4m3fn, 32, scm, is_swizzled_scales=not grouped)
                    return q, s

                self._compiled[key] = torch.compile(quant)
            compiled = self._compiled[key]
            if not grouped:
                return lambda x, offs: compiled(x)
            rearrange = self._attr("quant", "triton_mx_block_rearrange_2d_M_groups")

            def fn(x: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                q, s = compiled(x)
                return q, rearrange(s.view(torch.uint8), offs)

            return fn

        if grouped:
            return [
                (
                    "cutedsl mxfp8_quantize_cutedsl_2d_1x32 + triton_mx_block_rearrange_2d_M_groups",
                    cutedsl_plain_m_groups,
                ),
                ("triton_to_mxfp8_dim0 + triton_mx_block_rearrange_2d_M_groups", triton_dim0),
                ("emulated: torch.compile(to_mx) + triton_mx_block_rearrange_2d_M_groups", emulated),
            ]
        return [
            ("cutedsl mxfp8_quantize_2d_1x32_cutedsl (fused, blocked)", cutedsl_fused),
            ("triton_to_mxfp8_dim0 + triton_mx_block_rearrange", triton_dim0),
            ("emulated: torch.compile(to_mx, is_swizzled_scales=True)", emulated),
        ]

    def run_first(
        self, grouped: bool, mode: str, x: torch.Tensor, offs: torch.Tensor | None
    ) -> tuple[str | None, Callable[..., Any] | None, Any]:
        """Call the candidates on ``x`` until one works: ``(name, fn, output)`` or ``(None, None, None)``."""
        if not self.ok:
            return None, None, None
        variant = "grouped" if grouped else "ungrouped"
        for name, builder in self._candidates(grouped, mode):
            if (name, grouped, mode) in self._dead:
                continue
            try:
                fn = builder()
                out = fn(x, offs)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - next candidate
                self._dead.add((name, grouped, mode))
                self.info["unavailable"][f"{variant}/{mode}: {name}"] = short_error(exc)
                progress(f"    torchao {variant}/{mode} '{name}' unavailable: {short_error(exc)}")
                try:
                    torch.cuda.synchronize()
                except Exception:  # noqa: BLE001
                    pass
                continue
            self.info["chosen"][f"{variant}/{mode}"] = name
            return name, fn, out
        return None, None, None


# --------------------------------------------------------------------------------------------
# One shape
# --------------------------------------------------------------------------------------------


def make_input(m: int, k: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """bf16 (M, K): ``randn`` times 2^e, e uniform in [-12, 12] per 32-element block."""
    gen = torch.Generator(device=device)
    gen.manual_seed(31337 + 7 * seed + m + 3 * k)
    x = torch.randn((m, k // BLOCK, BLOCK), generator=gen, device=device, dtype=torch.bfloat16)
    e = torch.randint(-12, 13, (m, k // BLOCK, 1), generator=gen, device=device)
    x.mul_(torch.exp2(e.to(torch.float32)).to(torch.bfloat16))
    return x.view(m, k)


def _spread(t: Any) -> dict[str, Any]:
    return {
        "min": min(t.samples_us),
        "max": max(t.samples_us),
        "input_sets": t.input_sets,
        "calls_per_sample": t.calls_per_sample,
    }


@dataclass
class _BaselineRun:
    """What timing a baseline for one case needs: the case and its inputs (``x``, ``offs``, the
    rotated ``sets``), the reference output ``ref`` to compare with (``None``: unchecked), the timing
    options, and the row's ``methods`` and ``notes`` that the timings add to."""

    case: QuantCase
    x: torch.Tensor
    offs: torch.Tensor | None
    ref: tuple[torch.Tensor, torch.Tensor] | None
    sets: Sequence[tuple[Any, ...]]
    timing: dict[str, Any]
    methods: dict[str, str]
    notes: list[str]


def _time_compiled_ref(compiled_ref: dict[str, Callable[..., Any]], run: _BaselineRun) -> float | None:
    """Microseconds of ``torch.compile(reference)`` for ``run.case`` (``None`` if it raised, noted);
    its output is compared with ``run.ref`` (a difference is a note)."""
    case, offs, ref, notes = run.case, run.offs, run.ref, run.notes
    mode = case.mode
    if case.groups > 0:

        def cfn(xx: torch.Tensor) -> Any:
            return compiled_ref["grouped"](xx, offs, mode)
    else:

        def cfn(xx: torch.Tensor) -> Any:
            return compiled_ref["ungrouped"](xx, mode)

    try:
        t0 = time.perf_counter()
        cout = cfn(run.x)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        if first_s > 2.0:
            progress(f"    torch.compile(reference) first call (compile) {first_s:.1f} s")
        if ref is not None:
            why = diff_bytes(cout[0], ref[0]) or diff_bytes(cout[1], ref[1], case.scale_shape)
            if why:
                notes.append(f"compile(ref) output differs: {why}")
        del cout
        t = time_cuda_detailed(cfn, run.sets, **run.timing)
        run.methods["compile"] = t.method
        return t.us
    except Exception as exc:  # noqa: BLE001
        notes.append(f"compile(ref) n/a: {short_error(exc)}")
        progress(f"    torch.compile(reference) n/a: {short_error(exc)}")
        return None


def _time_torchao(torchao: TorchaoBaselines, run: _BaselineRun) -> tuple[float | None, str | None]:
    """torchao's microseconds and path name for ``run.case`` (``None`` us where it cannot run,
    noted); its output is compared with ``run.ref`` (a difference is a note)."""
    offs, ref, notes = run.offs, run.ref, run.notes
    base_name, base_fn, bout = torchao.run_first(run.case.groups > 0, run.case.mode, run.x, offs)
    if base_fn is None:
        notes.append("torchao n/a (see meta.torchao.unavailable)")
        return None, base_name
    try:
        if ref is not None:
            why = diff_bytes(bout[0], ref[0]) or diff_bytes(bout[1], ref[1])
            if why:
                notes.append(f"torchao output differs: {why}")
        del bout

        def tfn(xx: torch.Tensor) -> Any:
            return base_fn(xx, offs)

        t = time_cuda_detailed(tfn, run.sets, **run.timing)
        run.methods["torchao"] = t.method
        return t.us, base_name
    except Exception as exc:  # noqa: BLE001
        notes.append(f"torchao n/a: {short_error(exc)}")
        return None, base_name


def bench_variant(
    case: QuantCase,
    x: torch.Tensor,
    offs: torch.Tensor | None,
    sets: Sequence[tuple[Any, ...]],
    tb: Any,
    ref_mod: Any,
    compiled_ref: dict[str, Callable[..., Any]] | None,
    torchao: TorchaoBaselines | None,
    timing: dict[str, Any],
    device: torch.device,
    check: bool = True,
    backend: str = "cute",
    copy_tries_n: int = 2,
) -> dict[str, Any]:
    """Check and time one (shape, mode, grouping); return its row (never raises for kernel failures)."""
    grouped = case.groups > 0
    mode = case.mode
    expected_scales = case.scale_shape
    notes: list[str] = []
    methods: dict[str, str] = {}
    status = "ok"

    def ours(xx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tb.quantize_mxfp8_2d(xx, group_end_offsets=offs, scaling_mode=mode, backend=backend)

    # --- our output, checked against the reference -------------------------------------------
    ran = True
    out: tuple[torch.Tensor, torch.Tensor] | None = None
    ref: tuple[torch.Tensor, torch.Tensor] | None = None
    try:
        out = ours(x)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        ran = False
        status = f"FAIL: raised {short_error(exc)}"
        traceback.print_exc(file=sys.stderr)
    if check:
        try:
            ref = ref_mod.quantize_mxfp8_2d(x, group_end_offsets=offs, scaling_mode=mode)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"reference raised {short_error(exc)}")
            if ran:
                status = "FAIL: reference check raised"
    if ran and out is not None and ref is not None:
        why_q = diff_bytes(out[0], ref[0], (case.m, case.k))
        why_s = diff_bytes(out[1], ref[1], expected_scales)
        if out[0].dtype != torch.float8_e4m3fn or out[1].dtype != torch.float8_e8m0fnu:
            notes.append(f"output dtypes {out[0].dtype}, {out[1].dtype}")
        if why_q or why_s:
            status = "FAIL: " + "; ".join(
                f"{what} {why}" for what, why in (("q", why_q), ("scales", why_s)) if why
            )
    elif ran and not check:
        notes.append("not checked")
    del out

    # --- timings --------------------------------------------------------------------------------
    our_us: float | None = None
    spread: dict[str, Any] | None = None
    if ran:
        try:
            t = time_cuda_detailed(ours, sets, **timing)
            our_us, spread = t.us, _spread(t)
            methods["ours"] = t.method
            if t.fallback_reason:
                notes.append(f"ours: {t.fallback_reason}")
        except Exception as exc:  # noqa: BLE001
            status = f"FAIL: timing raised {short_error(exc)}"
            traceback.print_exc(file=sys.stderr)

    baseline_run = _BaselineRun(case, x, offs, ref, sets, timing, methods, notes)
    compile_us: float | None = None
    if compiled_ref is not None:
        compile_us = _time_compiled_ref(compiled_ref, baseline_run)

    base_us: float | None = None
    base_name: str | None = None
    if torchao is not None:
        base_us, base_name = _time_torchao(torchao, baseline_run)

    del ref
    torch.cuda.empty_cache()
    copy, copy_tries = copy_baseline_best(case.nbytes_moved, device, tries=copy_tries_n, **timing)
    methods["copy"] = copy.method

    row = make_row(
        mode=mode,
        shape=(case.m, case.k),
        G=case.groups if grouped else "-",
        nbytes=case.nbytes_moved,
        us=our_us,
        copy_us=copy.us,
        baseline_us=base_us,
        status=status,
    )
    row["groups"] = case.groups
    row["elems"] = case.elems
    row["ratio_goal"] = ratio_goal(case.elems)
    row["scales_shape"] = tuple(expected_scales)
    row["group_end_offsets"] = case.group_end_offsets() if grouped else None
    row["compile_us"] = compile_us
    row["compile_gbps"] = case.nbytes_moved / (compile_us * 1e3) if compile_us else None
    row["compile_speedup"] = compile_us / our_us if compile_us and our_us else None
    row["torchao_path"] = base_name
    row["copy_us_tries"] = copy_tries
    suspect = copy_suspect_note(row, copy_tries)
    if suspect:
        notes.append(suspect)
    row["timing_methods"] = methods
    if spread is not None:
        row["our_us_spread"] = spread
    row["note"] = "; ".join(notes)
    return row


def bench_shape(
    m: int,
    k: int,
    modes: Sequence[str],
    groups: int,
    tb: Any,
    ref_mod: Any,
    compiled_ref: dict[str, Callable[..., Any]] | None,
    torchao: TorchaoBaselines | None,
    timing: dict[str, Any],
    device: torch.device,
    check: bool,
    backend: str,
    index: str = "",
    copy_tries: int = 2,
) -> list[dict[str, Any]]:
    """All rows of one (M, K): every mode, ungrouped then grouped, sharing the rotated inputs."""
    x = make_input(m, k, device)
    cases = []
    for mode in modes:
        cases.append(QuantCase(m, k, mode))
        if groups:
            cases.append(QuantCase(m, k, mode, groups=groups))
    offs_list = cases[-1].group_end_offsets() if groups else []
    offs = torch.tensor(offs_list, dtype=torch.int32, device=device) if groups else None

    first = [True]

    def make() -> tuple[torch.Tensor]:
        if first[0]:
            first[0] = False
            return (x,)
        return (x.clone(),)

    per_set = max(c.nbytes_moved for c in cases)
    sets = make_rotating_inputs(make, bytes_per_set=per_set)
    for s in sets:
        torch._dynamo.maybe_mark_dynamic(s[0], 0)  # one compile per K for the compiled baselines

    rows = []
    for case in cases:
        progress(
            f"{index}{case.label()}: {case.nbytes_moved / 1e6:.1f} MB moved, {len(sets)} input set(s) ..."
        )
        row = bench_variant(
            case, x, offs if case.groups else None, sets, tb, ref_mod, compiled_ref, torchao,
            timing, device, check=check, backend=backend, copy_tries_n=copy_tries,
        )  # fmt: skip
        rows.append(row)
        progress_row(row, (("compile(ref)", "compile_us"), ("torchao", "baseline_us")))
    return rows  # x and the rotated copies are freed on return; the caller empties the cache


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 1 if any row FAILed, 2 without a GPU, else 0."""
    parser = make_parser(
        "Benchmark torch_bindings.quantize_mxfp8_2d (1x32, blocked / M-groups scales) against a device "
        "copy, torch.compile of the reference and torchao."
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(DEFAULT_MODES),
        help="scaling modes (default: rceil)",
    )
    parser.add_argument("--m", type=int, nargs="+", default=None, metavar="M", help="token counts M")
    parser.add_argument("--k", type=int, nargs="+", default=None, metavar="K", help="hidden sizes K")
    parser.add_argument(
        "--groups", type=int, default=DEFAULT_GROUPS, help="G of the grouped rows; 0: none (default: 8)"
    )
    parser.add_argument(
        "--no-compile", action="store_true", help="skip the torch.compile(reference) baseline"
    )
    add_bench_args(parser, op="quantize_mxfp8_2d")
    args = parser.parse_args(argv)
    if args.groups < 0:
        parser.error("--groups must be >= 0")
    shapes = build_shapes(args.quick, args.m, args.k)

    device = cuda_or_none("bench_quantize_2d")
    if device is None:
        return 2
    import torch_bindings
    import torch_bindings.reference as ref_mod

    raise_recompile_limit()
    torchao: TorchaoBaselines | None = None
    torchao_info: dict[str, Any] = {"skipped": True}
    if not args.no_torchao:
        torchao = TorchaoBaselines()
        torchao_info = torchao.info
        for what, err in torchao_info["errors"].items():
            progress(f"torchao {what} unavailable: {err}")

    compile_info: dict[str, Any] = {"skipped": args.no_compile}
    if not args.no_compile:
        compile_info["what"] = (
            "torch.compile (Inductor, default mode, M dynamic) of reference.e8m0_scale_bits + "
            "reference.quantize_blocks on the whole tensor, then reference.to_blocked's permutation "
            "(uint8) or, grouped, reference.swizzle_m_groups' placement with ends[-1] == M (no sync)"
        )

    timing = timing_kwargs(args)
    rows: list[dict[str, Any]] = []
    current_k: int | None = None
    compiled_ref: dict[str, Callable[..., Any]] | None = None
    start = time.perf_counter()
    for i, (m, k) in enumerate(shapes, 1):
        if k != current_k:
            # A fresh Dynamo state per K: K stays static (no automatic-dynamic recompiles).
            current_k = k
            torch._dynamo.reset()
            if torchao is not None:
                torchao.reset_compiled()
            compiled_ref = None if args.no_compile else make_compiled_reference(ref_mod)
        rows.extend(
            bench_shape(
                m,
                k,
                args.modes,
                args.groups,
                torch_bindings,
                ref_mod,
                compiled_ref,
                torchao,
                timing,
                device,
                check=not args.no_check,
                backend=args.backend,
                index=f"[{i}/{len(shapes)}, {time.perf_counter() - start:.0f} s] ",
                copy_tries=args.copy_tries,
            )  # fmt: skip
        )
        torch.cuda.empty_cache()
    add_grouped_ratios(rows)
    rows.sort(key=lambda r: (r["mode"], r["shape"][0], r["shape"][1], r["groups"]))

    summary = goal_summary(rows)
    json_path, png_path = output_paths(args.out, "quantize_2d")
    report(
        rows,
        COLUMNS,
        "quantize_mxfp8_2d: bf16 (M, K) -> e4m3 + blocked e8m0 scales (1x32)",
        json_path,
        png_path,
        label_keys=("shape", "G"),
        plot_series=PLOT_SERIES,
        panel_key="mode",
        meta={
            "benchmark": "quantize_2d",
            "backend": args.backend,
            "modes": list(args.modes),
            "groups": args.groups,
            "torchao": torchao_info,
            "compile": compile_info,
            "goal": summary,
            "quick": args.quick,
            "seconds": time.perf_counter() - start,
        },
    )
    lines = format_goal_lines(summary)
    if torchao is not None:
        lines += [f"torchao {variant}: {name}" for variant, name in torchao_info.get("chosen", {}).items()]
        if not torchao_info.get("chosen"):
            why = "; ".join(f"{k}: {v}" for k, v in torchao_info["unavailable"].items())
            lines.append(f"torchao: n/a ({why})")
    lines.append(f"({time.perf_counter() - start:.0f} s)")
    return finish(rows, lambda r: f"{r['mode']} {r['shape']} G={r['G']}", lines, (json_path, png_path))


if __name__ == "__main__":
    sys.exit(main())
