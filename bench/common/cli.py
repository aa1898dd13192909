"""Command line of the bench scripts: shared options, the results folder and progress lines.

:func:`make_parser` / :func:`add_common_args` add ``--out``, ``--quick``, ``--iters``,
``--warmup``, ``--reps``, ``--no-graph`` and ``--copy-tries``; :func:`add_bench_args` adds the
kernel benches' ``--no-torchao``, ``--no-check`` and ``--backend``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

#: Default output folder for JSON/PNG results (git-ignored): ``bench/results``.
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options every benchmark script shares.

    ``--out DIR`` (default ``bench/results``), ``--quick`` (a few shapes), ``--iters N`` (calls
    per sample), ``--warmup N``, ``--reps N`` (samples; the median is reported) and
    ``--no-graph`` (time eager calls instead of CUDA-graph replays).
    """
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"folder for the JSON and PNG results (default: {RESULTS_DIR})",
    )
    parser.add_argument("--quick", action="store_true", help="run a few representative shapes only")
    parser.add_argument("--iters", type=int, default=100, help="calls per timing sample (default: 100)")
    parser.add_argument("--warmup", type=int, default=10, help="warm-up calls (default: 10)")
    parser.add_argument("--reps", type=int, default=7, help="timing samples; median reported (default: 7)")
    parser.add_argument(
        "--no-graph", dest="use_graph", action="store_false", help="time eager calls, not CUDA-graph replays"
    )
    parser.add_argument(
        "--copy-tries",
        type=int,
        default=2,
        help="copy baseline = fastest of this many sizes, each 112 KiB larger, scaled (default: 2)",
    )
    return parser


def add_bench_args(
    parser: argparse.ArgumentParser,
    *,
    op: str | None = None,
    torchao: bool = True,
    check: bool = True,
    backend: str | None = "cute",
) -> argparse.ArgumentParser:
    """Add the options the kernel benches share on top of :func:`add_common_args`.

    ``--no-torchao`` (when ``torchao``), ``--no-check`` (when ``check``) and ``--backend``
    (choices ``cute``/``auto``/``reference``, default ``backend``; omitted when ``backend`` is
    ``None``). ``op`` names the public function in the help text.
    """
    if torchao:
        parser.add_argument("--no-torchao", action="store_true", help="skip the torchao baseline")
    if check:
        parser.add_argument(
            "--no-check", action="store_true", help="skip the reference check (debugging only)"
        )
    if backend is not None:
        parser.add_argument(
            "--backend",
            default=backend,
            choices=("cute", "auto", "reference"),
            help=f"backend= passed to {op or 'our op'} (default: {backend}; cute times the kernel)",
        )
    return parser


def make_parser(description: str) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with :func:`add_common_args` already applied."""
    parser = argparse.ArgumentParser(description=description)
    return add_common_args(parser)


def add_parts_arg(parser: argparse.ArgumentParser, parts: tuple[str, ...]) -> None:
    """``--parts``: a comma list of ``parts`` (default: all), parsed to a ``frozenset``; an unknown
    name is a usage error rather than a run that measures nothing."""

    def parse(text: str) -> frozenset[str]:
        chosen = frozenset(name.strip() for name in text.split(",") if name.strip())
        unknown = sorted(chosen - set(parts))
        if unknown or not chosen:
            names = ", ".join(parts)
            raise argparse.ArgumentTypeError(f"unknown part(s) {unknown or text!r}; choose from {names}")
        return chosen

    help_text = f"comma list of {', '.join(parts)} (default: all)"
    parser.add_argument("--parts", type=parse, default=frozenset(parts), help=help_text)


def resolve_out_dir(out: str | os.PathLike[str] | argparse.Namespace | None) -> Path:
    """The results folder (``--out`` or ``bench/results``), created if missing."""
    if isinstance(out, argparse.Namespace):
        out = getattr(out, "out", None)
    path = Path(out) if out is not None else RESULTS_DIR
    path.mkdir(parents=True, exist_ok=True)
    return path


def output_paths(out: str | os.PathLike[str] | argparse.Namespace | None, stem: str) -> tuple[Path, Path]:
    """``(DIR/stem.json, DIR/stem.png)`` for the results folder of :func:`resolve_out_dir`."""
    folder = resolve_out_dir(out)
    return folder / f"{stem}.json", folder / f"{stem}.png"


def timing_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``warmup``/``iters``/``reps``/``use_graph`` from parsed common args, for :func:`time_cuda`."""
    return {
        "warmup": args.warmup,
        "iters": args.iters,
        "reps": args.reps,
        "use_graph": args.use_graph,
    }


def progress(message: str) -> None:
    """One progress line on stderr (flushed)."""
    print(message, file=sys.stderr, flush=True)
