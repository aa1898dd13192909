"""``bench_overhead`` of two trees, run by run in alternation: is a change's host time no worse?

SPEC section 6 judges one tree. A change to the eager path must also not be slower than the tree
before it, and on a busy host one run moves a row's ratio by a few hundredths. So this script runs
``python -m bench.bench_overhead --runs R`` from the base tree and from this tree in turn. Each
pair swaps which tree goes first, so the host's drift over the session falls on both trees alike.
It then prints, per row, the ratio-to-floor medians of both trees and their difference, the mean
difference per pair, and a verdict.

The verdict comes from the mean difference (head - base, over the rows) of each pair: **no
worse** when every pair's is at most ``--tolerance`` (default 0.005, i.e. 0.5% of a floor);
**worse** when every pair's is above it; **unresolved** otherwise (run more pairs). At least two
pairs, so that each tree goes first once.

    python -m bench.overhead_ab --base REV [--pairs 4] [--runs 3] [--cpu-mock]   # needs git
    python -m bench.overhead_ab --base-tree DIR ...                                # a tree you made

``--base REV`` writes ``git archive REV`` of the packages into a temporary folder, which the
script removes afterwards, as it does the runs' JSON files. On a machine without the repository's
history, pass ``--base-tree``: for example ``git archive REV cute_kernels cute_utils torch_bindings
bench | tar x -C DIR``, made beforehand and carried along.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cute_kernels", "cute_utils", "torch_bindings", "bench")


def ratios_of(doc: dict) -> dict[str, float]:
    """``{row: ratio}`` from ``bench_overhead``'s JSON (``{"rows": [{"call", "ratio", ...}]}``); rows
    without a number there (the scale rows, an op that raised) are left out."""
    return {
        row["call"]: float(row["ratio"])
        for row in doc.get("rows", [])
        if isinstance(row.get("ratio"), (int, float)) and not isinstance(row.get("ratio"), bool)
    }


def run_tree(tree: Path, runs: int, cpu_mock: bool, timeout: int, out: Path) -> dict[str, float]:
    """One ``bench_overhead --runs runs`` from ``tree``, which comes first on the import path; its
    JSON goes to ``out`` (a scratch folder), not to either tree."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    )
    cmd = [sys.executable, "-m", "bench.bench_overhead", "--runs", str(runs), "--out", str(out)]
    result = out / "bench_overhead.json"
    result.unlink(missing_ok=True)  # a failed run must not leave the previous run's rows to be read
    out_run = subprocess.run(
        cmd + (["--cpu-mock"] if cpu_mock else []),
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    rows = ratios_of(json.loads(result.read_text())) if result.exists() else {}
    if not rows:
        tail = out_run.stderr[-2000:]
        raise RuntimeError(f"bench_overhead in {tree} wrote no ratios (exit {out_run.returncode}):\n{tail}")
    return rows


def summarize(
    base: list[dict[str, float]],
    head: list[dict[str, float]],
    tolerance: float,
) -> tuple[str, str]:
    """``(table, verdict)`` of the runs (``base[i]`` and ``head[i]``: pair i): per-row medians and
    their difference, per-pair mean differences (head - base over the rows every run has) and the
    module docstring's verdict."""
    names = [n for n in base[0] if all(n in r for r in base + head)]
    lines = ["| row | base median | head median | head - base |", "|---|---|---|---|"]
    diffs = []
    for name in names:
        b = statistics.median(r[name] for r in base)
        h = statistics.median(r[name] for r in head)
        diffs.append(h - b)
        lines.append(f"| {name} | {b:.3f} | {h:.3f} | {h - b:+.3f} |")
    per_pair = [statistics.fmean(h[n] - b[n] for n in names) for b, h in zip(base, head, strict=True)]
    left_out = sorted(set().union(*base, *head) - set(names))
    lines.append("")
    lines.append("per pair (head - base, mean over rows): " + ", ".join(f"{d:+.3f}" for d in per_pair))
    lines.append(f"rows where head's median is higher: {sum(d > 0 for d in diffs)} of {len(diffs)}")
    if left_out:
        lines.append(f"rows not in every run, left out: {', '.join(left_out)}")
    spread = f"pairs {min(per_pair):+.4f} .. {max(per_pair):+.4f}, tolerance {tolerance}"
    if max(per_pair) <= tolerance:
        verdict = f"no worse: {spread}"
    elif min(per_pair) > tolerance:
        verdict = f"worse: {spread}"
    else:
        verdict = f"unresolved: {spread} (run more pairs)"
    return "\n".join(lines), verdict


def _base_tree(args: argparse.Namespace, scratch: Path) -> Path:
    """The base tree: ``--base-tree``, or ``git archive`` of ``--base`` unpacked under ``scratch``;
    ``SystemExit`` when it lacks one of the packages (the head's copy would be imported instead)."""
    if args.base_tree is not None:
        tree = Path(args.base_tree).resolve()
    else:
        tree = scratch / "base"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", args.base, *PACKAGES], cwd=ROOT, capture_output=True)
        if archive.returncode:
            raise SystemExit(f"git archive {args.base} failed: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-f", "-", "-C", str(tree)], input=archive.stdout, check=True)
    missing = [pkg for pkg in PACKAGES if not (tree / pkg / "__init__.py").is_file()]
    if missing:
        raise SystemExit(f"base tree {tree} lacks {', '.join(missing)}: it needs {', '.join(PACKAGES)}")
    return tree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--base", help="git revision of the base tree")
    where.add_argument("--base-tree", help="a folder holding the base tree's packages")
    p.add_argument("--pairs", type=int, default=4, help="alternating pairs of runs, at least 2 (default 4)")
    p.add_argument("--runs", type=int, default=3, help="bench_overhead --runs per run (default 3)")
    p.add_argument("--cpu-mock", action="store_true", help="bench_overhead --cpu-mock (no GPU)")
    p.add_argument("--tolerance", type=float, default=0.005, help="mean ratio difference allowed")
    p.add_argument("--timeout", type=int, default=600, help="seconds per bench_overhead run")
    args = p.parse_args(argv)
    if not args.cpu_mock:
        from bench.common.device import cuda_or_none

        if cuda_or_none("overhead_ab (or pass --cpu-mock)") is None:
            return 2
    if args.pairs < 2:
        p.error("--pairs must be at least 2 (each tree goes first once)")
    scratch = Path(tempfile.mkdtemp(prefix="overhead_ab_"))
    try:
        base_tree, base, head = _base_tree(args, scratch), [], []
        for i in range(args.pairs):
            order = [("base", base_tree), ("head", ROOT)]
            got = {}
            for label, tree in order if i % 2 == 0 else order[::-1]:
                print(f"pair {i + 1} of {args.pairs}: {label}", flush=True)
                got[label] = run_tree(tree, args.runs, args.cpu_mock, args.timeout, scratch / "results")
            base.append(got["base"])
            head.append(got["head"])
        table, verdict = summarize(base, head, args.tolerance)
        print(table)
        print(f"verdict: {verdict}")
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
