"""The tuner's sweep (``python -m bench.tune``), apart from the GPU: cases, timing, ranking, the table.

A :class:`Case` is one shape of one tuning target: the registry kernels it runs (the FP8 column
scales: the amax pass, then the cast pass, which reads the amax words the first left), the variant,
how to make an argument set, launch a kernel on it and name the tensors it writes, the bytes a call
moves, and the tuned table's shape class (``""``: the kernel's configs live in ``sm90.py`` and the
sweep only prints). :func:`sweep` times every config of each kernel's space (``cute_kernels.configs
.spaces``) on every case: the outputs are reset, written once and compared with the first config's
(and with the case's reference, where it has one), then timed over the rotating argument sets;
:func:`winners` keeps per kernel and shape class the config with the best worst ratio to a copy
over the class's cases, and :func:`write_winners` merges them into the tuned table
(:func:`bench.common.tuned.merge_tuned`). Compiling, timing and the copy baseline are passed in,
so the CPU tests drive it with fakes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tuned import merge_tuned


@dataclass(frozen=True)
class Case:
    """One shape to time. ``kernels``: registry names run in this order on the same argument sets;
    ``make()``: one argument set; ``run(name, kernel, *args)``: launch; ``outputs(name, args)``:
    the tensors a launch writes (reset to ``fill(name)`` bytes before the checked run, then
    compared); ``moved(name)``: bytes a call moves (read + written); ``expected(name, args)``: the
    outputs' reference bytes (e.g. the public ops'), or None; ``shape_class``: the tuned table's
    key, "" when the table is not written."""

    label: str
    kernels: tuple[str, ...]
    variant: Any
    make: Callable[[], tuple]
    run: Callable[..., Any]
    outputs: Callable[[str, tuple], tuple]
    moved: Callable[[str], int]
    shape_class: str = ""
    expected: Callable[[str, tuple], tuple] | None = None
    fill: Callable[[str], int] = lambda name: 0xA5


@dataclass(frozen=True)
class Result:
    """One (case, kernel, config): time, ratio to a copy of the same bytes, whether its bytes are
    the first config's (and the reference's)."""

    case: str
    shape_class: str
    kernel: str
    config: Any
    us: float
    ratio: float
    same: bool

    def row(self) -> dict:
        """The result as a report row: case, kernel, the config's fields, us, ratio, same."""
        fields = dataclasses.asdict(self.config)
        return {
            "case": self.case,
            "kernel": self.kernel,
            **fields,
            "us": self.us,
            "ratio": self.ratio,
            "same": self.same,
        }


@dataclass(frozen=True)
class Harness:
    """What the sweep needs from the machine: ``compile(name, variant, config)`` (None: skipped,
    e.g. it does not compile or spills), ``time(fn, sets)`` in us, ``copy_us(nbytes)``,
    ``rotating(make)`` (argument sets), ``as_bytes(tensor)`` (a comparable copy),
    ``reset(tensor, byte)``, ``equal(a, b)`` and ``progress(line)``."""

    compile: Callable[[str, Any, Any], Any]
    time: Callable[[Callable, list], float]
    copy_us: Callable[[int], float]
    rotating: Callable[[Callable[[], tuple]], list]
    as_bytes: Callable[[Any], Any]
    reset: Callable[[Any, int], None]
    equal: Callable[[Any, Any], bool]
    progress: Callable[[str], None] = print


def _checked_run(case: Case, name: str, kernel: Any, args: tuple, harness: Harness) -> list:
    """Reset the outputs, launch once, return copies of what the launch wrote."""
    written = case.outputs(name, args)
    for tensor in written:
        harness.reset(tensor, case.fill(name))
    case.run(name, kernel, *args)
    return [harness.as_bytes(t) for t in written]


def _same(a: Sequence, b: Sequence, harness: Harness) -> bool:
    return len(a) == len(b) and all(harness.equal(x, y) for x, y in zip(a, b, strict=True))


def sweep(cases: Sequence[Case], space: dict[str, list], harness: Harness) -> list[Result]:
    """Time every config of ``space[name]`` for each kernel ``name`` of each case (compiled once
    per variant and config); see the module docstring."""
    kernels: dict[tuple, Any] = {}
    results = []
    for case in cases:
        harness.progress(f"{case.label}: {', '.join(case.kernels)}")
        sets = harness.rotating(case.make)
        for name in case.kernels:
            copy_us = harness.copy_us(case.moved(name))
            first = None
            expected = None if case.expected is None else case.expected(name, sets[0])
            for config in space[name]:
                key = (name, case.variant, config)
                if key not in kernels:
                    kernels[key] = harness.compile(name, case.variant, config)
                kernel = kernels[key]
                if kernel is None:
                    continue
                out = _checked_run(case, name, kernel, sets[0], harness)
                first = out if first is None else first
                same = _same(out, first, harness) and (expected is None or _same(out, expected, harness))
                us = harness.time(lambda *a, c=case, k=kernel, n=name: c.run(n, k, *a), sets)
                results.append(Result(case.label, case.shape_class, name, config, us, copy_us / us, same))
                harness.progress(f"  {name} {config} {us:9.1f} us ratio {copy_us / us:.3f} same={same}")
        del sets
    return results


def winners(results: Sequence[Result]) -> dict[str, dict[str, Any]]:
    """``{kernel: {shape class: config}}``: per kernel and shape class, the config with the best
    worst ratio over the class's cases (among the configs that ran in all of them and wrote the
    expected bytes in each)."""
    cases: dict[tuple[str, str], set] = {}
    worst: dict[tuple[str, str], dict] = {}
    for r in results:
        cases.setdefault((r.kernel, r.shape_class), set()).add(r.case)
        if not r.same:
            continue
        per = worst.setdefault((r.kernel, r.shape_class), {})
        ratio, seen = per.get(r.config, (float("inf"), set()))
        per[r.config] = (min(ratio, r.ratio), seen | {r.case})
    out: dict[str, dict[str, Any]] = {}
    for (kernel, shape_class), per in worst.items():
        full = {c: ratio for c, (ratio, seen) in per.items() if seen == cases[kernel, shape_class]}
        if full:
            out.setdefault(kernel, {})[shape_class] = max(full, key=full.get)
    return out


def write_winners(path: Path, arch: str, device: str, best: dict[str, dict[str, Any]]) -> None:
    """Merge the winners of every tabled shape class (not ``""``) into the tuned table at ``path``
    under ``arch`` and ``device``, one kernel at a time."""
    for kernel, per_class in best.items():
        entries = {c: dataclasses.asdict(config) for c, config in per_class.items() if c}
        if entries:
            merge_tuned(path, kernel, arch, device, entries)


__all__ = ["Case", "Harness", "Result", "sweep", "winners", "write_winners"]
