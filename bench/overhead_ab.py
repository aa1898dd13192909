"""``bench_overhead`` of two trees, run by run in alternation: is a change's host time no worse?

SPEC section 6 judges one tree. A change to the eager path must also not be slower than the tree
before it, and on a busy host one run moves a row's ratio by a few hundredths. So this script runs
``python -m bench.bench_overhead --runs R`` from the base tree and from this tree in turn. Each
pair swaps which tree goes first, so the host's drift over the session falls on both trees alike.
It then prints, per row, the ratio-to-floor medians of both trees and their difference, the mean
difference per pair, and a verdict.

The verdict is **no worse** when the mean over rows of (head median - base median) is at most
``--tolerance`` (default 0.005, i.e. 0.5% of a floor). Otherwise it is **worse** or **unresolved**:
unresolved when the pairs disagree in sign, so more pairs are needed.

    python -m bench.overhead_ab --base REV [--pairs 4] [--runs 3] [--cpu-mock]   # needs git
    python -m bench.overhead_ab --base-tree DIR ...                                # a tree you made

``--base REV`` writes ``git archive REV`` of the packages into a temporary folder, which the
script removes afterwards. On a machine without the repository's history, pass ``--base-tree``:
for example ``git archive REV cute_kernels cute_utils torch_bindings bench | tar x -C DIR``, made
beforehand and carried along.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cute_kernels", "cute_utils", "torch_bindings", "bench")


def parse_ratios(text: str) -> dict[str, float]:
    """``{row: ratio}`` from ``bench_overhead``'s markdown table (rows without a ratio left out)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 6 or not line.startswith("| ") or cells[1] == "call":
            continue
        try:
            rows[cells[1]] = float(cells[4])
        except ValueError:
            continue
    return rows


def run_tree(tree: Path, runs: int, cpu_mock: bool, timeout: int) -> dict[str, float]:
    """One ``bench_overhead --runs runs`` from ``tree``, which comes first on the import path."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    )
    cmd = [sys.executable, "-m", "bench.bench_overhead", "--runs", str(runs)] + (
        ["--cpu-mock"] if cpu_mock else []
    )
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    rows = parse_ratios(out.stdout)
    if not rows:
        raise RuntimeError(
            f"bench_overhead in {tree} printed no table (exit {out.returncode}):\n{out.stderr[-2000:]}"
        )
    return rows


def summarize(
    base: list[dict[str, float]],
    head: list[dict[str, float]],
    pairs: list[tuple[dict, dict]],
    tolerance: float,
) -> tuple[str, str]:
    """``(table, verdict)`` of the runs: per-row medians and their difference, per-pair mean
    differences (head - base over the rows both have) and the module docstring's verdict."""
    names = [n for n in base[0] if all(n in r for r in base + head)]
    lines = ["| row | base median | head median | head - base |", "|---|---|---|---|"]
    diffs = []
    for name in names:
        b = statistics.median(r[name] for r in base)
        h = statistics.median(r[name] for r in head)
        diffs.append(h - b)
        lines.append(f"| {name} | {b:.3f} | {h:.3f} | {h - b:+.3f} |")
    per_pair = [statistics.fmean(h[n] - b[n] for n in names) for b, h in pairs]
    mean = statistics.fmean(diffs)
    lines.append("")
    lines.append("per pair (head - base, mean over rows): " + ", ".join(f"{d:+.3f}" for d in per_pair))
    lines.append(f"rows where head's median is higher: {sum(d > 0 for d in diffs)} of {len(diffs)}")
    if mean <= tolerance:
        verdict = f"no worse: mean difference {mean:+.4f} <= {tolerance}"
    elif min(per_pair) < 0 < max(per_pair):
        verdict = (
            f"unresolved: mean difference {mean:+.4f} > {tolerance}, pairs disagree in sign (run more pairs)"
        )
    else:
        verdict = f"worse: mean difference {mean:+.4f} > {tolerance} in every pair"
    return "\n".join(lines), verdict


def _base_tree(args: argparse.Namespace, scratch: list[Path]) -> Path:
    if args.base_tree is not None:
        return Path(args.base_tree).resolve()
    folder = Path(tempfile.mkdtemp(prefix="overhead_ab_base_"))
    scratch.append(folder)
    archive = subprocess.run(
        ["git", "archive", args.base, *PACKAGES], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--base", help="git revision of the base tree")
    where.add_argument("--base-tree", help="a folder holding the base tree's packages")
    p.add_argument("--pairs", type=int, default=4, help="alternating pairs of runs (default 4)")
    p.add_argument("--runs", type=int, default=3, help="bench_overhead --runs per run (default 3)")
    p.add_argument("--cpu-mock", action="store_true", help="bench_overhead --cpu-mock (no GPU)")
    p.add_argument("--tolerance", type=float, default=0.005, help="mean ratio difference allowed")
    p.add_argument("--timeout", type=int, default=600, help="seconds per bench_overhead run")
    args = p.parse_args(argv)
    if not args.cpu_mock:
        from bench.common.device import cuda_or_none

        if cuda_or_none("overhead_ab (or pass --cpu-mock)") is None:
            return 2
    scratch: list[Path] = []
    try:
        base_tree, base, head, pairs = _base_tree(args, scratch), [], [], []
        for i in range(args.pairs):
            order = [("base", base_tree), ("head", ROOT)]
            got = {}
            for label, tree in order if i % 2 == 0 else order[::-1]:
                print(f"pair {i + 1} of {args.pairs}: {label}", flush=True)
                got[label] = run_tree(tree, args.runs, args.cpu_mock, args.timeout)
            base.append(got["base"])
            head.append(got["head"])
            pairs.append((got["base"], got["head"]))
        table, verdict = summarize(base, head, pairs, args.tolerance)
        print(table)
        print(f"verdict: {verdict}")
        return 0
    finally:
        for folder in scratch:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
