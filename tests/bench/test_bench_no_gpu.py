"""Every bench script, the tuner (each of its KERNEL targets) and the calibrate script, without a
CUDA GPU: exit code 2 and its one-line message on stderr, no traceback (bench/README.md; `make bench`
runs through on a CPU machine). The demo is not among them: it runs the reference on CPU."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from bench.tune import TARGETS

BENCH = Path(__file__).resolve().parents[2] / "bench"
#: (script, its arguments): every bench script and the calibrate script bare, the tuner per target.
SCRIPTS = sorted(
    [(p.stem, ()) for p in [*BENCH.glob("bench_*.py"), BENCH / "calibrate_model.py"]]
    + [("overhead_ab", ("--base", "HEAD"))]
    + [("tune", (kernel,)) for kernel in TARGETS]
)


def test_every_script_is_listed() -> None:
    names = {name for name, _ in SCRIPTS}
    assert {"bench_overhead", "tune", "calibrate_model"} <= names


@pytest.mark.parametrize(("name", "args"), SCRIPTS, ids=[" ".join((n, *a)) for n, a in SCRIPTS])
def test_script_without_gpu_exits_2_with_one_line(
    name: str, args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(f"bench.{name}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert module.main(list(args)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and name in lines[0], err
